"""Checks of a recorded SGLang run: did SGLang carry out what the policies decided, did ranks agree?

They read the record directory the plugin writes (``recorder.py``): ``decisions.jsonl`` is the
intent (rank 0's decisions), ``batches_rank{r}.jsonl`` is what each rank's SGLang batches held when
they launched, read from SGLang's own objects (``ScheduleBatch`` fields and the budget
``PrefillAdder`` received). Each function returns a list of problems, empty when all is well.
"""

from __future__ import annotations

from pathlib import Path

from fastpp.backends.sglang.recorder import read_jsonl

# what must be identical, microbatch by microbatch, on every PP rank
AGREEMENT_KEYS = (
    "mb",
    "slot",
    "decision",
    "mode",
    "chunks",
    "decodes",
    "chunk",
    "adder_chunk_budget",
    "parked",
)


def rank_batches(root: str | Path) -> dict[int, list[dict]]:
    """Each rank's launched batches in launch order (divergence notes excluded)."""
    out = {}
    for path in sorted(Path(root).glob("batches_rank*.jsonl")):
        rank = int(path.stem.removeprefix("batches_rank"))
        out[rank] = [e for e in read_jsonl(path) if "divergence" not in e]
    return out


def rank_disagreements(root: str | Path, num_ranks: int) -> list[str]:
    """Where PP ranks formed different microbatches, or a rank flagged a divergence."""
    problems = []
    for path in sorted(Path(root).glob("batches_rank*.jsonl")):
        for e in read_jsonl(path):
            if "divergence" in e:
                problems.append(f"{path.name}: decision {e.get('seq')}: {e['divergence']}")
    batches = rank_batches(root)
    if sorted(batches) != list(range(num_ranks)):
        return [*problems, f"batch logs of ranks {sorted(batches)}, expected 0..{num_ranks - 1}"]
    ref = batches[0]
    for rank in range(1, num_ranks):
        other = batches[rank]
        # the newest launches may not have reached every rank when the server stopped
        n = min(len(ref), len(other))
        if max(len(ref), len(other)) - n > num_ranks:
            problems.append(f"rank {rank} launched {len(other)} microbatches, rank 0 {len(ref)}")
        for a, b in zip(ref[:n], other[:n], strict=True):
            diff = [k for k in AGREEMENT_KEYS if a.get(k) != b.get(k)]
            if diff:
                problems.append(f"microbatch {a.get('mb')}: rank {rank} differs from rank 0 in {diff}")
    return problems


def applied_vs_decided(root: str | Path) -> list[str]:
    """Problems where rank 0's SGLang batches did not carry what the policies decided.

    * every prefill microbatch's chunk budget, as SGLang's PrefillAdder received it, is the C of
      the decision taken for that step, and the batch holds at most C tokens;
    * a parked request is in no launched batch until a decision restores it, and a request
      restored into a slot decodes in that slot's next decode microbatch.
    """
    problems = []
    decisions = {d["seq"]: d for d in read_jsonl(Path(root) / "decisions.jsonl")}
    batches = rank_batches(root).get(0, [])
    parked: dict[str, int] = {}  # rid -> decision seq that parked it
    pending_restore: dict[int, set[str]] = {}  # slot -> rids restored, not yet seen decoding
    by_seq = sorted(decisions)
    di = 0
    for b in batches:
        # replay the park / restore decisions taken up to this batch's step
        while di < len(by_seq) and by_seq[di] <= b["decision"]:
            d = decisions[by_seq[di]]
            for rid in d["park"]:
                parked[rid] = d["seq"]
                for rids in pending_restore.values():
                    rids.discard(rid)
            for rid in d["restore"]:
                parked.pop(rid, None)
                pending_restore.setdefault(d["slot"], set()).add(rid)
            di += 1
        d = decisions.get(b["decision"])
        if b["mode"] == "extend" and b["num_prefill_tokens"] > 0:
            if d is None:
                problems.append(f"microbatch {b['mb']}: prefill with no recorded decision {b['decision']}")
            elif d["slot"] == b["slot"]:
                if b["adder_chunk_budget"] != d["chunk"]:
                    problems.append(
                        f"microbatch {b['mb']}: SGLang's adder got {b['adder_chunk_budget']}, "
                        f"the policy decided {d['chunk']}"
                    )
                if d["chunk"] is not None and b["num_tokens"] > d["chunk"]:
                    problems.append(f"microbatch {b['mb']}: {b['num_tokens']} tokens > C={d['chunk']}")
        in_batch = set(b["decodes"]) | {c[0] for c in b["chunks"]}
        for rid in in_batch & parked.keys():
            problems.append(f"microbatch {b['mb']}: request {rid} runs while parked (decision {parked[rid]})")
        if b["decodes"]:
            missing = pending_restore.pop(b["slot"], set()) - set(b["decodes"])
            for rid in missing:
                problems.append(
                    f"microbatch {b['mb']}: request {rid} restored into slot {b['slot']} "
                    "does not decode there"
                )
    return problems

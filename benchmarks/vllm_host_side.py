"""The host side of vLLM's PP loop, per microbatch, from a vLLM record dir.

    python benchmarks/vllm_host_side.py RUN_DIR [--json FILE]

RUN_DIR is what ``fastpp serve --backend vllm --record-dir RUN_DIR`` wrote (our scheduler in
vLLM's engine core; any policy). Every instant below is on the scheduler's clock (the stage
times the workers write are ``time.time()`` stamps, put on the same base by the scheduler):

* ``decisions.jsonl``: ``schedule_started_at`` .. ``at``: one ``schedule()`` call (our policy's
  decision plus vLLM's own scheduling), empty calls included;
* ``iterations.csv``: each stage's interval per microbatch (stage 0 from the worker's
  ``execute_model`` entry; the last stage until its ``sample_tokens`` returns);
* ``returns.jsonl``: ``update_started_at`` (the engine core has the last rank's output and
  enters ``update_from_output``), ``returned_at`` (vLLM's part done: the token instants of
  requests.jsonl), ``done_at`` (ours done).

Printed per non-empty microbatch (median, p10, p90 in ms): the scheduling time; the launch path
(schedule() returned -> stage 0 starts computing: the RPC broadcast to the workers); the token
return path (last stage ends -> update_from_output entered -> vLLM folded the tokens in -> ours
done); the slot's cycle gap (last stage ends -> stage 0 starts the slot's next microbatch) and
what the records profile takes from it (``fastpp.records_profile``: token return and host
overhead). Also: the share of schedule() calls that ran while a microbatch was computing on some
stage (scheduling overlapped with compute), the share of calls that scheduled nothing, and the
share of stage 0's busy time during which a later stage computed too (the pipelining).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from fastpp.run_files import read_iterations_csv


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise SystemExit(f"{path} is missing: record with a fastpp whose vLLM recorder writes it")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stats_ms(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    a = np.asarray(values) * 1e3
    return {
        "n": len(a),
        "median_ms": float(np.median(a)),
        "p10_ms": float(np.quantile(a, 0.1)),
        "p90_ms": float(np.quantile(a, 0.9)),
    }


def host_side(run_dir: Path) -> dict:
    decisions = _read_jsonl(run_dir / "decisions.jsonl")
    returns = {r["mb_id"]: r for r in _read_jsonl(run_dir / "returns.jsonl")}
    its = read_iterations_csv(run_dir / "iterations.csv")
    if "schedule_started_at" not in decisions[0]:
        raise SystemExit(f"{run_dir}/decisions.jsonl has no schedule_started_at: recorded by an older fastpp")
    pp = max(it.stage for it in its) + 1
    by_mb: dict[int, dict[int, tuple[float, float]]] = {}
    for it in its:
        by_mb.setdefault(it.mb_id, {})[it.stage] = (it.started_at, it.finished_at)
    busy = sorted((it.started_at, it.finished_at) for it in its)

    def computing(t0: float, t1: float) -> bool:
        return any(a < t1 and b > t0 for a, b in busy)

    out: dict[str, object] = {
        "pp": pp,
        "schedule_calls": len(decisions),
        "empty_calls": sum(d["total_scheduled"] == 0 for d in decisions),
    }
    sched_s, empty_sched_s, launch_s, overlapped = [], [], [], 0
    for d in decisions:
        dur = d["at"] - d["schedule_started_at"]
        if d["total_scheduled"] == 0:
            empty_sched_s.append(dur)
            continue
        sched_s.append(dur)
        overlapped += computing(d["schedule_started_at"], d["at"])
        stages = by_mb.get(d["mb_id"])
        if stages and 0 in stages:
            launch_s.append(stages[0][0] - d["at"])
    out["schedule_s"] = stats_ms(sched_s)
    out["empty_schedule_s"] = stats_ms(empty_sched_s)
    out["scheduled_while_computing"] = overlapped / max(len(sched_s), 1)
    out["launch_s"] = stats_ms(launch_s)
    to_core, fold_in, ours, to_token = [], [], [], []
    for mb, r in returns.items():
        stages = by_mb.get(mb)
        if not stages or pp - 1 not in stages or r["update_started_at"] is None:
            continue
        end = stages[pp - 1][1]
        to_core.append(r["update_started_at"] - end)
        fold_in.append(r["returned_at"] - r["update_started_at"])
        ours.append(r["done_at"] - r["returned_at"])
        to_token.append(r["returned_at"] - end)
    out["last_stage_end_to_update_s"] = stats_ms(to_core)
    out["update_from_output_s"] = stats_ms(fold_in)
    out["fastpp_return_s"] = stats_ms(ours)
    out["last_stage_end_to_token_s"] = stats_ms(to_token)
    # the slot's cycle: last stage of mb k ends -> stage 0 of the slot's next non-empty mb starts
    slot_of = {d["mb_id"]: d["slot"] for d in decisions}
    nonempty = sorted(mb for mb, st in by_mb.items() if 0 in st and pp - 1 in st)
    cycle = []
    for k, mb in enumerate(nonempty):
        nxt = next((m for m in nonempty[k + 1 :] if slot_of.get(m) == slot_of.get(mb)), None)
        if nxt is not None and nxt - mb == pp:  # the slot's very next launch carried work
            cycle.append(by_mb[nxt][0][0] - by_mb[mb][pp - 1][1])
    out["slot_cycle_gap_s"] = stats_ms(cycle)
    out["stage0_busy_while_later_stage_busy"] = overlap_share(
        [(it.started_at, it.finished_at) for it in its if it.stage == 0],
        [(it.started_at, it.finished_at) for it in its if it.stage > 0],
    )
    return out


def row_ms(label: str, s: dict) -> str:
    """A markdown row of ``stats_ms`` figures: | label | n | median | p10 | p90 |."""
    if not s.get("n"):
        return f"| {label} | 0 | - | - | - |"
    return f"| {label} | {s['n']} | {s['median_ms']:.2f} | {s['p10_ms']:.2f} | {s['p90_ms']:.2f} |"


def overlap_share(first: list[tuple[float, float]], later: list[tuple[float, float]]) -> float:
    """Share of stage 0's busy time during which a later stage computes too: how much the
    pipeline actually pipelines (0 when one microbatch crosses the stages at a time)."""
    later = sorted(later)
    both = 0.0
    for a, b in first:
        for c, e in later:
            if c >= b:
                break
            both += max(0.0, min(b, e) - max(a, c))
    busy = sum(b - a for a, b in first)
    return both / busy if busy > 0 else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args(argv)
    out = host_side(args.run_dir)
    print(
        f"{args.run_dir}: pp={out['pp']}, {out['schedule_calls']} schedule() calls, "
        f"{out['empty_calls']} scheduled nothing; "
        f"{out['scheduled_while_computing']:.0%} of the non-empty calls ran while a stage computed; "
        f"stage 0 computed alongside a later stage {out['stage0_busy_while_later_stage_busy']:.1%} "
        "of its busy time"
    )
    print("| host-side step (non-empty microbatches) | n | median ms | p10 ms | p90 ms |")
    print("|---|---|---|---|---|")
    labels = (
        ("schedule_s", "schedule() (our decision + vLLM's)"),
        ("empty_schedule_s", "schedule() that scheduled nothing"),
        ("launch_s", "schedule() returned -> stage 0 computes (RPC to the workers)"),
        ("last_stage_end_to_update_s", "last stage ends -> update_from_output entered"),
        ("update_from_output_s", "update_from_output (vLLM folds the tokens in)"),
        ("fastpp_return_s", "our bookkeeping after it"),
        ("last_stage_end_to_token_s", "last stage ends -> token instant (token return)"),
        ("slot_cycle_gap_s", "last stage ends -> stage 0 starts the slot's next microbatch"),
    )
    for key, label in labels:
        print(row_ms(label, out[key]))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

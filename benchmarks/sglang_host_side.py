"""The host side of SGLang's PP loop, per step and per microbatch, from an SGLang record dir.

    python benchmarks/sglang_host_side.py RUN_DIR [--json FILE]
    python benchmarks/sglang_host_side.py RUN_DIR --profile P.json --profile-out Q.json

RUN_DIR is what ``fastpp serve --backend sglang --record-dir RUN_DIR`` wrote; its
``host_rank{r}.jsonl`` files time every phase of every non-idle step of ``event_loop_pp`` on
each rank (``fastpp.backends.sglang.host_timing``: ingest, schedule, recv_activations, launch,
exchange_outputs, process_result, send_activations), on the iterations' clock.

Printed: each phase's duration per rank (median, p10, p90 in ms, over the steps that ran it);
rank 0's host work before a launch (ingest + schedule: what the simulator's ``host_overhead_s``
stands for); the sampled tokens' path (the last stage ends slot k's microbatch -> rank 0 has its
tokens -> rank 0 has processed them: the simulator's ``token_return_s``), and how much of that
path is rank 0 still computing its own stage of the previous slot (the loop receives tokens only
after its launch returns); the slot's cycle gap (last stage ends -> rank 0 launches the slot
again); how often rank 0 schedules while a later stage computes; how much of rank 0's compute
overlaps a later stage's (the pipelining); and, from iterations.csv, how much the stage time of
one microbatch shape varies (median, p10, p90, coefficient of variation).

``--profile P.json --profile-out Q.json`` writes P with ``host_overhead_s`` and
``token_return_s`` replaced by the medians measured here (for ``benchmarks/sim_vs_real.py
--profile Q.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from vllm_host_side import overlap_share, row_ms, stats_ms

from fastpp.backends.sglang.host_timing import PHASES
from fastpp.run_files import read_iterations_csv


def read_host_files(run_dir: Path) -> dict[int, list[dict]]:
    """Each rank's timed steps, in step order."""
    files = sorted(run_dir.glob("host_rank*.jsonl"))
    if not files:
        raise SystemExit(
            f"{run_dir} has no host_rank*.jsonl: record with a fastpp whose SGLang plugin "
            "writes the loop's timings (fastpp serve --backend sglang --record-dir)"
        )
    out = {}
    for path in files:
        rank = int(path.stem.removeprefix("host_rank"))
        steps = []
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines, 1):
            try:
                steps.append(json.loads(line))
            except json.JSONDecodeError:
                if n < len(lines):  # only the last line may be cut short (SGLang kills its ranks)
                    raise SystemExit(f"{path}:{n}: not a JSON object") from None
        out[rank] = sorted(steps, key=lambda s: s["step"])
    return out


def _dur(step: dict, phase: str) -> float | None:
    span = step.get(phase)
    return None if span is None else span[1] - span[0]


def host_side(run_dir: Path) -> dict:
    ranks = read_host_files(run_dir)
    pp = max(ranks) + 1
    if set(ranks) != set(range(pp)):
        raise SystemExit(f"{run_dir}: host files for ranks {sorted(ranks)}, expected 0 .. {pp - 1}")
    slots = 1 + max(s["slot"] for steps in ranks.values() for s in steps if "slot" in s)
    out: dict[str, object] = {"pp": pp, "slots": slots}
    phases: dict[str, dict] = {}
    for rank, steps in ranks.items():
        phases[str(rank)] = {
            p: stats_ms([d for s in steps if (d := _dur(s, p)) is not None]) for p, _ in PHASES
        }
    out["phases"] = phases

    first, last = ranks[0], ranks[pp - 1]
    launches0 = [s for s in first if "launch" in s]
    # rank 0's host work before a launch: from the step's start (ingest) to the launch
    out["rank0_before_launch_s"] = stats_ms(
        [s["launch"][0] - s["ingest"][0] for s in launches0 if "ingest" in s]
    )
    last_launches = sorted((s["launch"][1], s["slot"]) for s in last if "launch" in s and "slot" in s)
    tokens_in, processed, own_compute, cycle = [], [], [], []
    for s in first:
        if "process_result" not in s or "exchange_outputs" not in s or "slot" not in s:
            continue
        slot = (s["slot"] + 1) % slots  # the step processes the next slot's result
        got = s["exchange_outputs"][1]
        ended = max((t for t, k in last_launches if k == slot and t <= got), default=None)
        if ended is None:
            continue
        tokens_in.append(got - ended)
        processed.append(s["process_result"][1] - ended)
        if "launch" in s:  # tokens that came in while rank 0 computed its own stage wait for it
            own_compute.append(max(0.0, s["launch"][1] - max(ended, s["launch"][0])))
        nxt = next((n for n in launches0 if n["slot"] == slot and n["launch"][0] > got), None)
        if nxt is not None:
            cycle.append(nxt["launch"][0] - ended)
    out["last_stage_end_to_tokens_at_rank0_s"] = stats_ms(tokens_in)
    out["of_which_rank0_computing_s"] = stats_ms(own_compute)
    out["last_stage_end_to_tokens_processed_s"] = stats_ms(processed)
    out["slot_cycle_gap_s"] = stats_ms(cycle)
    later = [tuple(s["launch"]) for r in range(1, pp) for s in ranks[r] if "launch" in s]
    scheds = [tuple(s["schedule"]) for s in launches0 if "schedule" in s]
    out["rank0_scheduled_while_later_stage_computed"] = sum(
        any(a < t1 and b > t0 for a, b in later) for t0, t1 in scheds
    ) / max(len(scheds), 1)
    out["stage0_busy_while_later_stage_busy"] = overlap_share([tuple(s["launch"]) for s in launches0], later)
    out["repeated_shapes"] = repeated_shapes(run_dir)
    return out


def repeated_shapes(run_dir: Path, min_count: int = 5) -> list[dict]:
    """Stage times of microbatches of one shape (stage, tokens, prefill tokens) seen at least
    ``min_count`` times in iterations.csv: how much identical work varies on this machine (what
    ``sim_vs_real.py --noise-cv`` puts back)."""
    path = run_dir / "iterations.csv"
    if not path.is_file():
        return []
    groups: dict[tuple[int, int, int], list[float]] = {}
    for it in read_iterations_csv(path, torn_tail=True):
        groups.setdefault((it.stage, it.num_tokens, it.num_prefill_tokens), []).append(it.duration_s)
    rows = []
    for (stage, tokens, prefill), times in sorted(groups.items()):
        if len(times) >= min_count:
            a = np.asarray(times)
            rows.append(
                {
                    "stage": stage,
                    "tokens": tokens,
                    "prefill_tokens": prefill,
                    **stats_ms(times),
                    "cv": float(a.std() / a.mean()),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    ap.add_argument("--profile", type=Path, help="a profile whose host constants to replace")
    ap.add_argument("--profile-out", type=Path, help="where to write it (with --profile)")
    args = ap.parse_args(argv)
    if (args.profile is None) != (args.profile_out is None):
        ap.error("--profile and --profile-out go together")
    out = host_side(args.run_dir)
    share = out["rank0_scheduled_while_later_stage_computed"]
    print(
        f"{args.run_dir}: pp={out['pp']}, {out['slots']} microbatch slots; rank 0 scheduled while a "
        f"later stage computed in {share:.0%} of its launching steps; rank 0 computed alongside a later "
        f"stage {out['stage0_busy_while_later_stage_busy']:.1%} of its busy time"
    )
    print("| phase of a loop step | n | median ms | p10 ms | p90 ms |")
    print("|---|---|---|---|---|")
    for rank, per_phase in out["phases"].items():
        for phase, _ in PHASES:
            print(row_ms(f"rank {rank}: {phase}", per_phase[phase]))
    print("| per microbatch | n | median ms | p10 ms | p90 ms |")
    print("|---|---|---|---|---|")
    for key, label in (
        ("rank0_before_launch_s", "rank 0: step start -> launch (ingest + schedule: host overhead)"),
        ("last_stage_end_to_tokens_at_rank0_s", "last stage ends -> rank 0 has the tokens"),
        ("of_which_rank0_computing_s", "  of which rank 0 was computing its own stage"),
        ("last_stage_end_to_tokens_processed_s", "last stage ends -> rank 0 processed them (token return)"),
        ("slot_cycle_gap_s", "last stage ends -> rank 0 launches the slot again"),
    ):
        print(row_ms(label, out[key]))
    shapes = out["repeated_shapes"]
    if shapes:
        print("| microbatch shape (stage, tokens, prefill tokens) | n | median ms | p10 ms | p90 ms | CV |")
        print("|---|---|---|---|---|---|")
        for r in shapes:
            print(row_ms(f"{r['stage']}, {r['tokens']}, {r['prefill_tokens']}", r) + f" {r['cv']:.2f} |")
        cv = np.average([r["cv"] for r in shapes], weights=[r["n"] for r in shapes])
        print(f"CV over the repeated shapes, weighted by count: {cv:.2f}")
    if args.profile is not None:
        from fastpp.profile import load_profile, save_profile

        host, ret = out["rank0_before_launch_s"], out["last_stage_end_to_tokens_processed_s"]
        if not host.get("n") or not ret.get("n"):
            raise SystemExit(f"{args.run_dir}: too few timed steps to measure the host constants")
        prof = load_profile(args.profile)
        prof = replace(prof, host_overhead_s=host["median_ms"] / 1e3, token_return_s=ret["median_ms"] / 1e3)
        save_profile(prof, args.profile_out)
        print(
            f"wrote {args.profile_out}: host_overhead_s {prof.host_overhead_s * 1e3:.2f} ms, "
            f"token_return_s {prof.token_return_s * 1e3:.2f} ms (medians measured above)"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

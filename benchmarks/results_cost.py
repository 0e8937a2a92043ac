"""Where the regeneration of docs/RESULTS.md spends its time: every goodput point of the page,
each timed in CPU seconds.

    python benchmarks/results_cost.py                  # all 119 points, 2 worker processes
    python benchmarks/results_cost.py --only nvlink    # one grid (names: scripts/make_results.py)
    python benchmarks/results_cost.py --jsonl cost.jsonl   # also one JSON line per point

The points are scripts/make_results.py's (``sweep_grids``: the same grids, the same ids, each
distinct point once), each evaluated as the sweep does (``fastpp.sim.sweep.evaluate_point``) in
a pool of worker processes, with its CPU time measured in the worker. Prints the dearest points
and the CPU seconds per grid and per workload, and which build ran (scripts/build_native.py).
The other experiments of the page (beat, DS, replay, predictor ablation) are not included; they
are a few percent of the whole.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from fastpp import _native
from fastpp.sim.sweep import evaluate_point, plan_sweep
from fastpp.sim.sweep_grid import SweepPoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import make_results  # noqa: E402 (the page's grids, from the script that runs them)


def timed(point: SweepPoint) -> tuple[str, float, dict]:
    cpu0 = time.process_time()
    row = evaluate_point(point)
    return point.point_id, time.process_time() - cpu0, row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", action="append", help="a grid's name (repeatable); default: all")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--jsonl", type=Path, help="write one JSON line per point here")
    ap.add_argument("--top", type=int, default=15, help="how many of the dearest points to list")
    args = ap.parse_args()
    grids = make_results.sweep_grids()
    unknown = set(args.only or ()) - set(grids)
    if unknown:
        ap.error(f"unknown grid(s) {', '.join(sorted(unknown))}; known: {', '.join(grids)}")
    points: dict[str, SweepPoint] = {}
    grid_of: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, grid in grids.items():
            if args.only and name not in args.only:
                continue
            for p in plan_sweep(grid, Path(tmp) / name).todo:
                points.setdefault(p.point_id, p)
                grid_of.setdefault(p.point_id, name)
    print(f"build   : {_native.status()}")
    print(f"points  : {len(points)} on {args.workers} worker processes", flush=True)
    rows = []
    out = args.jsonl.open("w") if args.jsonl else None
    wall0 = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        for i, (pid, cpu, row) in enumerate(pool.map(timed, points.values()), 1):
            rows.append({"grid": grid_of[pid], "cpu_s": round(cpu, 2), **row})
            if out:
                out.write(json.dumps(rows[-1], default=str) + "\n")
            if i % 10 == 0 or i == len(points):
                print(f"done    : {i}/{len(points)}, {time.perf_counter() - wall0:.0f} s", flush=True)
    if out:
        out.close()
    total = sum(r["cpu_s"] for r in rows)
    print(f"total   : {total:.0f} s CPU in the workers, {time.perf_counter() - wall0:.0f} s wall")
    for label, key in (("grid", lambda r: r["grid"]), ("workload", lambda r: r["workload"])):
        sums: dict[str, float] = defaultdict(float)
        for r in rows:
            sums[key(r)] += r["cpu_s"]
        for k, v in sorted(sums.items(), key=lambda kv: -kv[1]):
            print(f"{label:8s}: {k:28s} {v:7.0f} s CPU ({100 * v / total:4.1f}%)")
    for r in sorted(rows, key=lambda r: -r["cpu_s"])[: args.top]:
        print(
            f"dearest : {r['cpu_s']:6.1f} s  {r['grid']:20s} {r['workload']:24s} {r['model']:12s} "
            f"{r['deploy']} {r['policy']} x{r['slo_scale']}: {r['goodput']} req/s, "
            f"{r['num_probes']} probes"
        )


if __name__ == "__main__":
    main()

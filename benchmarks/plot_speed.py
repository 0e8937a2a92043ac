"""Plotting speed: `fastpp plot` on a 15-minute Azure conversation replay run.

    python benchmarks/plot_speed.py                      # 900 s of azure-conv, simulate's 4 deployments
    python benchmarks/plot_speed.py --window 3600        # the whole hour
    python benchmarks/plot_speed.py --run runs/simulate/20260101-120000   # an existing run folder

First writes the run with `fastpp simulate --replay TRACE --replay-window WINDOW` (not timed:
it is the input), unless ``--run`` names one, then times the whole `fastpp plot RUN` command in a
child process (reading the run folders, drawing every figure, writing PNG and SVG) and prints
its wall and CPU time (CPU time, the child's, is the steadier figure on a shared machine), the
run's size and the figures written. The target (issue 28) is at most 20 s of wall time.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 20.0
CLI = [sys.executable, "-c", "from fastpp.cli.app import main; main()"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trace", default="azure-conv")
    ap.add_argument("--window", type=float, default=900.0, help="seconds of trace to replay")
    ap.add_argument("--speed", type=float, default=1.0, help="replay rate factor")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--run", type=Path, default=None, help="plot this run folder instead")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        run = args.run
        if run is None:
            run = Path(tmp) / "run"
            cmd = [
                *CLI,
                "simulate",
                "--replay",
                args.trace,
                "--replay-window",
                str(args.window),
                "--replay-speed",
                str(args.speed),
                "--json",
                "-o",
                str(run),
            ]
            if args.data_dir is not None:
                cmd += ["--data-dir", args.data_dir]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        size = sum(p.stat().st_size for p in run.rglob("*") if p.is_file())
        iterations = sum(sum(1 for _ in p.open()) - 1 for p in run.rglob("iterations.csv"))
        requests = sum(sum(1 for _ in p.open()) for p in run.rglob("requests.jsonl"))
        plots = Path(tmp) / "plots"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(
            [*CLI, "plot", str(run), "-o", str(plots)], check=True, capture_output=True, text=True
        )
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        figures = len(done.stdout.split())
    what = run if args.run else f"{args.trace}, {args.window:g} s window at {args.speed:g}x"
    print(
        f"run           : {what}: {requests:,} request rows, {iterations:,} iteration rows, "
        f"{size / 1e6:.0f} MB"
    )
    print(f"fastpp plot   : {wall:.2f} s wall, {cpu:.2f} s CPU, {figures} files")
    print(f"target        : <= {TARGET_S:g} s wall -> {'met' if wall <= TARGET_S else 'NOT met'}")


if __name__ == "__main__":
    main()

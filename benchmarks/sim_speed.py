"""Simulator speed: the whole 1-hour Azure conversation trace (19,366 requests) on PP=4.

    python benchmarks/sim_speed.py                    # Qwen2.5-32B, 4 x A100-40GB PCIe, chunk 2048
    python benchmarks/sim_speed.py --speed 0.9 --window 900

Prints simulated requests, microbatches and stage-iterations per wall second, and the process's
CPU time for the simulation (the steadier figure on a shared machine). The target of issue 13 is
the full trace in at most 5 s on one core (the whole `fastpp simulate --replay azure-conv -d pp4`
command in at most 8 s). Pin to one core with ``taskset -c 0`` to measure the single-core figure.
"""

from __future__ import annotations

import argparse
import time

from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trace", default="azure-conv")
    ap.add_argument("--speed", type=float, default=1.0, help="replay rate factor")
    ap.add_argument("--window", type=float, default=None, help="seconds of trace (default: all)")
    ap.add_argument("--policy", default="static:2048")
    ap.add_argument("--deploy", default="pp4")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--iterations", action="store_true", help="also keep IterationRecords")
    args = ap.parse_args()

    from fastpp.sim.run import parse_deployment

    pp, tp, _ = parse_deployment(args.deploy)
    wl = WorkloadConfig(replay=args.trace, replay_window_s=args.window, replay_speed=args.speed,
                        data_dir=args.data_dir)
    t0 = time.perf_counter()
    requests = wl.requests()
    t_load = time.perf_counter() - t0
    dep = DeploymentConfig(pp=pp, tp=tp, policy=args.policy)
    cpu0 = time.process_time()
    run = run_simulation(wl, dep, requests=requests, record_iterations=args.iterations)
    cpu_s = time.process_time() - cpu0  # includes the summary after the simulation
    res, s = run.result, run.summary
    n = len(requests)
    print(f"workload      : {wl.describe()} ({n} requests, loaded in {t_load:.2f} s)")
    print(f"deployment    : {run.profile.model.name} on {run.profile.gpu}, {dep.label}, {dep.policy}")
    print(f"simulated     : {res.end_at:.0f} s of serving, {res.num_microbatches:,} microbatches, "
          f"{s['completed']} completed, {res.num_retractions} retractions")
    print(f"wall time     : {res.wall_s:.2f} s of simulation ({cpu_s:.2f} s CPU with the summary)")
    print(f"speed         : {n / res.wall_s:,.0f} requests/s, "
          f"{res.num_microbatches / res.wall_s:,.0f} microbatches/s, "
          f"{res.num_microbatches * pp / res.wall_s:,.0f} stage-iterations/s")
    print(f"target        : <= 5 s for the full trace -> {'met' if res.wall_s <= 5 else 'NOT met'}")


if __name__ == "__main__":
    main()

"""What one goodput search costs: CPU time per probe, the whole search, its peak memory.

    python benchmarks/goodput_speed.py                                   # 32B cnn-reversed, predictive
    python benchmarks/goodput_speed.py -w sharegpt-synthetic -m Qwen2.5-14B --precision 0.5
    FASTPP_NATIVE=1 python benchmarks/goodput_speed.py                   # the compiled build

The search is ``fastpp goodput``'s (fastpp.sim.goodput.slo_goodput, seeds 0 and 1). One line per
probe as the search runs it (rate, verdict, requests per seed looked at, whether it was a
confirmation at the longest look or stopped early, CPU seconds it took), then the answer, the
whole search's CPU time, the process's peak memory and which build ran (pure Python unless
``FASTPP_NATIVE=1`` asks for the one ``python -m fastpp.native_build`` made).
Compare builds or versions by running this one after the other on a quiet machine: CPU time is
the steadier figure.
"""

from __future__ import annotations

import argparse
import resource
import time

from fastpp.sim.goodput import ProbeResult, slo_goodput
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, parse_deployment


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-w", "--workload", default="cnn-reversed-synthetic")
    ap.add_argument("-m", "--model", default="Qwen2.5-32B")
    ap.add_argument("-d", "--deploy", default="pp4@predictive")
    ap.add_argument("--precision", type=float, default=0.25)
    args = ap.parse_args()
    pp, tp, policy = parse_deployment(args.deploy)
    deployment = DeploymentConfig(model=args.model, pp=pp, tp=tp, **({"policy": policy} if policy else {}))
    print(f"build    : {_build()}")
    print(f"search   : {args.workload}, {args.model} {args.deploy}, precision {args.precision}")
    last = [time.process_time()]

    def progress(p: ProbeResult) -> None:
        now = time.process_time()
        m = p.metrics
        tags = [t for t, k in (("confirmation", "confirmed"), ("stopped early", "stopped_early")) if m.get(k)]
        print(
            f"probe    : {p.rate:8.4g} req/s  {'ok  ' if p.ok else 'FAIL'}  "
            f"{m.get('requests_per_seed', m.get('num_requests', 0)):6.0f} requests/seed  "
            f"{now - last[0]:5.1f} s CPU  {', '.join(tags)}",
            flush=True,
        )
        last[0] = now

    cpu0 = time.process_time()
    found = slo_goodput(
        WorkloadConfig(name=args.workload), deployment, precision=args.precision, progress=progress
    )
    cpu = time.process_time() - cpu0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"goodput  : {found.rate:g} req/s (+{found.margin:g}), {len(found.probes)} probes")
    print(f"cost     : {cpu:.1f} s CPU for the search, peak memory {peak_mb:.0f} MB")


def _build() -> str:
    try:  # versions before the compiled build have no fastpp._native
        from fastpp import _native
    except ImportError:
        return "pure Python (this version has no compiled build)"
    return _native.status()


if __name__ == "__main__":
    main()

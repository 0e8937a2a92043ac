"""The dynamic policies against the tuned static chunk: steady-state goodput, the paper's
fixed-run protocol, and the Azure trace replays.

    python benchmarks/policy_targets.py steady --model Qwen2.5-32B --workload azure-conv
    python benchmarks/policy_targets.py fixed            # PP_static / TP, predictive, DS on CNN-R
    python benchmarks/policy_targets.py replay           # first 15 min of the Azure trace
    python benchmarks/policy_targets.py report           # the tables, from the cache only

Deployment: 4 x A100-40GB over PCIe 4.0, PP=4 (TP=4 for ``tp``), analytic profile; SLO P90 TTFT
<= 2 s and P90 TPOT <= 200 ms. Every result is kept in a JSON cache (``--cache``, default
benchmarks/out/policy_targets.json) keyed by what was measured, so a rerun only measures what is
missing; ``report`` prints every table from it.

* steady: ``fastpp.sim.goodput.slo_goodput`` (seeds 0 and 1 pooled, the steady-queue rule, the
  answer confirmed on 12,000 requests per seed) to ``--precision`` req/s, for every static chunk
  of the fine grid (multiples of 128 up to 1024, then 1536 and 2048) and the dynamic policies.
* fixed: ``fastpp.sim.goodput_fixed`` (docs/GOODPUT.md), the presets ``azure`` (400 prompts) and
  ``cnn-reversed`` (1,000), rates 1..11 refined to ``--precision``; seeds 0..2 pooled. On
  CNN-Reversed also retractions and P99 TPOT at the goodput rate, and the admission and
  retraction options (``@adm=all``, ``@adm=slot``, ``@ret=back``).
* replay: the Azure conversation trace, first 900 s, at 0.9x and 1.2x its arrival rate:
  per-request attainment (both SLOs met), P90 TTFT, P90 TPOT, mean E2E.

Policies are specs as ``fastpp policies`` lists them; a suffix ``@adm=all`` / ``@adm=slot``,
``@ret=back`` or ``@q=late`` sets DeploymentConfig.admission_reserve="all" / "slot" (the
default), retraction="fewest_output_back" or queue_order="late_last" for that run (``fastpp
goodput --admission all --retraction fewest_output_back --queue-order late_last``); the replays
run each policy under both queue orders.
Work runs in a process pool of ``--workers`` (default 2) processes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from fastpp.sim.plan_candidates import DEFAULT_STATIC_GRID as FINE_GRID  # the planner's static grid

WORKLOADS = ("azure-conv", "sharegpt-synthetic", "cnn-dailymail-synthetic", "cnn-reversed-synthetic")
DYNAMIC = ("predictive", "slack")
CACHE = Path(__file__).parent / "out" / "policy_targets.json"
OPTIONS = {
    "adm=slot": ("admission_reserve", "slot"),
    "adm=all": ("admission_reserve", "all"),
    "ret=back": ("retraction", "fewest_output_back"),
    "q=late": ("queue_order", "late_last"),
}


def _split(spec: str) -> tuple[str, dict[str, str]]:
    """``predictive+ds@adm=slot@ret=back`` -> (policy, DeploymentConfig overrides)."""
    policy, *opts = spec.split("@")
    overrides = {}
    for o in opts:
        if o not in OPTIONS:
            raise ValueError(f"unknown option {o!r}; known: {', '.join(OPTIONS)}")
        key, value = OPTIONS[o]
        overrides[key] = value
    return policy, overrides


def _deployment(model: str, spec: str):
    from fastpp.sim.run import DeploymentConfig

    policy, overrides = _split(spec)
    if policy.startswith("tp:"):
        return DeploymentConfig(model=model, pp=1, tp=4, policy=policy[3:], **overrides)
    return DeploymentConfig(model=model, pp=4, tp=1, policy=policy, **overrides)


def measure(job: tuple) -> tuple[str, dict]:
    """One cached measurement: (key, result)."""
    kind, model, workload, spec, arg = job
    key = "|".join(str(x) for x in job)
    t0 = time.process_time()
    from fastpp.sim.run import WorkloadConfig

    dep = _deployment(model, spec)
    if kind == "steady":
        from fastpp.sim.goodput import slo_goodput

        res = slo_goodput(WorkloadConfig(name=workload), dep, precision=arg, low=2.0, high=8.0)
        out = {"goodput": res.rate, "margin": res.margin}
    elif kind == "fixed":
        from fastpp.sim.goodput_fixed import PRESETS, fixed_goodput

        preset, precision = arg
        res = fixed_goodput(
            WorkloadConfig(name=workload), dep, PRESETS[preset], seeds=(0, 1, 2), precision=precision
        )
        out = {"goodput": res.rate, "margin": res.margin}
        if res.rate > 0:
            out.update(_at_rate(workload, dep, res.rate, PRESETS[preset].num_requests))
    else:  # replay at speed arg
        from fastpp.metrics import slo_attainment
        from fastpp.sim.run import run_simulation

        wl = WorkloadConfig(replay=workload, replay_window_s=900, replay_speed=arg)
        run = run_simulation(wl, dep, record_iterations=False)
        s = run.summary
        out = {
            "attainment": slo_attainment(run.result.records, dep.slo),
            "p90_ttft_ms": s["p90_ttft_ms"],
            "p90_tpot_ms": s["p90_tpot_ms"],
            "mean_e2e_s": s["mean_e2e_latency_ms"] / 1e3,
            "requests": s["completed"],
        }
    out["cpu_s"] = time.process_time() - t0
    return key, out


def _at_rate(workload: str, dep, rate: float, n: int) -> dict:
    """Retractions, parks and P99 TPOT of the fixed runs at ``rate`` (seeds 0..2 pooled)."""
    from fastpp.sim.experiments import pooled_summary
    from fastpp.sim.run import WorkloadConfig

    s = pooled_summary(WorkloadConfig(name=workload, rate=rate, num_requests=n), dep, (0, 1, 2))
    return {
        "p99_tpot_ms": s["p99_tpot_ms"],
        "p90_tpot_ms": s["p90_tpot_ms"],
        "retractions": s["num_retractions"],
        "parks": s["num_parked"],
    }


def run_jobs(jobs: list[tuple], cache: Path, workers: int) -> dict:
    done = json.loads(cache.read_text()) if cache.exists() else {}
    todo = [j for j in jobs if "|".join(str(x) for x in j) not in done]
    print(f"{len(jobs) - len(todo)} cached, {len(todo)} to measure", flush=True)
    cache.parent.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for key, out in pool.map(measure, todo):
            done = json.loads(cache.read_text()) if cache.exists() else {}
            done[key] = out
            tmp = cache.with_suffix(".tmp")
            tmp.write_text(json.dumps(done, indent=1, sort_keys=True))
            os.replace(tmp, cache)
            print(f"  {key}: {out}", flush=True)
    return json.loads(cache.read_text()) if cache.exists() else {}


def steady_jobs(models, workloads, precision, policies) -> list[tuple]:
    statics = [f"static:{c}" for c in FINE_GRID]
    return [("steady", m, w, p, precision) for m in models for w in workloads for p in (*statics, *policies)]


def fixed_jobs(models, precision) -> list[tuple]:
    jobs = []
    for m in models:
        for p in (*[f"static:{c}" for c in FINE_GRID], "tp:static:2048", "predictive", "slack"):
            jobs.append(("fixed", m, "azure-conv", p, ("azure", precision)))
        for p in (
            "predictive",
            "predictive+ds",
            "predictive@adm=all",
            "predictive+ds@adm=all",
            "predictive+ds@ret=back",
            "predictive@ret=back",
            "slack",
        ):
            jobs.append(("fixed", m, "cnn-reversed-synthetic", p, ("cnn-reversed", precision)))
    return jobs


def replay_jobs(models) -> list[tuple]:
    policies = ("static:384", "static:512", "greedy", "greedy:tile", "predictive", "predictive+ds", "slack")
    policies += tuple(f"{p}@q=late" for p in policies)  # and each under the late-last queue order
    return [("replay", m, "azure-conv", p, speed) for m in models for speed in (0.9, 1.2) for p in policies]


def report(done: dict) -> None:
    rows: dict[tuple, dict[str, dict]] = {}
    for key, out in done.items():
        kind, model, workload, spec, arg = key.split("|", 4)
        rows.setdefault((kind, model, workload, arg), {})[spec] = out
    for (kind, model, workload, arg), by in sorted(rows.items()):
        print(f"\n{kind} {model} {workload} {arg}")
        if kind == "replay":
            for spec, o in by.items():
                print(
                    f"  {spec:<32} attainment {o['attainment']:6.1%}  P90 TTFT {o['p90_ttft_ms']:8.0f} ms"
                    f"  P90 TPOT {o['p90_tpot_ms']:6.1f} ms  mean E2E {o['mean_e2e_s']:6.1f} s"
                )
            continue
        statics = {s: o["goodput"] for s, o in by.items() if s.startswith("static:")}
        best = max(statics, key=lambda s: (statics[s], -int(s.split(":")[1])), default=None)
        for spec, o in sorted(
            by.items(), key=lambda kv: (not kv[0].startswith("static:"), _chunk(kv[0]), kv[0])
        ):
            extra = ""
            if best is not None and not spec.startswith("static:") and statics[best] > 0:
                extra = f"  {o['goodput'] / statics[best] - 1:+6.1%} vs best static {best}"
            if "retractions" in o:
                extra += (
                    f"  retractions {o['retractions']:.0f}  parks {o['parks']:.0f}"
                    f"  P99 TPOT {o['p99_tpot_ms']:.1f} ms"
                )
            print(f"  {spec:<32} {o['goodput']:6.3f} (+{o['margin']:.3g}) req/s{extra}")
        tp = by.get("tp:static:2048")
        if tp and best and tp["goodput"] > 0:
            print(
                f"  PP_static / TP = {statics[best]:.3f} / {tp['goodput']:.3f} = "
                f"{statics[best] / tp['goodput']:.2f}"
            )


def _chunk(spec: str) -> int:
    try:
        return int(spec.split(":")[1])
    except (IndexError, ValueError):
        return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("what", choices=("steady", "fixed", "replay", "report"))
    ap.add_argument("--model", action="append", help="repeat; default both paper models")
    ap.add_argument("--workload", action="append", help="steady: repeat; default all four")
    ap.add_argument("--policy", action="append", help="steady: dynamic policies (default predictive, slack)")
    ap.add_argument("--static", help="steady: comma list of static chunks instead of the fine grid")
    ap.add_argument("--precision", type=float, default=0.125, help="req/s (default 0.125)")
    ap.add_argument("--exclude", action="append", default=[], help="skip specs containing this")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=CACHE)
    args = ap.parse_args()
    models = args.model or ["Qwen2.5-32B", "Qwen2.5-14B"]
    t0 = time.perf_counter()
    if args.what == "steady":
        jobs = steady_jobs(models, args.workload or WORKLOADS, args.precision, args.policy or DYNAMIC)
        if args.static is not None:
            keep = {f"static:{c}" for c in args.static.split(",") if c}
            jobs = [j for j in jobs if not j[3].startswith("static:") or j[3] in keep]
    elif args.what == "fixed":
        jobs = fixed_jobs(models, args.precision)
    elif args.what == "replay":
        jobs = replay_jobs(models)
    else:
        jobs = []
    jobs = [j for j in jobs if not any(x in j[3] for x in args.exclude)]
    done = (
        run_jobs(jobs, args.cache, args.workers)
        if jobs
        else (json.loads(args.cache.read_text()) if args.cache.exists() else {})
    )
    wanted = {"|".join(str(x) for x in j) for j in jobs}
    report({k: v for k, v in done.items() if not jobs or k in wanted})
    print(f"\nwall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

"""Goodput of the chunk policies in simulation (PAPER.md section 5, the policies issue's checks).

    python benchmarks/policy_goodput.py                 # both experiments, ~10-15 min on 2 cores
    python benchmarks/policy_goodput.py --only azure    # or --only cnnr

Deployment: Qwen2.5-32B (BF16) on 4 x A100-40GB over PCIe 4.0, PP=4, analytic profile; SLO P90
TTFT <= 2 s and P90 TPOT <= 200 ms; Poisson arrivals; seeds 0 and 1 pooled; goodput to 0.1 req/s
(fastpp.sim.goodput.slo_goodput, whose probe length and steady-state rules apply).

1. azure: goodput of static chunks 256..2048 ("best static" = PP_static of the paper), of greedy,
   predictive and upstream; then, at the best static chunk's goodput rate, P90 TPOT (and mean
   E2E) of the best static chunk and of the predictive policy on the same requests.
2. cnnr: goodput of predictive and predictive+ds on CNN-Reversed (synthetic, 65 in / 884 out), and
   of the best static chunk for this workload (256, docs/RESULTS.md) with and without DS; then, at
   the goodput rate of each policy with DS (seed 0), what delay scheduling could act on: the
   share of microbatches holding more decodes than one 128-token tile, and KV use of the running set.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from fastpp.sim.goodput import probe_span_s, slo_goodput
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation

STATIC = (256, 512, 768, 1024, 1536, 2048)


def goodput(workload: WorkloadConfig, policy: str) -> float:
    t0 = time.perf_counter()
    res = slo_goodput(workload, DeploymentConfig(policy=policy), seeds=(0, 1), low=1.0, high=8.0)
    print(
        f"  {policy:<16} goodput {res.rate:6.2f} req/s  (+{res.margin:.2f}, {len(res.probes)} "
        f"probes, {time.perf_counter() - t0:5.1f} s)",
        flush=True,
    )
    return res.rate


def latency_at(workload: WorkloadConfig, policy: str, rate: float) -> dict:
    """Pooled-seed P90 TPOT / P90 TTFT / mean E2E at ``rate`` (same request count rule)."""
    n = max(300, int(probe_span_s(workload, DeploymentConfig().slo) * rate))
    rows = [
        run_simulation(
            replace(workload, rate=rate, seed=s, num_requests=n),
            DeploymentConfig(policy=policy),
            record_iterations=False,
        ).summary
        for s in (0, 1)
    ]
    return {
        k: sum(r[k] for r in rows) / len(rows)
        for k in ("p90_tpot_ms", "p90_ttft_ms", "mean_e2e_latency_ms", "mean_bubble_fraction")
    }


def azure() -> None:
    wl = WorkloadConfig(name="azure-conv")
    print("azure-conv (built-in Azure 2023 conversation lengths), Qwen2.5-32B PP=4, A100-40GB PCIe")
    static = {c: goodput(wl, f"static:{c}") for c in STATIC}
    best = max(static, key=lambda c: static[c])
    for policy in ("greedy", "predictive", "upstream"):
        goodput(wl, policy)
    rate = static[best]
    print(f"best static chunk: {best} ({rate:.2f} req/s); latency at that rate (mean of 2 seeds):")
    for policy in (f"static:{best}", "predictive"):
        m = latency_at(wl, policy, rate)
        print(
            f"  {policy:<16} P90 TPOT {m['p90_tpot_ms']:6.1f} ms  P90 TTFT {m['p90_ttft_ms']:6.0f} ms"
            f"  mean E2E {m['mean_e2e_latency_ms'] / 1e3:5.1f} s  stage idle "
            f"{m['mean_bubble_fraction']:.1%}",
            flush=True,
        )


def tile_use(workload: WorkloadConfig, policy: str, rate: float) -> None:
    """What DS could act on at ``rate`` (seed 0, arrivals after the first 30% of the span):
    microbatches (stage 0) whose decode count exceeds one tile, the largest, parks, KV use."""
    n = max(300, int(probe_span_s(workload, DeploymentConfig().slo) * rate))
    run = run_simulation(
        replace(workload, rate=rate, seed=0, num_requests=n), DeploymentConfig(policy=policy)
    )
    step, cap = run.profile.token_step, run.profile.kv_capacity_tokens
    last_arrival = max(r.arrived_at for r in run.result.records)
    mbs = [i for i in run.result.iterations if i.stage == 0]
    steady = [k for k, i in enumerate(mbs) if 0.3 * last_arrival < i.started_at < last_arrival]
    over = sum(mbs[k].num_decode_reqs > step for k in steady) / len(steady)
    # the running set is spread over the D_p slots: D_p consecutive microbatches hold all of it
    pp = run.profile.pp
    windows = [mbs[k - pp + 1 : k + 1] for k in steady if k >= pp - 1]
    running = sum(sum(i.num_decode_reqs for i in w) for w in windows) / len(windows)
    kv = sum(sum(i.sum_dec_ctx + i.num_decode_reqs for i in w) for w in windows) / len(windows) / cap
    print(
        f"  {policy:<16} at {rate:.2f} req/s: microbatches with > {step} decodes {over:6.1%}, "
        f"max {max(mbs[k].num_decode_reqs for k in steady)}; running {running:.0f} requests, "
        f"their KV {kv:.0%} of {cap:,} tokens; parks {sum(r.num_parked for r in run.result.records)}",
        flush=True,
    )


def cnnr() -> None:
    wl = WorkloadConfig(name="cnn-reversed-synthetic")
    print("cnn-reversed-synthetic (65 in / 884 out), Qwen2.5-32B PP=4, A100-40GB PCIe")
    rates = {
        policy: goodput(wl, policy)
        for policy in ("predictive", "predictive+ds", "static:256", "static:256+ds")
    }
    print("what DS could act on, at the goodput rate of the policy with DS (seed 0):")
    for policy in ("predictive", "predictive+ds", "static:256", "static:256+ds"):
        tile_use(wl, policy, rates[policy.removesuffix("+ds") + "+ds"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", choices=("azure", "cnnr"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.only in (None, "azure"):
        azure()
    if args.only in (None, "cnnr"):
        cnnr()
    print(f"total wall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

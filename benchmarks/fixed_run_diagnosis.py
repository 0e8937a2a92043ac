"""How the predictive policy's TPOT rules act under the paper's fixed runs on azure-conv: the
same fixed runs (400 prompts per seed, seeds 0..2 pooled, Poisson at ``--rate``) for the static
chunk, the shipped predictive policy, and predictive with its KV rule's lift turned off or with
its TPOT rules relaxed.

    python benchmarks/fixed_run_diagnosis.py                 # Qwen2.5-32B, 7.0 req/s
    python benchmarks/fixed_run_diagnosis.py --rate 6.5 --model Qwen2.5-14B

Rows (PredictiveConfig fields; fastpp/policies/predictive.py explains each rule):

* ``static:N``: the best static chunk of docs/RESULTS.md section 8 (``--static``);
* ``predictive``: as shipped;
* ``predictive, no lift``: ``kv_lift_wait_ratio = 0`` (the KV rule's tighter budget holds
  however long the backlog has waited);
* ``predictive, KV rule off``: ``kv_bound_tpot_coeff = tpot_coeff`` (the round's TPOT budget
  is not tightened while the KV pool is projected to fill);
* ``predictive, KV rule off, tpot_coeff 1.15``: and the per-round budget 15% above the SLO;
* ``slack``: the slack policy as shipped.

With ``--steady`` each row also gets section 1's steady-state goodput on azure-conv (the
search of ``fastpp goodput``, to 0.25 req/s), which the relaxed rules cost.

Columns: P90 TTFT and TPOT of the pooled records (the fixed-run test: both within the SLO,
2 s / 200 ms), the share of requests meeting both, and the share of prefill microbatches whose
chunk was chosen under the KV rule (reason ``kv-bound``). The predictive policy bounds every
slot round's predicted time by the TPOT budget; the SLO bounds each request's mean token gap,
which a static chunk meets on average over rounds that are sometimes longer than the budget.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from fastpp.metrics import summarize
from fastpp.sim.engine import PipelineSimulation
from fastpp.sim.goodput import slo_goodput
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, open_simulation

SEEDS = (0, 1, 2)


def configure(sim: PipelineSimulation, overrides: dict) -> None:
    """Set ``overrides`` (PredictiveConfig fields) on the simulation's chunk policy."""
    if overrides:
        chunk = sim.scheduler.chunk_policy
        chunk.config = replace(chunk.config, **overrides)


def steady_goodput(model: str, policy: str, overrides: dict) -> float:
    """Section 1's steady-state goodput (azure-conv, to 0.25 req/s) with ``overrides``."""
    deployment = DeploymentConfig(model=model, policy=policy)
    found = slo_goodput(
        WorkloadConfig(name="azure-conv"),
        deployment,
        precision=0.25,
        on_open=lambda sim: configure(sim, overrides),
    )
    return found.rate


def measure(model: str, rate: float, n: int, policy: str, overrides: dict) -> dict:
    """Pooled summary and the kv-bound share of prefill microbatches over ``SEEDS``."""
    deployment = DeploymentConfig(model=model, policy=policy)
    records, kv_bound, prefill = [], 0, 0
    for seed in SEEDS:
        workload = WorkloadConfig(name="azure-conv", rate=rate, num_requests=n, seed=seed)
        sim = open_simulation(workload, deployment, record_token_times=False)
        configure(sim, overrides)
        result = sim.run()
        records += result.records
        for it in result.iterations:
            if it.stage == 0 and it.num_prefill_tokens > 0:
                prefill += 1
                kv_bound += "kv-bound" in it.reason
    s = summarize(records, slo=deployment.slo)
    s["kv_bound_share"] = kv_bound / prefill if prefill else 0.0
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="Qwen2.5-32B")
    ap.add_argument("--rate", type=float, default=7.0, help="req/s (default: static:512's fixed-run goodput)")
    ap.add_argument("-n", "--num-requests", type=int, default=400, help="prompts per seed (the azure preset)")
    ap.add_argument("--static", type=int, default=512, help="the static chunk to compare with")
    ap.add_argument(
        "--steady", action="store_true", help="also each row's steady-state goodput (azure-conv, 0.25 req/s)"
    )
    args = ap.parse_args()
    rows = (
        (f"static:{args.static}", f"static:{args.static}", {}),
        ("predictive", "predictive", {}),
        ("predictive, no lift", "predictive", {"kv_lift_wait_ratio": 0.0}),
        ("predictive, KV rule off", "predictive", {"kv_bound_tpot_coeff": 1.05}),
        (
            "predictive, KV rule off, tpot_coeff 1.15",
            "predictive",
            {"kv_bound_tpot_coeff": 1.15, "tpot_coeff": 1.15},
        ),
        ("slack", "slack", {}),
    )
    print(
        f"{args.model}, 4 x A100-40GB PCIe, PP=4; azure-conv, {args.num_requests} prompts per seed at "
        f"{args.rate:g} req/s, seeds {', '.join(map(str, SEEDS))} pooled\n"
    )
    columns = ["policy", "P90 TTFT (ms)", "P90 TPOT (ms)", "passes", "attainment"]
    columns += ["prefill microbatches with the pool filling"]
    columns += ["steady-state goodput (req/s)"] if args.steady else []
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for label, policy, overrides in rows:
        s = measure(args.model, args.rate, args.num_requests, policy, overrides)
        ok = s["p90_ttft_ms"] <= 2000 and s["p90_tpot_ms"] <= 200
        steady = f" {steady_goodput(args.model, policy, overrides):.3f} |" if args.steady else ""
        print(
            f"| {label} | {s['p90_ttft_ms']:.0f} | {s['p90_tpot_ms']:.1f} | {'yes' if ok else 'no'} | "
            f"{s['slo_attainment']:.1%} | {s['kv_bound_share']:.0%} |{steady}",
            flush=True,
        )


if __name__ == "__main__":
    main()

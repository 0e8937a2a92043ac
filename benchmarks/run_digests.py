"""Digests of eight seeded simulations: did a change to the simulator change any result?

    python benchmarks/run_digests.py                  # in one checkout, then in the other
    FASTPP_NATIVE=0 python benchmarks/run_digests.py  # the pure Python build

For each case (the three host loops, PP and TP, static, greedy, predictive and predictive+DS
policies, a time limit, stage noise) one line: a SHA-256 of the run's request records, stage
records, end time and notes as JSON, then the events the clock ran, the microbatches and the
CPU seconds. Two versions give the same results iff every digest matches; the event count and
the CPU time are what a speed change is expected to move (session 25 dropped the launch event:
half the events, the same digests; docs/GOODPUT.md).
"""

from __future__ import annotations

import hashlib
import json
import time

from fastpp.sim.run import DeploymentConfig, WorkloadConfig, open_simulation

# (workload, deployment fields, rate req/s, requests, open_simulation extras)
CASES: list[tuple[str, dict, float, int, dict]] = [
    ("azure-conv", dict(model="Qwen2.5-14B", pp=4, policy="static:512"), 6.0, 1500, {}),
    ("cnn-reversed-synthetic", dict(model="Qwen2.5-14B", pp=4, policy="predictive"), 2.0, 600, {}),
    ("sharegpt-synthetic", dict(model="Qwen2.5-14B", pp=4, policy="predictive+ds"), 30.0, 2500, {}),
    ("azure-conv", dict(pp=4, policy="greedy", host_loop="blocking-launch"), 3.0, 800, {}),
    ("azure-conv", dict(pp=4, policy="static:1024", host_loop="batch-queue"), 3.0, 800, {}),
    ("azure-conv", dict(pp=1, tp=4, policy="static:2048"), 2.0, 600, {}),
    ("azure-conv", dict(pp=4, policy="static:512"), 9.0, 1500, {"max_time_s": 60.0}),
    ("sharegpt-synthetic", dict(pp=4, policy="static:256"), 40.0, 1500, {"noise_cv": 0.1}),
]


def main() -> None:
    from fastpp import _native

    print(f"build: {_native.status()}")
    for workload, fields, rate, n, extra in CASES:
        deployment = DeploymentConfig(**fields)
        sim = open_simulation(
            WorkloadConfig(name=workload, rate=rate, num_requests=n, seed=3), deployment, **extra
        )
        cpu0 = time.process_time()
        result = sim.run()
        cpu = time.process_time() - cpu0
        doc = {
            "records": [r.to_dict() for r in result.records],
            "iterations": [it.to_dict() for it in result.iterations],
            "end_at": result.end_at,
            "notes": result.notes,
        }
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
        label = f"{workload} {deployment.model} {deployment.label}@{deployment.policy}"
        label += f" {deployment.host_loop}" + "".join(f" {k}={v}" for k, v in extra.items())
        print(
            f"{digest}  {label:75s} {result.events:7d} events {result.num_microbatches:7d} "
            f"microbatches {cpu:6.2f} s CPU"
        )


if __name__ == "__main__":
    main()

"""Decision cost of PredictiveChunkPolicy.choose: 1,000 waiting and 512 running requests at D_p=4.

    python benchmarks/policy_speed.py

Builds a real Scheduler for the default deployment (Qwen2.5-32B, 4 x A100-40GB PCIe, PP=4),
gets 512 requests decoding (128 per slot) and 1,000 waiting with Azure-conversation lengths,
then times choose() for each slot in turn, with a range of queue ages (some decisions find
stale requests, some do not). Target: median <= 100 us, p99 <= 1 ms (a GPU iteration is 10 ms
or more; the scheduler must stay under 1% of it). Also prints the static policy's cost in the
same process as a baseline for the machine's speed.
"""

from __future__ import annotations

import statistics
import time

from fastpp.policies import make_policies
from fastpp.scheduler import Scheduler
from fastpp.scheduler_config import SchedulerConfig
from fastpp.sim.analytic import analytic_profile
from fastpp.types import Request
from fastpp.workloads import make_requests


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def build(policy: str) -> tuple[Scheduler, Clock]:
    profile = analytic_profile("Qwen2.5-32B", "A100-40GB-PCIe", 4, 1)
    clock = Clock()
    cfg = SchedulerConfig(
        num_slots=4,
        kv_capacity_tokens=profile.kv_capacity_tokens,
        max_context=profile.model.max_context,
        default_chunk=8192,
        token_step=profile.token_step,
    )
    chunk, balancer = make_policies(policy, cfg, profile)
    warm = Scheduler(cfg, clock)  # static 8192: gets 512 requests decoding quickly
    for i in range(512):
        warm.add_request(Request(i, 0.0, 200, 4000))
    while sum(warm.view.num_running(s) for s in range(4)) < 512:
        for slot in range(4):
            plan = warm.schedule(slot)
            clock.t += 0.01
            if plan is not None:
                warm.update(plan)
    # 1,000 requests queued over the last 100 s (an overloaded server at 10 req/s): most are
    # stale, the newest few are fresh.
    start = clock.t
    clock.t += 100.0
    for req in make_requests("azure-conv", seed=1, rate=10.0, num_requests=1000):
        warm.add_request(
            Request(req.req_id + 512, start + min(req.arrived_at, 99.9), req.prompt_len, req.output_len)
        )
    warm.chunk_policy, warm.balancer = chunk, balancer
    return warm, clock


def measure(policy: str, calls: int = 4000) -> list[float]:
    sched, clock = build(policy)
    view = sched.view
    base = clock.t
    samples = []
    for i in range(calls):
        view.slot = i % 4  # what schedule() sets before it asks the policy
        clock.t = base + (i % 50) * 0.05  # the queue ages as the decisions go on
        view.now = clock.t
        t0 = time.perf_counter()
        sched.chunk_policy.choose(view)
        samples.append(time.perf_counter() - t0)
    return samples


def report(name: str, samples: list[float]) -> float:
    samples = sorted(samples)
    med = statistics.median(samples) * 1e6
    p99 = samples[int(0.99 * len(samples))] * 1e6
    print(f"{name:<12} median {med:7.1f} us   p99 {p99:7.1f} us   ({len(samples)} calls)")
    return med


def main() -> None:
    sched, _ = build("predictive")
    print(
        f"state: {sched.view.num_waiting} waiting, "
        f"{sum(sched.view.num_running(s) for s in range(4))} running over 4 slots"
    )
    base = report("static", measure("static:2048"))
    med = report("predictive", measure("predictive"))
    print(f"predictive / static: {med / base:.0f}x; target median <= 100 us, p99 <= 1000 us")
    pol = sched.chunk_policy
    pol.choose(sched.view)
    print(f"a decision in this state: {pol.last}")


if __name__ == "__main__":
    main()

"""Cost of one DelayScheduler.plan() call: 512 running decodes over D_p = 4 slots, some parked.

    python benchmarks/balancer_speed.py
    python benchmarks/balancer_speed.py --calls 50000 --requests 560

Builds a real Scheduler, admits ``--requests`` decodes (one prefill microbatch per slot), lets
the balancer park the excess over the tier (560 requests, tiles of 128: 512 run, 48 parked), then
times plan() for each slot in turn on that state without applying it. Prints the median and p99
in microseconds per mode. The target is a median of at most 100 us.
"""

from __future__ import annotations

import argparse
import time

from fastpp.policies.delay import DelayConfig, DelayScheduler
from fastpp.scheduler import Scheduler
from fastpp.scheduler_config import SchedulerConfig
from fastpp.types import Request

NUM_SLOTS = 4
ROUND_S = 0.02  # simulated time per microbatch while setting up (seconds)


class Clock:
    """A hand-advanced clock: the scheduler never reads the system clock."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def build(num_requests: int, balancer: DelayScheduler) -> tuple[Scheduler, Clock]:
    """A scheduler whose slots hold ``num_requests`` decodes in all, balanced by ``balancer``."""
    clock = Clock()
    cfg = SchedulerConfig(
        num_slots=NUM_SLOTS,
        kv_capacity_tokens=10_000_000,
        max_context=1 << 20,
        default_chunk=16_384,
        token_step=128,
    )
    sched = Scheduler(cfg, clock, balancer=balancer)
    per_slot = -(-num_requests // NUM_SLOTS)
    next_id = 0
    for slot in range(NUM_SLOTS):  # one prefill microbatch per slot admits its share
        for _ in range(min(per_slot, num_requests - next_id)):
            sched.add_request(Request(next_id, clock.t, 32, 100_000))
            next_id += 1
        plan = sched.schedule(slot)
        clock.t += ROUND_S
        assert plan is not None
        sched.update(plan)
    for _ in range(3 * NUM_SLOTS):  # decode rounds: the balancer parks the excess
        for slot in range(NUM_SLOTS):
            plan = sched.schedule(slot)
            clock.t += ROUND_S / NUM_SLOTS
            assert plan is not None
            sched.update(plan)
    return sched, clock


def time_plans(sched: Scheduler, clock: Clock, balancer: DelayScheduler, calls: int) -> list[float]:
    view = sched.view
    samples = []
    for i in range(calls):
        slot = i % NUM_SLOTS
        view.slot = slot  # what schedule() sets before it asks the balancer
        clock.t += 1e-7  # stays well within max_park_s: the state does not change
        view.now = clock.t
        t0 = time.perf_counter_ns()
        balancer.plan(view, slot)
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    return samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=560, help="decodes in all (running + parked)")
    ap.add_argument("--calls", type=int, default=20_000)
    args = ap.parse_args()
    for mode in ("auto", "tpot_first", "e2e_first"):
        balancer = DelayScheduler(DelayConfig(mode=mode))
        sched, clock = build(args.requests, balancer)
        # one more prefill completes in slot 1: it is one above its share and must park
        sched.add_request(Request(args.requests, clock.t, 32, 100_000))
        plan = sched.schedule(1)
        clock.t += ROUND_S
        assert plan is not None
        sched.update(plan)
        running = [sched.view.num_running(s) for s in range(NUM_SLOTS)]
        samples = time_plans(sched, clock, balancer, args.calls)
        parking = sorted(samples[1::NUM_SLOTS])
        samples.sort()
        print(
            f"{mode:10s}: running {running}, parked {sched.view.num_parked}, "
            f"{len(sched.view.recent_token_gap)} gap samples"
        )
        print(
            f"{'':10s}  all slots  : median {_pct(samples, 0.5):6.1f} us, "
            f"p99 {_pct(samples, 0.99):6.1f} us over {len(samples)} calls"
        )
        print(
            f"{'':10s}  parking one: median {_pct(parking, 0.5):6.1f} us, "
            f"p99 {_pct(parking, 0.99):6.1f} us  "
            f"(target median <= 100 us: {'met' if _pct(samples, 0.5) <= 100 else 'NOT met'})"
        )


def _pct(sorted_samples: list[float], q: float) -> float:
    return sorted_samples[int(q * (len(sorted_samples) - 1))]


if __name__ == "__main__":
    main()

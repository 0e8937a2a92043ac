"""Property tests: over random workloads, parameters and interleavings, the scheduler keeps its
invariants and its contract with executors. A hand-rolled driver launches into free slots,
returns microbatches in launch order (a pipeline is FIFO), admits arrivals and aborts requests at
random points, and keeps an executor's own KV table from the plans alone (fastpp.plan)."""

from __future__ import annotations

import random
from collections import deque

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FakeClock, make_profile, make_scheduler
from fastpp.plan import BalancePlan
from fastpp.scheduler_config import ADMISSION_RESERVES, RETRACTIONS
from fastpp.sim.engine import PipelineSimulation
from fastpp.types import SLO, FinishReason, Request


class RandomChunks:
    """A chunk policy that picks a random candidate each time (deterministic per seed)."""

    def __init__(self, seed: int, candidates: list[int]) -> None:
        self.rng = random.Random(seed)
        self.candidates = candidates
        self.last_reason = "random"

    def choose(self, view) -> int:
        return self.rng.choice(self.candidates)

    def observe(self, rec) -> None:
        pass


class RandomBalancer:
    """Parks and restores random requests, only ever touching the launching slot."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def plan(self, view, slot) -> BalancePlan:
        running = [r.req_id for r in view.iter_running(slot)]
        parked = [r.req_id for r in view.iter_parked()]
        park = tuple(rid for rid in running if self.rng.random() < 0.2)
        restore = tuple(rid for rid in parked if self.rng.random() < 0.5)
        return BalancePlan(park, restore)

    def observe(self, rec) -> None:
        pass


def check_state(sched, executor_kv: dict[int, int]) -> None:
    """The scheduler's internal invariants (white box), and that an executor which only applied
    the plans' kv_frees / kv_reservations holds exactly what the scheduler reserved."""
    kv, live, queue, slots = sched._kv.pool, sched._live, sched._queue, sched._slots
    assert 0 <= kv.used <= kv.capacity
    held = sum(r.kv_tokens for r in live.values())
    assert held == kv.used, (held, kv.used)
    seen: set[int] = set()
    places = [r.req_id for r in queue] + [r.req_id for s in slots.running for r in s]
    places += list(slots.parked)
    for rid in places:
        assert rid not in seen, f"request {rid} held twice"
        seen.add(rid)
    for slot, run in enumerate(slots.running):
        assert slots.ctx_sum[slot] == sum(r.ctx_len for r in run)
        assert all(r.slot == slot for r in run)
    assert abs(queue.arrival_sum - sum(r.arrived_at for r in queue)) < 1e-6
    pending = sum(r.remaining_prefill for r in queue)
    if queue.chunked is not None:
        pending += queue.chunked.remaining_prefill
    assert queue.prefill_tokens == pending
    assert sched._kv.output_backlog == sum(r.remaining_output for r in live.values() if r.kv_tokens)
    not_yet_freed = set(sched._kv._frees)
    shown = {rid: t for rid, t in executor_kv.items() if rid not in not_yet_freed}
    assert shown == {rid: r.kv_tokens for rid, r in live.items() if r.kv_tokens}


workloads = st.lists(
    st.tuples(st.floats(0, 0.5), st.integers(1, 700), st.integers(1, 40)), min_size=1, max_size=40
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=workloads,
    num_slots=st.integers(1, 4),
    kv=st.integers(300, 3000),
    page=st.sampled_from([1, 4, 16]),
    seed=st.integers(0, 10_000),
    balance=st.booleans(),
    late_last=st.booleans(),
    admission=st.sampled_from(ADMISSION_RESERVES),
    retraction=st.sampled_from(RETRACTIONS),
)
def test_random_interleavings_keep_invariants(
    reqs, num_slots, kv, page, seed, balance, late_last, admission, retraction
):
    rng = random.Random(seed)
    clock = FakeClock()
    candidates = [8, 32, 64, 128, 256]
    sched = make_scheduler(
        clock,
        RandomChunks(seed, candidates),
        RandomBalancer(seed) if balance else None,
        num_slots=num_slots,
        kv_capacity_tokens=kv,
        page_size=page,
        max_context=1024,
        admission_reserve=admission,
        retraction=retraction,
        # a TTFT SLO of a few steps: requests turn late, and wait their 10 x SLO, mid-run
        **({"queue_order": "late_last", "slo": SLO(0.002, 0.2)} if late_last else {}),
    )
    pending = deque(Request(i, t, p, o) for i, (t, p, o) in enumerate(reqs))
    in_flight: deque = deque()
    tokens_seen: dict[int, int] = {}
    records = {}
    ends: list[int] = []  # every end the scheduler reported, by whichever call
    executor_kv: dict[int, int] = {}
    steps = 0
    while pending or sched.has_work:
        steps += 1
        assert steps < 50_000, "no progress"
        clock.t += 0.001
        action = rng.random()
        live = sorted(r.req_id for r in records.values() if not r.is_finished)
        if pending and action < 0.3:
            rec = sched.add_request(pending.popleft())
            records[rec.req_id] = rec
            if rec.is_finished:
                ends.append(rec.req_id)
        elif action < 0.35 and live:
            end = sched.abort(rng.choice(live))
            if end is not None:
                ends.append(end.req_id)
        elif in_flight and (action < 0.65 or len(in_flight) == num_slots):
            plan = in_flight.popleft()
            out = sched.update(plan)
            ends += [e.req_id for e in out.finished]
            assert out.discarded_ids <= {e.req_id for e in out.finished if e.reason is FinishReason.ABORTED}
        else:
            free = [s for s in range(num_slots) if sched.is_slot_free(s)]
            if free:
                plan = sched.schedule(free[0])
                if plan is not None:
                    assert plan.num_tokens <= plan.chunk_budget
                    assert plan.num_tokens == len(plan.decode_req_ids) + sum(
                        c.num_tokens for c in plan.prefill
                    )
                    ids = list(plan.decode_req_ids) + [c.req_id for c in plan.prefill]
                    assert len(ids) == len(set(ids)), "a request twice in one microbatch"
                    assert set(plan.retracted_ids) <= set(plan.kv_frees)
                    for rid in plan.kv_frees:
                        assert executor_kv.pop(rid, None) is not None, f"free of {rid}, never reserved"
                    for rid, tokens in plan.kv_reservations(page):
                        executor_kv[rid] = max(executor_kv.get(rid, 0), tokens)
                    assert sum(executor_kv.values()) <= sched.stats().kv_capacity_tokens
                    in_flight.append(plan)
            elif not in_flight and not pending:
                raise AssertionError("work left but nothing schedulable or in flight")
        check_state(sched, executor_kv)
        for rid, rec in records.items():
            assert rec.num_generated == len(rec.token_times)
            assert rec.num_generated >= tokens_seen.get(rid, 0)
            tokens_seen[rid] = rec.num_generated
    assert sorted(ends) == sorted(records) == list(range(len(reqs))), "each end reported exactly once"
    assert sched.stats().kv_used_tokens == 0
    capacity = sched.stats().kv_capacity_tokens
    for rec in records.values():
        assert rec.finish_reason is not None
        if rec.finish_reason is FinishReason.LENGTH:
            assert rec.num_generated == min(
                rec.output_len, 1024 - rec.prompt_len, capacity - rec.prompt_len + 1
            )
        if rec.finish_reason is FinishReason.REJECTED:
            assert rec.detail
        times = rec.token_times
        assert all(a < b for a, b in zip(times, times[1:], strict=False)), "token generated twice"


@settings(max_examples=25, deadline=None)
@given(
    reqs=workloads,
    pp=st.integers(1, 4),
    depth=st.integers(0, 2),  # extra slots in flight (--pp-async-batch-depth)
    kv=st.integers(800, 4000),
    seed=st.integers(0, 99),
)
def test_simulation_ends_every_request_once(reqs, pp, depth, kv, seed):
    requests = [Request(i, t, p, o) for i, (t, p, o) in enumerate(reqs)]
    sched = make_scheduler(
        None,
        RandomChunks(seed, [16, 64, 256]),
        RandomBalancer(seed),
        num_slots=pp + depth,
        kv_capacity_tokens=kv,
        max_context=4096,
    )
    result = PipelineSimulation(make_profile(pp=pp, kv_tokens=kv), sched, requests).run()
    assert sorted(r.req_id for r in result.records) == list(range(len(requests)))
    for rec in result.records:
        assert rec.finish_reason in (FinishReason.LENGTH, FinishReason.REJECTED)
        if rec.finish_reason is FinishReason.LENGTH:
            assert rec.num_generated == rec.output_len == len(rec.token_times)
            assert rec.first_token_at is not None and rec.first_token_at > rec.arrived_at
    assert sched.stats().kv_used_tokens == 0
    per_stage: dict[int, list] = {}
    for it in result.iterations:
        assert it.num_tokens <= it.chunk_budget
        per_stage.setdefault(it.stage, []).append(it)
    for its in per_stage.values():  # a stage runs one microbatch at a time, in launch order
        assert [i.mb_id for i in its] == sorted(i.mb_id for i in its)
        assert all(a.finished_at <= b.started_at + 1e-12 for a, b in zip(its, its[1:], strict=False))

"""Scheduler behaviour, one rule per test: schedule(), fabricate the return, update(), assert."""

from __future__ import annotations

import logging

import pytest

from conftest import FakeClock, make_scheduler
from fastpp.plan import BalancePlan
from fastpp.types import FinishReason, Request


def run_round(sched, clock, slot=0, dt=0.01):
    plan = sched.schedule(slot)
    if plan is not None:
        clock.t += dt
        sched.update(plan)
    return plan


def test_long_prompt_chunks_go_out_in_consecutive_microbatches():
    clock = FakeClock()
    sched = make_scheduler(clock, num_slots=2, default_chunk=64)
    rec = sched.add_request(Request(0, 0.0, 150, 3))
    p0 = sched.schedule(0)
    p1 = sched.schedule(1)  # slot 1 continues the same prompt while slot 0 is in flight
    assert [(c.num_computed, c.num_tokens, c.completes) for c in p0.prefill] == [(0, 64, False)]
    assert [(c.num_computed, c.num_tokens, c.completes) for c in p1.prefill] == [(64, 64, False)]
    assert p0.sum_pre_sq == 64 * 64 and p1.sum_past_x_pre == 64 * 64
    clock.t = 1.0
    sched.update(p0)
    p2 = sched.schedule(0)
    assert [(c.num_computed, c.num_tokens, c.completes) for c in p2.prefill] == [(128, 22, True)]
    assert p2.num_sampled == 1
    sched.update(p1)
    clock.t = 2.0
    sched.update(p2)
    assert rec.first_token_at == 2.0 and rec.num_generated == 1
    assert [r.req_id for r in sched.view.iter_running(0)] == [0]  # decodes where its last chunk ran


def test_decodes_first_then_chunk_then_fcfs_within_budget():
    clock = FakeClock()
    sched = make_scheduler(clock, num_slots=1, default_chunk=32)
    for i in range(3):
        sched.add_request(Request(i, 0.0, 10, 5))
    plan = run_round(sched, clock)  # three prompts of 10 fit in 32
    assert [c.req_id for c in plan.prefill] == [0, 1, 2]
    sched.add_request(Request(3, 0.0, 40, 5))
    plan = sched.schedule(0)
    assert plan.decode_req_ids == (0, 1, 2)
    assert [(c.req_id, c.num_tokens) for c in plan.prefill] == [(3, 29)]
    assert plan.num_tokens == 32 == plan.chunk_budget
    assert plan.sum_dec_ctx == 3 * 11


def test_decode_count_above_budget_sits_out_in_rotation():
    clock = FakeClock()
    sched = make_scheduler(clock, num_slots=1, default_chunk=64)
    for i in range(6):
        sched.add_request(Request(i, 0.0, 4, 10))
    run_round(sched, clock)
    sched.chunk_policy.chunk = 4
    a = run_round(sched, clock)
    b = run_round(sched, clock)
    assert len(a.decode_req_ids) == 4 and len(b.decode_req_ids) == 4
    assert set(a.decode_req_ids) | set(b.decode_req_ids) == set(range(6))
    assert sched.stats().num_decode_sitouts == 4


def test_prompt_longer_than_context_is_rejected_with_reason():
    sched = make_scheduler(max_context=100)
    rec = sched.add_request(Request(0, 0.0, 100, 5))
    assert rec.finish_reason is FinishReason.REJECTED
    assert "context limit 100" in rec.detail
    assert not sched.has_work


def test_prompt_larger_than_kv_pool_is_rejected():
    sched = make_scheduler(kv_capacity_tokens=50, max_context=1000)
    rec = sched.add_request(Request(0, 0.0, 60, 5))
    assert rec.finish_reason is FinishReason.REJECTED and "KV pool" in rec.detail


def test_output_capped_at_context_finishes_with_length():
    clock = FakeClock()
    sched = make_scheduler(clock, num_slots=1, max_context=20, default_chunk=64)
    rec = sched.add_request(Request(0, 0.0, 15, 100))
    while sched.has_work:
        run_round(sched, clock)
    assert rec.finish_reason is FinishReason.LENGTH and rec.num_generated == 5
    assert rec.detail.startswith("output capped at 5 tokens")


def test_admission_waits_for_kv_and_keeps_fcfs_order():
    clock = FakeClock()
    sched = make_scheduler(clock, num_slots=1, kv_capacity_tokens=100, default_chunk=256, new_token_ratio=0.0)
    r0 = sched.add_request(Request(0, 0.0, 80, 3))
    sched.add_request(Request(1, 0.0, 50, 3))  # does not fit beside 0
    sched.add_request(Request(2, 0.0, 5, 3))  # would fit, but must not overtake 1
    plan = run_round(sched, clock)
    assert [c.req_id for c in plan.prefill] == [0]
    while r0.finish_reason is None:
        plan = run_round(sched, clock)
        assert all(c.req_id != 2 for c in plan.prefill)
    plan = run_round(sched, clock)
    assert [c.req_id for c in plan.prefill] == [1, 2]


def test_decode_growth_retracts_newest_and_recomputes_it():
    clock = FakeClock()
    sched = make_scheduler(clock, num_slots=1, kv_capacity_tokens=64, default_chunk=256, new_token_ratio=0.0)
    r0 = sched.add_request(Request(0, 0.0, 30, 20))
    r1 = sched.add_request(Request(1, 0.0, 30, 20))
    retracted, freed = [], []
    while sched.has_work:
        plan = run_round(sched, clock)
        retracted += plan.retracted_ids
        freed += plan.kv_frees
        stats = sched.stats()
        assert stats.kv_used_tokens <= stats.kv_capacity_tokens
    assert r1.num_retractions >= 1 and r0.num_retractions == 0
    assert retracted and set(retracted) == {1} and set(retracted) <= set(freed)
    assert sched.stats().num_retractions >= 1
    assert r0.num_generated == r1.num_generated == 20
    assert len(r1.token_times) == 20 and r1.token_times == sorted(set(r1.token_times))


def test_output_is_capped_so_a_retracted_request_always_fits_the_pool_again():
    # request 0 alone could grow past the 40-token pool; requeued, it could never be admitted
    # again and would block the queue: its output is capped at admission instead
    clock = FakeClock()
    sched = make_scheduler(clock, num_slots=1, kv_capacity_tokens=40, default_chunk=256, new_token_ratio=0.0)
    r0 = sched.add_request(Request(0, 0.0, 30, 50))
    r1 = sched.add_request(Request(1, 0.0, 5, 3))
    rounds = 0
    while sched.has_work and rounds < 200:
        run_round(sched, clock)
        rounds += 1
    assert not sched.has_work
    assert r0.finish_reason == FinishReason.LENGTH and r0.num_generated == 11  # 30 + 10 cached + 1
    assert "output capped at 11 tokens" in r0.detail and "KV pool of 40" in r0.detail
    assert r1.finish_reason == FinishReason.LENGTH and r1.num_generated == 3 and r1.detail == ""
    assert sched.stats().kv_used_tokens == 0


def test_abort_frees_kv_in_every_state():
    clock = FakeClock()
    sched = make_scheduler(clock, num_slots=2, default_chunk=16)
    sched.add_request(Request(0, 0.0, 8, 50))
    r1 = sched.add_request(Request(1, 0.0, 40, 5))
    sched.add_request(Request(2, 0.0, 8, 5))
    p0 = sched.schedule(0)  # 0 complete, 1 partly
    assert sched.abort(1) is None  # chunked and in flight: ends when its microbatch returns
    clock.t = 0.1
    out = sched.update(p0)
    assert [(e.req_id, e.reason) for e in out.finished] == [(1, FinishReason.ABORTED)]
    assert r1.finish_reason is FinishReason.ABORTED and 1 not in out.discarded_ids  # no token due
    end = sched.abort(0)  # running decode: ends now
    assert (end.req_id, end.reason, end.detail) == (0, FinishReason.ABORTED, "aborted by client")
    assert sched.abort(2, "gone").detail == "gone"  # waiting
    assert not sched.has_work and sched.stats().kv_used_tokens == 0
    assert sched.abort(2) is None  # already ended
    assert set(sched.drain_kv_frees()) == {0, 1}  # 2 never held KV


class ExplodingPolicy:
    last_reason = ""

    def choose(self, view):
        raise RuntimeError("boom")

    def observe(self, rec):
        raise RuntimeError("boom")


def test_a_failing_policy_is_logged_once_and_replaced_by_the_static_chunk(caplog):
    clock = FakeClock()
    sched = make_scheduler(clock, chunk_policy=ExplodingPolicy(), num_slots=1, default_chunk=32)
    sched.add_request(Request(0, 0.0, 100, 2))
    with caplog.at_level(logging.ERROR):
        plans = [run_round(sched, clock) for _ in range(3)]
    assert [p.chunk_budget for p in plans] == [32, 32, 32]
    assert plans[0].reason.startswith("fallback")
    assert sum("chunk policy raised" in r.message for r in caplog.records) == 1


class ParkAll:
    def plan(self, view, slot):
        return BalancePlan(park_ids=tuple(r.req_id for r in view.iter_running(slot)))

    def observe(self, rec):
        pass


def test_parked_requests_keep_kv_and_are_restored_when_the_pipeline_would_idle():
    clock = FakeClock()
    sched = make_scheduler(clock, balancer=ParkAll(), num_slots=1, default_chunk=64)
    rec = sched.add_request(Request(0, 0.0, 10, 4))
    run_round(sched, clock)
    used = sched.stats().kv_used_tokens
    plan = run_round(sched, clock)  # parked, then restored: nothing else could run
    assert plan.decode_req_ids == (0,)
    assert sched.stats().kv_used_tokens >= used
    assert rec.num_parked >= 1


def test_bad_balancer_plan_is_contained():
    class Bad:
        def plan(self, view, slot):
            return BalancePlan(park_ids=(999,))

        def observe(self, rec):
            pass

    clock = FakeClock()
    sched = make_scheduler(clock, balancer=Bad(), num_slots=1)
    rec = sched.add_request(Request(0, 0.0, 10, 3))
    while sched.has_work:
        run_round(sched, clock)
    assert rec.finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize(
    "field,value",
    [
        ("num_slots", 0),
        ("kv_capacity_tokens", 0),
        ("page_size", 0),
        ("new_token_ratio", 2.0),
        ("chunk_candidates", (256, 128)),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        make_scheduler(**{field: value})


def test_forget_drops_only_ended_records():
    clock = FakeClock()
    sched = make_scheduler(clock, num_slots=1)
    sched.add_request(Request(0, 0.0, 10, 2))
    with pytest.raises(ValueError, match="has not ended"):
        sched.forget(0)
    while sched.has_work:
        run_round(sched, clock)
    rec = sched.forget(0)
    assert rec.num_generated == 2
    with pytest.raises(ValueError, match="unknown"):
        sched.forget(0)


def test_plans_carry_the_kv_an_executor_must_reserve_and_free():
    clock = FakeClock()
    sched = make_scheduler(clock, num_slots=1, default_chunk=64, page_size=4, kv_capacity_tokens=256)
    sched.add_request(Request(0, 0.0, 10, 3))
    sched.add_request(Request(1, 0.0, 6, 1))
    p = sched.schedule(0)
    assert p.kv_allocs == ((0, 12), (1, 8)) and p.kv_frees == ()  # whole prompts, page-rounded
    clock.t = 1.0
    out = sched.update(p)
    assert [(e.req_id, e.reason) for e in out.finished] == [(1, FinishReason.LENGTH)]
    p = sched.schedule(0)  # 0 decodes; 1's KV was released on its return
    assert p.kv_frees == (1,) and p.kv_allocs == () and p.decode_ctx == (11,)
    assert p.kv_reservations(4) == [(0, 12)]
    assert p.sample_req_ids == (0,)


def test_every_end_is_reported_once_by_the_call_that_caused_it():
    clock = FakeClock()
    sched = make_scheduler(clock, num_slots=2, default_chunk=24, max_context=64, kv_capacity_tokens=120)
    reported: list[int] = []
    records = []
    for i in range(12):
        rec = sched.add_request(Request(i, 0.0, 4 + 7 * i, 5 + i))
        records.append(rec)
        if rec.is_finished:  # rejected at once (prompt beyond the context)
            reported.append(i)
    in_flight = {}
    step = 0
    while sched.has_work:
        step += 1
        for slot in range(2):
            if slot not in in_flight and (plan := sched.schedule(slot)) is not None:
                in_flight[slot] = plan
        if step == 3:
            reported += [e.req_id for rid in (5, 6) if (e := sched.abort(rid)) is not None]
        slot = min(in_flight, key=lambda s: in_flight[s].mb_id)
        clock.t += 0.01
        reported += [e.req_id for e in sched.update(in_flight.pop(slot)).finished]
    assert sorted(reported) == list(range(12))
    assert all(r.is_finished for r in records)

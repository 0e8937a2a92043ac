"""DelayScheduler: the rules on a hand-built view, then invariants over random runs of a real
Scheduler. Small tiles (base_unit 2-4) make the tiers trigger with a handful of requests."""

from __future__ import annotations

import random
from collections import Counter, deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FakeClock, make_scheduler
from fastpp.live_request import LiveRequest
from fastpp.plan import BalancePlan
from fastpp.policies.delay import BalanceMode, DelayConfig, DelayScheduler, Victims
from fastpp.types import SLO, FinishReason, Request, RequestRecord

DEFAULT_SLO = SLO(2.0, 0.2)


class FakeView:
    """The part of SchedulerView a balancer reads, with state a test sets directly."""

    def __init__(
        self,
        running,
        parked_ages=(),
        num_slots=None,
        now=10.0,
        token_step=0,
        waiting_tokens=0,
        kv_free=0.5,
        slo=DEFAULT_SLO,
    ) -> None:
        self.now = now
        self.num_slots = num_slots or len(running)
        self.slot = 0
        self.slo = slo
        self.token_step = token_step
        self.kv_total_tokens = 1000
        self.kv_free_tokens = int(kv_free * 1000)
        self.waiting_prefill_tokens = waiting_tokens
        self.recent_token_gap: deque[tuple[float, float]] = deque(maxlen=64)
        self.running: list[list[LiveRequest]] = []
        seq = 0
        for slot, n in enumerate(running):
            self.running.append([_live(seq + i, slot) for i in range(n)])
            seq += n
        self.parked: list[LiveRequest] = []
        for i, age in enumerate(sorted(parked_ages, reverse=True)):  # longest parked first
            r = _live(1000 + i, -1)
            r.parked_at = now - age
            self.parked.append(r)

    def num_running(self, slot):
        return len(self.running[slot])

    def iter_running(self, slot):
        return iter(self.running[slot])

    @property
    def num_parked(self):
        return len(self.parked)

    def iter_parked(self):
        return iter(self.parked)

    def ids(self, slot):
        return [r.req_id for r in self.running[slot]]

    def apply(self, plan: BalancePlan, slot: int) -> None:
        """What Scheduler._apply_balance does with a plan."""
        park = set(plan.park_ids)
        moved = [r for r in self.running[slot] if r.req_id in park]
        self.running[slot] = [r for r in self.running[slot] if r.req_id not in park]
        back = [r for r in self.parked if r.req_id in set(plan.restore_ids)]
        self.parked = [r for r in self.parked if r.req_id not in set(plan.restore_ids)]
        for r in moved:
            r.parked_at = self.now
        self.parked += moved
        for r in back:
            r.parked_at = None
        self.running[slot] += back


def _live(rid: int, slot: int) -> LiveRequest:
    return LiveRequest(
        RequestRecord(rid, 0.0, 16, 100),
        target_len=100,
        fill_len=16,
        num_computed=16,
        slot=slot,
        admit_seq=rid,
    )


def delay(**kw) -> DelayScheduler:
    return DelayScheduler(DelayConfig(**kw))


# ---------------------------------------------------------------------------- the rules
def test_band_parks_the_excess_over_the_tier_share():
    view = FakeView([6, 4])  # unit 4, D_p 2: tier 8, n_total 10 < 8 + 0.4 * 8
    plan = delay(base_unit=4, mode="e2e_first").plan(view, 0)
    assert plan.park_ids == (4, 5) and plan.restore_ids == ()
    assert plan.reason.startswith("band 4..4")


def test_balanced_slots_get_no_plan():
    assert delay(base_unit=4).plan(FakeView([4, 4], parked_ages=[0.01]), 0).is_noop
    assert delay(base_unit=4).plan(FakeView([0, 0]), 0).is_noop


def test_band_restores_the_longest_parked_into_a_short_slot():
    view = FakeView([3, 4], parked_ages=[0.01, 0.05])  # n_total 9: band, share 4
    plan = delay(base_unit=4).plan(view, 0)
    assert plan.restore_ids == (1000,) and plan.park_ids == ()
    assert view.parked[0].parked_at == view.now - 0.05


def test_above_the_band_moves_toward_the_mean():
    view = FakeView([2, 10], parked_ages=[0.01, 0.02])  # n_total 14 >= 8 + 3.2: mean 7
    bal = delay(base_unit=4, mode="e2e_first")
    plan = bal.plan(view, 0)
    assert plan.restore_ids == (1000, 1001) and plan.park_ids == ()
    plan = bal.plan(view, 1)  # 10 > share 4 + unit 4: park down to 8
    assert plan.park_ids == (10, 11) and plan.reason.startswith("mean 7..8")


def test_below_the_first_tier_a_slot_holds_at_most_one_unit_and_slots_even_out():
    view = FakeView([4, 0, 1])  # unit 2, D_p 3: tier 6 > n_total 5, so th = 0
    bal = delay(base_unit=2)
    plan = bal.plan(view, 0)
    assert len(plan.park_ids) == 2 and plan.reason.startswith("mean 1..2")
    for launch in range(6):
        slot = launch % 3
        view.apply(bal.plan(view, slot), slot)
    counts = [view.num_running(s) for s in range(3)]
    assert sum(counts) + view.num_parked == 5
    assert max(counts) <= 2 and min(counts) >= 5 // 3


def test_prefill_pressure_skips_the_band_and_never_parks():
    bal = delay(base_unit=4)
    pressed = FakeView([6, 4], waiting_tokens=2000, kv_free=0.5)
    assert bal.plan(pressed, 0).is_noop
    full = FakeView([6, 4], waiting_tokens=2000, kv_free=0.05)  # no KV to admit: no pressure
    assert len(bal.plan(full, 0).park_ids) == 2
    few = FakeView([6, 4], waiting_tokens=1024, kv_free=0.5)  # at the threshold: no pressure
    assert len(bal.plan(few, 0).park_ids) == 2


def test_base_unit_defaults_to_the_token_step_then_128():
    assert delay().plan(FakeView([6, 4], token_step=4), 0).park_ids == (4, 5)
    assert delay().plan(FakeView([130, 128]), 0).park_ids == (128, 129)
    assert delay().plan(FakeView([6, 4]), 0).is_noop  # 10 requests are below a tier of 128


@pytest.mark.parametrize(
    "mode,tpot_victims,expected",
    [
        ("tpot_first", "oldest", [0, 1]),  # PAPER.md: short TPOT slack defers the oldest
        ("e2e_first", "oldest", [4, 5]),
        ("tpot_first", "newest", [4, 5]),  # the reference code's mapping
        ("e2e_first", "newest", [0, 1]),
    ],
)
def test_victims_per_mode(mode, tpot_victims, expected):
    bal = delay(base_unit=4, mode=mode, tpot_first_victims=tpot_victims)
    assert sorted(bal.plan(FakeView([6, 4]), 0).park_ids) == expected
    assert bal.last_mode == mode


@pytest.mark.parametrize(
    "gaps,expected_mode",
    [
        ([(9.0, 0.19), (9.5, 0.18)], BalanceMode.TPOT_FIRST),  # mean 0.185 >= 0.9 * 0.2
        ([(9.0, 0.19), (9.5, 0.10)], BalanceMode.E2E_FIRST),
        ([(1.0, 0.50), (9.5, 0.10)], BalanceMode.E2E_FIRST),  # the slow sample left the 5 s window
        ([], BalanceMode.E2E_FIRST),  # no signal yet counts as ample slack
    ],
)
def test_auto_mode_switches_on_the_windowed_tpot_signal(gaps, expected_mode):
    view = FakeView([6, 4])
    view.recent_token_gap.extend(gaps)
    bal = delay(base_unit=4)
    plan = bal.plan(view, 0)
    assert bal.last_mode is expected_mode
    assert sorted(plan.park_ids) == ([0, 1] if expected_mode is BalanceMode.TPOT_FIRST else [4, 5])


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(
        st.tuples(st.lists(st.floats(0.0, 1.0), max_size=10), st.floats(0.0, 3.0)), min_size=1, max_size=15
    )
)
def test_tpot_signal_equals_the_mean_of_samples_in_the_window(batches):
    view = FakeView([1])
    bal = delay(signal_window_s=2.0)
    t = 0.0
    for values, advance in batches:
        for v in values:
            t += 0.1
            view.recent_token_gap.append((t, v))
        view.now = t = t + advance  # the clock never goes back
        inside = [g for at, g in view.recent_token_gap if at >= view.now - 2.0]
        got = bal.tpot_signal(view)
        if not inside:
            assert got is None
        else:
            assert got == pytest.approx(sum(inside) / len(inside), abs=1e-9)


def test_a_request_past_max_park_is_restored_first_and_the_slot_keeps_its_share():
    view = FakeView([4, 4], parked_ages=[0.25, 0.05], slo=SLO(2.0, 0.2))  # bound 0.2 s
    bal = delay(base_unit=4, mode="tpot_first")
    plan = bal.plan(view, 0)
    assert plan.restore_ids == (1000,)  # the expired one only
    assert plan.park_ids == (0,)  # swapped for one of the slot's own: it stays at 4
    assert "1 past max_park" in plan.reason and bal.num_forced_restores == 1


def test_max_park_is_relative_to_the_slo_unless_set():
    view = FakeView([4, 4], parked_ages=[0.15], slo=SLO(2.0, 0.1))
    assert delay(base_unit=4).plan(view, 0).restore_ids == (1000,)
    assert delay(base_unit=4, max_park_slo_ratio=2.0).plan(view, 0).is_noop
    assert delay(base_unit=4, max_park_s=0.2).plan(view, 0).is_noop


@pytest.mark.parametrize(
    "field,value",
    [
        ("base_unit", -1),
        ("load_alpha", 1.5),
        ("waiting_tok_threshold", -1),
        ("kv_free_threshold", 2.0),
        ("mode", "fastest"),
        ("tpot_first_victims", "middle"),
        ("tpot_mode_ratio", 0.0),
        ("signal_window_s", 0.0),
        ("max_park_slo_ratio", -1.0),
        ("max_park_s", 0.0),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        DelayConfig(**{field: value})


def test_config_accepts_mode_names_as_strings():
    cfg = DelayConfig(mode="e2e_first", tpot_first_victims="newest")
    assert cfg.mode is BalanceMode.E2E_FIRST and cfg.tpot_first_victims is Victims.NEWEST


# ---------------------------------------------------------------------------- invariants
def expected_count(running, n_total, num_parked, num_slots, unit, alpha, pressure):
    """The slot's decode count after a decision without expired parks, from the rules."""
    tier = unit * num_slots
    th = n_total // tier * tier
    if th > 0 and n_total < th + alpha * tier and not pressure:
        desired = th // num_slots
        return desired if running > desired else running + min(desired - running, num_parked)
    desired = n_total // num_slots
    if running < desired and num_parked:
        return running + min(desired - running, num_parked)
    if not pressure and running > th // num_slots + unit:
        return th // num_slots + unit
    return running


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(0, 14), min_size=1, max_size=4),
    ages=st.lists(st.floats(0.0, 0.4), max_size=8),
    unit=st.integers(1, 4),
    alpha=st.sampled_from([0.0, 0.4, 1.0]),
    pressure=st.booleans(),
    mode=st.sampled_from(list(BalanceMode)),
    data=st.data(),
)
def test_plans_stay_in_the_slot_and_follow_the_rules(counts, ages, unit, alpha, pressure, mode, data):
    view = FakeView(counts, parked_ages=ages, waiting_tokens=5000 if pressure else 0)
    view.recent_token_gap.append((view.now, data.draw(st.sampled_from([0.05, 0.3]))))
    slot = data.draw(st.integers(0, len(counts) - 1))
    bal = delay(base_unit=unit, load_alpha=alpha, mode=mode)
    running, parked = view.ids(slot), [r.req_id for r in view.parked]
    plan = bal.plan(view, slot)
    assert set(plan.park_ids) <= set(running) and len(set(plan.park_ids)) == len(plan.park_ids)
    assert list(plan.restore_ids) == parked[: len(plan.restore_ids)]  # longest parked first
    after = len(running) - len(plan.park_ids) + len(plan.restore_ids)
    expired = sum(r.parked_at <= view.now - 0.2 for r in view.parked)  # the SLO TPOT is 0.2 s
    assert len(plan.restore_ids) >= expired
    if len(running) + len(plan.restore_ids):
        assert after >= 1, "a rule emptied the slot"
    if not expired:
        n_total = sum(counts) + len(ages)
        assert after == expected_count(len(running), n_total, len(ages), len(counts), unit, alpha, pressure)
    if plan.park_ids:  # victims are one end of the list
        k = len(plan.park_ids)
        assert sorted(plan.park_ids) in (sorted(running[:k]), sorted(running[-k:]))


class Checked:
    """Wraps a DelayScheduler in a real Scheduler and checks every plan at call time."""

    def __init__(self, inner: DelayScheduler) -> None:
        self.inner = inner
        self.parks: Counter[int] = Counter()
        self.num_calls = 0

    def plan(self, view, slot):
        self.num_calls += 1
        assert slot == view.slot and not view.is_in_flight(slot)
        running = {r.req_id for r in view.iter_running(slot)}
        parked = {r.req_id: r.parked_at for r in view.iter_parked()}
        plan = self.inner.plan(view, slot)
        assert set(plan.park_ids) <= running, "parks a request of another slot"
        assert set(plan.restore_ids) <= set(parked), "restores a request that is not parked"
        bound = self.inner.max_park_s(view)
        for rid, at in parked.items():
            if rid not in plan.restore_ids:
                assert at > view.now - bound, f"request {rid} left parked past the bound"
        self.parks.update(plan.park_ids)
        return plan

    def observe(self, rec):
        self.inner.observe(rec)


def check_state(sched) -> None:
    """White box: the scheduler's own structures (a test may look inside)."""
    kv, slots = sched._kv.pool, sched._slots
    assert kv.used == sum(r.kv_tokens for r in sched._live.values()) <= kv.capacity
    places = [r.req_id for r in sched._queue] + [r.req_id for s in slots.running for r in s]
    places += list(slots.parked)
    assert len(places) == len(set(places)), "a request held twice"
    for r in slots.parked.values():
        assert r.slot == -1 and r.kv_tokens > 0 and not r.in_flight


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=st.lists(st.tuples(st.integers(1, 64), st.integers(2, 40)), min_size=4, max_size=40),
    num_slots=st.integers(1, 4),
    unit=st.integers(1, 4),
    seed=st.integers(0, 10_000),
    mode=st.sampled_from(list(BalanceMode)),
    victims=st.sampled_from(list(Victims)),
    max_park=st.sampled_from([0.003, 0.01, 0.05]),
    waiting_tok=st.sampled_from([0, 1024]),
)
def test_a_real_scheduler_loses_nothing_and_parks_within_the_bound(
    reqs, num_slots, unit, seed, mode, victims, max_park, waiting_tok
):
    rng = random.Random(seed)
    clock = FakeClock()
    inner = DelayScheduler(
        DelayConfig(
            base_unit=unit,
            mode=mode,
            tpot_first_victims=victims,
            max_park_s=max_park,
            waiting_tok_threshold=waiting_tok,
        )
    )
    checked = Checked(inner)
    sched = make_scheduler(
        clock,
        balancer=checked,
        num_slots=num_slots,
        kv_capacity_tokens=4096,
        default_chunk=256,
        slo=SLO(2.0, 0.01),
    )
    pending = deque(Request(i, 0.0, p, o) for i, (p, o) in enumerate(reqs))
    in_flight: deque = deque()
    records = {}
    steps = 0
    while pending or sched.has_work:
        steps += 1
        assert steps < 20_000, "no progress"
        clock.t += 0.001
        action = rng.random()
        if pending and action < 0.3:
            r = pending.popleft()
            records[r.req_id] = sched.add_request(Request(r.req_id, clock.t, r.prompt_len, r.output_len))
        elif in_flight and (action < 0.6 or len(in_flight) == num_slots):
            sched.update(in_flight.popleft())
        else:
            plan = None
            for slot in (s for s in range(num_slots) if sched.is_slot_free(s)):
                plan = sched.schedule(slot)
                if plan is not None:
                    in_flight.append(plan)
                    break
            if plan is None and not in_flight and not pending:
                raise AssertionError("work left but nothing schedulable or in flight")
        check_state(sched)
    assert not sched.policies.errors, sched.policies.errors  # every plan was valid and applied
    assert sched.stats().kv_used_tokens == 0 and sched.stats().num_parked == 0
    assert sorted(records) == list(range(len(reqs)))
    for rid, rec in records.items():
        assert rec.finish_reason is FinishReason.LENGTH
        assert rec.num_generated == rec.output_len == len(rec.token_times)
        assert all(a < b for a, b in zip(rec.token_times, rec.token_times[1:], strict=False))
        assert rec.num_parked == checked.parks[rid]
    assert inner.num_parks == sum(checked.parks.values())


def test_a_busy_run_parks_and_the_bound_rotates_the_parked():
    """Deterministic run: 9 decodes over 2 slots with tiers of 2 per slot keep 1 parked (band)."""
    clock = FakeClock()
    inner = delay(base_unit=2, max_park_s=0.02, mode="tpot_first")
    checked = Checked(inner)
    sched = make_scheduler(clock, balancer=checked, num_slots=2, default_chunk=256)
    records = [sched.add_request(Request(i, 0.0, 8, 60)) for i in range(9)]
    in_flight: deque = deque()
    while sched.has_work:
        clock.t += 0.005
        free = [s for s in range(2) if sched.is_slot_free(s)]
        plan = sched.schedule(free[0]) if free else None
        if plan is not None:
            in_flight.append(plan)
        elif in_flight:
            sched.update(in_flight.popleft())
        check_state(sched)
    assert inner.num_parks > 0 and inner.num_forced_restores > 0
    parked_reqs = [rec for rec in records if rec.num_parked]
    assert len(parked_reqs) > 1, "the bound should rotate deferral across requests"
    assert all(rec.finish_reason is FinishReason.LENGTH for rec in records)

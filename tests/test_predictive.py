"""PredictiveChunkPolicy: candidate packing features, decision rules, invariants, learning."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FakeClock, make_profile, make_scheduler
from fastpp.policies.predictive import PredictiveChunkPolicy, PredictiveConfig, _Stream
from fastpp.policies.rules import gaps_cv, index_above
from fastpp.policies.slack import SlackConfig, SlackPolicy
from fastpp.sim.engine import PipelineSimulation
from fastpp.types import SLO, FinishReason, IterationRecord, Request

CANDS = (16, 32, 64, 128, 256, 512)


def brute_features(items, a, b):
    """Expand the stream token by token: (request index, position within the request)."""
    tokens = [(i, off + k) for i, (length, off) in enumerate(items) for k in range(length)]
    chunks: dict[int, list[int]] = {}
    pad = 0
    for p in range(a, b):
        if p < len(tokens):
            i, pos = tokens[p]
            chunks.setdefault(i, []).append(pos)
        else:
            pad += 1
    spp = sum(min(pos) * len(pos) for pos in chunks.values())
    sps = sum(len(pos) ** 2 for pos in chunks.values()) + pad * pad
    return spp, sps


@given(
    items=st.lists(st.tuples(st.integers(1, 50), st.integers(0, 30)), max_size=8),
    a=st.integers(0, 200),
    n=st.integers(0, 120),
)
def test_stream_features_match_token_by_token_packing(items, a, n):
    items = [(items[0][0], items[0][1])] + [(ln, 0) for ln, _ in items[1:]] if items else []
    stream = _Stream()
    for length, off in items:
        stream.add(length, off)
    assert stream.features(a, a + n) == brute_features(items, a, a + n)


def policy_for(pp=2, **cfg):
    return PredictiveChunkPolicy.from_profile(make_profile(pp=pp), PredictiveConfig(**cfg), CANDS)


def policy_of(kind, **cfg):
    """A predictive policy, or slack (which inherits its rules), with these PredictiveConfig knobs."""
    if kind == "slack":
        config = SlackConfig(predictive=PredictiveConfig(**cfg))
        return SlackPolicy.from_profile(make_profile(pp=2), config, CANDS)
    return policy_for(**cfg)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), pp=st.integers(1, 4), tpot_ms=st.sampled_from([1, 20, 200]))
def test_chunk_is_always_a_candidate_above_the_slot_decodes(seed, pp, tpot_ms):
    rng = random.Random(seed)
    clock = FakeClock()
    policy = policy_for(pp)
    sched = make_scheduler(
        clock,
        policy,
        num_slots=pp,
        kv_capacity_tokens=6000,
        chunk_candidates=CANDS,
        slo=SLO(0.5, tpot_ms / 1e3),
    )
    in_flight = []
    for i in range(120):
        sched.add_request(Request(i, clock.t, rng.randint(1, 300), rng.randint(1, 60)))
        clock.t += rng.random() * 0.01
        for slot in range(pp):
            if sched.is_slot_free(slot):
                n_dec = sched.view.num_running(slot)
                plan = sched.schedule(slot)
                if plan is not None and plan.reason == "tile-cap: leftover fill":
                    # the rest of the slot's last tile (128 tokens here), completing no prompt
                    assert plan.chunk_budget % 128 == 0 and n_dec < plan.chunk_budget < n_dec + 128
                    assert plan.prefill and all(r.remaining_prefill > 0 for r, _, _ in plan.prefill)
                elif plan is not None and plan.reason.startswith("tile-cap"):
                    assert plan.chunk_budget == n_dec and not plan.prefill  # decode only
                elif plan is not None:
                    assert plan.chunk_budget in CANDS
                    if n_dec < CANDS[-1]:
                        assert plan.chunk_budget > n_dec
                    in_flight.append(plan)
        if in_flight and rng.random() < 0.7:
            clock.t += 0.01
            sched.update(in_flight.pop(0))
    reasons = {
        "optimal",
        "best-effort",
        "infeasible",
        "kv-pressure",
        "idle",
        "guard",
        "tile-cap",
        "over-committed",
    }
    assert set(policy.reasons) <= reasons


def loaded_scheduler(policy, slo=None, n_waiting=40, prompt=200):
    slo = slo or SLO(2.0, 0.2)
    clock = FakeClock()
    sched = make_scheduler(
        clock, policy, num_slots=2, kv_capacity_tokens=100_000, chunk_candidates=CANDS, slo=slo
    )
    for i in range(n_waiting):
        sched.add_request(Request(i, 0.0, prompt, 50))
    return sched, clock


def test_low_load_gets_the_smallest_chunk_that_keeps_up():
    # without the tile floor (any time per token counts as efficient): the smallest candidate
    policy = policy_for(tile_tolerance=1e9)
    sched, clock = loaded_scheduler(policy, n_waiting=1, prompt=20)
    clock.t = 0.01
    sched.view.now = clock.t
    assert policy.choose(sched.view) == CANDS[0]
    assert policy.last.reason == "optimal"


def test_no_chunk_below_the_efficient_tile_while_the_queue_is_deep():
    policy = policy_for()
    predict = policy.predictor.predict_one
    per_token = {c: predict(c, 0, 0, 0) / c for c in CANDS}
    tile = CANDS[policy.tile_index(CANDS)]
    # the floor is derived from the cost model: the smallest C within 1.25x of the largest's
    # time per token, and every smaller one is above that
    assert per_token[tile] <= 1.25 * per_token[CANDS[-1]]
    assert all(per_token[c] > 1.25 * per_token[CANDS[-1]] for c in CANDS if c < tile)
    assert CANDS[0] < tile < CANDS[-1]
    first = 0
    # a queue more than a round deep (more prompt tokens than the largest sub-tile candidate
    # carries in the next D_p microbatches) starts the scan at the tile ...
    below = CANDS[policy.tile_index(CANDS) - 1]
    sched, clock = loaded_scheduler(policy, n_waiting=1, prompt=2 * below + 1)
    assert policy.floor_index(sched.view, CANDS, first) == policy.tile_index(CANDS)
    clock.t = sched.view.now = 0.01
    assert policy.choose(sched.view) >= tile
    # ... a shallower one (a few short prompts) at the smallest candidate, as without a floor
    sched, clock = loaded_scheduler(policy, n_waiting=1, prompt=2 * below)
    assert policy.floor_index(sched.view, CANDS, first) == first
    clock.t = sched.view.now = 0.01
    assert policy.choose(sched.view) == CANDS[0] and policy.last.reason == "optimal"
    # the floor is a floor, not a cap: a late backlog still takes the largest TPOT-safe chunk
    sched, clock = loaded_scheduler(policy)
    clock.t = sched.view.now = 1.95
    assert policy.choose(sched.view) == CANDS[-1]
    # and when the tile itself breaks TPOT, a smaller TPOT-safe chunk is used (not "infeasible")
    tight = policy_for()
    budget = tight.config.tpot_coeff
    beat_tile = predict(tile, 0, 0, 0)
    slo_tpot = (2 * 0.9 * beat_tile + tight.config.round_overhead_s) / budget
    sched, clock = loaded_scheduler(tight, slo=SLO(2.0, slo_tpot))
    clock.t = sched.view.now = 1.95
    chunk = tight.choose(sched.view)
    assert chunk < tile and tight.last.reason == "best-effort"
    # with the A100 cost model the floor is 256 tokens for both paper models
    from fastpp.sim.run import DeploymentConfig

    for model in ("Qwen2.5-32B", "Qwen2.5-14B"):
        profile = DeploymentConfig(model=model).load_profile()
        real = PredictiveChunkPolicy.from_profile(profile)
        cands = tuple(range(128, 2049, 128))
        assert cands[real.tile_index(cands)] == 256


def test_late_backlog_takes_the_largest_tpot_safe_chunk():
    policy = policy_for()
    sched, clock = loaded_scheduler(policy)
    clock.t = sched.view.now = 1.95  # every request has waited almost the whole TTFT SLO
    chunk = policy.choose(sched.view)
    assert policy.last.reason == "best-effort" and policy.last.required_tok_s == float("inf")
    assert chunk == CANDS[-1]  # the toy deployment is fast: even 512 tokens meet 200 ms


def test_tpot_bound_caps_the_chunk_and_infeasible_slo_falls_back_to_the_smallest():
    tight = policy_for()
    sched, clock = loaded_scheduler(tight, slo=SLO(2.0, 0.012))
    clock.t = sched.view.now = 1.95
    capped = tight.choose(sched.view)
    assert tight.last.reason == "best-effort" and CANDS[0] < capped < CANDS[-1]
    # the record names what the chosen chunk delivers, and its beat fits the TPOT bound
    num_slots = sched.view.num_slots
    assert tight.last.capacity_tok_s > 0 and 0 < num_slots * tight.last.beat_s <= 0.012 * 1.05
    impossible = policy_for()
    sched, clock = loaded_scheduler(impossible, slo=SLO(2.0, 0.0001))
    clock.t = sched.view.now = 1.95
    assert impossible.choose(sched.view) == CANDS[0]
    assert impossible.last.reason == "infeasible"


def test_kv_pressure_drains_with_the_smallest_chunk_above_every_slot():
    policy = policy_for()
    clock = FakeClock()
    sched = make_scheduler(
        clock,
        None,
        num_slots=2,
        kv_capacity_tokens=1000,
        chunk_candidates=CANDS,
        new_token_ratio=0.0,
        default_chunk=512,
    )
    for i in range(20):
        sched.add_request(Request(i, 0.0, 40, 200))
    while sched.view.kv_free_tokens >= policy.config.kv_free_watermark * sched.view.kv_total_tokens:
        for slot in range(2):
            plan = sched.schedule(slot)
            if plan is not None:
                clock.t += 0.01
                sched.update(plan)
    sched.chunk_policy = policy
    top = max(sched.view.num_running(s) for s in range(2))
    chunk = policy.choose(sched.view)
    assert policy.last.reason == "kv-pressure"
    assert chunk == min(c for c in CANDS if c > top)


def test_observe_learns_once_per_microbatch_from_its_slowest_stage():
    policy = policy_for(pp=2)
    before = policy.predictor.n_updates_

    def rec(mb, stage, dur):
        return IterationRecord(mb, stage, 0, 0.0, dur, 100, 100, 0, 0, 10_000, 0, 128)

    policy.observe(rec(0, 0, 0.030))
    policy.observe(rec(0, 1, 0.010))
    assert policy.predictor.n_updates_ == before + 1
    x = policy.predictor.predict_one(100, 0, 10_000, 0)
    for mb in range(1, 200):
        policy.observe(rec(mb, 0, 0.030))
        policy.observe(rec(mb, 1, 0.010))
    assert abs(policy.predictor.predict_one(100, 0, 10_000, 0) - 0.030) < abs(x - 0.030)


def test_runs_in_the_simulator_and_every_request_completes():
    profile = make_profile(pp=4)
    policy = PredictiveChunkPolicy.from_profile(profile, candidates=CANDS)
    sched = make_scheduler(
        None, policy, num_slots=4, chunk_candidates=CANDS, kv_capacity_tokens=8192, slo=SLO(0.1, 0.02)
    )
    rng = random.Random(3)
    reqs = [Request(i, i * 0.002, rng.randint(1, 400), rng.randint(1, 40)) for i in range(400)]
    result = PipelineSimulation(profile, sched, reqs).run()
    assert all(r.finish_reason is FinishReason.LENGTH for r in result.records)
    assert len({it.chunk_budget for it in result.iterations}) > 1
    assert policy.predictor.n_updates_ > 0


def test_inflow_counts_a_replay_that_starts_at_time_zero():
    """A trace replay's first arrival is at t = 0.0: the inflow estimate must still divide the
    window's prompt tokens by the time since then (0.0 is a start, not a missing one)."""
    policy = policy_for()
    clock = FakeClock()
    sched = make_scheduler(
        clock, policy, num_slots=2, kv_capacity_tokens=100_000, chunk_candidates=CANDS, slo=SLO(2.0, 0.2)
    )
    for i in range(5):  # 100 prompt tokens every 0.5 s from t = 0
        clock.t = 0.5 * i
        sched.add_request(Request(i, clock.t, 100, 10))
    clock.t = sched.view.now = 2.5
    inflow = policy._inflow(sched.view, 2.5)
    assert inflow == 500 / 2.5  # five prompts of 100 tokens over the 2.5 s since t = 0
    # once the run is older than the window, the window divides
    clock.t = sched.view.now = 10.2
    assert policy._inflow(sched.view, 10.2) == 400 / policy.config.window_s  # t=0 left it


class _KVOnly:
    """The three view fields KVTrend reads."""

    def __init__(self, now, total, free):
        self.now, self.kv_total_tokens, self.kv_free_tokens = now, total, free


def test_kv_trend_measures_share_and_slope_over_its_window():
    from fastpp.policies.rules import KVTrend

    trend = KVTrend(window_s=5.0)
    trend.update(_KVOnly(0.0, 1000, 900))
    assert trend.share == 0.1 and trend.slope == 0.0  # one sample: no slope yet
    for t in range(1, 11):  # 2% of the pool per second
        trend.update(_KVOnly(float(t), 1000, 900 - 20 * t))
    assert abs(trend.share - 0.3) < 1e-12 and abs(trend.slope - 0.02) < 1e-12
    assert abs(trend.projected(10.0) - 0.5) < 1e-12
    assert trend.kv_bound(0.49, 10.0) and not trend.kv_bound(0.51, 10.0)
    trend.update(_KVOnly(11.0, 1000, 950))  # draining: projection never below the present
    assert trend.projected(10.0) == trend.share


def test_kv_aware_rule_switches_the_catch_up_tpot_budget():
    """A late backlog takes the largest TPOT-safe chunk; while the KV pool fills (projected
    share over kv_bound_share) the TPOT budget is kv_bound_tpot_coeff x SLO instead of
    tpot_coeff x SLO, so the catch-up chunk is smaller and the reason says kv-bound; unless the
    queue's head has waited kv_lift_wait_ratio x SLO TTFT while the pool is under
    kv_lift_max_share full (the lift), when the budget is tpot_coeff's again."""

    def late_choice(used_shares, slo, **cfg):
        policy = policy_for(**cfg)
        sched, clock = loaded_scheduler(policy, slo=slo)
        pool = sched._kv.pool
        for t, share in used_shares:  # fill the pool by hand, as admitted requests would
            pool.used = int(share * pool.capacity)
            clock.t = sched.view.now = t
            chunk = policy.choose(sched.view)
        return chunk, policy

    top, p0 = late_choice([(1.95, 0.0)], SLO(2.0, 0.2))  # loose: the largest candidate
    assert top == CANDS[-1]
    # an SLO TPOT at which the largest candidate's round takes exactly 1.0 x SLO: inside the
    # roomy budget (1.05 x SLO), outside the KV-bound one (0.8 x SLO)
    slo = SLO(2.0, 2 * p0.last.beat_s + p0.config.round_overhead_s)
    rising = [(1.0, 0.5), (1.95, 0.7)]  # 0.21/s: projected full within the horizon
    roomy, p1 = late_choice([(1.0, 0.5), (1.95, 0.5)], slo)  # half full, flat: room
    filling, p2 = late_choice(rising, slo, kv_lift_wait_ratio=0.0)  # no lift: bound
    lifted, p3 = late_choice(rising, slo)  # the head waited 1.95 s >= 0.4 x 2 s, pool 70% full
    full, p4 = late_choice([(1.0, 0.72), (1.95, 0.92)], slo)  # as late, but 92% >= 90% full
    assert roomy == lifted == CANDS[-1]
    assert p1.last.reason == p3.last.reason == "best-effort"
    assert p2.last.reason == p4.last.reason == "best-effort: kv-bound"
    assert filling < roomy and full < roomy
    for p, coeff in ((p1, p1.config.tpot_coeff), (p2, p2.config.kv_bound_tpot_coeff)):
        assert 2 * p.last.beat_s + p.config.round_overhead_s <= coeff * slo.tpot_s
    # a fresh backlog (the head waited 0.5 s < 0.8 s) is not lifted
    _, p5 = late_choice([(0.0, 0.5), (0.5, 0.7)], slo)
    assert "kv-bound" in p5.last.reason


def test_backlog_waits_reads_the_head_of_the_waiting_queue():
    from fastpp.policies.rules import backlog_waits

    policy = policy_for()
    sched, clock = loaded_scheduler(policy, n_waiting=2)
    sched.view.now = 0.79
    assert not backlog_waits(sched.view, 0.8)
    sched.view.now = 0.8
    assert backlog_waits(sched.view, 0.8)
    empty, _ = loaded_scheduler(policy, n_waiting=0)
    empty.view.now = 100.0
    assert not backlog_waits(empty.view, 0.8)


class _CapView:
    """The view fields ``rules.decode_tile_cap`` reads: D_p slots of equal decodes, a pool."""

    def __init__(self, decodes_per_slot, kv_total, kv_used, ctx=100, num_slots=4, parked=0):
        self.num_slots, self.token_step, self.num_parked, self.chunked = num_slots, 128, parked, None
        self._dec, self._ctx = decodes_per_slot, ctx
        self.kv_total_tokens, self.kv_free_tokens = kv_total, kv_total - kv_used

    def num_running(self, slot):
        return self._dec

    def sum_decode_ctx(self, slot):
        return self._dec * self._ctx


def _tiles(fixed):
    """A decode microbatch's time: ``fixed`` plus one unit per started 128-token tile."""
    return lambda n, ctx: fixed + -(-n // 128)


def test_tile_cap_stops_at_the_boundary_a_pool_cannot_fill_past():
    from fastpp.policies.rules import decode_tile_cap

    # 100 decodes per slot use 40% of the pool: it holds 250 per slot
    roomy = _CapView(100, kv_total=100_000, kv_used=40_000)
    # ... and 130 per slot when 100 use 77%: just past the 128 boundary
    tight = _CapView(100, kv_total=100_000, kv_used=77_000)
    # without a per-microbatch cost, a partial second tile never pays: both stop at 128
    assert decode_tile_cap(roomy, _tiles(0.0), 0.0) == 128
    assert decode_tile_cap(tight, _tiles(0.0), 0.0) == 128
    # with one (a launch costing a tile), 250 decodes on two tiles beat 128 on one; 130 do not
    assert decode_tile_cap(roomy, _tiles(1.0), 0.0) == 256
    assert decode_tile_cap(tight, _tiles(1.0), 0.0) == 128
    # a pool that holds fewer than a tile per slot (50) caps at the first boundary
    assert decode_tile_cap(_CapView(20, kv_total=100_000, kv_used=40_000), _tiles(1.0), 0.0) == 128
    # parked requests hold KV too: 240 running + 160 parked in 40% of the pool is 250 per slot
    # (counting the running ones alone, 150: past 128, too few to pay for the second tile)
    parked = _CapView(60, kv_total=100_000, kv_used=40_000, parked=160)
    assert decode_tile_cap(parked, _tiles(1.0), 0.0) == 256
    # nothing resident: nothing measured, no cap below the pool's size
    assert decode_tile_cap(_CapView(0, kv_total=100_000, kv_used=0), _tiles(1.0), 0.0) == 100_000


def test_the_tile_cap_holds_kv_bound_slots_at_the_boundary():
    """CNN-Reversed on Qwen2.5-32B above its goodput, admission "all" (a reserve for every
    admitted request's output): the pool holds about 125 decodes per slot. With the tile cap
    almost no microbatch carries more than 128 decodes (some launch decode only, the budget
    their decode count, or fill the rest of their last tile with part of a prompt); without it
    about a tenth do, each paying for a second tile. (The
    default "slot" admission admits more, and slots pass 128 more often, with the cap or
    without: 11% and 14% of microbatches here.)"""
    from dataclasses import replace

    from fastpp.sim.run import DeploymentConfig, WorkloadConfig, open_simulation

    over_128 = {}
    for cap in (True, False):
        wl = WorkloadConfig(name="cnn-reversed-synthetic", rate=6.0, num_requests=2500, seed=0)
        deployment = DeploymentConfig(model="Qwen2.5-32B", policy="predictive", admission_reserve="all")
        sim = open_simulation(wl, deployment)
        policy = sim.scheduler.chunk_policy
        policy.config = replace(policy.config, tile_cap=cap)
        sim.run()
        stage0 = [r for r in sim.driver.iterations if r.stage == 0]
        over_128[cap] = sum(r.num_decode_reqs > 128 for r in stage0) / len(stage0)
        capped = [r for r in stage0 if r.reason.startswith("tile-cap")]
        assert bool(capped) == cap
        for r in capped:  # decode only, or the rest of the last tile filled
            if r.reason == "tile-cap: leftover fill":
                assert r.chunk_budget % 128 == 0 and r.num_prefill_tokens < 128  # 0: KV full
                assert r.num_decode_reqs + r.num_prefill_tokens <= r.chunk_budget
            else:
                assert r.chunk_budget == r.num_decode_reqs and r.num_prefill_tokens == 0
    assert over_128[True] < over_128[False] / 2, over_128


class _LiftView(_CapView):
    """Two slots of equal decodes, each resident request holding 1,000 tokens of a pool sized
    for 130 per slot, and one prompt waiting since t = 0: what the KV lift reads."""

    def __init__(self, decodes_per_slot):
        per_slot, tokens = 130, 1000
        used = decodes_per_slot * 2 * tokens
        super().__init__(decodes_per_slot, kv_total=per_slot * 2 * tokens, kv_used=used, num_slots=2)
        self.now, self.slo = 10.0, SLO(2.0, 0.2)

    def iter_waiting(self):
        head = _Waiting(200)
        head.arrived_at = 0.0
        return iter([head])


def test_the_kv_lift_is_off_while_the_decodes_fill_the_slots():
    """The head has waited 10 s and the pool is under 90% full, so the lift applies; but not
    once the running decodes reach kv_lift_decode_share (0.9) x D_p x the tile cap (2 x 128
    here: a pool of 130 decodes per slot cannot pay for a second tile): the slots then admit
    only as fast as decodes finish."""
    policy = policy_for()
    lifted = {}
    for per_slot in (115, 116):  # 230 and 232 decodes, around 0.9 x 2 x 128 = 230.4
        view = _LiftView(per_slot)
        assert policy.slot_decode_cap(view) == 128
        policy.kv.update(view)
        assert policy.kv.share < policy.config.kv_lift_max_share
        lifted[per_slot] = policy.kv_lifted(view)
    assert lifted == {115: True, 116: False}
    # the same full slots, with the share set to 1.0: the check switches only at the cap itself
    full = PredictiveChunkPolicy.from_profile(
        make_profile(pp=2), PredictiveConfig(kv_lift_decode_share=1.0), CANDS
    )
    view = _LiftView(116)
    full.kv.update(view)
    assert full.kv_lifted(view)
    assert not full.decodes_fill_slots(_LiftView(127)) and full.decodes_fill_slots(_LiftView(128))


class _Waiting:
    def __init__(self, tokens):
        self.remaining_prefill, self.num_computed = tokens, 0


class _ScanView:
    """Two slots, decodes in slot 1 only, a deep queue: what ``_scan`` reads."""

    slot, num_slots, chunked = 0, 2, None

    def num_running(self, slot):
        return 100 * slot

    def sum_decode_ctx(self, slot):
        return 100 * slot * 1000

    def iter_waiting(self):
        return iter([_Waiting(200) for _ in range(40)])


def test_the_round_is_the_sum_of_its_microbatches_not_d_p_times_the_slowest():
    """A stage runs the D_p microbatches one after another: the round is the sum of their
    times. With unequal slots D_p x the slowest overstates it, and a chunk whose round fits the
    TPOT budget would be refused (``bottleneck_round=True``, PAPER.md 3.2's D_p x T_iter)."""
    view = _ScanView()
    probe = policy_for()
    predict = probe.predictor.predict_one
    k = CANDS.index(256)
    t = []
    stream = probe._stream(view, 2 * 256)
    for pos, slot in ((0, 0), (256, 1)):  # slot 0: 256 prompt tokens; slot 1: 100 decodes + 156
        dec = view.num_running(slot)
        spp, sps = stream.features(pos, pos + 256 - dec)
        t.append(predict(256, spp, sps, view.sum_decode_ctx(slot)))
    assert t[1] > t[0]
    budget = (sum(t) + 2 * max(t)) / 2  # between the sum and D_p x the slowest

    def never(capacity, round_s):
        return False

    chosen = {}
    for bottleneck in (False, True):
        policy = policy_for(bottleneck_round=bottleneck)
        chosen[bottleneck] = policy._scan(view, CANDS, 0, len(CANDS), never, budget)[0]
    assert chosen[False] == k and chosen[True] < k


def test_bad_config_values_are_refused_by_name():
    for bad in (
        {"kv_lift_wait_ratio": 1.0},
        {"kv_lift_wait_ratio": -0.1},
        {"kv_lift_max_share": 0.0},
        {"kv_lift_max_share": 1.5},
        {"kv_lift_decode_share": 0.0},
        {"kv_lift_decode_share": 1.1},
        {"kv_bound_share": 0.0},
        {"tile_tolerance": 0.5},
        {"kv_horizon_s": -1.0},
        {"over_committed_kv_share": 1.2},
        {"kv_ceiling_hold_s": -1.0},
        {"burst_gaps": 1},
        {"burst_gap_cv": 0.0},
        {"burst_kv_share": 1.5},
    ):
        (name,) = bad
        with pytest.raises(ValueError, match=name):
            PredictiveConfig(**bad)
    PredictiveConfig(kv_lift_wait_ratio=0.0, kv_lift_max_share=1.0)  # the lift off; a full pool


def test_the_lift_serves_a_finite_burst_sooner_within_the_tpot_slo():
    """One of the paper's fixed runs (400 Azure prompts at 7 req/s, Qwen2.5-32B, PP=4): the pool
    never passes 90%, so the lift keeps the whole TPOT budget for the backlog: fewer kv-bound
    decisions and a lower P90 TTFT than with the lift off, P90 TPOT still within the SLO."""
    from dataclasses import replace

    from fastpp.metrics import summarize
    from fastpp.sim.run import DeploymentConfig, WorkloadConfig, open_simulation

    dep = DeploymentConfig(model="Qwen2.5-32B", policy="predictive")
    out = {}
    for lift in (0.4, 0.0):
        workload = WorkloadConfig(name="azure-conv", rate=7.0, num_requests=400, seed=0)
        sim = open_simulation(workload, dep, record_token_times=False)
        policy = sim.scheduler.chunk_policy
        policy.config = replace(policy.config, kv_lift_wait_ratio=lift)
        res = sim.run()
        bound = sum("kv-bound" in it.reason for it in res.iterations if it.stage == 0)
        out[lift] = (summarize(res.records, slo=dep.slo), bound)
    (lifted, lifted_bound), (held, held_bound) = out[0.4], out[0.0]
    assert lifted_bound < held_bound
    assert lifted["p90_ttft_ms"] < 0.8 * held["p90_ttft_ms"]
    assert lifted["p90_tpot_ms"] <= 200


def test_extra_slots_in_flight_hide_the_round_trip_from_the_round():
    """With an async batch depth (D_p = stages + 1) stage 0 computes the other slots while one
    slot's tokens travel back, so the round overhead counts only beyond that: every TPOT budget
    admits a chunk at least as large as with D_p = stages, some a larger one."""

    class ThreeSlots(_ScanView):
        num_slots = 3

    def never(capacity, round_s):
        return False

    view = ThreeSlots()
    deep = policy_for(pp=2, round_overhead_s=0.05)  # 2 stages, 3 slots: one extra in flight
    flat = policy_for(pp=2, round_overhead_s=0.05)
    flat._num_stages = 3  # the same predictor, read as one slot per stage
    larger = 0
    for budget in (0.01 * i for i in range(1, 40)):
        d = deep._scan(view, CANDS, 0, len(CANDS), never, budget)
        f = flat._scan(view, CANDS, 0, len(CANDS), never, budget)
        assert d[0] >= f[0]
        if d[0] >= 0 and d[0] == f[0]:
            assert d[1] >= f[1]  # the same chunk: a shorter round, more capacity
        larger += d[0] > f[0]
    assert larger > 0


@pytest.mark.parametrize("kind", ["predictive", "slack"])
def test_after_a_retraction_prefill_takes_only_the_tile_leftover_until_the_pool_drains(kind):
    """Decode growth that outruns the pool retracts a request: admission over-committed it. From
    then on the chunk is the smallest candidate above the launching slot's decodes (a larger
    one would admit prompts the pool cannot grow, and retract them again), until no retracted
    request waits and less than over_committed_kv_share of the pool is used. The share 0 turns
    the rule off. Slack inherits the rule."""
    from test_admission_retraction import run_round

    def retracting(policy):
        clock = FakeClock()
        sched = make_scheduler(
            clock,
            policy,
            num_slots=2,
            kv_capacity_tokens=160,
            chunk_candidates=CANDS,
            token_step=16,
            new_token_ratio=0.0,
        )
        for i in range(4):
            sched.add_request(Request(i, 0.0, 30, 40))
        while not any(r.num_generated for r in sched.view.iter_waiting()):
            assert sched.has_work
            run_round(sched, clock)
        return sched, clock

    policy = policy_of(kind)
    sched, clock = retracting(policy)
    view = sched.view
    assert policy.choose(view) == CANDS[index_above(CANDS, view.num_running(view.slot))]
    assert policy.last.reason == "over-committed: tile leftover only"
    while sched.has_work:  # the retracted requests finish too
        run_round(sched, clock)
    sched.add_request(Request(9, clock.t, 30, 40))
    policy.choose(view)
    assert not policy.last.reason.startswith("over-committed")
    # the same retraction with the rule off
    off = policy_of(kind, over_committed_kv_share=0.0)
    sched_off, _ = retracting(off)
    off.choose(sched_off.view)
    assert not off.last.reason.startswith("over-committed")
    # a policy on a scheduler that never retracted never throttles
    fresh = policy_of(kind)
    sched_fresh, _ = loaded_scheduler(fresh)
    fresh.choose(sched_fresh.view)
    assert not fresh.last.reason.startswith("over-committed")


@pytest.mark.parametrize("kind", ["predictive", "slack"])
def test_after_kv_pressure_the_scan_stays_below_its_largest_recent_chunk(kind):
    """A KV-pressure decision after the scan chose candidate k caps the scan at k - 1: with the
    pool full, a larger chunk only lengthens the round and so every request's stay. The ceiling
    is dropped once less than kv_bound_share of the pool is used, and rises one candidate per
    kv_ceiling_hold_s; the hold 0 turns the rule off. Slack inherits it."""

    def choices(policy, steps):
        sched, clock = loaded_scheduler(policy, slo=SLO(2.0, 1.0))  # TPOT loose: 512 fits
        pool = sched._kv.pool
        out = []
        for t, share in steps:  # fill the pool by hand, as admitted requests would
            pool.used = int(share * pool.capacity)
            clock.t = sched.view.now = t
            out.append((policy.choose(sched.view), policy.last.reason))
        return out

    late = [(1.9, 0.5), (1.95, 0.99)]  # a late backlog takes 512, then the pool runs short
    (top, _), (_, pressure) = choices(policy_of(kind), late)[:2]
    assert top == CANDS[-1] and pressure == "kv-pressure"
    hold = PredictiveConfig().kv_ceiling_hold_s
    full = choices(policy_of(kind), [*late, (2.0, 0.85), (2.0 + hold / 2, 0.85), (1.95 + hold, 0.85)])
    assert [c for c, _ in full[2:]] == [CANDS[-2], CANDS[-2], CANDS[-1]]  # held, then raised
    assert not full[2][1].startswith(("kv-pressure", "over-committed", "infeasible"))
    drained = choices(policy_of(kind), [*late, (2.0, 0.6)])  # under kv_bound_share: the ceiling goes
    assert drained[2][0] == CANDS[-1]
    off = choices(policy_of(kind, kv_ceiling_hold_s=0.0), [*late, (2.0, 0.85)])
    assert off[2][0] == CANDS[-1]


# 65 arrivals (64 gaps) over the same 96 s: evenly spaced, or in five bunches of 13 at once
EVEN = [1.5 * i for i in range(65)]
BUNCHED = [24.0 * (i // 13) for i in range(65)]


def test_gaps_cv_is_the_coefficient_of_variation_of_the_last_gaps():
    arrivals = [(t, 100) for t in BUNCHED]
    assert gaps_cv([(t, 100) for t in EVEN], 64) == pytest.approx(0.0, abs=1e-9)
    # 4 gaps of 24 s and 60 of 0: mean 1.5, population sd sqrt(4 x 22.5^2 + 60 x 1.5^2) / 8
    assert gaps_cv(arrivals, 64) == pytest.approx(math.sqrt(4 * 22.5**2 + 60 * 1.5**2) / 8 / 1.5)
    assert gaps_cv(arrivals[-13:], 12) == 0.0  # every gap 0: a backlog, not a burst
    assert gaps_cv(arrivals, 65) == 0.0  # fewer gaps than asked for
    assert gaps_cv([(0.0, 1), (1.0, 1), (3.0, 1)], 2) == pytest.approx(1 / 3)  # gaps 1 and 2


@pytest.mark.parametrize("kind", ["predictive", "slack"])
def test_under_bursty_arrivals_with_the_pool_roomy_no_chunk_is_just_in_time(kind):
    """Deadlines far off (SLO TTFT 100 s): after evenly spaced arrivals the smallest chunk the
    floor allows keeps up; after the same number bunched (gap CV about 3.9, over burst_gap_cv
    2.5) the queue is prefilled at the largest TPOT-safe chunk, since a burst's later arrivals
    are not in the queue yet. Not once burst_kv_share of the KV pool is used (0 here), nor with
    the rule off (burst_gap_cv inf). Slack inherits the rule."""

    def decide(arrivals, **cfg):
        policy = policy_of(kind, **cfg)
        clock = FakeClock()
        sched = make_scheduler(
            clock,
            policy,
            num_slots=2,
            kv_capacity_tokens=100_000,
            chunk_candidates=CANDS,
            slo=SLO(100.0, 0.2),
            token_step=16,
        )
        for i, t in enumerate(arrivals):
            sched.add_request(Request(i, t, 200, 50))
        clock.t = sched.view.now = arrivals[-1] + 0.01
        return policy.choose(sched.view), policy.last.reason

    even, reason = decide(EVEN)
    assert reason == "optimal" and even < CANDS[-1]
    assert decide(BUNCHED) == (CANDS[-1], "best-effort: bursty arrivals")
    assert decide(BUNCHED, burst_kv_share=0.0) == (even, "optimal")
    assert decide(BUNCHED, burst_gap_cv=math.inf) == (even, "optimal")


class _FillView(_CapView):
    """Two slots, 130 decodes in the launching one and 100 in the other, in 85% of a pool
    that holds about 135 per slot: the tile cap is 128, the launching slot is past it with 126
    tokens left in its second tile; ``head`` is the prompt next in line."""

    def __init__(self, head, chunked=False):
        super().__init__(0, kv_total=300_000, kv_used=256_000, num_slots=2)
        self.slot, self.now, self.slo = 0, 1.0, SLO(2.0, 0.2)
        head.num_generated = 0  # not a retracted request
        self._head = head
        self.chunked = head if chunked else None
        self.num_waiting = 0 if chunked else 1

    def num_running(self, slot):
        return 130 if slot == 0 else 100

    def iter_waiting(self):
        return iter([] if self.chunked is not None else [self._head])

    iter_waiting_newest_first = iter_waiting

    def iter_running(self, slot):
        return iter([])  # (slack tracks the banked slack of these; none needed here)


@pytest.mark.parametrize("kind", ["predictive", "slack"])
def test_a_capped_slot_fills_its_last_tile_only_with_a_prompt_it_does_not_complete(kind):
    """Past the cap, a slot launches decode only unless the prompt next in line (the continuing
    chunk, else the queue's head) is longer than the room left in its last tile: then the
    budget is the end of that tile, and the fill completes no prompt, so no decode joins the
    slot. Slack inherits the rule."""
    policy = policy_of(kind)
    assert policy.slot_decode_cap(_FillView(_Waiting(500))) == 128
    for chunked in (False, True):
        assert policy.choose(_FillView(_Waiting(500), chunked)) == 256
        assert policy.last.reason == "tile-cap: leftover fill"
        assert policy.choose(_FillView(_Waiting(126), chunked)) == 130  # it would complete
        assert policy.last.reason == "tile-cap: decode only"

"""GreedyChunkPolicy (PAPER.md 3.1): the rule on a hand-built view, one behaviour per test, then
the candidate/guard invariant over random views and a real Scheduler, then a simulation."""

from __future__ import annotations

import random
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FakeClock, make_scheduler
from fastpp.policies import make_policies
from fastpp.policies.greedy import GreedyChunkPolicy, GreedyConfig, Statistic
from fastpp.scheduler_config import SchedulerConfig
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation
from fastpp.types import SLO, Request

# SLO 2 s / 0.2 s: grow needs TTFT > 0.6 s and TPOT < 0.17 s; shrink TPOT > 0.216 s or TTFT < 0.2 s
BUSY_TTFT, IDLE_TTFT, MID_TTFT = 1.0, 0.1, 0.4
ROOM_GAP, TIGHT_GAP, BAD_GAP = 0.1, 0.2, 0.3


class FakeView:
    """The part of SchedulerView the greedy policy reads, with state a test sets directly."""

    def __init__(
        self, num_slots=4, running=None, kv_free=0.5, candidates=tuple(range(128, 2049, 128))
    ) -> None:
        self.now = 100.0
        self.num_slots = num_slots
        self.slot = 0
        self.slo = SLO(2.0, 0.2)
        self.chunk_candidates = candidates
        self.kv_total_tokens = 1000
        self.kv_free_tokens = int(kv_free * 1000)
        self.running = list(running or [0] * num_slots)
        self.waiting_prefill_tokens = 0
        self.recent_ttft: deque[tuple[float, float]] = deque(maxlen=4096)
        self.recent_token_gap: deque[tuple[float, float]] = deque(maxlen=4096)

    def num_running(self, slot):
        return self.running[slot]

    def add(self, ttft=(), gap=()):
        for v in ttft:
            self.recent_ttft.append((self.now, v))
        for v in gap:
            self.recent_token_gap.append((self.now, v))


def decide(policy, view, ttft=(), gap=(), dt=0.5):
    """Add samples, then make one full decision round (D_p calls); the first call decides."""
    view.now += dt
    view.add(ttft, gap)
    chunk = policy.choose(view)
    reason = policy.last_reason
    for _ in range(view.num_slots - 1):
        assert policy.choose(view) == chunk and policy.last_reason == "hold"
    return chunk, reason


def grown_to(steps, **config):
    policy, view = GreedyChunkPolicy(GreedyConfig(**config)), FakeView()
    for _ in range(steps):
        decide(policy, view, [BUSY_TTFT], [ROOM_GAP])
    return policy, view


# ---------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "field, value",
    [
        ("min_chunk", 0),
        ("max_chunk", 0),
        ("kv_free_watermark", 1.0),
        ("tpot_violation_ratio", 0.0),
        ("ttft_low_ratio", 0.5),
        ("tpot_safe_ratio", 1.2),
        ("statistic", "p50"),
        ("window_s", 0.0),
        ("tile_floor", 0),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        GreedyConfig(**{field: value})


def test_registry_builds_mean_by_default_and_p90_by_argument():
    cfg = SchedulerConfig(num_slots=4, kv_capacity_tokens=1000)
    mean, _ = make_policies("greedy", cfg)
    p90, _ = make_policies("greedy:p90", cfg)
    assert isinstance(mean, GreedyChunkPolicy) and mean.config.statistic is Statistic.MEAN
    assert p90.config.statistic is Statistic.P90
    with pytest.raises(ValueError, match="statistic"):
        make_policies("greedy:p50", cfg)


def test_registry_builds_the_tile_floor_from_the_profile_as_predictive_does():
    from fastpp.policies.predictive import PredictiveChunkPolicy
    from fastpp.sim.analytic import analytic_profile

    cfg = SchedulerConfig(num_slots=4, kv_capacity_tokens=1000)
    profile = analytic_profile("Qwen2.5-32B", "A100-40GB-PCIe", pp=4, tp=1)
    tile, _ = make_policies("greedy:tile", cfg, profile)
    cands = cfg.chunk_candidates
    expected = cands[PredictiveChunkPolicy.from_profile(profile).tile_index(cands)]
    assert isinstance(tile, GreedyChunkPolicy) and tile.config.statistic is Statistic.MEAN
    assert tile.config.tile_floor == expected > cands[0]  # a floor that binds: 256 on this GPU
    with pytest.raises(ValueError, match="greedy:tile.*profile"):
        make_policies("greedy:tile", cfg)


# ---------------------------------------------------------------------- cadence
def test_starts_at_smallest_and_decides_only_every_dp_calls():
    policy, view = GreedyChunkPolicy(), FakeView(num_slots=4)
    view.add([BUSY_TTFT], [ROOM_GAP])
    reasons = []
    for _ in range(8):
        view.add([BUSY_TTFT], [ROOM_GAP])  # fresh evidence at every call: only cadence limits
        reasons.append((policy.choose(view), policy.last_reason))
    assert reasons == [(256, "grow")] + [(256, "hold")] * 3 + [(384, "grow")] + [(384, "hold")] * 3
    assert policy.num_decisions == 2


# ---------------------------------------------------------------------- the rule
def test_shrinks_one_step_on_tpot_violation_even_under_queue_pressure():
    policy, view = grown_to(3)
    assert decide(policy, view, [BUSY_TTFT], [BAD_GAP]) == (384, "shrink:tpot")


def test_shrinks_one_step_when_idle():
    policy, view = grown_to(3)
    assert decide(policy, view, [IDLE_TTFT], [ROOM_GAP]) == (384, "shrink:idle")


def test_grows_only_with_queue_pressure_and_tpot_room():
    policy, view = GreedyChunkPolicy(), FakeView()
    assert decide(policy, view, [MID_TTFT], [ROOM_GAP]) == (128, "hold")  # no queue pressure
    assert decide(policy, view, [BUSY_TTFT], [TIGHT_GAP]) == (128, "hold")  # TPOT near its SLO
    assert decide(policy, view, [BUSY_TTFT], [ROOM_GAP]) == (256, "grow")


def test_clamps_at_both_ends():
    policy, view = GreedyChunkPolicy(), FakeView()
    assert decide(policy, view, [IDLE_TTFT]) == (128, "shrink:idle")
    for _ in range(20):
        chunk, _ = decide(policy, view, [BUSY_TTFT], [ROOM_GAP])
    assert chunk == 2048 == policy.chunk


def test_kv_pressure_jumps_above_busiest_slot_then_restores_in_one_decision():
    policy, view = grown_to(7)  # C = 1024
    view.kv_free_tokens = 50  # 5 % free
    view.running = [100, 300, 0, 0]
    assert decide(policy, view, [BUSY_TTFT], [ROOM_GAP]) == (384, "kv-pressure")
    view.running = [100, 520, 0, 0]
    assert decide(policy, view, [BUSY_TTFT], [ROOM_GAP]) == (640, "kv-pressure")  # keeps 1024
    view.kv_free_tokens = 500
    assert decide(policy, view, [BUSY_TTFT], [ROOM_GAP]) == (1024, "restore")
    assert decide(policy, view, [BUSY_TTFT], [ROOM_GAP]) == (1152, "grow")  # rule resumes


def test_tile_floor_lifts_c_only_while_prompts_outrun_a_sub_tile_chunk():
    policy, view = GreedyChunkPolicy(GreedyConfig(tile_floor=200)), FakeView()  # 200 -> 256
    assert decide(policy, view, [IDLE_TTFT]) == (128, "shrink:idle")  # nothing waits
    view.waiting_prefill_tokens = 4 * 128  # exactly what 128 carries in D_p = 4 microbatches
    assert decide(policy, view, [MID_TTFT]) == (128, "hold")
    view.waiting_prefill_tokens += 1
    assert decide(policy, view, [MID_TTFT]) == (256, "tile-floor")  # the controller's C too
    assert decide(policy, view, [BUSY_TTFT], [ROOM_GAP]) == (384, "grow")  # climbs from the tile
    view.waiting_prefill_tokens = 0
    for _ in range(2):
        decide(policy, view, [IDLE_TTFT])
    assert policy.chunk == 128  # the shrinks go below the tile once the queue is short
    view.running = [100] * 4  # decodes fill most of a 128 chunk: 4 x 28 tokens of room
    view.waiting_prefill_tokens = 4 * 28 + 1
    assert decide(policy, view, [MID_TTFT]) == (256, "tile-floor")


def test_tile_floor_lifts_the_kv_pressure_chunk_while_prompts_wait():
    policy, view = GreedyChunkPolicy(GreedyConfig(tile_floor=256)), FakeView(running=[100, 0, 0, 0])
    view.kv_free_tokens = 0
    assert decide(policy, view) == (128, "kv-pressure")  # the cut stands while nothing waits
    view.waiting_prefill_tokens = 10_000
    assert decide(policy, view) == (256, "tile-floor")


def test_kv_pressure_needs_no_new_ttft_sample():
    policy, view = grown_to(2)
    view.kv_free_tokens = 0
    assert decide(policy, view) == (128, "kv-pressure")


def test_guard_returns_a_candidate_above_the_slots_decodes_without_moving_c():
    policy, view = GreedyChunkPolicy(), FakeView(running=[300, 0, 0, 0])
    view.slot = 0
    assert policy.choose(view) == 384 and policy.last_reason == "guard"
    view.slot = 1
    assert policy.choose(view) == 128 and policy.chunk == 128
    view.running[2], view.slot = 5000, 2
    assert policy.choose(view) == 2048 and policy.last_reason == "guard"


def test_walks_the_views_candidates_within_the_bounds():
    view = FakeView(candidates=(128, 256, 512))
    policy = GreedyChunkPolicy()
    assert decide(policy, view, [BUSY_TTFT], [ROOM_GAP]) == (256, "grow")
    assert decide(policy, view, [BUSY_TTFT], [ROOM_GAP]) == (512, "grow")
    assert decide(policy, view, [BUSY_TTFT], [ROOM_GAP]) == (512, "grow")  # clamped
    bounded = GreedyChunkPolicy(GreedyConfig(max_chunk=256))
    assert [decide(bounded, view, [BUSY_TTFT], [ROOM_GAP])[0] for _ in range(3)] == [256, 256, 256]
    bad = GreedyChunkPolicy(GreedyConfig(min_chunk=1024, max_chunk=2048))
    with pytest.raises(ValueError, match="min_chunk"):
        bad.choose(view)


def test_honours_the_chunk_candidates_of_the_deployment():
    """--chunk-candidates 32:1024:32 (the CPU engine's): greedy starts at 32 and moves by 32."""
    view = FakeView(candidates=tuple(range(32, 1025, 32)))
    policy = GreedyChunkPolicy()
    assert decide(policy, view, [BUSY_TTFT], [ROOM_GAP]) == (64, "grow")
    assert decide(policy, view, [IDLE_TTFT], [ROOM_GAP]) == (32, "shrink:idle")
    cfg = SchedulerConfig(num_slots=2, kv_capacity_tokens=1000, chunk_candidates=tuple(range(32, 1025, 32)))
    chunk, _ = make_policies("greedy", cfg)
    assert chunk.choose(FakeView(num_slots=2, candidates=cfg.chunk_candidates)) == 32


# ---------------------------------------------------------------------- signals
def test_mean_and_p90_read_the_same_tpot_samples_differently():
    gaps = [ROOM_GAP] * 8 + [BAD_GAP] * 2  # mean 0.14 s has room; P90 0.3 s violates
    mean, p90 = GreedyChunkPolicy(), GreedyChunkPolicy(GreedyConfig(statistic="p90"))
    assert decide(mean, FakeView(), [BUSY_TTFT], gaps) == (256, "grow")
    assert decide(p90, FakeView(), [BUSY_TTFT], gaps) == (128, "shrink:tpot")


def test_mean_uses_only_samples_since_last_decision_and_holds_without_ttft():
    policy, view = GreedyChunkPolicy(), FakeView()
    assert decide(policy, view, [BUSY_TTFT] * 5, [ROOM_GAP]) == (256, "grow")
    assert decide(policy, view) == (256, "hold")  # nothing new: old samples are not reused
    assert decide(policy, view, [], [BAD_GAP]) == (256, "hold")  # TPOT alone decides nothing...
    assert decide(policy, view, [MID_TTFT]) == (128, "shrink:tpot")  # ...but it is kept


def test_p90_uses_a_sliding_window():
    policy, view = GreedyChunkPolicy(GreedyConfig(statistic="p90", window_s=2.0)), FakeView()
    assert decide(policy, view, [BUSY_TTFT], [ROOM_GAP]) == (256, "grow")
    assert decide(policy, view, dt=1.0) == (384, "grow")  # same samples, still in the window
    assert decide(policy, view, dt=1.5) == (384, "hold")  # they left it: nothing to go on


# ---------------------------------------------------------------------- invariants
def _view_from(seed: int) -> FakeView:
    rng = random.Random(seed)
    view = FakeView(num_slots=rng.randint(1, 6), kv_free=rng.choice([0.0, 0.05, 0.5, 1.0]))
    view.running = [rng.choice([0, 5, 127, 128, 129, 700, 3000]) for _ in range(view.num_slots)]
    view.slot = rng.randrange(view.num_slots)
    return view


@given(
    st.integers(0, 10**6),
    st.lists(st.tuples(st.floats(0, 5), st.floats(0, 1)), max_size=40),
    st.sampled_from(["mean", "p90"]),
)
@settings(max_examples=60, deadline=None)
def test_choice_is_always_a_candidate_above_the_slots_decodes(seed, samples, statistic):
    rng = random.Random(seed)
    policy = GreedyChunkPolicy(GreedyConfig(statistic=statistic))
    view = _view_from(seed)
    candidates = set(range(128, 2049, 128))
    for ttft, gap in samples:
        view.now += rng.random()
        view.add([ttft] * rng.randint(0, 2), [gap] * rng.randint(0, 2))
        if rng.random() < 0.3:
            view = _view_from(rng.randrange(10**6)) if rng.random() < 0.5 else view
        chunk = policy.choose(view)
        assert chunk in candidates
        assert chunk > view.num_running(view.slot) or chunk == 2048


@given(st.integers(0, 10**6))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_real_scheduler_budgets_are_candidates_above_the_slots_decodes(seed):
    rng = random.Random(seed)
    clock = FakeClock()
    policy = GreedyChunkPolicy(GreedyConfig(kv_free_watermark=0.3))
    num_slots = rng.randint(1, 4)
    sched = make_scheduler(
        clock,
        policy,
        num_slots=num_slots,
        kv_capacity_tokens=800,
        slo=SLO(0.5, 0.05),
        chunk_candidates=tuple(range(4, 65, 4)),
    )
    in_flight, next_id = [], 0
    for _ in range(60):  # bursts build decode sets above small chunks and fill the KV pool
        for _ in range(rng.randint(0, 3)):
            sched.add_request(Request(next_id, clock.t, rng.randint(1, 30), rng.randint(1, 40)))
            next_id += 1
        for slot in range(num_slots):
            if sched.is_slot_free(slot):
                num_decodes = sched.view.num_running(slot)
                plan = sched.schedule(slot)
                if plan is not None:
                    assert plan.chunk_budget % 4 == 0 and 4 <= plan.chunk_budget <= 64
                    assert plan.chunk_budget > num_decodes or plan.chunk_budget == 64
                    assert not plan.reason.startswith("fallback")
                    in_flight.append(plan)
        clock.t += rng.random() * 0.05
        if in_flight:
            sched.update(in_flight.pop(0))  # the pipeline returns microbatches in launch order


# ---------------------------------------------------------------------- simulation
def test_runs_in_a_real_simulation_and_moves_the_chunk():
    run = run_simulation(WorkloadConfig(num_requests=200, rate=3), DeploymentConfig(policy="greedy"))
    assert run.summary["completed"] == 200
    budgets = {it.chunk_budget for it in run.result.iterations}
    assert len(budgets) > 1 and budgets <= set(range(128, 2049, 128))

"""The discrete-event pipeline model: stage order, unequal stages, token return, noise, time limit."""

from __future__ import annotations

import pytest

from conftest import make_profile, make_requests, make_scheduler
from fastpp.sim.engine import PipelineSimulation
from fastpp.types import FinishReason, Request


def simulate(pp=2, n=30, **kw):
    profile = make_profile(pp=pp, num_layers=kw.pop("num_layers", 4))
    sched = make_scheduler(None, num_slots=pp, kv_capacity_tokens=8192, default_chunk=64)
    reqs = kw.pop("requests", None) or make_requests(n, prompt_len=40, output_len=6, gap_s=0.001)
    return PipelineSimulation(profile, sched, reqs, **kw).run(), profile


def test_a_microbatch_visits_stages_in_order_and_returns_after_the_token_hand_back():
    result, profile = simulate(pp=3)
    by_mb: dict[int, list] = {}
    for it in result.iterations:
        by_mb.setdefault(it.mb_id, []).append(it)
    for its in by_mb.values():
        assert [i.stage for i in its] == [0, 1, 2]
        assert all(a.finished_at <= b.started_at for a, b in zip(its, its[1:], strict=False))
    first = min(result.records, key=lambda r: r.first_token_at)
    last_stage_end = min(i.finished_at for i in result.iterations if i.stage == 2)
    assert first.first_token_at == pytest.approx(last_stage_end + profile.token_return_s)


def test_uneven_layers_make_uneven_stages():
    result, profile = simulate(pp=3, num_layers=7)
    assert [s.num_layers for s in profile.stages] == [3, 2, 2]
    assert result.stage_busy_s[0] > result.stage_busy_s[1]


def test_single_stage_has_no_token_return_and_never_idles_between_back_to_back_batches():
    result, profile = simulate(pp=1, requests=[Request(0, 0.0, 40, 3)])
    (rec,) = result.records
    its = sorted(result.iterations, key=lambda i: i.started_at)
    assert rec.first_token_at == pytest.approx(its[0].finished_at)


def test_noise_is_seeded_mean_one_and_changes_timing_not_tokens():
    a, _ = simulate(noise_cv=0.05, noise_seed=1)
    b, _ = simulate(noise_cv=0.05, noise_seed=1)
    c, _ = simulate(noise_cv=0.0)
    assert [r.token_times for r in a.records] == [r.token_times for r in b.records]
    assert [r.token_times for r in a.records] != [r.token_times for r in c.records]
    assert [r.num_generated for r in a.records] == [r.num_generated for r in c.records]
    assert a.stage_busy_s[0] == pytest.approx(c.stage_busy_s[0], rel=0.1)
    with pytest.raises(ValueError, match="noise_cv"):
        simulate(noise_cv=1.5)


def test_time_limit_aborts_what_is_left_with_a_reason():
    result, _ = simulate(n=200, max_time_s=0.05)
    reasons = {r.finish_reason for r in result.records}
    assert FinishReason.ABORTED in reasons
    aborted = [r for r in result.records if r.finish_reason is FinishReason.ABORTED]
    assert all("time limit" in r.detail for r in aborted)
    assert len(result.records) == 200 and result.notes
    for bad in (0.0, -1.0, float("nan")):  # a limit at or before the start ran nothing, silently
        with pytest.raises(ValueError, match="max_time_s must be > 0 seconds"):
            simulate(n=10, max_time_s=bad)


def test_every_stage_serves_in_launch_order_and_starts_when_input_and_stage_are_ready():
    """The tandem-queue recurrence: stage i starts microbatch k at max(its activations' arrival
    over the link, stage i's end of microbatch k-1); nothing overlaps on a stage."""
    result, profile = simulate(pp=3, n=60)
    link = profile.link
    by_stage: dict[int, list] = {}
    by_mb: dict[tuple[int, int], object] = {}
    for it in result.iterations:
        by_stage.setdefault(it.stage, []).append(it)
        by_mb[it.mb_id, it.stage] = it
    for its in by_stage.values():
        its.sort(key=lambda i: i.mb_id)
        assert all(a.finished_at <= b.started_at for a, b in zip(its, its[1:], strict=False))
    link_free = [0.0] * 3
    for mb_id in sorted({i.mb_id for i in result.iterations}):
        for stage in (1, 2):
            prev, cur = by_mb[mb_id, stage - 1], by_mb[mb_id, stage]
            sent = max(prev.finished_at, link_free[stage - 1]) + link.time_s(
                prev.num_tokens * profile.activation_bytes_per_token
            )
            link_free[stage - 1] = sent
            own_prev = by_mb.get((mb_id - 1, stage))
            ready = max(sent, own_prev.finished_at if own_prev else 0.0)
            assert cur.started_at == pytest.approx(ready, abs=1e-12)


def test_the_event_clock_runs_in_time_order_and_equal_times_in_scheduling_order():
    from fastpp.sim.events import EventClock

    clock, seen = EventClock(), []
    clock.at(2.0, seen.append, "c")
    clock.at(1.0, seen.append, "a")
    clock.at(1.0, seen.append, "b")  # same instant: after "a", scheduled first
    clock.at(1.0, lambda _: clock.at(clock.now, seen.append, "a2"))  # due now: runs after "b"
    assert clock.next_at() == 1.0
    assert clock.run() is True and seen == ["a", "b", "a2", "c"] and clock.now == 2.0
    assert clock.num_events == 5 and len(clock) == 0 and clock.next_at() == float("inf")
    with pytest.raises(ValueError, match="before now"):
        clock.at(1.5, seen.append)


def test_the_event_clock_stops_before_until_and_sits_there():
    from fastpp.sim.events import EventClock

    clock, seen = EventClock(), []
    for t in (1.0, 3.0, 5.0):
        clock.at(t, seen.append, t)
    assert clock.run(until=3.0) is False  # 3.0 is not run: due at the limit, not before it
    assert seen == [1.0] and clock.now == 3.0 and len(clock) == 2
    assert clock.run() is True and seen == [1.0, 3.0, 5.0]


def test_the_event_clock_runs_a_callback_at_the_instant_asked_or_one_ulp_after():
    """SimPy adds a delay to its clock. 0.7 - 0.1 is not exact, yet 0.1 + (0.7 - 0.1) lands on
    0.7; 1.919e-06 + (3.27e-04 - 1.919e-06) falls on a rounding tie that no delay reaches:
    the callback runs at the next float, never before the instant asked."""
    import math

    from fastpp.sim.events import EventClock, _exact_delay

    tie_now, tie_when = 1.9194282348248724e-06, 0.00032701679757823286
    assert tie_now + (tie_when - tie_now) < tie_when

    def seen_at(now: float, when: float) -> list[float]:
        clock, seen = EventClock(), []
        clock.at(now, lambda _: clock.at(when, lambda _: seen.append(clock.now)))
        assert clock.run() is True
        return seen

    assert seen_at(0.1, 0.7) == [0.7]
    assert seen_at(tie_now, tie_when) == [math.nextafter(tie_when, math.inf)]
    assert tie_now + _exact_delay(tie_now, tie_when) == math.nextafter(tie_when, math.inf)


class _Watcher:
    """A chunk policy without an ``observes`` attribute: it must get every stage record of a
    microbatch, stage by stage, before that microbatch's tokens are folded in."""

    last_reason = "watch"

    def __init__(self, scheduler_ref):
        self.seen: list[tuple[int, int]] = []
        self.ref = scheduler_ref

    def choose(self, view):
        return 64

    def observe(self, rec):
        plan = self.ref[0]._in_flight[rec.slot]
        assert plan is not None and plan.mb_id == rec.mb_id  # not yet returned
        self.seen.append((rec.mb_id, rec.stage))


def test_a_policy_that_observes_gets_every_stage_record_before_the_return():
    ref: list = []
    watcher = _Watcher(ref)
    sched = make_scheduler(None, chunk_policy=watcher, num_slots=3, kv_capacity_tokens=8192)
    ref.append(sched)
    assert sched.observes_iterations
    reqs = make_requests(20, prompt_len=40, output_len=6, gap_s=0.001)
    result = PipelineSimulation(make_profile(pp=3), sched, reqs, record_iterations=False).run()
    assert result.iterations == []  # not kept, but observed
    assert watcher.seen == [(mb, s) for mb in range(result.num_microbatches) for s in range(3)]


def test_records_are_built_only_when_kept_or_observed_and_busy_time_is_the_same():
    kept, _ = simulate(pp=3)
    bare, _ = simulate(pp=3, record_iterations=False)  # static policy: observes = False
    assert bare.iterations == [] and len(kept.iterations) == 3 * kept.num_microbatches
    assert bare.stage_busy_s == kept.stage_busy_s
    assert [r.token_times for r in bare.records] == [r.token_times for r in kept.records]


def test_records_without_token_times_have_the_same_ttft_tpot_and_run():
    """A goodput probe's scheduler keeps no per-token times: the run, every TTFT and TPOT
    (from the completed request's finished_at, the instant of its last token) are unchanged."""
    from dataclasses import replace

    from fastpp.sim.run import DeploymentConfig, WorkloadConfig, open_simulation

    workload = WorkloadConfig(name="cnn-reversed-synthetic", rate=6.0, num_requests=200, seed=1)
    for policy in ("static:512", "predictive+ds"):
        deployment = DeploymentConfig(pp=4, policy=policy)
        kept = open_simulation(workload, deployment, record_iterations=False).run()
        bare = open_simulation(workload, deployment, record_iterations=False, record_token_times=False).run()
        assert all(r.token_times == [] for r in bare.records)
        assert all(len(r.token_times) == r.num_generated for r in kept.records)
        assert [r.tpot_s for r in bare.records] == [r.tpot_s for r in kept.records]
        assert sum(r.tpot_s is not None for r in bare.records) > 150
        assert [replace(r, token_times=[]) for r in kept.records] == bare.records
        assert (bare.end_at, bare.num_microbatches) == (kept.end_at, kept.num_microbatches)


def test_guarded_policies_observe_unless_both_say_they_do_not():
    from fastpp.policies.base import NoBalancer, StaticChunkPolicy
    from fastpp.policies.guard import GuardedPolicies

    assert not GuardedPolicies(StaticChunkPolicy(64), NoBalancer(), 64).observes
    assert GuardedPolicies(_Watcher([]), NoBalancer(), 64).observes  # no attribute: assumed


def test_looking_at_the_first_requests_and_going_on_changes_nothing():
    """run_until_ended(n) stops once the first n requests by arrival have ended and hands back
    final records; going on (a larger count, or run()) gives what one uninterrupted run gives."""
    import copy

    from fastpp.sim.run import DeploymentConfig, WorkloadConfig, open_simulation

    workload = WorkloadConfig(name="azure-conv", rate=7.0, num_requests=300, seed=3)
    deployment = DeploymentConfig(pp=4, policy="predictive")
    stepped = open_simulation(workload, deployment, record_iterations=False)
    first = copy.deepcopy(stepped.run_until_ended(80))
    assert [r.req_id for r in first] == list(range(80))
    assert all(r.is_finished for r in first)
    later = stepped.run_until_ended(200)
    assert later[:80] == first  # ended records do not change as the run goes on
    direct = open_simulation(workload, deployment, record_iterations=False).run_until_ended(200)
    assert later == direct
    whole = open_simulation(workload, deployment, record_iterations=False).run()
    assert stepped.run().records == whole.records
    assert whole.records[:200] == direct  # the first 200 ended as in the uninterrupted run
    with pytest.raises(ValueError, match="count must be in"):
        stepped.run_until_ended(301)


def test_giving_up_stops_the_look_and_going_on_loses_nothing():
    from fastpp.sim.run import DeploymentConfig, WorkloadConfig, open_simulation

    workload = WorkloadConfig(name="azure-conv", rate=7.0, num_requests=300, seed=3)
    deployment = DeploymentConfig(pp=4, policy="static:512")
    asked: list[tuple[int, float]] = []

    def give_up(arrived, now):
        asked.append((len(arrived), now))
        return now >= 20.0

    stepped = open_simulation(workload, deployment, record_iterations=False)
    partial = stepped.run_until_ended(250, give_up)
    assert stepped.gave_up and len(partial) < 250 and not all(r.is_finished for r in partial)
    assert [now for _, now in asked] == [10.0, 20.0] and asked[-1][0] == len(partial)
    done = stepped.run_until_ended(250)
    assert not stepped.gave_up and all(r.is_finished for r in done)
    direct = open_simulation(workload, deployment, record_iterations=False).run_until_ended(250)
    assert done == direct


def test_a_launch_has_no_event_of_its_own_and_the_host_looks_again_only_when_it_may_launch():
    from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation

    # a loaded PP=4 deployment paying 3 ms of host overhead per launch: every launch used to be
    # an event (then the host's look for work); now a run has about one event per microbatch
    # (its return), plus the arrivals and the looks after an overhead with a slot still free
    result = run_simulation(
        WorkloadConfig(name="azure-conv", rate=6.0, num_requests=600, seed=3),
        DeploymentConfig(model="Qwen2.5-14B", pp=4, policy="static:512"),
        record_iterations=False,
    ).result
    assert result.events < 1.2 * result.num_microbatches + len(result.records)
    sched = make_scheduler(None, num_slots=2, kv_capacity_tokens=8192, default_chunk=64)
    sim = PipelineSimulation(
        make_profile(pp=2), sched, make_requests(4, prompt_len=40, output_len=6, gap_s=0.0)
    )
    driver = sim.driver
    assert driver.may_launch()  # both slots free
    sched.add_request(Request(0, 0.0, 40, 6))
    sched.add_request(Request(1, 0.0, 40, 6))
    plans = [driver.next_plan(), driver.next_plan()]
    assert all(plans) and not driver.may_launch() and driver.next_plan() is None
    driver.returned(plans[0])
    assert driver.may_launch()


@pytest.mark.parametrize("bad", ["2", 0, True, 2.0])
def test_a_deployment_with_a_non_integer_or_zero_degree_is_refused_naming_it(bad):
    from fastpp.sim.run import DeploymentConfig

    with pytest.raises(ValueError, match=f"pp must be an integer >= 1, got {bad!r}"):
        DeploymentConfig(pp=bad)
    with pytest.raises(ValueError, match="tp must be an integer >= 1"):
        DeploymentConfig(tp=bad)

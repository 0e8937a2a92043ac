"""SchedulerConfig.queue_order: FCFS, or late-last (a request that has missed its TTFT waits
behind the ones that can still meet theirs, for a bounded time)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FakeClock, make_scheduler
from fastpp.live_request import LiveRequest
from fastpp.scheduler_config import LATE_REQUEUE_SLO_RATIO, SchedulerConfig, late_thresholds
from fastpp.types import SLO, Request, RequestRecord
from fastpp.waiting_queue import WaitingQueue, late_last_order


def live(req_id: int, arrived_at: float, prompt: int = 10, generated: int = 0) -> LiveRequest:
    rec = RequestRecord(req_id, arrived_at, prompt, 20, num_generated=generated)
    return LiveRequest(rec, target_len=20, fill_len=prompt + generated)


def ids(queue) -> list[int]:
    return [r.req_id for r in queue]


def test_fcfs_never_defers():
    q = WaitingQueue()
    for i in range(3):
        q.push(live(i, float(i)))
    q.defer_late(1e9)
    assert ids(q) == [0, 1, 2] and q.head.req_id == 0 and q.num_late == 0


def test_late_requests_wait_behind_on_time_ones_until_their_max_wait():
    q = WaitingQueue(late_after=2.0, late_max_wait=20.0)
    for i, t in enumerate((0.0, 1.0, 3.5, 4.0)):
        q.push(live(i, t))
    q.defer_late(4.5)  # 0 and 1 have waited over 2 s: late; 2 and 3 can still make it
    assert ids(q) == [2, 3, 0, 1] and q.num_late == 2
    assert [r.req_id for r in q.newest_first()] == [3, 2, 1, 0]
    assert q.pop_head().req_id == 2
    q.defer_late(20.5)  # 0 has waited 20 s: first again; 3 became late meanwhile, after 1
    assert ids(q) == [0, 1, 3] and q.head.req_id == 0
    assert [q.pop_head().req_id for _ in range(3)] == [0, 1, 3]
    assert len(q) == 0 and q.prefill_tokens == 40 and q.arrival_sum == 0.0


def test_late_requests_go_first_when_nobody_else_waits():
    q = WaitingQueue(late_after=1.0, late_max_wait=100.0)
    q.push(live(0, 0.0))
    q.defer_late(5.0)
    assert q.num_late == 1 and q.head.req_id == 0 and q.pop_head().req_id == 0


def test_a_retracted_request_is_never_late():
    q = WaitingQueue(late_after=1.0, late_max_wait=100.0)
    q.push(live(1, 9.0))
    q.push_front(live(0, 0.0, generated=3))  # has its first token: its TTFT is done
    q.defer_late(9.5)
    assert ids(q) == [0, 1] and q.num_late == 0


def test_remove_finds_a_late_request_and_keeps_the_sums():
    q = WaitingQueue(late_after=1.0, late_max_wait=100.0)
    a, b = live(0, 0.0, prompt=7), live(1, 5.0, prompt=9)
    q.push(a)
    q.push(b)
    q.defer_late(5.5)
    assert q.num_late == 1
    assert q.remove(a) and not q.remove(a)
    assert ids(q) == [1] and q.prefill_tokens == 9 and q.arrival_sum == 5.0


def test_bad_thresholds_are_refused():
    with pytest.raises(ValueError, match="late_after"):
        WaitingQueue(late_after=5.0, late_max_wait=1.0)
    with pytest.raises(ValueError, match="queue_order must be one of fcfs, late_last"):
        SchedulerConfig(num_slots=1, kv_capacity_tokens=10, queue_order="edf")


def test_the_thresholds_follow_the_slo():
    fcfs = SchedulerConfig(num_slots=1, kv_capacity_tokens=10)
    late = SchedulerConfig(num_slots=1, kv_capacity_tokens=10, queue_order="late_last", slo=SLO(1.5, 0.1))
    assert late_thresholds(fcfs) == (float("inf"), float("inf"))
    assert late_thresholds(late) == (1.5, LATE_REQUEUE_SLO_RATIO * 1.5)


def test_the_scheduler_admits_a_request_that_can_still_make_it_before_a_late_one():
    clock = FakeClock()
    sched = make_scheduler(clock, num_slots=1, queue_order="late_last", slo=SLO(1.0, 0.2))
    sched.add_request(Request(0, 0.0, 30, 4))
    clock.t = 1.5
    sched.add_request(Request(1, 1.5, 30, 4))
    plan = sched.schedule(0)  # budget 64: the on-time request first, then the late one
    assert [c.req_id for c in plan.prefill] == [1, 0]
    fcfs = make_scheduler(FakeClock(), num_slots=1)
    fcfs.clock.t = 0.0
    fcfs.add_request(Request(0, 0.0, 30, 4))
    fcfs.clock.t = 1.5
    fcfs.add_request(Request(1, 1.5, 30, 4))
    assert [c.req_id for c in fcfs.schedule(0).prefill] == [0, 1]


def test_a_burst_over_capacity_meets_more_ttfts_late_last_and_serves_everyone():
    from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation

    wl = WorkloadConfig(name="azure-conv", rate=12.0, num_requests=300, seed=1)
    runs = {
        order: run_simulation(wl, DeploymentConfig(policy="static:384", queue_order=order))
        for order in ("fcfs", "late_last")
    }
    fcfs, late = (runs[o].summary for o in ("fcfs", "late_last"))
    assert late["queue_order"] == "late_last" and fcfs["queue_order"] == "fcfs"
    assert fcfs["completed"] == late["completed"] == 300
    gain = late["slo_attainment"] - fcfs["slo_attainment"]  # 49.3% -> 58.7% when written
    assert gain > 0.05, (fcfs["slo_attainment"], late["slo_attainment"])
    assert late["p99_ttft_ms"] > fcfs["p99_ttft_ms"]  # what it costs: the late ones wait longer


def test_a_deployment_carries_the_queue_order_to_its_scheduler_and_sweep_point():
    from fastpp.sim.run import DeploymentConfig, build_scheduler
    from fastpp.sim.sweep_grid import SweepGrid, grid_from_mapping

    dep = DeploymentConfig(model="Qwen2.5-14B", pp=2, queue_order="late_last")
    assert build_scheduler(dep.load_profile(), dep).config.queue_order == "late_last"
    plain = SweepGrid(metric="simulate", rates=(1.0,)).expand()[0][0]
    same = SweepGrid(metric="simulate", rates=(1.0,), queue_order="fcfs").expand()[0][0]
    other = grid_from_mapping({"queue_order": "late_last", "rate": [1.0]}).expand()[0][0]
    assert plain.point_id == same.point_id != other.point_id  # the default keeps the old ids
    assert other.deployment_config().queue_order == "late_last" and "queue_order" not in plain.axes()
    with pytest.raises(ValueError, match="--queue-order"):
        DeploymentConfig(queue_order="edf")


def test_the_cli_names_a_bad_queue_order():
    from typer.testing import CliRunner

    from fastpp.cli.app import app

    for command in ("simulate", "goodput"):
        bad = CliRunner().invoke(app, [command, "-n", "5", "--queue-order", "edf"])
        assert bad.exit_code != 0 and "edf" in bad.output and "queue-order" in bad.output


@settings(max_examples=60, deadline=None)
@given(
    arrivals=st.lists(st.floats(0.0, 50.0), min_size=1, max_size=25),
    steps=st.lists(st.tuples(st.floats(0.0, 10.0), st.booleans()), max_size=15),
)
def test_an_engine_queue_reordered_by_late_last_order_admits_as_the_waiting_queue(arrivals, steps):
    """late_last_order over an engine's FCFS list (vLLM keeps its own queue) gives the order
    WaitingQueue admits in, at every instant, as requests arrive, turn late and are taken."""
    q = WaitingQueue(late_after=2.0, late_max_wait=20.0)
    engine: list[LiveRequest] = []  # the engine's queue: arrival order
    pending = sorted(arrivals)
    now, next_id = 0.0, 0
    for dt, take in [(0.0, False), *steps]:
        now += dt
        while pending and pending[0] <= now:
            r = live(next_id, pending.pop(0))
            next_id += 1
            q.push(r)
            engine.append(r)
        q.defer_late(now)
        order = late_last_order(engine, now, 2.0, 20.0, lambda r: r.arrived_at, lambda r: r.num_generated > 0)
        assert ids(order) == ids(q)
        if take and engine:
            head = q.pop_head()
            assert head is order[0]
            engine.remove(head)


def test_late_last_order_keeps_a_preempted_request_with_a_first_token_on_time():
    rs = [live(0, 0.0, generated=3), live(1, 1.0), live(2, 9.0)]
    order = late_last_order(rs, 10.0, 2.0, 20.0, lambda r: r.arrived_at, lambda r: r.num_generated > 0)
    assert ids(order) == [0, 2, 1]
    due = late_last_order(rs, 21.5, 2.0, 20.0, lambda r: r.arrived_at, lambda r: r.num_generated > 0)
    assert ids(due) == [1, 0, 2]  # 1 waited 20.5 s: first again; 2 is late (12.5 s)

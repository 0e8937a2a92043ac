"""Throughput under overload (fastpp.sim.overload): the middle-half completion rate, whether a
request waited through all of it, and clear errors for what it cannot measure."""

from __future__ import annotations

import pytest

from fastpp.sim.overload import completion_rate, overload_throughput
from fastpp.sim.run import DeploymentConfig, WorkloadConfig
from fastpp.types import FinishReason, RequestRecord


def done(i: int, arrived_at: float, admitted_at: float, finished_at: float, reason=FinishReason.LENGTH):
    return RequestRecord(
        i,
        arrived_at,
        100,
        10,
        num_generated=10,
        scheduled_at=admitted_at,
        finished_at=finished_at,
        finish_reason=reason,
    )


def test_the_rate_counts_completions_between_the_quartiles_of_their_times():
    # 100 completions of a backlog: a slow warm-up (every 1 s), 2 per second, a slow drain;
    # each admitted 5 s before it finishes, so some request waits until 70 s
    times = [float(t) for t in range(25)] + [25 + k / 2 for k in range(50)] + [50 + t for t in range(25)]
    records = [done(i, 0.0, max(0.0, t - 5), t) for i, t in enumerate(times)]
    records.append(done(100, 0.0, 0.0, 99.0, reason=FinishReason.ABORTED))  # not completed
    got = completion_rate(records)
    assert got.window_s == (25.0, 50.0) and got.rate == pytest.approx(2.0)
    assert got.num_completed == 100 and got.empty_s == 0.0 and got.saturated


def test_the_time_no_request_waited_is_measured_inside_the_window():
    # arrivals every second from 0, each admitted 0.25 s later: the queue is empty 75% of the time
    records = [done(i, float(i), i + 0.25, i + 10.0) for i in range(100)]
    got = completion_rate(records)
    assert got.window_s == (35.0, 85.0)
    assert got.empty_s == pytest.approx(0.75 * 50) and not got.saturated
    assert "queue emptied" in got.describe()
    # one rejected on arrival never waited; one never admitted nor ended waits until the end
    rejected = RequestRecord(200, 30.0, 100, 10, finished_at=30.0, finish_reason=FinishReason.REJECTED)
    assert completion_rate([*records, rejected]).empty_s == pytest.approx(0.75 * 50)
    assert completion_rate([*records, RequestRecord(201, 30.0, 100, 10)]).saturated


def test_a_backlog_keeps_the_queue_full_and_a_light_load_does_not():
    wl = WorkloadConfig(name="sharegpt-synthetic", num_requests=4000)
    dep = DeploymentConfig(policy="static:384")
    backlog = overload_throughput(wl, dep)
    assert backlog.saturated and backlog.num_completed == 4000
    assert overload_throughput(wl, dep, rate=2 * backlog.rate).saturated
    light = overload_throughput(wl, dep, rate=backlog.rate / 4)
    assert not light.saturated and light.rate < backlog.rate / 2


@pytest.mark.parametrize(
    ("workload", "rate", "match"),
    [
        (WorkloadConfig(replay="azure-conv", replay_window_s=60), None, "not a trace replay"),
        (WorkloadConfig(num_requests=None, duration_s=60.0), None, "request count"),
        (WorkloadConfig(num_requests=100), 0.0, "rate must be > 0"),
    ],
)
def test_what_it_cannot_measure_is_refused_by_name(workload, rate, match):
    with pytest.raises(ValueError, match=match):
        overload_throughput(workload, DeploymentConfig(policy="static:384"), rate)


def test_too_few_completions_are_refused():
    with pytest.raises(ValueError, match="at least 8 completed requests"):
        completion_rate([done(i, 0.0, 0.0, float(i)) for i in range(7)])

"""Throughput under overload: how many requests per second a deployment completes while its
queue never empties.

Goodput (``fastpp.sim.goodput``) is the rate a deployment sustains within the SLO; this is the
rate it sustains at all, the ceiling goodput approaches as queueing is squeezed out. Two
arrival patterns, both parameter-free once the request count is set:

- a backlog: every request arrives at t = 0 (a batch job dumped on the server);
- sustained overload: Poisson arrivals at a rate above what the deployment completes, the
  queue growing for as long as they come.

The rate is the completions per second between the first and the third quartile of the
completion times: the middle half, past the warm-up (an empty KV cache filling) and before the
drain. It is only a saturated rate if some request waited to be admitted at every moment of
that window, so the result says for how long none did (``empty_s``; ``saturated`` when never):
a run whose arrivals end too early, or come too slowly, measures its drain or its load
instead. Units: requests per second, seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation
from fastpp.sim.steady import COMPLETED
from fastpp.types import RequestRecord


@dataclass(frozen=True, slots=True)
class OverloadThroughput:
    """Completions per second over the middle half of the completion times."""

    rate: float  # req/s
    window_s: tuple[float, float]  # first and third quartile of the completion times
    empty_s: float  # time within the window with no request waiting to be admitted
    num_completed: int

    @property
    def saturated(self) -> bool:
        """A request waited to be admitted at every moment of the window."""
        return self.empty_s == 0.0

    def describe(self) -> str:
        start, end = self.window_s
        state = (
            "queue never empty"
            if self.saturated
            else f"queue emptied for {self.empty_s:.0f} s of it: give more requests or a higher rate"
        )
        return f"{self.rate:.2f} req/s completed over {start:.0f}..{end:.0f} s ({state})"


def completion_rate(records: list[RequestRecord]) -> OverloadThroughput:
    """The middle-half completion rate of one run's records (module docstring)."""
    finished = np.sort(
        [r.finished_at for r in records if r.finish_reason in COMPLETED and r.finished_at is not None]
    )
    if finished.size < 8:
        raise ValueError(f"need at least 8 completed requests to measure a rate, got {finished.size}")
    q1, q3 = finished.size // 4, 3 * finished.size // 4
    start, end = float(finished[q1]), float(finished[q3])
    return OverloadThroughput(
        rate=(q3 - q1) / (end - start) if end > start else float("inf"),
        window_s=(start, end),
        empty_s=_queue_empty_s(records, start, end),
        num_completed=int(finished.size),
    )


def _queue_empty_s(records: list[RequestRecord], start: float, end: float) -> float:
    """Seconds of [start, end] in which no request was waiting: between its arrival and its
    first microbatch (one never admitted waits until it left, rejected or aborted, or until the
    end if it never did)."""
    waits = sorted((r.arrived_at, _left_queue(r, end)) for r in records)
    empty, covered = 0.0, start
    for arrived, admitted in waits:
        if arrived > covered:
            empty += min(arrived, end) - covered
        covered = max(covered, admitted)
        if covered >= end:
            return empty
    return empty + end - covered


def _left_queue(r: RequestRecord, end: float) -> float:
    if r.scheduled_at is not None:
        return r.scheduled_at
    return end if r.finished_at is None else r.finished_at


def overload_throughput(
    workload: WorkloadConfig, deployment: DeploymentConfig, rate: float | None = None
) -> OverloadThroughput:
    """Serve ``workload``'s requests as a backlog (``rate`` None: all at t = 0) or as Poisson
    arrivals at ``rate`` req/s, and measure the completion rate (module docstring). The
    workload's own rate and arrival process are replaced; its length distribution, request
    count and seed are kept."""
    if workload.replay is not None:
        raise ValueError("overload throughput needs a synthetic workload, not a trace replay")
    if workload.num_requests is None:
        raise ValueError("overload throughput needs a request count (num_requests), not a duration")
    if rate is not None and not rate > 0:
        raise ValueError(f"rate must be > 0 req/s (or None for a backlog), got {rate!r}")
    loaded = replace(workload, rate=rate, arrival="poisson")
    run = run_simulation(loaded, deployment, record_iterations=False)
    return completion_rate(run.result.records)

"""Plain data of the engine: a request it serves, the events callers get, its counters."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

from fastpp.backends.torch.sampling import SamplingParams
from fastpp.plan import SchedulerStats
from fastpp.types import RequestRecord


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """New output tokens of one request and, on its last event only, why it ended.

    ``finish_reason`` is None while it runs, then one of ``length``, ``stop`` (a stop token),
    ``aborted``, ``rejected`` or ``error`` (the engine failed; ``detail`` says how).
    """

    req_id: int
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    detail: str = ""


@dataclass(slots=True)
class ActiveRequest:
    """What the engine keeps per request besides the scheduler's counters."""

    req_id: int
    tokens: list[int]  # prompt then generated tokens: the input of every microbatch it is in
    prompt_len: int
    params: SamplingParams
    stop_ids: frozenset[int]
    on_event: Callable[[EngineEvent], None]
    unsent: list[int] = field(default_factory=list)  # sampled, not yet passed to on_event


# Bucket bounds (seconds) from 1 ms: vLLM's TTFT buckets; its ITL and request-latency buckets
# with millisecond bounds below theirs, for small models on fast hardware.
TTFT_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TPOT_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)  # TPOT and ITL
LATENCY_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)  # E2E and queue time


@dataclass(slots=True)
class Histogram:
    """Fixed buckets (upper bounds), as Prometheus histograms: constant memory however long it runs."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; last = +Inf
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def add(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def copy(self) -> Histogram:
        return Histogram(self.bounds, list(self.counts), self.total, self.n)


@dataclass(slots=True)
class EngineCounters:
    """Monotonic counters, sums and histograms for /metrics (written by the engine thread only)."""

    num_stages: int
    prompt_tokens: int = 0
    generated_tokens: int = 0
    microbatches: int = 0
    num_ended: int = 0
    ended: dict[str, int] = field(default_factory=dict)  # finish reason -> requests
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))  # completed requests
    tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS_S))
    chunk_budgets: dict[int, int] = field(default_factory=dict)  # C the policy chose -> microbatches
    itl: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS_S))  # every token gap
    e2e: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))  # arrival -> end
    queue: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))  # arrival -> scheduled

    def count_end(self, reason: str, rec: RequestRecord | None) -> None:
        """One request ended; ``rec`` None when the engine failed under it."""
        self.num_ended += 1
        self.ended[reason] = self.ended.get(reason, 0) + 1
        if rec is None:
            return
        if rec.ttft_s is not None:
            self.ttft.add(rec.ttft_s)
        if rec.tpot_s is not None:
            self.tpot.add(rec.tpot_s)
        times = rec.token_times
        for a, b in zip(times, times[1:], strict=False):
            self.itl.add(b - a)
        if rec.finished_at is not None:
            self.e2e.add(rec.finished_at - rec.arrived_at)
        if rec.scheduled_at is not None:
            self.queue.add(rec.scheduled_at - rec.arrived_at)

    def relabel_end(self, was: str, now: str) -> None:
        """One request counted as ended for ``was`` ended for ``now`` instead."""
        self.ended[was] -= 1
        self.ended[now] = self.ended.get(now, 0) + 1

    def copy(self) -> EngineCounters:
        """An independent copy (the engine thread publishes one; readers never see it change)."""
        return EngineCounters(
            self.num_stages,
            self.prompt_tokens,
            self.generated_tokens,
            self.microbatches,
            self.num_ended,
            dict(self.ended),
            self.ttft.copy(),
            self.tpot.copy(),
            dict(self.chunk_budgets),
            self.itl.copy(),
            self.e2e.copy(),
            self.queue.copy(),
        )


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """What other threads (/metrics, admission) read of the engine: published by the engine
    thread after each pass of its loop, never changed after."""

    stats: SchedulerStats
    counters: EngineCounters
    stage_busy_s: tuple[float, ...]  # compute seconds per stage
    stage0_free_blocks: int

"""SimPy model of one pipeline-parallel (or tensor-parallel) deployment serving a workload.

Scenario: requests arrive (a workload's arrival times); the scheduler host, on stage 0's
machine, forms a microbatch for each free slot and pays ``host_overhead_s`` per launch; every
stage is a FIFO server that computes microbatches in order, for a time the profile's cost model
gives from the microbatch's token counts and ALP features; activations then cross a link to the
next stage (alpha-beta cost, one transfer at a time per link, overlapping the sender's next
compute); after the last stage the sampled tokens travel back to the scheduler
(``token_return_s``), which folds them in with ``Scheduler.update``.

What it exercises: the very Scheduler, ChunkPolicy and DecodeBalancer objects a real engine
uses; unequal stages (layer remainders, embedding on the first, LM head and sampling on the
last); bubbles, measured as per-stage idle time. A TP deployment is the same model with a
single stage whose cost includes its all-reduces.

Units: seconds of virtual time.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import simpy

from fastpp.metrics import bubble_fraction
from fastpp.pipeline import PipelineDriver
from fastpp.plan import MicroBatchPlan
from fastpp.profile import Profile
from fastpp.scheduler import Scheduler
from fastpp.types import IterationRecord, Request, RequestRecord

ProgressFn = Callable[[int, int], None]  # (requests ended, total requests)
PROGRESS_EVERY = 256  # report progress every this many returned microbatches


@dataclass(slots=True)
class SimResult:
    """Everything a run produced. Times in seconds of virtual time."""

    records: list[RequestRecord]
    iterations: list[IterationRecord]
    stage_busy_s: list[float]  # compute time per stage
    end_at: float  # virtual time when the last request ended
    num_microbatches: int
    num_retractions: int
    num_decode_sitouts: int
    wall_s: float  # real seconds the simulation took
    events: int = 0  # SimPy events processed (for the speed report)
    notes: list[str] = field(default_factory=list)

    @property
    def start_at(self) -> float:
        """The first arrival: the start of the window bubble fractions are measured over."""
        return min((r.arrived_at for r in self.records), default=0.0)

    @property
    def bubble_fraction(self) -> list[float]:
        """Per stage: share of [first arrival, end] the stage sat idle."""
        return bubble_fraction(self.stage_busy_s, self.start_at, self.end_at)


class _Stage:
    """A FIFO server: an inbox of (plan, ready_at, costs) and a wake-up event."""

    __slots__ = ("inbox", "wake", "link_free_at")

    def __init__(self) -> None:
        self.inbox: deque[tuple[MicroBatchPlan, float, list[float]]] = deque()
        self.wake: simpy.Event | None = None
        self.link_free_at = 0.0  # when the outgoing link finishes its current transfer


class PipelineSimulation:
    """Run ``requests`` through ``scheduler`` on the deployment described by ``profile``."""

    def __init__(
        self,
        profile: Profile,
        scheduler: Scheduler,
        requests: Sequence[Request],
        *,
        record_iterations: bool = True,
        max_time_s: float | None = None,
        noise_cv: float = 0.0,
        noise_seed: int = 0,
    ) -> None:
        if scheduler.config.num_slots != profile.pp:
            raise ValueError(
                f"scheduler has {scheduler.config.num_slots} slots but the profile has pp={profile.pp}"
            )
        self.profile = profile
        self.scheduler = scheduler
        self.requests = sorted(requests, key=lambda r: (r.arrived_at, r.req_id))
        self.record_iterations = record_iterations
        self.max_time_s = max_time_s
        if not 0.0 <= noise_cv < 1.0:
            raise ValueError(f"noise_cv must be in [0, 1), got {noise_cv!r}")
        # Real stage times jitter around the cost model; noise_cv > 0 multiplies each stage
        # time by a mean-one lognormal factor of that coefficient of variation (seeded).
        self._noise_sigma = math.sqrt(math.log1p(noise_cv * noise_cv))
        self._noise = random.Random(noise_seed)
        self.env = simpy.Environment()
        scheduler.clock = lambda: self.env.now
        self.stages = [_Stage() for _ in profile.stages]
        self.driver = PipelineDriver(scheduler, len(profile.stages), record_iterations=record_iterations)
        self._records: list[RequestRecord] = []
        self._host_wake: simpy.Event | None = None
        self._arrivals_done = False
        self._num_returned = 0
        self._token_return_s = profile.token_return_s if profile.pp > 1 else 0.0
        self._progress: ProgressFn | None = None

    # ------------------------------------------------------------------ processes
    def _arrivals(self):
        env, sched = self.env, self.scheduler
        for req in self.requests:
            if req.arrived_at > env.now:
                yield env.timeout(req.arrived_at - env.now)
            self._records.append(sched.add_request(req))
            self._wake_host()
        self._arrivals_done = True
        self._wake_host()

    def _host(self):
        """The scheduler loop on stage 0's host: launch into free slots (the driver's order)."""
        env, sched, driver = self.env, self.scheduler, self.driver
        overhead = self.profile.host_overhead_s
        while True:
            plan = driver.next_plan()
            if plan is None:
                if self._arrivals_done and not sched.has_work:
                    return
                self._host_wake = env.event()
                yield self._host_wake
                continue
            if overhead > 0:
                yield env.timeout(overhead)
            self._submit(plan)

    def _submit(self, plan: MicroBatchPlan) -> None:
        costs = [
            st.time_s(plan.num_tokens, plan.num_sampled, plan.sum_past_x_pre, plan.sum_pre_sq,
                      plan.sum_dec_ctx)
            for st in self.profile.stages
        ]
        sigma = self._noise_sigma
        if sigma > 0:
            gauss, mu = self._noise.gauss, -0.5 * sigma * sigma
            costs = [c * math.exp(mu + sigma * gauss(0.0, 1.0)) for c in costs]
        self._enqueue(0, plan, self.env.now, costs)

    def _enqueue(self, i: int, plan: MicroBatchPlan, ready_at: float, costs: list[float]) -> None:
        stage = self.stages[i]
        stage.inbox.append((plan, ready_at, costs))
        if stage.wake is not None and not stage.wake.triggered:
            stage.wake.succeed()

    def _stage(self, i: int):
        env = self.env
        stage = self.stages[i]
        last = i == len(self.stages) - 1
        link = self.profile.link
        act_bytes = self.profile.activation_bytes_per_token
        stage_finished = self.driver.stage_finished
        while True:
            if not stage.inbox:
                stage.wake = env.event()
                yield stage.wake
                stage.wake = None
                continue
            plan, ready_at, costs = stage.inbox.popleft()
            if ready_at > env.now:  # activations still on the wire
                yield env.timeout(ready_at - env.now)
            start = env.now
            yield env.timeout(costs[i])
            end = env.now
            stage_finished(plan, i, start, end)
            if not last:
                sent = max(end, stage.link_free_at) + link.time_s(plan.num_tokens * act_bytes)
                stage.link_free_at = sent
                self._enqueue(i + 1, plan, sent, costs)
            elif self._token_return_s > 0:
                back = env.timeout(self._token_return_s)
                back.callbacks.append(lambda _e, p=plan: self._on_return(p))
            else:
                self._on_return(plan)

    def _on_return(self, plan: MicroBatchPlan) -> None:
        self.driver.returned(plan)
        self._num_returned += 1
        if self._progress is not None and self._num_returned % PROGRESS_EVERY == 0:
            self._progress(self._num_ended(), len(self.requests))
        self._wake_host()

    def _wake_host(self) -> None:
        if self._host_wake is not None and not self._host_wake.triggered:
            self._host_wake.succeed()

    def _num_ended(self) -> int:
        return self.scheduler.num_ended

    # ------------------------------------------------------------------ run
    def run(self, progress: ProgressFn | None = None) -> SimResult:
        """Simulate until every request has ended (or ``max_time_s``, then abort the rest)."""
        self._progress = progress
        wall0 = time.perf_counter()
        env = self.env
        env.process(self._arrivals())
        host = env.process(self._host())
        for i in range(len(self.stages)):
            env.process(self._stage(i))
        notes: list[str] = []
        until = host if self.max_time_s is None else env.any_of([host, env.timeout(self.max_time_s)])
        env.run(until=until)
        sched = self.scheduler
        if sched.has_work or len(self._records) < len(self.requests):
            notes.append(f"stopped at the time limit {self.max_time_s} s; unfinished requests aborted")
            for req in self.requests[len(self._records):]:
                self._records.append(sched.add_request(req))
            sched.abort_all("run time limit reached")
        if progress is not None:
            progress(self._num_ended(), len(self.requests))
        stats = sched.stats()
        return SimResult(
            records=self._records,
            iterations=self.driver.iterations,
            stage_busy_s=list(self.driver.stage_busy_s),
            end_at=env.now,
            num_microbatches=stats.num_microbatches,
            num_retractions=stats.num_retractions,
            num_decode_sitouts=stats.num_decode_sitouts,
            wall_s=time.perf_counter() - wall0,
            notes=notes,
        )

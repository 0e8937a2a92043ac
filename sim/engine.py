"""SimPy model of one pipeline-parallel (or tensor-parallel) deployment serving a workload.

Scenario: requests arrive (a workload's arrival times); the scheduler host, on stage 0's
machine, forms a microbatch for each free slot and pays ``host_overhead_s`` per launch; every
stage is a FIFO server that computes microbatches in order, for a time the profile's cost model
gives from the microbatch's token counts and ALP features; activations then cross a link to the
next stage (alpha-beta cost, one transfer at a time per link, overlapping the sender's next
compute); after the last stage the sampled tokens travel back to the scheduler
(``token_return_s``), which folds them in with ``Scheduler.update``. A stage whose worker does
per-microbatch work outside its compute (receiving and preparing the input, sampling and sending
the output: ``stage_turnaround_s``, measured on the CPU engine) takes its next microbatch only
that long after its previous compute ended.

What it exercises: the very Scheduler, ChunkPolicy and DecodeBalancer objects a real engine
uses; unequal stages (layer remainders, embedding on the first, LM head and sampling on the
last); bubbles, measured as per-stage idle time. A TP deployment is the same model with a
single stage whose cost includes its all-reduces.

How time advances (sim/events.py, a SimPy environment): a microbatch's stage costs are fixed
when it is launched and every stage and link serves in launch order, so its whole passage is
known at launch: stage i starts at max(its activations' arrival, stage i's end of the previous
microbatch + its turnaround) and the link after it sends at max(stage end, link free). The
launch computes that tandem-queue recurrence and schedules one callback, the return, at which
the policies observe every stage's record and then the scheduler folds the tokens in: as in the
CPU engine, where stage times come back with the sampled tokens (a real scheduler cannot see a
stage end before then). No process waits on another, so every event is a callback-style SimPy
Timeout (an arrival, a return, the host looking for work), never a generator process to resume.
A launch needs no event of its own: while the host pays its overhead nothing else launches, so
the microbatch's passage is computed when the host takes it, starting when the overhead ends,
and the host looks for work again then only if a slot is free or something arrived or returned
meanwhile (otherwise that look would find nothing: about one event fewer per microbatch).

Units: seconds of virtual time.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fastpp.metrics import bubble_fraction
from fastpp.pipeline import BatchQueueDriver, PipelineDriver
from fastpp.plan import MicroBatchPlan
from fastpp.profile import Profile
from fastpp.scheduler import Scheduler
from fastpp.sim.events import EventClock
from fastpp.sim.limits import check_requests
from fastpp.types import FinishReason, IterationRecord, Request, RequestRecord


@dataclass(frozen=True, slots=True)
class HostLoop:
    """How the host launches microbatches (fastpp/pipeline.py). "free-slots" launches into any
    free slot as soon as the scheduler has work (our engines, SGLang's PP loop on GPUs);
    "batch-queue" is vLLM 0.32.0's engine-core loop (slots strictly in turn, blocking on the
    oldest output), measured in docs/engines/vllm.md section 6; "blocking-launch" is free-slots
    with a host that computes stage 0 itself (SGLang's PP loop on CPU, where run_batch returns
    only when the forward is done): while stage 0 computes, the host neither launches nor folds
    in returned tokens; they wait for it (docs/engines/sglang.md section 6)."""

    driver: type[PipelineDriver]  # slot order and when the host calls the scheduler
    computes_stage0: bool = False  # the host is busy while stage 0 computes what it launched


HOST_LOOPS: dict[str, HostLoop] = {
    "free-slots": HostLoop(PipelineDriver),
    "batch-queue": HostLoop(BatchQueueDriver),
    "blocking-launch": HostLoop(PipelineDriver, computes_stage0=True),
}

ProgressFn = Callable[[int, int], None]  # (requests ended, total requests)
PROGRESS_EVERY = 256  # report progress every this many returned microbatches
LOOK_STEP_S = 1.0  # run_until_ended checks the records this often, in virtual seconds
GIVE_UP_EVERY_S = 10.0  # ... and asks its give_up predicate this often
GiveUp = Callable[[Sequence[RequestRecord], float], bool]  # (arrived records, now) -> stop?


@dataclass(slots=True)
class SimResult:
    """Everything a run produced. Times in seconds of virtual time."""

    records: list[RequestRecord]
    iterations: Sequence[IterationRecord]  # an IterationLog (fastpp.iteration_log)
    stage_busy_s: list[float]  # compute time per stage
    end_at: float  # virtual time when the last request ended
    num_microbatches: int
    num_retractions: int
    num_decode_sitouts: int
    wall_s: float  # real seconds the simulation took
    cpu_s: float = 0.0  # CPU seconds of this process the simulation took
    events: int = 0  # callbacks the event clock ran (for the speed report)
    notes: list[str] = field(default_factory=list)

    @property
    def start_at(self) -> float:
        """The first arrival: the start of the window bubble fractions are measured over."""
        return min((r.arrived_at for r in self.records), default=0.0)

    @property
    def bubble_fraction(self) -> list[float]:
        """Per stage: share of [first arrival, end] the stage sat idle."""
        return bubble_fraction(self.stage_busy_s, self.start_at, self.end_at)


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
        host_loop: str = "free-slots",
    ) -> None:
        if host_loop not in HOST_LOOPS:
            raise ValueError(f"host_loop must be one of {', '.join(HOST_LOOPS)}, got {host_loop!r}")
        if scheduler.config.num_slots < profile.pp:  # more: microbatches wait at stage 0
            raise ValueError(
                f"scheduler has {scheduler.config.num_slots} slots, fewer than the profile's "
                f"pp={profile.pp} stages"
            )
        self.profile = profile
        self.scheduler = scheduler
        self.requests = sorted(requests, key=lambda r: (r.arrived_at, r.req_id))
        check_requests(self.requests)  # too many, or spread too thin: refused before running
        self.record_iterations = record_iterations
        if max_time_s is not None and not max_time_s > 0:  # NaN included
            raise ValueError(f"max_time_s must be > 0 seconds (or None: no limit), got {max_time_s!r}")
        self.max_time_s = max_time_s
        if not 0.0 <= noise_cv < 1.0:
            raise ValueError(f"noise_cv must be in [0, 1), got {noise_cv!r}")
        # Real stage times jitter around the cost model; noise_cv > 0 multiplies each stage
        # time by a mean-one lognormal factor of that coefficient of variation (seeded).
        self._noise_sigma = math.sqrt(math.log1p(noise_cv * noise_cv))
        self._noise = random.Random(noise_seed)
        self.clock = EventClock()
        env = self.clock.env
        scheduler.clock = lambda: env.now
        num_stages = len(profile.stages)
        loop = HOST_LOOPS[host_loop]
        self.driver = loop.driver(scheduler, num_stages, record_iterations=record_iterations)
        self._stage_costs = [st.cost_fn() for st in profile.stages]  # StageCost.time_s, faster
        self._stage_free_at = [0.0] * num_stages  # when each stage can take its next microbatch
        self._turnaround = list(profile.stage_turnaround_s)  # per stage, after each compute
        self._link_free_at = [0.0] * num_stages  # when the link after each stage is free
        # per slot in flight: its plan and each stage's (start, end), known at launch
        self._in_flight: dict[int, tuple[MicroBatchPlan, list[tuple[float, float]]]] = {}
        self._records: list[RequestRecord] = []
        self._next_arrival = 0  # index into self.requests
        self._host_busy = False  # blocking launch: computing stage 0
        self._host_free_at = 0.0  # paying a launch's overhead until then
        self._blocking_launch = loop.computes_stage0
        self._held_returns: list[int] = []  # blocking launch: slots returned while the host was busy
        self._host_woken = False  # a host step is already scheduled (now, or when the host is free)
        self._num_returned = 0
        self._token_return_s = profile.token_return_s if profile.pp > 1 else 0.0
        self._progress: ProgressFn | None = None
        self._started = False  # first arrival and first host look scheduled
        self._first_unended = 0  # run_until_ended: records before this index have ended
        self.gave_up = False  # the last run_until_ended stopped on its give_up predicate

    # ------------------------------------------------------------------ arrivals
    def _arrive(self, _: object = None) -> None:
        """Add every request due now (equal arrival times come in together), then wake the host
        and schedule the next arrival."""
        sched, reqs, now = self.scheduler, self.requests, self.clock.now
        i = self._next_arrival
        while i < len(reqs) and reqs[i].arrived_at <= now:
            self._records.append(sched.add_request(reqs[i]))
            i += 1
        self._next_arrival = i
        if i < len(reqs):
            self.clock.at(reqs[i].arrived_at, self._arrive)
        self._wake_host()

    @property
    def _arrivals_done(self) -> bool:
        return self._next_arrival == len(self.requests)

    # ------------------------------------------------------------------ the host
    def _wake_host(self) -> None:
        """Something changed (an arrival, a return): the host looks for work at this instant,
        after what is already due now, or, while it pays a launch's overhead, when that ends;
        a blocking launch's host looks when stage 0 is done (``_stage0_done``). With nothing
        else due now it looks at once (the same order, one event fewer)."""
        if not self._host_busy and not self._host_woken:
            clock = self.clock
            now = clock.now
            if now < self._host_free_at:
                self._host_woken = True
                clock.at(self._host_free_at, self._host_step)
            elif clock.next_at() > now:
                self._host_step()
            else:
                self._host_woken = True
                clock.at(now, self._host_step)

    def _host_step(self, _: object = None) -> None:
        """The scheduler loop on stage 0's host: launch into free slots (the driver's order),
        paying ``host_overhead_s`` per launch; idle when no slot has anything to run.

        A launch with overhead: the plan is formed now and enters stage 0 when the overhead
        ends. Nothing else launches meanwhile, so its passage is computed now (as at the end of
        the overhead: the stages and links it meets are those of the launches before it), and
        the host looks again when the overhead ends only if the driver may launch then
        (``may_launch``: a free slot) or an arrival or a return wakes it meanwhile; otherwise
        that look would find nothing to run."""
        self._host_woken = False
        overhead = self.profile.host_overhead_s
        while (plan := self.driver.next_plan()) is not None:
            if overhead > 0:
                launch_at = self.clock.now + overhead
                self._submit(plan, launch_at)
                if not self._host_busy:  # (a blocking launch's host looks when stage 0 is done)
                    self._host_free_at = launch_at
                    if self.driver.may_launch():
                        self._wake_host()
                return
            self._submit(plan, self.clock.now)
            if self._host_busy:  # blocking launch: computing stage 0
                return

    def _stage0_done(self, _: object = None) -> None:
        """Blocking launch: the host is back from stage 0's compute; it folds in the tokens that
        returned meanwhile (in the order they came back), then looks for work."""
        self._host_busy = False
        held, self._held_returns = self._held_returns, []
        for slot in held:
            self._fold_in(slot)
        self._wake_host()

    # ------------------------------------------------------------------ the stages
    def _submit(self, plan: MicroBatchPlan, ready: float) -> None:
        """Send ``plan`` down the pipeline, its input on stage 0 at ``ready`` (now, or when the
        launch overhead ends): its cost on every stage, then the tandem-queue recurrence
        (module docstring) gives each stage's start and end."""
        stages = self.profile.stages
        n, sampled, px, sq, dec = (
            plan.num_tokens,
            plan.num_sampled,
            plan.sum_past_x_pre,
            plan.sum_pre_sq,
            plan.sum_dec_ctx,
        )
        costs = [cost.time_s(n, sampled, px, sq, dec) for cost in self._stage_costs]
        sigma = self._noise_sigma
        if sigma > 0:
            gauss, mu = self._noise.gauss, -0.5 * sigma * sigma
            costs = [c * math.exp(mu + sigma * gauss(0.0, 1.0)) for c in costs]
        link_s = (
            self.profile.link.time_s(plan.num_tokens * self.profile.activation_bytes_per_token)
            if len(stages) > 1
            else 0.0
        )
        stage_free, link_free, turnaround = self._stage_free_at, self._link_free_at, self._turnaround
        # ``ready``: when the microbatch's input is on the stage
        last = len(stages) - 1
        times = []
        for i, cost in enumerate(costs):
            start = max(ready, stage_free[i])
            end = start + cost
            stage_free[i] = end + turnaround[i]
            times.append((start, end))
            if i < last:
                ready = link_free[i] = max(end, link_free[i]) + link_s
        self._in_flight[plan.slot] = (plan, times)
        self.clock.at(end + self._token_return_s, self._on_return, plan.slot)
        if self._blocking_launch:
            self._host_busy = True
            self.clock.at(times[0][1], self._stage0_done)

    def _on_return(self, slot: int) -> None:
        """The sampled tokens of ``slot``'s microbatch are back, with every stage's (start,
        end): the policies observe those, then the scheduler folds the tokens in (a blocking
        launch's busy host does that when it is free)."""
        if self._blocking_launch and self._host_busy:
            self._held_returns.append(slot)
            return
        self._fold_in(slot)
        self._wake_host()

    def _fold_in(self, slot: int) -> None:
        plan, times = self._in_flight.pop(slot)
        self.driver.stages_finished(plan, times)
        self.driver.returned(plan)
        self._num_returned += 1
        if self._progress is not None and self._num_returned % PROGRESS_EVERY == 0:
            self._progress(self.scheduler.num_ended, len(self.requests))

    # ------------------------------------------------------------------ run
    def run(self, progress: ProgressFn | None = None) -> SimResult:
        """Simulate until every request has ended (or ``max_time_s``, then abort the rest)."""
        self._progress = progress
        wall0, cpu0 = time.perf_counter(), time.process_time()
        self._start()
        clock = self.clock
        finished = clock.run(math.inf if self.max_time_s is None else self.max_time_s)
        notes: list[str] = []
        sched = self.scheduler
        if not finished:
            notes.append(f"stopped at the time limit {self.max_time_s} s; unfinished requests aborted")
            for plan, times in self._in_flight.values():  # the stages that ended before the limit
                self.driver.stages_finished(plan, [t for t in times if t[1] < clock.now])
            for req in self.requests[len(self._records) :]:
                self._records.append(sched.add_request(req))
            sched.abort_all("run time limit reached")
        rejected = [r for r in self._records if r.finish_reason == FinishReason.REJECTED]
        if rejected:
            notes.append(
                f"{len(rejected)} of {len(self.requests)} requests rejected on arrival (the first: "
                f"{rejected[0].detail}); each one's reason is its detail in requests.jsonl"
            )
        if progress is not None:
            progress(sched.num_ended, len(self.requests))
        stats = sched.stats()
        return SimResult(
            records=self._records,
            iterations=self.driver.iterations,
            stage_busy_s=list(self.driver.stage_busy_s),
            end_at=clock.now,
            num_microbatches=stats.num_microbatches,
            num_retractions=stats.num_retractions,
            num_decode_sitouts=stats.num_decode_sitouts,
            wall_s=time.perf_counter() - wall0,
            cpu_s=time.process_time() - cpu0,
            events=clock.num_events,
            notes=notes,
        )

    def run_until_ended(self, count: int, give_up: GiveUp | None = None) -> list[RequestRecord]:
        """Simulate until the first ``count`` requests by arrival have all ended, the later ones
        arriving meanwhile as they would in a longer run, and return those ``count`` records
        (final: a record no longer changes once its request has ended). Call again with a larger
        ``count`` to look further: the run goes on from where it stopped, so looking at n, then
        2n requests costs one run of 2n, and the first n are judged amid the load that follows
        them instead of a queue that drains (fastpp.sim.goodput's converging probes).

        ``give_up(records, now)`` is asked every ``GIVE_UP_EVERY_S`` virtual seconds with the
        records of those of the first ``count`` requests that have arrived; when it answers
        True the run stops there and returns them as they stand (some not ended), and
        ``gave_up`` is True until the next call. A later call goes on from that point as if it
        had never stopped."""
        if not 0 <= count <= len(self.requests):
            raise ValueError(f"count must be in [0, {len(self.requests)}] requests, got {count}")
        self._start()
        self.gave_up = False
        clock, records = self.clock, self._records
        # step virtual time in LOOK_STEP_S strides; records end out of order, so a pointer
        # skips the leading ended ones (amortised O(1) a look)
        next_ask = clock.now + GIVE_UP_EVERY_S
        while True:
            i = self._first_unended
            while i < len(records) and records[i].finish_reason is not None:
                i += 1
            self._first_unended = i
            if i >= count:
                break
            if give_up is not None and clock.now >= next_ask:
                next_ask = clock.now + GIVE_UP_EVERY_S
                if give_up(records[:count], clock.now):
                    self.gave_up = True
                    break
            if clock.run(clock.now + LOOK_STEP_S):
                break
        return records[:count]

    def _start(self) -> None:
        """Schedule the first arrival and the host's first look (once per simulation)."""
        if self._started:
            return
        self._started = True
        if self.requests:
            self.clock.at(self.requests[0].arrived_at, self._arrive)
        self._wake_host()  # the host's first look, after the arrivals due at time 0

"""Our policies over vLLM's requests: vLLM's side of the policy host (fastpp/policy_host.py).

vLLM keeps its queues, KV blocks and token counters; the ``PolicyHost`` keeps the policies,
records, signals and the decision step, as in every executor; this module translates between
the two (level 2 of the executor contract, fastpp/policy_host_contract.py):

* Slots. vLLM's engine core keeps up to ``pp`` scheduled batches in a FIFO batch queue and
  calls ``schedule()`` once per step, empty steps included, so the batches in the queue at any
  time are consecutive calls. We number the calls and call ``seq % pp`` the slot: batches in
  the pipeline together always have distinct slots, and a decode whose token came back from
  slot s is next schedulable exactly when slot s launches again (docs/engines/vllm.md proves
  both from core.py). A request joins the slot where its last prefill chunk ran, as in our
  Scheduler, and leaves it when it ends, is preempted or is parked.
* The decision (``begin_step``): the host's ``begin_step`` for the slot (balance, liveness,
  C, the decodes that ride: ``DecodeSlots.pick``), with C capped at vLLM's
  ``max_num_batched_tokens``. Translated here into vLLM's terms: every other decoding request
  is held out of this step; vLLM fills what is left of C with prefill its own way.
* What ran (``launched``): read from vLLM's SchedulerOutput (``num_scheduled_tokens``), never
  from the decision, as the host's ``BatchFeatures``; the decision log keeps both, so tests can
  compare them.
* The return (``returned``): vLLM's own request counters after its ``update_from_output``
  become the host's token, end and join events; the stage times of the microbatch become the
  host's stage records, which the policies observe.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastpp.backends.vllm.tracked import TrackedRequest
from fastpp.decode_slots import DecodeSlots
from fastpp.iteration_log import Head
from fastpp.policies.base import ChunkPolicy, DecodeBalancer
from fastpp.policy_host import BatchFeatures, PolicyHost
from fastpp.policy_host_records import RequestLog
from fastpp.scheduler_config import SchedulerConfig, late_thresholds
from fastpp.types import FinishReason, IterationRecord, RequestRecord
from fastpp.waiting_queue import late_last_reorder

log = logging.getLogger("fastpp.vllm")


class EngineQueues(Protocol):
    """What the adapter reads of the engine's own state (``FastPPScheduler`` over vLLM)."""

    def engine_waiting(self) -> Iterable[Any]:
        """vLLM requests not admitted (no KV), in the order vLLM will admit them."""
        ...

    def engine_running(self) -> list[Any]:
        """vLLM's running list (admitted requests holding KV), in vLLM's order."""
        ...

    def kv_total_tokens(self) -> int: ...

    def kv_free_tokens(self) -> int: ...


class Recorder(Protocol):
    """Where the adapter reports what happened (``recorder.RunRecorder``)."""

    def on_decision(self, entry: dict) -> None: ...

    def on_return(self, entry: dict) -> None: ...

    def on_iteration(self, rec: IterationRecord) -> None: ...

    def on_request_end(self, rec: RequestRecord) -> None: ...


@dataclass(frozen=True, slots=True)
class StepDecision:
    """What our policies want from the ``schedule()`` call about to run."""

    seq: int  # schedule() call number, from 0; also the microbatch id
    slot: int
    budget: int  # C, capped at max_num_batched_tokens
    reason: str  # the chunk policy's reason (or the fallback's)
    decode_ids: frozenset[str]  # engine ids of the slot's decodes that ride this step
    held_ids: frozenset[str]  # engine ids of every other decoding request (held out this step)
    balance: str  # the balancer's reason, "" when it did nothing
    started_at: float = 0.0  # clock when schedule() was entered (host-side timing)


@dataclass(slots=True)
class LaunchedBatch:
    """One scheduled step as vLLM scheduled it, until its output returns."""

    decision: StepDecision
    output: Any  # vLLM's SchedulerOutput (identity-checked at the return)
    scheduled_at: float
    decodes: list[TrackedRequest]
    prefill: list[tuple[TrackedRequest, bool]]  # (request, whether this chunk completes it)
    features: BatchFeatures
    head: Head  # its stage records' shared fields (BatchFeatures.head)

    @property
    def slot(self) -> int:
        return self.decision.slot

    @property
    def mb_id(self) -> int:
        return self.decision.seq

    @property
    def num_tokens(self) -> int:
        return self.features.num_tokens


@dataclass(slots=True)
class AdapterCounters:
    """vLLM-side counts worth a log line and a test assertion (the decision counts are the
    host's: ``Adapter.host.counters``)."""

    steps: int = 0  # schedule() calls
    empty_steps: int = 0  # calls that scheduled nothing
    preemptions: int = 0
    unexpected_decodes: int = 0  # decodes vLLM scheduled that the decision did not pick
    missing_stage_times: int = 0  # microbatches returned without the workers' stage times
    late_reorders: int = 0  # steps before which queue order late_last moved a request


class Adapter:
    """vLLM's translation to and from the policy host of one engine core. Not thread-safe:
    vLLM's engine core calls the scheduler from one thread."""

    def __init__(
        self,
        config: SchedulerConfig,
        chunk_policy: ChunkPolicy,
        balancer: DecodeBalancer,
        engine: EngineQueues,
        clock: Callable[[], float],
        *,
        max_budget: int,
        recorder: Recorder | None = None,
        stage_times: Callable[[int], dict[int, tuple[float, float]] | None] | None = None,
    ) -> None:
        from fastpp.backends.vllm.view import VllmView  # the view reads the adapter's state

        if max_budget < 1:
            raise ValueError(f"max_budget must be >= 1 token, got {max_budget}")
        self.config = config
        self.engine = engine
        self.clock = clock
        self.max_budget = max_budget
        self.recorder = recorder
        self.stage_times = stage_times
        self.in_flight: deque[LaunchedBatch] = deque()  # scheduled steps, oldest first
        self.slots = DecodeSlots(config.num_slots, self.any_in_flight)
        self.host = PolicyHost(config, chunk_policy, balancer, self.slots, fit_budget=self._fit)
        self.policies = self.host.policies
        self.signals = self.host.signals
        self.tracked: dict[str, TrackedRequest] = {}  # by vLLM request id, until the request ends
        self.counters = AdapterCounters()
        self.view = self.host.view = VllmView(self)
        self._next_req_id = 0
        self._seq = 0
        self._late_after, self._late_max_wait = late_thresholds(config)

    # ------------------------------------------------------------------ queue order
    def order_waiting(self, waiting: deque[Any]) -> bool:
        """Queue order late_last (``SchedulerConfig.queue_order``): vLLM admits from the head
        of its FCFS deque, so before each step the deque is put in ``late_last_order``, the
        order our own scheduler admits in. A request is late once it has waited the SLO TTFT
        (since its arrival on our clock) without a first token; a preempted request that had
        one never is. True when a request moved. Under "fcfs" the deque is left as it is."""
        tracked = self.tracked

        def arrived_at(r: Any) -> float:
            t = tracked.get(r.request_id)
            return t.rec.arrived_at if t is not None else self.engine_time(r.arrival_time)

        def has_first_token(r: Any) -> bool:
            return r.num_output_tokens > 0

        order = late_last_reorder(
            waiting, self.clock(), self._late_after, self._late_max_wait, arrived_at, has_first_token
        )
        if order is None:
            return False
        waiting.clear()
        waiting.extend(order)
        self.counters.late_reorders += 1
        return True

    # ------------------------------------------------------------------ arrivals and ends
    def arrive(self, engine_req: Any) -> TrackedRequest:
        """A request reached the scheduler (vLLM's ``add_request``)."""
        now = self.clock()
        arrived_at = min(now, self.engine_time(engine_req.arrival_time))
        rec = self.host.arrive(
            self._next_req_id, arrived_at, engine_req.num_prompt_tokens, max(1, int(engine_req.max_tokens))
        )
        self._next_req_id += 1
        t = TrackedRequest(rec, engine_req)
        self.tracked[engine_req.request_id] = t
        return t

    def engine_time(self, wall_s: float) -> float:
        """A ``time.time()`` instant (vLLM's arrival times) on our clock."""
        return wall_s - self.epoch

    @property
    def epoch(self) -> float:
        return getattr(self.clock, "epoch", 0.0)

    def ended(self, engine_id: str, reason: FinishReason, detail: str = "") -> None:
        """The request ended outside a return (an abort): free its slot, close its record."""
        t = self.tracked.get(engine_id)
        if t is not None:
            self._end(t, self.clock(), reason, detail)

    def preempted(self, engine_id: str) -> None:
        """vLLM freed the request's KV; it waits to be recomputed and then rejoins a slot."""
        t = self.tracked.get(engine_id)
        if t is None:
            return
        self.slots.leave(t)
        RequestLog.retracted(t.rec)
        self.counters.preemptions += 1

    def _end(self, t: TrackedRequest, now: float, reason: FinishReason, detail: str) -> None:
        if t.ended:
            return
        t.ended = True
        self.slots.leave(t)
        RequestLog.end(t.rec, now, reason, detail)
        self.host.records.forget(t.rec.req_id)
        del self.tracked[t.engine_id]
        if self.recorder is not None:
            self.recorder.on_request_end(t.rec)

    # ------------------------------------------------------------------ the decision
    def begin_step(self, slot: int | None = None) -> StepDecision:
        """The host's decision for this ``schedule()`` call, in vLLM's terms. ``slot``: the
        call number mod pp unless given (a replay of another executor's slot order)."""
        now = self.clock()
        seq = self._seq
        self._seq += 1
        if slot is None:
            slot = seq % self.config.num_slots
        self.view.begin(now, slot)
        d = self.host.begin_step(slot, now)
        picked = frozenset(t.engine_id for t in d.decodes)
        held = frozenset(eid for eid, t in self.tracked.items() if t.is_decoding and eid not in picked)
        return StepDecision(seq, slot, d.budget, d.reason, picked, held, d.balance, now)

    def _fit(self, budget: int, reason: str) -> tuple[int, str]:
        return min(budget, self.max_budget), reason

    # ------------------------------------------------------------------ what vLLM scheduled
    def launched(self, decision: StepDecision, output: Any, num_scheduled: dict[str, int]) -> LaunchedBatch:
        """vLLM's ``schedule()`` returned ``output``; ``num_scheduled`` is its
        ``num_scheduled_tokens`` (engine id -> tokens). Counters of the requests in it were
        already advanced by vLLM (``_update_after_schedule``)."""
        now = self.clock()
        decodes: list[TrackedRequest] = []
        prefill: list[tuple[TrackedRequest, bool]] = []
        chunks: list[tuple[int, int, bool]] = []
        for eid, n in num_scheduled.items():
            t = self.tracked.get(eid)
            if t is None:
                continue  # not ours (cannot happen: every request passes add_request)
            if t.is_decoding:
                if eid not in decision.decode_ids:
                    self.counters.unexpected_decodes += 1
                decodes.append(t)
                continue
            engine = t.engine
            completes = engine.num_computed_tokens >= engine.num_tokens
            prefill.append((t, completes))
            chunks.append((engine.num_computed_tokens - n, n, completes))
            RequestLog.scheduled(t.rec, now)
        features = BatchFeatures.of([t.ctx_len for t in decodes], chunks)
        head = self.host.launched(decision.seq, decision.slot, features, decision.budget, decision.reason)
        batch = LaunchedBatch(decision, output, now, decodes, prefill, features, head)
        self.counters.steps += 1
        if features.num_tokens == 0:
            self.counters.empty_steps += 1
        self.in_flight.append(batch)
        if self.recorder is not None:
            self.recorder.on_decision(self._decision_entry(batch, num_scheduled))
        return batch

    def _decision_entry(self, batch: LaunchedBatch, num_scheduled: dict[str, int]) -> dict:
        d = batch.decision
        return {
            "mb_id": d.seq,
            "slot": d.slot,
            "at": round(batch.scheduled_at, 6),
            "schedule_started_at": round(d.started_at, 6),
            "budget": d.budget,
            "reason": d.reason,
            "balance": d.balance,
            "chosen_decodes": sorted(d.decode_ids),
            "scheduled": dict(num_scheduled),  # vLLM's SchedulerOutput.num_scheduled_tokens
            "scheduled_decodes": sorted(t.engine_id for t in batch.decodes),
            "total_scheduled": batch.num_tokens,
            "running": [self.view.num_running(s) for s in range(self.config.num_slots)],
            "parked": len(self.slots.parked),
        }

    # ------------------------------------------------------------------ the return
    def returned(self, output: Any, update_started_at: float | None = None) -> LaunchedBatch:
        """vLLM folded in the step that scheduled ``output`` (its ``update_from_output`` ran,
        entered at ``update_started_at`` on our clock, if the caller timed it)."""
        if not self.in_flight or self.in_flight[0].output is not output:
            raise RuntimeError(
                "update_from_output for a step that is not the oldest in flight: "
                "vLLM's batch queue is no longer FIFO (docs/engines/vllm.md)"
            )
        batch = self.in_flight.popleft()
        now = self.clock()
        self._stage_records(batch, now)
        slot = batch.slot
        stayed = []
        for t in batch.decodes:
            if t.ended:
                continue
            self._take_tokens(t, now)
            if self._end_if_finished(t, now):
                continue
            if t.slot == slot:  # not preempted meanwhile
                stayed.append(t)
        for t in stayed:  # each fed one token: its context grew by one
            t.ctx_len += 1
        self.slots.decoded(slot, len(stayed))
        for t, completes in batch.prefill:
            if t.ended or not completes:
                continue
            got = self._take_tokens(t, now)
            if self._end_if_finished(t, now) or not got or t.is_decoding or not is_running(t.engine):
                continue  # preempted while in flight: it is recomputed before it decodes
            t.ctx_len = t.engine.num_tokens
            self.slots.join(t, slot)
        if batch.num_tokens:  # an empty step ran nothing: no microbatch came back
            self.host.returned(slot, now, bool(batch.decodes))
        if self.recorder is not None:
            self.recorder.on_return(
                {
                    "mb_id": batch.mb_id,
                    "slot": slot,
                    "num_tokens": batch.num_tokens,
                    "update_started_at": None if update_started_at is None else round(update_started_at, 6),
                    "returned_at": round(now, 6),
                    "done_at": round(self.clock(), 6),
                }
            )
        return batch

    def _take_tokens(self, t: TrackedRequest, now: float) -> int:
        """Fold in the tokens vLLM appended to ``t`` since we last looked; returns how many."""
        return self.host.records.took(t.rec, t.engine.num_output_tokens, now)

    def _end_if_finished(self, t: TrackedRequest, now: float) -> bool:
        reason = finish_reason_of(t.engine)
        if reason is None:
            return False
        self._end(t, now, *reason)
        return True

    def _stage_records(self, batch: LaunchedBatch, now: float) -> None:
        if batch.num_tokens == 0:
            return
        times = self.stage_times(batch.mb_id) if self.stage_times is not None else None
        if not times:
            self.counters.missing_stage_times += 1
            return
        prev_end = None
        spans = []
        for stage in sorted(times):
            t0, t1 = (self.engine_time(x) for x in times[stage])
            # A later stage's call starts waiting for the activations; its compute starts when
            # the previous stage's ends (the transfer between processes on one host is short).
            started = t0 if prev_end is None else max(t0, prev_end)
            spans.append((stage, started, max(started, t1)))
            prev_end = t1
        for rec in self.host.stage_records(batch.head, spans):
            if self.recorder is not None:
                self.recorder.on_iteration(rec)

    # ------------------------------------------------------------------ queries
    def iter_tracked(self, engine_reqs: Iterable[Any]) -> Iterator[TrackedRequest]:
        tracked = self.tracked
        for r in engine_reqs:
            t = tracked.get(r.request_id)
            if t is not None:
                yield t

    def any_in_flight(self) -> bool:
        """A step that computes something is in the pipeline (empty steps pass at once)."""
        return any(b.num_tokens for b in self.in_flight)

    def slot_in_flight(self, slot: int) -> bool:
        return any(b.slot == slot and b.num_tokens for b in self.in_flight)


# vLLM's RequestStatus names of finished requests -> our FinishReason (and a detail)
_FINISHED: dict[str, tuple[FinishReason, str]] = {
    "FINISHED_STOPPED": (FinishReason.STOP, ""),
    "FINISHED_LENGTH_CAPPED": (FinishReason.LENGTH, ""),
    "FINISHED_ABORTED": (FinishReason.ABORTED, "aborted by client"),
    "FINISHED_IGNORED": (FinishReason.REJECTED, "ignored by vLLM (prompt too long for the KV cache)"),
    "FINISHED_ERROR": (FinishReason.ABORTED, "vLLM reported an error"),
    "FINISHED_REPETITION": (FinishReason.STOP, "repetition detected"),
}


def is_running(engine_req: Any) -> bool:
    """True while vLLM holds the request in its running list (admitted, with KV)."""
    return getattr(engine_req.status, "name", str(engine_req.status)) == "RUNNING"


def finish_reason_of(engine_req: Any) -> tuple[FinishReason, str] | None:
    """Our reason for a finished vLLM request, None while it runs."""
    name = getattr(engine_req.status, "name", str(engine_req.status))
    if not name.startswith("FINISHED"):
        return None
    return _FINISHED.get(name, (FinishReason.ABORTED, f"vLLM status {name}"))


@dataclass(slots=True)
class WallClock:
    """Seconds since ``epoch`` (a ``time.time()`` instant): vLLM stamps arrivals with
    ``time.time()``, so our clock must be on the same base."""

    epoch: float
    now_fn: Callable[[], float] = field(repr=False, default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.now_fn is None:
            import time

            self.now_fn = time.time

    def __call__(self) -> float:
        return self.now_fn() - self.epoch

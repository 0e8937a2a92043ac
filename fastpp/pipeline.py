"""The loop every pipeline executor runs around a Scheduler, written once.

The simulator (virtual time) and the CPU engine (real stage processes) both drive the Scheduler
through a ``PipelineDriver``, so these rules hold in both:

* Slot order: free slots are tried round-robin, starting after the slot that launched last
  (SGLang's PP loop walks its microbatches in the same cyclic order).
* Launch: ``next_plan`` forms at most one microbatch per call; a slot whose ``schedule`` has
  nothing to run is skipped.
* Stage records: each stage's (start, end) of a microbatch becomes one IterationRecord, built
  from the plan here and nowhere else, observed by the policies at once.
* Return: ``returned`` folds the sampled tokens in (``Scheduler.update``); every stage record of
  a microbatch is reported before its return (the executor's duty).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from fastpp.iteration_log import Head, IterationLog, make_head, make_record
from fastpp.plan import MicroBatchPlan, StepOutput
from fastpp.scheduler import Scheduler
from fastpp.types import IterationRecord


def microbatch_head(plan: MicroBatchPlan) -> Head:
    """The fields every stage record of ``plan`` shares (``fastpp.iteration_log``)."""
    return make_head(
        plan.mb_id,
        plan.slot,
        plan.num_tokens,
        plan.num_prefill_tokens,
        len(plan.decode_req_ids),
        plan.sum_past_x_pre,
        plan.sum_pre_sq,
        plan.sum_dec_ctx,
        plan.chunk_budget,
        plan.reason,
        plan.num_sampled,
    )


def iteration_record(
    plan: MicroBatchPlan, stage: int, started_at: float, finished_at: float
) -> IterationRecord:
    """The IterationRecord of ``plan`` on ``stage`` between the two instants (seconds)."""
    return make_record(microbatch_head(plan), stage, started_at, finished_at)


class PipelineDriver:
    """Launch order, stage records and returns of one pipeline around ``scheduler``.

    ``stage_busy_s`` accumulates each stage's compute seconds; with ``record_iterations`` every
    stage record is kept in ``iterations`` (a run's iterations file and timeline).
    """

    def __init__(self, scheduler: Scheduler, num_stages: int, *, record_iterations: bool = True) -> None:
        if num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {num_stages}")
        self.scheduler = scheduler
        self.num_stages = num_stages
        self.record_iterations = record_iterations
        self.iterations = IterationLog()
        self.stage_busy_s = [0.0] * num_stages
        self._num_slots = scheduler.config.num_slots
        self._next_slot = 0

    def next_plan(self) -> MicroBatchPlan | None:
        """The next microbatch to launch, or None when no free slot has anything to run."""
        sched = self.scheduler
        n = self._num_slots
        for i in range(n):
            slot = (self._next_slot + i) % n
            if sched.is_slot_free(slot):
                plan = sched.schedule(slot)
                if plan is not None:
                    self._next_slot = (slot + 1) % n
                    return plan
        return None

    def may_launch(self) -> bool:
        """Whether ``next_plan`` could launch anything (or change any state) now: False only
        when it would surely return None with no effect, so an executor may skip that call
        until something arrives or returns. Here: some slot is free."""
        return any(self.scheduler.is_slot_free(slot) for slot in range(self._num_slots))

    def stage_finished(
        self, plan: MicroBatchPlan, stage: int, started_at: float, finished_at: float
    ) -> IterationRecord:
        """Stage ``stage`` computed ``plan`` between the two instants: record it, let the
        policies observe it, and return the record."""
        rec = iteration_record(plan, stage, started_at, finished_at)
        self.stage_busy_s[stage] += finished_at - started_at
        if self.record_iterations:
            self.iterations.append(rec)
        self.scheduler.observe(rec)
        return rec

    def stages_finished(self, plan: MicroBatchPlan, times: Sequence[tuple[float, float]]) -> None:
        """Stages 0, 1, ... computed ``plan`` between these (start, end) instants: each is
        recorded and observed as by ``stage_finished``; the records are built only when a policy
        observes them (the log keeps their columns)."""
        busy = self.stage_busy_s
        for stage, (start, end) in enumerate(times):
            busy[stage] += end - start
        record, observe = self.record_iterations, self.scheduler.observes_iterations
        if record or observe:
            head = microbatch_head(plan)
            if record:
                self.iterations.add_stages(head, times)
            if observe:
                for stage, (start, end) in enumerate(times):
                    self.scheduler.observe(make_record(head, stage, start, end))

    def returned(self, plan: MicroBatchPlan, stop_ids: Collection[int] = ()) -> StepOutput:
        """The sampled tokens of ``plan`` are back: fold them in (see ``Scheduler.update``)."""
        return self.scheduler.update(plan, stop_ids)


class BatchQueueDriver(PipelineDriver):
    """The host loop of vLLM's engine core with pp > 1 (``EngineCore.step_with_batch_queue``,
    docs/engines/vllm.md section 1), for replaying vLLM runs in the simulator.

    Differences from :class:`PipelineDriver`, each measured in vLLM's records:

    * Slots strictly in turn: the k-th ``schedule()`` call launches slot ``k % num_slots``,
      and a call that schedules nothing uses its turn too (vLLM queues empty outputs).
    * After a call that scheduled nothing, or one that filled the queue (``num_slots``
      outputs), the host blocks on the oldest output in flight and launches nothing until it
      returns (FIFO), whatever arrives meanwhile. An empty output resolves at once.
    * The host calls ``schedule()`` only while there are requests (vLLM's ``has_requests``),
      plus once after a return that ended requests (their ids go to the workers in the next
      call); with requests but nothing launchable and nothing in flight it keeps calling, so
      every slot gets its turn before ``next_plan`` reports nothing to run. Which slot a
      request arriving after an idle spell lands in depends on these calls.
    """

    def __init__(self, scheduler: Scheduler, num_stages: int, *, record_iterations: bool = True) -> None:
        super().__init__(scheduler, num_stages, record_iterations=record_iterations)
        self._seq = 0  # schedule() calls so far
        self._queue: list[MicroBatchPlan | None] = []  # oldest first; None = an empty output
        self._blocked = False  # waiting on the oldest real output
        self._flush_finished = False  # a return ended requests: one more call tells the workers
        self.empty_calls = 0  # schedule() calls that scheduled nothing (the frozen split's sign)

    def _pop_empty_head(self) -> None:
        while self._queue and self._queue[0] is None:
            self._queue.pop(0)

    def next_plan(self) -> MicroBatchPlan | None:
        if self._blocked:
            return None
        sched = self.scheduler
        n = self._num_slots
        for _ in range(n):  # at most one turn of every slot without a launch
            if not (sched.has_work or self._flush_finished):
                return None  # vLLM's loop does not call schedule() without requests
            self._flush_finished = False
            slot = self._seq % n
            plan = sched.schedule(slot) if sched.is_slot_free(slot) else None
            self._seq += 1
            self._queue.append(plan)
            if plan is not None and len(self._queue) < n:
                return plan  # the queue has room: the host schedules again at once
            if plan is None:
                self.empty_calls += 1
            # vLLM pops the oldest output and waits for it: an empty one resolves at once
            if self._queue[0] is None:
                self._queue.pop(0)
            else:
                self._blocked = True
            if plan is not None or self._blocked:
                return plan
        return None

    def may_launch(self) -> bool:
        """``next_plan`` has no effect while blocked on an output, or without requests and no
        ended ones to report (any other call takes a slot's turn, launching or not)."""
        return not self._blocked and (self.scheduler.has_work or self._flush_finished)

    def returned(self, plan: MicroBatchPlan, stop_ids: Collection[int] = ()) -> StepOutput:
        self._pop_empty_head()
        if not self._queue or self._queue[0] is not plan:
            raise RuntimeError(f"microbatch {plan.mb_id} returned out of launch order")
        self._queue.pop(0)
        self._blocked = False
        out = super().returned(plan, stop_ids)
        if out.finished:
            self._flush_finished = True
        return out

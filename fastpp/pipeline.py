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

from collections.abc import Collection

from fastpp.plan import MicroBatchPlan, StepOutput
from fastpp.scheduler import Scheduler
from fastpp.types import IterationRecord


def iteration_record(plan: MicroBatchPlan, stage: int, started_at: float,
                     finished_at: float) -> IterationRecord:
    """The IterationRecord of ``plan`` on ``stage`` between the two instants (seconds)."""
    return IterationRecord(
        plan.mb_id, stage, plan.slot, started_at, finished_at, plan.num_tokens,
        plan.num_prefill_tokens, len(plan.decode_req_ids), plan.sum_past_x_pre, plan.sum_pre_sq,
        plan.sum_dec_ctx, plan.chunk_budget, plan.reason, plan.num_sampled,
    )


class PipelineDriver:
    """Launch order, stage records and returns of one pipeline around ``scheduler``.

    ``stage_busy_s`` accumulates each stage's compute seconds; with ``record_iterations`` every
    IterationRecord is kept in ``iterations`` (a run's iterations file and timeline).
    """

    def __init__(self, scheduler: Scheduler, num_stages: int, *, record_iterations: bool = True) -> None:
        if num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {num_stages}")
        self.scheduler = scheduler
        self.num_stages = num_stages
        self.record_iterations = record_iterations
        self.iterations: list[IterationRecord] = []
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

    def stage_finished(self, plan: MicroBatchPlan, stage: int, started_at: float,
                       finished_at: float) -> IterationRecord:
        """Stage ``stage`` computed ``plan`` between the two instants: record it, let the
        policies observe it, and return the record."""
        rec = iteration_record(plan, stage, started_at, finished_at)
        self.stage_busy_s[stage] += finished_at - started_at
        if self.record_iterations:
            self.iterations.append(rec)
        self.scheduler.observe(rec)
        return rec

    def returned(self, plan: MicroBatchPlan, stop_ids: Collection[int] = ()) -> StepOutput:
        """The sampled tokens of ``plan`` are back: fold them in (see ``Scheduler.update``)."""
        return self.scheduler.update(plan, stop_ids)

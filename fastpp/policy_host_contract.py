"""The executor contract, at two levels (as vLLM's ``v1/core/sched/interface.py`` states its
engine loop). Every executor talks to our policies through exactly one level and uses nothing
beyond the members named here (tests/test_layering.py checks the source and pins both sets).

Level 1, ``PipelineScheduler``: for executors without a scheduler of their own (the simulator,
the CPU engine). ``fastpp.scheduler.Scheduler`` implements it: it owns the queue, chunking, KV
and slots, and runs the policy host inside ``schedule``. The loop, written once as
``fastpp.pipeline.PipelineDriver``::

    rec = scheduler.add_request(req)          # on arrival
    plan = scheduler.schedule(slot)           # called for each free slot; None: nothing to run
    ...                                       # the executor runs the plan on its stages
    scheduler.observe(stage_record)           # each stage's record, before the return
    out = scheduler.update(plan, stop_ids)    # the sampled tokens are back: who ended

Level 2, ``EngineHost``: for engines that keep their own queues, KV and batch forming (SGLang,
vLLM). ``fastpp.policy_host.PolicyHost`` implements it; the engine's adapter supplies a
``SlotState`` (its decode membership) and a ``PolicyView`` over its own state, and translates::

    rec = host.arrive(req_id, at, prompt_len, output_len)      # on arrival
    d = host.begin_step(slot, now)            # before the engine forms slot's microbatch:
                                              # apply d.park_ids / d.restore_ids (already
                                              # applied to the SlotState), run d.decodes, cap
                                              # the engine's token budget at d.budget
    head = host.launched(mb_id, slot, BatchFeatures.of(...), d.budget, d.reason)
    host.stage_records(head, [(stage, start, end), ...])      # the policies observe them
    host.returned(slot, now, had_decodes)     # the microbatch is back
    host.records.took(rec, num_generated, now) / .end(rec, now, reason, detail)

The policies themselves are the same objects at both levels (``fastpp.policies``), called
through the host's ``GuardedPolicies``; the decision step, its liveness rule, balance-plan
validation, the records and the signals exist once, in the host.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from fastpp.iteration_log import Head
    from fastpp.plan import MicroBatchPlan, RequestEnd, SchedulerStats, StepOutput
    from fastpp.policies.guard import GuardedPolicies
    from fastpp.policy_host import BatchFeatures, HostCounters, StepDecision
    from fastpp.policy_host_records import RequestLog
    from fastpp.scheduler_config import SchedulerConfig
    from fastpp.signals import Signals
    from fastpp.types import IterationRecord, Request, RequestRecord
    from fastpp.view import PolicyView


class PipelineScheduler(Protocol):
    """Level 1: a whole scheduler the executor drives (``fastpp.scheduler.Scheduler``)."""

    config: SchedulerConfig  # read-only: slots, KV pool, page size, limits
    clock: Callable[[], float]  # the executor's clock (the simulator sets its virtual one)

    def add_request(self, req: Request) -> RequestRecord:
        """Queue ``req``; its record, kept up to date (ended at once if rejected)."""
        ...

    def abort(self, req_id: int, reason: str = ...) -> RequestEnd | None:
        """End a request early: its end if it ended now, None if it ends on its return."""
        ...

    def abort_all(self, reason: str) -> list[RequestEnd]:
        """End every unfinished request (in-flight microbatches are forgotten)."""
        ...

    def schedule(self, slot: int) -> MicroBatchPlan | None:
        """Decide and form the microbatch of the free ``slot`` (None: nothing to run)."""
        ...

    def observe(self, rec: IterationRecord) -> None:
        """A stage record for the policies (every stage of a plan before its ``update``)."""
        ...

    @property
    def observes_iterations(self) -> bool:
        """Whether the policies use stage records (else an executor may skip building them)."""
        ...

    def update(self, plan: MicroBatchPlan, stop_ids: Collection[int] = ...) -> StepOutput:
        """Fold in a returned plan's sampled tokens: who ended, whose token to drop."""
        ...

    def is_slot_free(self, slot: int) -> bool: ...

    @property
    def has_work(self) -> bool:
        """Some admitted or waiting request has not ended."""
        ...

    @property
    def num_ended(self) -> int: ...

    def stats(self) -> SchedulerStats:
        """Counts to publish (a copy)."""
        ...

    def forget(self, req_id: int) -> RequestRecord:
        """Drop an ended request's record (a long-running server)."""
        ...

    def drain_kv_frees(self) -> tuple[int, ...]:
        """KV released since the last plan, for an executor that frees it before the next."""
        ...

    @property
    def counters(self) -> HostCounters:
        """The policy host's decision counts, live (the same object level 2 exposes)."""
        ...


class EngineHost(Protocol):
    """Level 2: the policy host an engine with its own queues drives
    (``fastpp.policy_host.PolicyHost``)."""

    view: PolicyView  # the engine's view over its own state; set once, pointed per decision
    signals: Signals  # what the view's recent_* members read (written by the host only)
    records: RequestLog  # the requests' records: took / scheduled / parked / retracted / end
    policies: GuardedPolicies  # the guarded policies and their one failure count
    counters: HostCounters  # decision counts (steps, parks, restores, liveness, sit-outs)

    def arrive(self, req_id: int, arrived_at: float, prompt_len: int, output_len: int) -> RequestRecord:
        """A new request: its record and an arrival sample."""
        ...

    def begin_step(self, slot: int, now: float) -> StepDecision:
        """Balance, the liveness rule, C, the decodes that ride (applied to the SlotState)."""
        ...

    def launched(self, mb_id: int, slot: int, features: BatchFeatures, budget: int, reason: str) -> Head:
        """What the engine scheduled for the microbatch: the head of its stage records."""
        ...

    def stage_records(self, head: Head, times: Iterable[tuple[int, float, float]]) -> list[IterationRecord]:
        """The microbatch ran on these (stage, start, end): its records, observed."""
        ...

    def observe(self, rec: IterationRecord) -> None:
        """A stage record built elsewhere (another PP rank's) for the policies."""
        ...

    def returned(self, slot: int, now: float, had_decodes: bool) -> None:
        """A microbatch of ``slot`` came back (the token-gap signal)."""
        ...


def members(protocol: type) -> frozenset[str]:
    """The names a contract level declares (methods, properties and attributes)."""
    names = {n for n in vars(protocol) if not n.startswith("_")}
    names |= set(getattr(protocol, "__annotations__", {}))
    return frozenset(names)

"""The policy host: where every executor's policies decide, written once.

Four executors run our policies: the simulator and the CPU engine (through our Scheduler), and
real SGLang and vLLM (which keep their own queues and KV). Each owns a ``PolicyHost`` and does
only the translation between its own state and the host (fastpp/policy_host_contract.py states
the two levels of that contract). The host owns:

* the guarded policies and their one failure count (``GuardedPolicies``);
* the signals and the request records (``RequestLog``);
* the per-launch step, ``begin_step``: balance, then the liveness rule, then choose, then pick
  the decodes that ride (``StepDecision``);
* balance-plan validation (``check_balance``), before a plan touches any executor's state;
* stage-iteration records, built from one ``BatchFeatures`` value per microbatch.

The liveness rule, the same for every executor: when the launching slot has no running decode
after balancing, requests are parked and no microbatch is in flight, every parked request is
restored into the launching slot (longest parked first). It is decided before the budget and
before the engine forms its batch, from slot state alone, so engines that pack prefill
themselves apply it exactly as our Scheduler does; without it a balancer that parks everything
could leave the pipeline idle with requests held back (and, with their KV held, waiting
requests unable to be admitted).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastpp.iteration_log import Head, make_head, make_record
from fastpp.plan import BalancePlan
from fastpp.policies.base import ChunkPolicy, DecodeBalancer
from fastpp.policies.guard import FALLBACK_REASON, GuardedPolicies
from fastpp.policy_host_records import RequestLog
from fastpp.scheduler_config import SchedulerConfig
from fastpp.signals import Signals
from fastpp.types import IterationRecord
from fastpp.view import PolicyView

BALANCER_FALLBACK = "fallback: balancer error"
LIVENESS_REASON = "liveness"


class SlotState(Protocol):
    """An executor's decode membership over its own data: the D_p running sets (join order)
    and the parked set (longest parked first). Requests are named by our integer ids.
    ``DecodeSlots`` is one (our Scheduler, vLLM); backends/sglang/slot_state.py wraps SGLang's
    per-microbatch running batches."""

    def running_ids(self, slot: int) -> Sequence[int]:
        """Ids of the slot's running decodes, join order."""
        ...

    def num_running(self, slot: int) -> int: ...

    def num_parked(self) -> int: ...

    def parked_ids(self) -> Sequence[int]:
        """Ids of the parked requests, longest parked first."""
        ...

    def is_parked(self, req_id: int) -> bool: ...

    def apply(self, plan: BalancePlan, slot: int, now: float) -> None:
        """Park and restore as the checked ``plan`` says; restored requests join ``slot``."""
        ...

    def pick(self, slot: int, budget: int) -> list[Any]:
        """The executor's objects of the slot's decodes that ride a microbatch of ``budget``
        tokens (an engine that cannot leave decodes out returns all of them)."""
        ...

    def any_in_flight(self) -> bool:
        """Whether any microbatch that computes something is in the pipeline."""
        ...


def check_balance(plan: BalancePlan, slot: int, slots: SlotState) -> None:
    """Raise ValueError unless ``plan`` parks only decodes of ``slot`` and restores only parked
    requests, each request at most once (the guard then falls back to no balancing)."""
    running = set(slots.running_ids(slot))
    for rid in plan.park_ids:
        if rid not in running:
            raise ValueError(f"balancer parks request {rid}, not a decode of slot {slot}")
    for rid in plan.restore_ids:
        if not slots.is_parked(rid):
            raise ValueError(f"balancer restores request {rid}, which is not parked")
    park = set(plan.park_ids)
    if (
        len(park) != len(plan.park_ids)
        or park & set(plan.restore_ids)
        or len(set(plan.restore_ids)) != len(plan.restore_ids)
    ):
        raise ValueError("balancer plan repeats a request")


@dataclass(slots=True)
class BatchFeatures:
    """What a microbatch computes, as the stage cost model and the ALP predictor see it.
    Token counts; ``sum_*`` are the ALP features of ``fastpp.types.IterationRecord``. Read-only
    by contract (not frozen: one per microbatch, and a frozen dataclass's construction is
    several times slower)."""

    num_tokens: int  # decode tokens (one per decode) + prefill tokens
    num_prefill_tokens: int
    num_decode_reqs: int
    sum_past_x_pre: int  # sum over prefill chunks of L_past * L_pre
    sum_pre_sq: int  # sum over prefill chunks of L_pre ** 2
    sum_dec_ctx: int  # sum over decodes of L_dec
    num_sampled: int  # rows the last stage samples: every decode + every chunk that completes

    @classmethod
    def of(cls, decode_ctx: Sequence[int], chunks: Iterable[tuple[int, int, bool]]) -> BatchFeatures:
        """From the decodes' L_dec and the prefill chunks as (L_past, L_pre, completes)."""
        px = sq = pre = done = 0
        for past, n, completes in chunks:
            px += past * n
            sq += n * n
            pre += n
            done += completes
        nd = len(decode_ctx)
        return cls(nd + pre, pre, nd, px, sq, sum(decode_ctx), nd + done)

    def head(self, mb_id: int, slot: int, budget: int, reason: str) -> Head:
        """The fields every stage record of this microbatch shares (fastpp.iteration_log)."""
        return make_head(
            mb_id,
            slot,
            self.num_tokens,
            self.num_prefill_tokens,
            self.num_decode_reqs,
            self.sum_past_x_pre,
            self.sum_pre_sq,
            self.sum_dec_ctx,
            budget,
            reason,
            self.num_sampled,
        )


@dataclass(slots=True)
class StepDecision:
    """What the policies decided for one launch of ``slot``: the executor applies exactly this.
    Read-only by contract (not frozen: one is built per launch, on the simulator's hot path)."""

    slot: int
    at: float  # the clock at the decision
    budget: int  # C: the whole token budget of the microbatch, decodes included
    reason: str  # the chunk policy's reason (FALLBACK_REASON when it failed)
    park_ids: tuple[int, ...]  # parked by the balancer (they were decodes of ``slot``)
    restore_ids: tuple[int, ...]  # restored into ``slot``: the balancer's, then the liveness rule's
    num_liveness: int  # how many of ``restore_ids`` (its tail) the liveness rule restored
    decodes: list[Any]  # the executor's objects of the slot's decodes that ride (the pick's own list)
    balance: str  # the balancer's reason, BALANCER_FALLBACK, or "" when it did nothing
    fallback: str  # which policies failed this step: "", "chunk", "balancer" or "balancer,chunk"


@dataclass(slots=True)
class HostCounters:
    """Decision counts every executor reports the same way."""

    steps: int = 0  # begin_step calls
    parks: int = 0
    restores: int = 0  # by the balancer
    liveness_restores: int = 0  # by the liveness rule
    decode_sitouts: int = 0  # decodes of the launching slot left out because C was too small


@dataclass(slots=True)
class PolicyHost:
    """One executor's policies, records and signals (module docstring). ``view`` is the
    executor's PolicyView over its own state and ``slots`` its SlotState; the executor points
    the view at (now, slot) before each ``begin_step``. ``fit_budget`` maps a chosen C (and its
    reason) to what the engine can run (vLLM's cap, SGLang's page grid); None keeps C."""

    config: SchedulerConfig
    chunk_policy: ChunkPolicy
    balancer: DecodeBalancer
    slots: SlotState
    view: PolicyView = field(init=False)
    signals: Signals = field(default_factory=Signals)
    fit_budget: Callable[[int, str], tuple[int, str]] | None = None
    keep_token_times: bool = True
    policies: GuardedPolicies = field(init=False)
    records: RequestLog = field(init=False)
    counters: HostCounters = field(default_factory=HostCounters)
    trace: Callable[[tuple], None] | None = None  # sees ("arrive", ...) and ("step", ...) events

    def __post_init__(self) -> None:
        self.policies = GuardedPolicies(self.chunk_policy, self.balancer, self.config.default_chunk)
        self.records = RequestLog(self.signals, keep_token_times=self.keep_token_times)

    # ------------------------------------------------------------------ arrivals
    def arrive(self, req_id: int, arrived_at: float, prompt_len: int, output_len: int):
        """A new request's record (fastpp.policy_host_records.RequestLog.arrive)."""
        if self.trace is not None:
            self.trace(("arrive", arrived_at, req_id, prompt_len, output_len))
        return self.records.arrive(req_id, arrived_at, prompt_len, output_len)

    # ------------------------------------------------------------------ the per-launch step
    def begin_step(self, slot: int, now: float) -> StepDecision:
        """Balance ``slot``, apply the liveness rule, choose C, pick the decodes that ride."""
        slots, policies, view, counters = self.slots, self.policies, self.view, self.counters
        counters.steps += 1
        park: tuple[int, ...] = ()
        restore: tuple[int, ...] = ()
        balance = fallback = ""
        num_parked, num_running = slots.num_parked(), slots.num_running(slot)
        if num_parked or num_running:
            failures = policies.num_failures
            plan = policies.balance(view, slot, self._check)
            if policies.num_failures > failures:
                balance, fallback = BALANCER_FALLBACK, "balancer"
            elif not plan.is_noop:
                self._apply(plan, slot, now)
                park, restore = plan.park_ids, plan.restore_ids
                balance = plan.reason or "balanced"
                num_parked, num_running = slots.num_parked(), slots.num_running(slot)
        num_liveness = 0
        if num_parked and not num_running and not slots.any_in_flight():
            live = tuple(slots.parked_ids())
            slots.apply(BalancePlan(restore_ids=live, reason=LIVENESS_REASON), slot, now)
            num_liveness = len(live)
            num_running = slots.num_running(slot)
            counters.liveness_restores += num_liveness
            restore += live
        budget, reason = policies.choose(view)
        if reason == FALLBACK_REASON:
            fallback = "balancer,chunk" if fallback else "chunk"
        if self.fit_budget is not None:
            budget, reason = self.fit_budget(budget, reason)
        decodes = slots.pick(slot, budget)
        counters.decode_sitouts += num_running - len(decodes)
        decision = StepDecision(
            slot, now, budget, reason, park, restore, num_liveness, decodes, balance, fallback
        )
        if self.trace is not None:
            self.trace(("step", now, slot, decision))
        return decision

    def _check(self, plan: BalancePlan, slot: int) -> None:
        check_balance(plan, slot, self.slots)

    def _apply(self, plan: BalancePlan, slot: int, now: float) -> None:
        self.slots.apply(plan, slot, now)
        by_id = self.records.by_id
        for rid in plan.park_ids:
            rec = by_id.get(rid)
            if rec is not None:
                RequestLog.parked(rec)
        self.counters.parks += len(plan.park_ids)
        self.counters.restores += len(plan.restore_ids)

    # ------------------------------------------------------------------ stage records and returns
    @staticmethod
    def launched(mb_id: int, slot: int, features: BatchFeatures, budget: int, reason: str) -> Head:
        """A microbatch of ``slot`` went out carrying ``features`` under budget C = ``budget``
        (the engine's own reading of what it scheduled): the head its stage records share."""
        return features.head(mb_id, slot, budget, reason)

    @property
    def observes(self) -> bool:
        """Whether the policies use stage records (an executor may skip building them)."""
        return self.policies.observes

    def observe(self, rec: IterationRecord) -> None:
        """A stage-iteration record for the policies (errors contained)."""
        self.policies.observe(rec)

    def stage_records(self, head: Head, times: Iterable[tuple[int, float, float]]) -> list[IterationRecord]:
        """The microbatch ``head`` (``BatchFeatures.head``) ran on these (stage, start, end):
        its IterationRecords, each observed by the policies; returned for the executor's log."""
        out = []
        for stage, start, end in times:
            rec = make_record(head, stage, start, end)
            self.policies.observe(rec)
            out.append(rec)
        return out

    def returned(self, slot: int, now: float, had_decodes: bool) -> None:
        """A microbatch of ``slot`` came back at ``now`` (the token-gap signal)."""
        self.signals.on_return(slot, now, had_decodes)

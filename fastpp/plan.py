"""The executor contract, as data: what the scheduler tells an executor to run, and what it
reports back when a microbatch returns. Also the decode balancer's answer to the scheduler.

An executor (the simulator, the CPU engine, an engine plugin) needs nothing of the Scheduler but
these objects and the calls that return them (docs/ARCHITECTURE.md, "The executor contract"):

* ``Scheduler.schedule(slot) -> MicroBatchPlan | None``: what to compute, which KV to free and
  to reserve first;
* ``Scheduler.update(plan, stop_ids) -> StepOutput``: which requests ended when it returned;
* ``Scheduler.abort(req_id) -> RequestEnd | None`` and ``add_request(req) -> RequestRecord``
  report the ends they cause themselves;
* ``Scheduler.stats() -> SchedulerStats``: counts an executor may publish.

Every request's end is reported exactly once, by the call during which it happened.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastpp._mypyc import mypyc_attr
from fastpp.types import FinishReason, RequestRecord, pickle_by_constructor


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """A slice of one request's prompt processed in a microbatch.

    ``num_computed`` is L_past (tokens of this request already in the KV cache) and
    ``num_tokens`` is L_pre (tokens prefilled now). ``completes`` is true when this chunk is
    the last one, so the microbatch samples this request's next token. After a retraction the
    "prompt" is the original prompt plus the tokens generated before it (recomputed).
    """

    req_id: int
    num_computed: int
    num_tokens: int
    completes: bool

    # Written out, not generated: compiled (fastpp/_native.py) this __init__ is native code,
    # several times faster than the one dataclasses writes; tests/test_plan_types.py checks it
    # takes the fields, in order, with their defaults.
    def __init__(self, req_id: int, num_computed: int, num_tokens: int, completes: bool) -> None:
        object.__setattr__(self, "req_id", req_id)
        object.__setattr__(self, "num_computed", num_computed)
        object.__setattr__(self, "num_tokens", num_tokens)
        object.__setattr__(self, "completes", completes)


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassable when compiled (fastpp/_mypyc.py)
@dataclass(frozen=True, slots=True)
class MicroBatchPlan:
    """One microbatch: everything every stage must do for it. Frozen: executors only read it.

    Order of work for an executor: free the KV of ``kv_frees``, reserve ``kv_allocs`` and the
    decodes' growth (:meth:`kv_reservations`), then compute ``decode_req_ids`` (one token each,
    in order) followed by ``prefill`` (in order). The tokens it samples belong, in order, to
    :attr:`sample_req_ids`.

    Invariants: ``num_tokens == len(decode_req_ids) + sum(c.num_tokens for c in prefill)``;
    ``num_tokens <= chunk_budget``; ``num_sampled == len(sample_req_ids)``; a request appears
    at most once; no id of ``kv_frees`` is computed in this plan unless it also appears in
    ``kv_allocs`` (a retracted request admitted again).
    """

    mb_id: int  # sequence number of the microbatch, unique within a run
    slot: int  # microbatch slot 0 .. D_p-1; a slot has at most one microbatch in flight
    scheduled_at: float  # scheduler clock (seconds) when the plan was formed
    chunk_budget: int  # C: whole token budget of the microbatch, decode tokens included
    decode_req_ids: tuple[int, ...]  # decode requests, one token each
    decode_ctx: tuple[int, ...]  # their context length L_dec (tokens attended, the fed one included)
    prefill: tuple[PrefillChunk, ...]  # prompt chunks: continuing chunked request first, then FCFS
    num_tokens: int  # decode tokens + prefill tokens
    num_prefill_tokens: int  # sum of the chunks' num_tokens
    num_sampled: int  # positions that produce a token (decodes + completing chunks)
    sum_past_x_pre: int  # ALP feature: sum L_past * L_pre over prefill chunks
    sum_pre_sq: int  # ALP feature: sum L_pre^2 over prefill chunks
    sum_dec_ctx: int  # ALP feature: sum L_dec over decodes
    reason: str = ""  # the chunk policy's reason for ``chunk_budget``
    # KV bookkeeping since the previous plan (tokens; reservations are whole pages):
    kv_frees: tuple[int, ...] = ()  # requests whose whole KV was released: ended (any cause)
    #                                 or retracted. An executor drops their per-request state.
    kv_allocs: tuple[tuple[int, int], ...] = ()  # (req_id, tokens) reserved at admission: the
    #                                             whole prompt of a request whose prefill starts here
    retracted_ids: tuple[int, ...] = ()  # retracted since the previous plan (also in kv_frees):
    #                                      queued again, recomputed from prompt + generated tokens

    # Written out, as PrefillChunk's: one plan per microbatch. Each store spelled
    # ``object.__setattr__(self, ...)``: mypyc compiles that form to a direct field store, an
    # alias of it (``set = object.__setattr__``) to a generic attribute call.
    def __init__(
        self,
        mb_id: int,
        slot: int,
        scheduled_at: float,
        chunk_budget: int,
        decode_req_ids: tuple[int, ...],
        decode_ctx: tuple[int, ...],
        prefill: tuple[PrefillChunk, ...],
        num_tokens: int,
        num_prefill_tokens: int,
        num_sampled: int,
        sum_past_x_pre: int,
        sum_pre_sq: int,
        sum_dec_ctx: int,
        reason: str = "",
        kv_frees: tuple[int, ...] = (),
        kv_allocs: tuple[tuple[int, int], ...] = (),
        retracted_ids: tuple[int, ...] = (),
    ) -> None:
        object.__setattr__(self, "mb_id", mb_id)
        object.__setattr__(self, "slot", slot)
        object.__setattr__(self, "scheduled_at", scheduled_at)
        object.__setattr__(self, "chunk_budget", chunk_budget)
        object.__setattr__(self, "decode_req_ids", decode_req_ids)
        object.__setattr__(self, "decode_ctx", decode_ctx)
        object.__setattr__(self, "prefill", prefill)
        object.__setattr__(self, "num_tokens", num_tokens)
        object.__setattr__(self, "num_prefill_tokens", num_prefill_tokens)
        object.__setattr__(self, "num_sampled", num_sampled)
        object.__setattr__(self, "sum_past_x_pre", sum_past_x_pre)
        object.__setattr__(self, "sum_pre_sq", sum_pre_sq)
        object.__setattr__(self, "sum_dec_ctx", sum_dec_ctx)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "kv_frees", kv_frees)
        object.__setattr__(self, "kv_allocs", kv_allocs)
        object.__setattr__(self, "retracted_ids", retracted_ids)

    @property
    def sample_req_ids(self) -> tuple[int, ...]:
        """Requests that get a token from this microbatch, in sampling order: the decodes, then
        the requests whose completing chunk is in ``prefill``."""
        done = tuple(c.req_id for c in self.prefill if c.completes)
        return self.decode_req_ids + done if done else self.decode_req_ids

    def kv_reservations(self, page_size: int) -> list[tuple[int, int]]:
        """(req_id, tokens reserved after this plan) for every request whose reservation may
        grow here: ``kv_allocs`` plus each decode, which holds ``round_up(L_dec)`` once its fed
        token's KV is written. A paged executor allocates up to these totals, never shrinks."""
        out = list(self.kv_allocs)
        for rid, ctx in zip(self.decode_req_ids, self.decode_ctx, strict=True):
            out.append((rid, -(-ctx // page_size) * page_size))
        return out


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassable when compiled (fastpp/_mypyc.py)
@dataclass(frozen=True, slots=True)
class RequestEnd:
    """One request's end, reported once. ``record`` is the scheduler's final record of it."""

    req_id: int
    reason: FinishReason
    detail: str  # why, for aborted / rejected / capped requests; "" for a plain finish
    record: RequestRecord

    # Written out, as MicroBatchPlan's: one per request.
    def __init__(self, req_id: int, reason: FinishReason, detail: str, record: RequestRecord) -> None:
        object.__setattr__(self, "req_id", req_id)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "detail", detail)
        object.__setattr__(self, "record", record)


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassable when compiled (fastpp/_mypyc.py)
@dataclass(frozen=True, slots=True)
class StepOutput:
    """What one returned microbatch did (``Scheduler.update``).

    Every request of the plan's ``sample_req_ids`` got one new output token, except those in
    ``discarded_ids`` (aborted while in flight: their token is dropped). ``finished`` lists the
    requests that ended with this return: ``length`` or ``stop`` after their new token, or
    ``aborted`` (those are the discarded ones).
    """

    finished: tuple[RequestEnd, ...] = ()
    discarded_ids: frozenset[int] = frozenset()


NO_OUTPUT = StepOutput()  # the common case: nothing ended, nothing discarded


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassable when compiled (fastpp/_mypyc.py)
@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """Counts an executor may publish (e.g. on /metrics): a copy, safe to hand to other threads."""

    num_waiting: int  # queued, not admitted (no KV yet)
    num_admitted: int  # holding KV: prefilling, decoding or parked
    num_parked: int
    num_in_flight: int  # microbatches in the pipeline
    kv_used_tokens: int
    kv_capacity_tokens: int
    num_arrived: int  # requests ever added (rejected ones included)
    num_ended: int  # requests that ended (finished, aborted or rejected)
    num_microbatches: int  # launched so far
    num_retractions: int
    num_decode_sitouts: int  # decode steps skipped because C was below a slot's decode count


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassable when compiled (fastpp/_mypyc.py)
@dataclass(frozen=True, slots=True)
class BalancePlan:
    """The decode balancer's answer for the slot about to launch.

    ``park_ids`` must be decode requests of that slot; ``restore_ids`` must be parked requests.
    Restored requests join the slot and decode in this microbatch.
    """

    park_ids: tuple[int, ...] = ()
    restore_ids: tuple[int, ...] = ()
    reason: str = ""

    @property
    def is_noop(self) -> bool:
        return not self.park_ids and not self.restore_ids


NO_BALANCE = BalancePlan()


pickle_by_constructor(PrefillChunk, MicroBatchPlan, RequestEnd, StepOutput, SchedulerStats, BalancePlan)

"""Data-only plans the scheduler hands to an executor, and the balancer hands to the scheduler."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """A slice of one request's prompt processed in a microbatch.

    ``num_computed`` is L_past (tokens of this request already in the KV cache) and
    ``num_tokens`` is L_pre (tokens prefilled now). ``completes`` is true when this chunk is
    the last one, so the microbatch samples this request's next token.
    """

    req_id: int
    num_computed: int
    num_tokens: int
    completes: bool


@dataclass(frozen=True, slots=True)
class MicroBatchPlan:
    """One microbatch: what every stage computes when it reaches them. Frozen: executors read it.

    Invariants: ``num_tokens == len(decode_req_ids) + sum(c.num_tokens for c in prefill)``,
    ``num_tokens <= chunk_budget``, ``num_sampled == len(decode_req_ids) + #completing chunks``.
    """

    mb_id: int  # sequence number of the microbatch, unique within a run
    slot: int  # microbatch slot 0 .. D_p-1; a slot has at most one microbatch in flight
    scheduled_at: float  # scheduler clock when the plan was formed
    chunk_budget: int  # C: whole token budget of the microbatch, decode tokens included
    decode_req_ids: tuple[int, ...]  # decode requests, one token each
    decode_ctx: tuple[int, ...]  # their context length L_dec (tokens attended), same order
    prefill: tuple[PrefillChunk, ...]  # prompt chunks: continuing chunked request first, then FCFS
    num_tokens: int  # decode tokens + prefill tokens
    num_prefill_tokens: int
    num_sampled: int  # positions that produce a token (decodes + completing chunks)
    sum_past_x_pre: int  # ALP feature: sum L_past * L_pre over prefill chunks
    sum_pre_sq: int  # ALP feature: sum L_pre^2 over prefill chunks
    sum_dec_ctx: int  # ALP feature: sum L_dec over decodes
    reason: str = ""  # the chunk policy's reason for ``chunk_budget``

    @staticmethod
    def make_empty(mb_id: int = -1, slot: int = 0, scheduled_at: float = 0.0) -> MicroBatchPlan:
        return MicroBatchPlan(mb_id, slot, scheduled_at, 0, (), (), (), 0, 0, 0, 0, 0, 0)

    @property
    def is_empty(self) -> bool:
        return self.num_tokens == 0


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

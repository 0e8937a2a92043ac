"""The policy view over one SGLang 0.5.23 scheduler: what our policies read, nothing they write.

It presents SGLang's state under the members of ``fastpp.view`` (the policy-view surface shared
by every executor): the waiting queue (``Scheduler.waiting_queue``), the continuing chunked
request (``Scheduler.chunked_req``), the decode membership of each microbatch slot
(``Scheduler.running_mbs``), the KV pool, the requests our balancer parked, and the recent
signals the adapter records. Requests appear as ``SGLangRequestView`` objects built on demand
from SGLang's ``Req`` (iterators are lazy: a policy that stops early pays for what it read).

The launching slot is special: while SGLang forms microbatch k, ``running_mbs[k]`` still holds
the batch from before this step's merge of the finished prefill; the view reads the running
decodes and the parked set from the adapter's ``SGLangSlots`` (slot_state.py), which holds the
merged batch about to be scheduled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from fastpp.backends.sglang.slot_state import ParkedRequest, SGLangSlots
from fastpp.scheduler_config import SchedulerConfig
from fastpp.signals import Signals
from fastpp.view import DeploymentFields

__all__ = ["ParkedRequest", "SGLangRequestView", "SGLangView", "req_tokens_computed"]


@dataclass(frozen=True, slots=True)
class SGLangRequestView:
    """One request as policies see it (the RequestView members of ``fastpp.view``).

    ``num_computed``: prompt tokens of its current prefill already scheduled (L_past of its next
    chunk); ``ctx_len``: L_dec while decoding (prompt + generated tokens).
    """

    req_id: int
    arrived_at: float
    prompt_len: int
    num_computed: int
    remaining_prefill: int
    ctx_len: int
    num_generated: int
    parked_at: float | None = None


def req_tokens_computed(req: Any) -> int:
    """Prompt tokens of ``req``'s current prefill already scheduled (0 before its first chunk)."""
    end = getattr(req, "extend_end", None)
    return max(int(getattr(req, "prefix_len", 0) or 0), int(end or 0))


class SGLangView(DeploymentFields):
    """The policy view of one SGLang scheduler at one scheduling step (see the module doc).

    ``identity`` maps an SGLang ``Req`` to our int id and arrival time; ``slots`` holds the
    launching slot's merged running batch and the balancer's parked requests.
    """

    def __init__(
        self,
        scheduler: Any,
        config: SchedulerConfig,
        signals: Signals,
        clock: Callable[[], float],
        identity: Callable[[Any], tuple[int, float]],
        slots: SGLangSlots,
    ) -> None:
        self._s = scheduler
        self._config = config
        self._signals = signals
        self._clock = clock
        self._identity = identity
        self._slots = slots
        self.slot = 0
        self.now = clock()

    def begin(self, now: float, slot: int) -> None:
        """Point the view at the decision for microbatch ``slot`` at ``now`` (the slot state
        already holds that step's merged running batch)."""
        self.now = now
        self.slot = slot

    # -- memory -----------------------------------------------------------------------------
    @property
    def kv_total_tokens(self) -> int:
        return int(self._s.max_total_num_tokens)

    @property
    def kv_free_tokens(self) -> int:
        """Free KV tokens plus what the radix cache could evict (SGLang's own admission rule)."""
        free = int(self._s.token_to_kv_pool_allocator.available_size())
        tree = getattr(self._s, "tree_cache", None)
        if tree is not None and hasattr(tree, "evictable_size"):
            free += int(tree.evictable_size())
        return free

    # -- queue ------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self._s.waiting_queue)

    @property
    def waiting_prefill_tokens(self) -> int:
        total = sum(self._fill_len(r) - req_tokens_computed(r) for r in self._s.waiting_queue)
        chunked = self._s.chunked_req
        if chunked is not None:
            total += self._fill_len(chunked) - req_tokens_computed(chunked)
        return total

    @property
    def waiting_arrival_sum(self) -> float:
        return sum(self._identity(r)[1] for r in self._s.waiting_queue)

    def iter_waiting(self) -> Iterator[SGLangRequestView]:
        return (self._prefilling(r) for r in self._s.waiting_queue)

    def iter_waiting_newest_first(self) -> Iterator[SGLangRequestView]:
        return (self._prefilling(r) for r in reversed(self._s.waiting_queue))

    @property
    def chunked(self) -> SGLangRequestView | None:
        r = self._s.chunked_req
        return None if r is None else self._prefilling(r)

    # -- running decodes --------------------------------------------------------------------
    def _running_reqs(self, slot: int) -> list[Any]:
        return self._slots.running_reqs(slot)

    def num_running(self, slot: int) -> int:
        return len(self._running_reqs(slot))

    def sum_decode_ctx(self, slot: int) -> int:
        return sum(len(r.origin_input_ids) + len(r.output_ids) for r in self._running_reqs(slot))

    def iter_running(self, slot: int) -> Iterator[SGLangRequestView]:
        """The slot's decodes in batch order: SGLang appends joiners at the tail, so the head
        has decoded in this slot longest."""
        return (self._decoding(r) for r in self._running_reqs(slot))

    def is_in_flight(self, slot: int) -> bool:
        """Every other slot with a batch is in flight while slot k is formed: event_loop_pp
        processes microbatch k+1's result only after launching k (scheduler_pp_mixin.py)."""
        return slot != self.slot and self._s.mbs[slot] is not None

    @property
    def num_parked(self) -> int:
        return len(self._slots.parked)

    def iter_parked(self) -> Iterator[SGLangRequestView]:
        return (self._decoding(p.req, p.parked_at) for p in self._slots.parked.values())

    # -- signals ----------------------------------------------------------------------------
    @property
    def recent_ttft(self):
        return self._signals.ttft

    @property
    def recent_token_gap(self):
        return self._signals.token_gap

    @property
    def recent_arrivals(self):
        return self._signals.arrivals

    @property
    def num_arrivals(self) -> int:
        return self._signals.num_arrivals

    # -- helpers ----------------------------------------------------------------------------
    @staticmethod
    def _fill_len(req: Any) -> int:
        """Tokens its current prefill must compute: the prompt, or after a retraction the prompt
        plus the tokens generated so far (SGLang recomputes them)."""
        return len(req.origin_input_ids) + len(req.output_ids)

    def _prefilling(self, req: Any) -> SGLangRequestView:
        req_id, arrived_at = self._identity(req)
        fill = self._fill_len(req)
        computed = req_tokens_computed(req)
        return SGLangRequestView(
            req_id=req_id,
            arrived_at=arrived_at,
            prompt_len=len(req.origin_input_ids),
            num_computed=computed,
            remaining_prefill=fill - computed,
            ctx_len=0,
            num_generated=len(req.output_ids),
        )

    def _decoding(self, req: Any, parked_at: float | None = None) -> SGLangRequestView:
        req_id, arrived_at = self._identity(req)
        fill = self._fill_len(req)
        return SGLangRequestView(
            req_id=req_id,
            arrived_at=arrived_at,
            prompt_len=len(req.origin_input_ids),
            num_computed=fill,
            remaining_prefill=0,
            ctx_len=fill,
            num_generated=len(req.output_ids),
            parked_at=parked_at,
        )

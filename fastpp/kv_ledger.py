"""Who holds how much KV, and what an executor must be told about it."""

from __future__ import annotations

from fastpp.kv_pool import KVPool
from fastpp.live_request import LiveRequest


class KVLedger:
    """The KV pool plus each admitted request's reservation (``LiveRequest.kv_tokens``).

    Invariants, kept by the methods here: ``pool.used`` is the sum of ``kv_tokens`` over the
    requests holding KV; ``output_backlog`` is the sum of ``remaining_output`` over them (the
    tokens they may still write: the admission reserve is a share of it); every request whose
    reservation is released is listed once in the next ``take_frees``, every admission in the
    next ``take_allocs`` (what a plan tells the executor).
    """

    __slots__ = ("pool", "output_backlog", "_frees", "_allocs")

    def __init__(self, capacity_tokens: int, page_size: int) -> None:
        self.pool = KVPool(capacity_tokens, page_size)
        self.output_backlog = 0
        self._frees: list[int] = []
        self._allocs: list[tuple[int, int]] = []

    def admission_reserve(self, new_token_ratio: float) -> int:
        """KV kept free beyond a new prompt: a share of what admitted requests may still write."""
        return int(new_token_ratio * self.output_backlog)

    def admit(self, r: LiveRequest, kv_tokens: int) -> None:
        """Reserve ``kv_tokens`` (page-rounded, checked free by the caller) for ``r``'s prefill."""
        self.pool.alloc(kv_tokens)
        r.kv_tokens = kv_tokens
        self._allocs.append((r.req_id, kv_tokens))
        self.output_backlog += r.remaining_output

    def decode_need(self, decodes: list[LiveRequest]) -> int:
        """Tokens the pool must grant so each decode can write its fed token's KV."""
        pool = self.pool
        if pool.page_size == 1:
            return len(decodes)  # one token each, one token per page
        round_up = pool.round_up
        return sum(max(0, round_up(r.ctx_len) - r.kv_tokens) for r in decodes)

    def grow(self, decodes: list[LiveRequest]) -> None:
        """Each decode's reservation after its step (the pool was charged ``decode_need``)."""
        if self.pool.page_size == 1:
            for r in decodes:
                r.kv_tokens += 1
        else:
            round_up = self.pool.round_up
            for r in decodes:
                r.kv_tokens = max(r.kv_tokens, round_up(r.ctx_len))

    def release(self, r: LiveRequest) -> None:
        """Free ``r``'s whole reservation (it ended or was retracted)."""
        self.pool.release(r.kv_tokens)
        r.kv_tokens = 0
        self.output_backlog -= r.remaining_output
        self._frees.append(r.req_id)

    def take_frees(self) -> tuple[int, ...]:
        return _take(self._frees)

    def take_allocs(self) -> tuple[tuple[int, int], ...]:
        return _take(self._allocs)


def _take(items: list) -> tuple:
    if not items:
        return ()
    out = tuple(items)
    items.clear()
    return out

"""SchedulerView: the read-only window policies get onto the scheduler's state.

It is a facade, not a copy: building a snapshot of 1,000 waiting requests at every launch would
cost more than the decision itself. Properties return live state; the iterators yield
``LiveRequest`` objects whose fields policies must treat as read-only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from fastpp.live_request import LiveRequest
from fastpp.types import SLO

if TYPE_CHECKING:
    from fastpp.scheduler import Scheduler


class SchedulerView:
    """What a ChunkPolicy or DecodeBalancer may look at. Time comes only from ``now``."""

    __slots__ = ("_s",)

    def __init__(self, scheduler: Scheduler) -> None:
        self._s = scheduler

    # -- clock and deployment -------------------------------------------------------------
    @property
    def now(self) -> float:
        return self._s.now

    @property
    def num_slots(self) -> int:
        """D_p: the pipeline depth, one microbatch slot per stage."""
        return self._s.config.num_slots

    @property
    def slot(self) -> int:
        """The slot about to launch."""
        return self._s.launching_slot

    @property
    def slo(self) -> SLO:
        return self._s.config.slo

    @property
    def chunk_candidates(self) -> tuple[int, ...]:
        return self._s.config.chunk_candidates

    @property
    def default_chunk(self) -> int:
        return self._s.config.default_chunk

    @property
    def token_step(self) -> int:
        """The hardware's tile step in tokens (128 on A100/H100); 0 when none is known."""
        return self._s.config.token_step

    # -- memory ---------------------------------------------------------------------------
    @property
    def kv_total_tokens(self) -> int:
        return self._s.kv.capacity

    @property
    def kv_free_tokens(self) -> int:
        return self._s.kv.free

    # -- queue ----------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self._s.waiting)

    @property
    def waiting_prefill_tokens(self) -> int:
        """Prompt tokens still to prefill: waiting requests plus the chunked one."""
        return self._s.pending_prefill_tokens

    def iter_waiting(self) -> Iterator[LiveRequest]:
        """Waiting requests in FCFS order (the order they will be admitted)."""
        return iter(self._s.waiting)

    def iter_waiting_newest_first(self) -> Iterator[LiveRequest]:
        """Waiting requests, most recently queued first (a policy can stop early)."""
        return reversed(self._s.waiting)

    @property
    def waiting_arrival_sum(self) -> float:
        """Sum of arrival times over the waiting queue: mean waits without walking it."""
        return self._s.waiting_arrival_sum

    @property
    def chunked(self) -> LiveRequest | None:
        """The request whose prompt is partly prefilled and continues in the next microbatch."""
        return self._s.chunked

    # -- running decodes ------------------------------------------------------------------
    def num_running(self, slot: int) -> int:
        return len(self._s.running[slot])

    def sum_decode_ctx(self, slot: int) -> int:
        """Sum of L_dec over the slot's running decodes (parked ones excluded)."""
        return self._s.slot_ctx_sum[slot]

    def iter_running(self, slot: int) -> Iterator[LiveRequest]:
        """The slot's running decodes, oldest admitted first."""
        return iter(self._s.running[slot])

    def is_in_flight(self, slot: int) -> bool:
        return self._s.in_flight[slot] is not None

    @property
    def num_parked(self) -> int:
        return len(self._s.parked)

    def iter_parked(self) -> Iterator[LiveRequest]:
        """Parked requests, longest parked first."""
        return iter(self._s.parked.values())

    # -- recent signals (each a deque of (time, value), newest last) ----------------------
    @property
    def recent_ttft(self) -> deque[tuple[float, float]]:
        """(first-token time, TTFT seconds) of recent first tokens."""
        return self._s.signals.ttft

    @property
    def recent_token_gap(self) -> deque[tuple[float, float]]:
        """(return time, seconds since that slot's previous return) per decode microbatch."""
        return self._s.signals.token_gap

    @property
    def recent_tpot(self) -> deque[tuple[float, float]]:
        """(finish time, TPOT seconds) of recently finished requests with >= 2 tokens."""
        return self._s.signals.tpot

    @property
    def recent_arrivals(self) -> deque[tuple[float, int]]:
        """(arrival time, prompt tokens) of recent arrivals."""
        return self._s.signals.arrivals

    @property
    def num_arrivals(self) -> int:
        """Arrivals so far: a policy that keeps its own window ingests only the new ones."""
        return self._s.signals.num_arrivals

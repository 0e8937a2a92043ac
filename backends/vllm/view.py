"""``VllmView``: the ``PolicyView`` (fastpp/view.py) over the adapter's slots and vLLM's queues.

Where vLLM's state meets the view's contract:

* The waiting queue: vLLM's ``kv_holding_waiting`` then ``waiting`` (the order its
  ``schedule()`` drains them; a preempted request is put back at the front, like a retraction
  in our Scheduler). ``chunked`` is the first request of vLLM's running list whose prefill
  started and has tokens left to schedule; should vLLM hold more than one such request (it can,
  rarely), the others lead ``iter_waiting`` (they continue before anyone is admitted).
* KV: vLLM's block pool, in tokens (blocks x block size). Free blocks include cached prefixes
  vLLM may evict; parked requests keep their blocks.
* Slots, parking and signals: the adapter's ``DecodeSlots`` and its policy host's ``Signals``
  (as in our Scheduler). ``is_in_flight(slot)``: a non-empty step of that slot is in vLLM's batch queue.

Queue-wide sums are computed once per decision, on first use, and reused by every policy call
of that decision: the queue does not change while the policies decide.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from fastpp.backends.vllm.tracked import TrackedRequest
from fastpp.view import DeploymentFields, Sample

if TYPE_CHECKING:
    from fastpp.backends.vllm.adapter import Adapter


class VllmView(DeploymentFields):
    """The policy view of one vLLM engine core. Values are live; see the module docstring."""

    __slots__ = ("_a", "_config", "now", "slot", "_queue")

    def __init__(self, adapter: Adapter) -> None:
        self._a = adapter
        self._config = adapter.config
        self.now = 0.0
        self.slot = 0
        self._queue: tuple[list[TrackedRequest], TrackedRequest | None] | None = None

    def begin(self, now: float, slot: int) -> None:
        """A decision for ``slot`` starts at ``now``: forget the previous decision's sums."""
        self.now = now
        self.slot = slot
        self._queue = None

    def _waiting(self) -> tuple[list[TrackedRequest], TrackedRequest | None]:
        if self._queue is None:
            a = self._a
            partial = [
                t
                for t in a.iter_tracked(a.engine.engine_running())
                if not t.is_decoding and t.remaining_prefill > 0
            ]
            chunked = partial[0] if partial else None
            waiting = partial[1:] + list(a.iter_tracked(a.engine.engine_waiting()))
            self._queue = (waiting, chunked)
        return self._queue

    # -- memory
    @property
    def kv_total_tokens(self) -> int:
        return self._a.engine.kv_total_tokens()

    @property
    def kv_free_tokens(self) -> int:
        return self._a.engine.kv_free_tokens()

    # -- the waiting queue
    @property
    def num_waiting(self) -> int:
        return len(self._waiting()[0])

    @property
    def waiting_prefill_tokens(self) -> int:
        waiting, chunked = self._waiting()
        total = sum(t.remaining_prefill for t in waiting)
        return total + (chunked.remaining_prefill if chunked is not None else 0)

    @property
    def waiting_arrival_sum(self) -> float:
        return sum(t.arrived_at for t in self._waiting()[0])

    @property
    def chunked(self) -> TrackedRequest | None:
        return self._waiting()[1]

    def iter_waiting(self) -> Iterator[TrackedRequest]:
        return iter(self._waiting()[0])

    def iter_waiting_newest_first(self) -> Iterator[TrackedRequest]:
        return reversed(self._waiting()[0])

    # -- running decodes and parked requests
    def num_running(self, slot: int) -> int:
        return len(self._a.slots.running[slot])

    def sum_decode_ctx(self, slot: int) -> int:
        return self._a.slots.ctx_sum[slot]

    def iter_running(self, slot: int) -> Iterator[TrackedRequest]:
        return iter(self._a.slots.running[slot])

    def is_in_flight(self, slot: int) -> bool:
        return self._a.slot_in_flight(slot)

    @property
    def num_parked(self) -> int:
        return len(self._a.slots.parked)

    def iter_parked(self) -> Iterator[TrackedRequest]:
        return iter(self._a.slots.parked.values())

    # -- recent signals
    @property
    def recent_ttft(self) -> Sequence[Sample]:
        return self._a.signals.ttft

    @property
    def recent_token_gap(self) -> Sequence[Sample]:
        return self._a.signals.token_gap

    @property
    def recent_arrivals(self) -> Sequence[tuple[float, int]]:
        return self._a.signals.arrivals

    @property
    def num_arrivals(self) -> int:
        return self._a.signals.num_arrivals

"""The requests waiting for (re)prefill: an FCFS queue plus the one partly prefilled request,
with the running sums the policies read in O(1)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from fastpp.live_request import LiveRequest


class WaitingQueue:
    """FCFS queue of requests whose prefill has not started, and ``chunked``: the request whose
    prefill started and continues in the next microbatch (at most one).

    Invariants (kept by every method here, and only here): ``prefill_tokens`` is the sum of
    ``remaining_prefill`` over the queue, ``chunked`` and a request taken from the head whose
    first chunk has not been scheduled yet; ``arrival_sum`` is the sum of ``arrived_at`` over
    the queue. Queue order is arrival order, except that retracted requests go to the front.
    """

    __slots__ = ("_queue", "chunked", "prefill_tokens", "arrival_sum")

    def __init__(self) -> None:
        self._queue: deque[LiveRequest] = deque()
        self.chunked: LiveRequest | None = None
        self.prefill_tokens = 0
        self.arrival_sum = 0.0

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[LiveRequest]:
        return iter(self._queue)

    def newest_first(self) -> Iterator[LiveRequest]:
        return reversed(self._queue)

    @property
    def head(self) -> LiveRequest | None:
        return self._queue[0] if self._queue else None

    def push(self, r: LiveRequest) -> None:
        """A new arrival joins the tail."""
        self._queue.append(r)
        self.arrival_sum += r.arrived_at
        self.prefill_tokens += r.remaining_prefill

    def push_front(self, r: LiveRequest) -> None:
        """A retracted request goes first: it was admitted before anyone waiting."""
        self._queue.appendleft(r)
        self.arrival_sum += r.arrived_at
        self.prefill_tokens += r.remaining_prefill

    def pop_head(self) -> LiveRequest:
        """Take the head for admission; its tokens count as pending until ``advance``."""
        r = self._queue.popleft()
        self.arrival_sum -= r.arrived_at
        return r

    def advance(self, r: LiveRequest, num_tokens: int) -> None:
        """``num_tokens`` more of ``r``'s prefill were scheduled; ``r`` becomes (or stops being)
        the chunked request."""
        r.num_computed += num_tokens
        self.prefill_tokens -= num_tokens
        if r.num_computed < r.fill_len:
            self.chunked = r
        elif self.chunked is r:
            self.chunked = None

    def remove(self, r: LiveRequest) -> bool:
        """Take ``r`` out (queued or chunked); False if it is neither."""
        if r is self.chunked:
            self.chunked = None
            self.prefill_tokens -= r.remaining_prefill
            return True
        try:
            self._queue.remove(r)
        except ValueError:
            return False
        self.arrival_sum -= r.arrived_at
        self.prefill_tokens -= r.remaining_prefill
        return True

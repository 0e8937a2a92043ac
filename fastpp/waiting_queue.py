"""The requests waiting for (re)prefill, in the order they will be admitted, plus the one partly
prefilled request, with the running sums the policies read in O(1)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from itertools import chain, islice
from math import inf
from typing import TypeVar

from fastpp.live_request import LiveRequest

T = TypeVar("T")


class WaitingQueue:
    """The queue of requests whose prefill has not started, and ``chunked``: the request whose
    prefill started and continues in the next microbatch (at most one).

    Order. FCFS by default (``late_after`` = inf): arrival order, except that retracted requests
    go to the front. With a finite ``late_after`` (SchedulerConfig.queue_order "late_last") a
    request that has waited longer than ``late_after`` s without a first token is late: it has
    missed its TTFT whatever happens next, so it steps behind the requests that can still meet
    theirs, into a second queue (``defer_late``, called with the clock before each admission).
    A late request goes first again once it has waited ``late_max_wait`` s, or when nobody else
    waits: under sustained overload every request ends up waiting that long, so a rate above
    capacity still shows as a growing queue. Retracted requests (they have their first token)
    are never late. Both queues stay in arrival order, so each check looks at a head only.

    Invariants (kept by every method here, and only here): ``prefill_tokens`` is the sum of
    ``remaining_prefill`` over both queues, ``chunked`` and a request taken from a head whose
    first chunk has not been scheduled yet; ``arrival_sum`` is the sum of ``arrived_at`` over
    both queues.
    """

    __slots__ = (
        "_queue",
        "_late",
        "late_after",
        "late_max_wait",
        "now",
        "chunked",
        "prefill_tokens",
        "arrival_sum",
    )

    def __init__(self, late_after: float = inf, late_max_wait: float = inf) -> None:
        if not 0 < late_after <= late_max_wait:
            raise ValueError(f"need 0 < late_after <= late_max_wait, got {late_after!r}, {late_max_wait!r}")
        self._queue: deque[LiveRequest] = deque()  # on time (FCFS: everyone)
        self._late: deque[LiveRequest] = deque()  # late for their first token, by arrival
        self.late_after = late_after
        self.late_max_wait = late_max_wait
        self.now = 0.0  # the clock at the last ``defer_late``
        self.chunked: LiveRequest | None = None
        self.prefill_tokens = 0
        self.arrival_sum = 0.0

    def __len__(self) -> int:
        return len(self._queue) + len(self._late)

    def __iter__(self) -> Iterator[LiveRequest]:
        """Admission order: late requests due again, the on-time queue, the other late ones."""
        if not self._late:
            return iter(self._queue)
        due = self._num_due()
        return chain(islice(self._late, due), self._queue, islice(self._late, due, None))

    def newest_first(self) -> Iterator[LiveRequest]:
        """Latest arrivals first (the on-time queue from its tail, then the late queue)."""
        return chain(reversed(self._queue), reversed(self._late))

    @property
    def num_late(self) -> int:
        return len(self._late)

    def _num_due(self) -> int:
        """Late requests that have waited ``late_max_wait`` (a prefix: arrival order)."""
        due_before = self.now - self.late_max_wait
        n = 0
        for r in self._late:
            if r.arrived_at > due_before:
                break
            n += 1
        return n

    def defer_late(self, now: float) -> None:
        """Move the requests that became late by ``now`` behind the on-time ones."""
        self.now = now
        queue, late = self._queue, self._late
        before = now - self.late_after
        while queue and queue[0].arrived_at < before and queue[0].num_generated == 0:
            late.append(queue.popleft())

    def _late_first(self) -> bool:
        late = self._late
        return bool(late) and (not self._queue or late[0].arrived_at <= self.now - self.late_max_wait)

    @property
    def head(self) -> LiveRequest | None:
        if self._late_first():
            return self._late[0]
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
        r = self._late.popleft() if self._late_first() else self._queue.popleft()
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
        """Take ``r`` out (queued, late or chunked); False if it is none of these."""
        if r is self.chunked:
            self.chunked = None
            self.prefill_tokens -= r.remaining_prefill
            return True
        for queue in (self._queue, self._late):
            try:
                queue.remove(r)
            except ValueError:
                continue
            self.arrival_sum -= r.arrived_at
            self.prefill_tokens -= r.remaining_prefill
            return True
        return False


def late_last_order(
    waiting: Sequence[T],
    now: float,
    late_after: float,
    late_max_wait: float,
    arrived_at: Callable[[T], float],
    has_first_token: Callable[[T], bool],
) -> list[T]:
    """``waiting`` (an engine's own queue, in its admission order) in ``WaitingQueue``'s
    late_last order: the late requests that have waited ``late_max_wait`` s, then the requests
    that can still meet their TTFT, then the other late ones, each group in its given order. A
    request is late when it has waited longer than ``late_after`` s and has no first token (a
    preempted request that had one is never late). For executors that keep the queue
    themselves (vLLM): reordered before each step, their admission follows the same rule."""
    late_before, due_before = now - late_after, now - late_max_wait
    due: list[T] = []
    on_time: list[T] = []
    late: list[T] = []
    for r in waiting:
        at = arrived_at(r)
        if at >= late_before or has_first_token(r):
            on_time.append(r)
        elif at <= due_before:
            due.append(r)
        else:
            late.append(r)
    return due + on_time + late


def late_last_reorder(
    waiting: Sequence[T],
    now: float,
    late_after: float,
    late_max_wait: float,
    arrived_at: Callable[[T], float],
    has_first_token: Callable[[T], bool],
) -> list[T] | None:
    """``late_last_order`` of an engine's queue when it moves a request, else None (nothing to
    reorder: fcfs, where ``late_after`` is inf, or fewer than two requests waiting)."""
    if late_after == inf or len(waiting) < 2:
        return None
    order = late_last_order(waiting, now, late_after, late_max_wait, arrived_at, has_first_token)
    if all(a is b for a, b in zip(order, waiting, strict=True)):
        return None
    return order

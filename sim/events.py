"""A minimal discrete-event clock: callbacks at absolute instants, run in time order.

Scenario: the pipeline simulator (sim/engine.py) needs only "call f(arg) at time t"; every
duration of a microbatch is known when it is launched, so no process has to wait on another.
This is the whole of the event machinery it uses: a heap of (time, sequence, callback, arg).

Order: by time, and among callbacks due at the same instant, in the order they were scheduled
(first scheduled, first run), which is SimPy's rule for events of equal priority. Times are
absolute (``at``), so an instant computed once is the instant the callback sees, with no
``now + (t - now)`` rounding.

Why not SimPy: a SimPy process costs a generator resume and several Event objects per wait;
the simulator spent half its time there (benchmarks/sim_speed.py, issue 13).

Units: seconds of virtual time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any


class EventClock:
    """Virtual time and the callbacks due at future instants."""

    __slots__ = ("now", "num_events", "_queue", "_seq")

    def __init__(self) -> None:
        self.now = 0.0
        self.num_events = 0  # callbacks run so far (the speed report's unit)
        self._queue: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = 0

    def at(self, when: float, callback: Callable[[Any], None], arg: Any = None) -> None:
        """Call ``callback(arg)`` at virtual time ``when`` (never before ``now``)."""
        if when < self.now:
            raise ValueError(f"cannot schedule at {when!r}, before now {self.now!r}")
        self._seq += 1
        heappush(self._queue, (when, self._seq, callback, arg))

    def next_at(self) -> float:
        """When the next scheduled callback is due (infinity when none is)."""
        return self._queue[0][0] if self._queue else math.inf

    def run(self, until: float = math.inf) -> bool:
        """Run callbacks in order while any is due before ``until``; returns True when the
        queue emptied, False when it stopped at ``until`` (then ``now == until``)."""
        queue = self._queue
        n = 0
        while queue:
            if queue[0][0] >= until:
                self.now = until
                self.num_events += n
                return False
            self.now, _, callback, arg = heappop(queue)
            callback(arg)
            n += 1
        self.num_events += n
        return True

    def __len__(self) -> int:
        """Callbacks scheduled and not yet run."""
        return len(self._queue)

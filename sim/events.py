"""The simulator's event clock: callbacks at absolute instants on a SimPy environment.

Scenario: the pipeline simulator (sim/engine.py) needs only "call f(arg) at time t"; every
duration of a microbatch is known when it is launched, so no process has to wait on another.
Each such call is one SimPy ``Timeout`` with the callback attached (callback-style events, no
generator process to resume), run by SimPy's own event loop.

Order: by time, and among callbacks due at the same instant, in the order they were scheduled
(first scheduled, first run): SimPy's rule for events of equal priority, and every event here is
a ``Timeout`` of normal priority. Times are absolute (``at``): SimPy takes a delay and adds it to
its clock, so the delay is chosen so that ``now + delay`` is exactly ``when`` (an instant
computed once is the instant the callback sees, with no rounding of ``now + (when - now)``;
where the exact sum falls on a rounding tie no delay lands on ``when``, and the callback runs
one unit in the last place later).

Cost: one Timeout object and one heap entry per call (benchmarks/sim_speed.py, issue 13).

Units: seconds of virtual time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import simpy
from simpy.events import Timeout


class EventClock:
    """Virtual time (a ``simpy.Environment``) and the callbacks due at future instants."""

    __slots__ = ("env", "num_events", "_num_scheduled")

    def __init__(self) -> None:
        # a float from the start: SimPy's default is the int 0, which a record stamped at the
        # first instant kept in Python and the compiled scheduler turns into 0.0
        self.env = simpy.Environment(initial_time=0.0)
        self.num_events = 0  # callbacks run so far (the speed report's unit)
        self._num_scheduled = 0

    @property
    def now(self) -> float:
        return self.env.now

    def at(self, when: float, callback: Callable[[Any], None], arg: Any = None) -> None:
        """Call ``callback(arg)`` at virtual time ``when`` (never before ``now``)."""
        now = self.env.now
        if when < now:
            raise ValueError(f"cannot schedule at {when!r}, before now {now!r}")
        delay = when - now
        if now + delay != when:  # the subtraction rounded: step the delay onto ``when``
            delay = _exact_delay(now, when)
        self._num_scheduled += 1
        Timeout(self.env, delay, (callback, arg)).callbacks.append(_call)

    def next_at(self) -> float:
        """When the next scheduled callback is due (infinity when none is)."""
        return self.env.peek()

    def run(self, until: float = math.inf) -> bool:
        """Run callbacks in order while any is due before ``until``; returns True when none is
        left, False when it stopped at ``until`` (then ``now == until``)."""
        env = self.env
        peek, step = env.peek, env.step
        n = 0
        while (due := peek()) < until:
            step()
            n += 1
        self.num_events += n
        if due == math.inf:
            return True
        if until > env.now:
            env.run(until=until)  # no event is due before it: this only moves the clock there
        return False

    def __len__(self) -> int:
        """Callbacks scheduled and not yet run (between runs)."""
        return self._num_scheduled - self.num_events


def _call(event: Timeout) -> None:
    """A Timeout's callback: its value is the (callback, arg) pair ``at`` was given."""
    callback, arg = cast(tuple[Callable[[Any], None], Any], event.value)  # SimPy types it Optional
    callback(arg)


def _exact_delay(now: float, when: float) -> float:
    """The delay d >= 0 with ``now + d == when`` in floating point where one exists, else the
    one whose ``now + d`` is the first float after ``when``. SimPy adds the delay to its clock,
    and ``now + (when - now)`` misses ``when`` only when the exact sum falls on a rounding tie:
    then no delay lands on ``when`` and the callback runs one unit in the last place later."""
    delay = when - now
    if now + delay == when:
        return delay
    for nearby in (math.nextafter(delay, math.inf), math.nextafter(delay, 0.0)):
        if now + nearby == when:
            return nearby
    while now + delay <= when:
        delay = math.nextafter(delay, math.inf)
    return delay

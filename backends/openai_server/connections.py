"""uvicorn's h11 connection with two guards against slow and idle clients.

- A read deadline: a request's line and headers must arrive within ``read_timeout_s`` of the
  connection opening or of the previous response ending, else the connection is closed (a
  silent socket, or a slowloris sending a byte now and then). The body has the same deadline,
  enforced by the request guard (guard.py) once the headers are in. uvicorn's own keep-alive
  timeout still closes an idle kept-alive connection sooner.
- A cap on open connections: past it, a new connection closes the connection that has waited
  longest without a request under way (a flood of idle sockets cannot keep /health or a new
  client out), or itself when every connection is busy with a request.
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


class GuardedH11Protocol(H11Protocol):
    """Subclassed per server by :func:`guarded_protocol`, which sets the two limits."""

    read_timeout_s: float = 30.0
    max_connections: int = 1024

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._read_deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._waiting_since = self.loop.time()
        self._arm_read_deadline()
        if len(self.connections) > self.max_connections:
            self._shed_one()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read_deadline()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self._read_deadline is not None and self.conn.their_state is not h11.IDLE:
            self._cancel_read_deadline()  # the request's head is in

    def on_response_complete(self) -> None:
        self._waiting_since = self.loop.time()
        self._arm_read_deadline()  # before: a pipelined request it handles at once cancels it
        super().on_response_complete()

    @property
    def waiting_for_request(self) -> bool:
        """No request under way: before the first, or between responses."""
        return self.cycle is None or self.cycle.response_complete

    def _arm_read_deadline(self) -> None:
        self._cancel_read_deadline()
        self._read_deadline = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _cancel_read_deadline(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

    def _shed_one(self) -> None:
        idle = [
            c
            for c in self.connections
            if c is not self
            and isinstance(c, GuardedH11Protocol)
            and c.waiting_for_request
            and not c.transport.is_closing()
        ]
        if idle:
            min(idle, key=lambda c: c._waiting_since).transport.close()
        else:
            log.warning(
                "%d connections open, all busy (--max-connections %d): refusing a new one",
                len(self.connections) - 1,
                self.max_connections,
            )
            self.transport.close()


def guarded_protocol(read_timeout_s: float, max_connections: int) -> type[GuardedH11Protocol]:
    """The protocol class to give ``uvicorn.Config(http=...)``, with these limits."""
    return type(
        "ServerH11Protocol",
        (GuardedH11Protocol,),
        {"read_timeout_s": read_timeout_s, "max_connections": max_connections},
    )

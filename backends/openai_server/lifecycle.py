"""How ``fastpp serve`` stops: on SIGINT or SIGTERM (to the process or to its whole group, as a
terminal's Ctrl-C and systemd send them), whatever it is doing.

- While the model loads, the first signal raises :class:`StopRequested`; the runner ends the
  stage processes and exits 0.
- While serving, the first signal drains (:func:`drain`): new requests and /health get 503, the
  open requests get up to the shutdown timeout to finish, the rest are ended with an error
  (streams get an error event and ``data: [DONE]``), the responses are let out, then the HTTP
  server closes, the engine stops and the record dir is written.
- A second signal, at any time, exits at once (code 128 + the signal's number) without
  finishing anything: one log line, no traceback.

uvicorn's own signal handling is replaced (:class:`DrainingServer`): it would re-raise the
signal after its shutdown, before ours has run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn

log = logging.getLogger("fastpp.serve")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
ABORT_WAIT_S = 3.0  # after the aborts: how long the pipeline has to hand its last microbatches back
FLUSH_WAIT_S = 3.0  # how long ended responses have to reach their clients before the server closes


class StopRequested(BaseException):
    """A stop signal arrived while the model was loading (BaseException: no ``except Exception``
    on the way may swallow it)."""


class StopSignals:
    """The process's SIGINT / SIGTERM handler. ``serving`` switches the first signal from
    raising :class:`StopRequested` to asking :class:`DrainingServer` to drain."""

    def __init__(self) -> None:
        self.received: int | None = None  # the first signal's number
        self.serving = False
        self.stopping = False  # past serving: any signal exits at once
        self.on_exit_now: Callable[[], None] = lambda: None  # e.g. kill the stage processes
        self._saved: dict[int, Any] = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else ""

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._saved = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}

    def restore(self) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved = {}

    def _handle(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.received is not None or self.stopping:
            log.warning(
                "%s again: exiting now, without finishing open requests or writing the record dir", name
            )
            try:
                self.on_exit_now()
            finally:
                for handler in logging.getLogger().handlers:
                    handler.flush()
                sys.stdout.flush()
                os._exit(128 + signum)
        self.received = signum
        if not self.serving:
            log.info("%s while loading: stopping", name)
            raise StopRequested(name)


class DrainingServer(uvicorn.Server):
    """uvicorn's server with our signal handling: ``drain()`` runs inside the server's main loop
    (the socket still open, answering 503) once a signal has arrived, before uvicorn's shutdown."""

    def __init__(self, config: uvicorn.Config, signals: StopSignals, drain: Callable[[], Any]) -> None:
        super().__init__(config)
        self.signals = signals
        self.drain = drain

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # StopSignals is installed for the process's whole life

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):
            if self.signals.received is not None:
                await self.drain()
                return
            counter = (counter + 1) % 864000
            await asyncio.sleep(0.1)


async def wait_until(done: Callable[[], bool], timeout_s: float, every_s: float = 0.05) -> bool:
    """Poll ``done()`` until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(every_s)
    return True


async def drain(state: Any, engine: Any, timeout_s: float, signal_name: str) -> bool:
    """Stop admitting, let open requests finish within ``timeout_s``, end the rest, and wait for
    their responses to go out. Returns True if the stage processes had to be killed (they did
    not hand back their last microbatches)."""
    state.draining = True
    open_now = engine.num_unfinished
    if open_now:  # idle, the runner's stop line says it all
        log.info(
            "%s: stopping; %d open request(s) get up to %g s to finish (--shutdown-timeout)",
            signal_name,
            open_now,
            timeout_s,
        )

    def settled() -> bool:
        return engine.num_unfinished == 0 or not engine.is_alive

    killed = False
    if not await wait_until(settled, timeout_s):
        log.info("ending %d request(s) still open after %g s", engine.num_unfinished, timeout_s)
        engine.abort_all(
            f"the server is shutting down ({signal_name}); the request did not finish within "
            f"the {timeout_s:g} s shutdown timeout"
        )
        if not await wait_until(settled, ABORT_WAIT_S):
            killed = True
            engine.stall(
                f"the server is shutting down ({signal_name}) and the pipeline did not return its "
                f"microbatches within {ABORT_WAIT_S:g} s"
            )
            await wait_until(lambda: not engine.is_alive and engine.num_unfinished == 0, ABORT_WAIT_S)
    await wait_until(lambda: state.open_responses <= 0, FLUSH_WAIT_S)
    return killed

"""Is every stage making progress? Heartbeats and step deadlines in shared memory, and the
signal and socket settings of the stage processes.

Each stage process runs a heartbeat thread that writes ``time.monotonic()`` (CLOCK_MONOTONIC,
the same clock in every process of the machine) into its slot every ``HEARTBEAT_S``, and marks
when it starts and ends computing a microbatch. A process that is stopped (SIGSTOP, a debugger,
swapped out) stops beating; one stuck in a computation keeps its step mark. The engine's
watchdog (:meth:`Liveness.stalled`) names the first stage that has done either for longer than
the stage timeout.

Stage processes ignore SIGINT and SIGTERM: a terminal's Ctrl-C and systemd's stop signal reach
the whole process group, and the engine, not the signal, decides when a stage ends (a STOP
message, or SIGKILL once it has given up on it).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

HEARTBEAT_S = 0.25  # how often a stage process writes its heartbeat
# stage 0 sends a ping down the pipeline when it has sent nothing for this long, so every
# receive in the pipeline gets a message well within the (finite) collective timeout
PING_INTERVAL_S = 5.0
MIN_COLLECTIVE_TIMEOUT_S = 60.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def collective_timeout(stage_timeout_s: float) -> timedelta:
    """How long a torch.distributed operation may wait before gloo gives up: a backstop behind
    the watchdog, finite, and far above the ping interval and one step."""
    return timedelta(seconds=max(MIN_COLLECTIVE_TIMEOUT_S, 2 * stage_timeout_s))


def loopback_gloo() -> None:
    """Make gloo listen on the loopback interface only (unless the user chose one): set in the
    engine's process before the stage processes start, so they inherit it."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def ignore_stop_signals() -> None:
    """In a stage process: SIGINT and SIGTERM do nothing (see the module docstring)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def stop_signals_ignored_by_children() -> Iterator[None]:
    """Start processes inside this block and they begin life ignoring SIGINT and SIGTERM (spawn
    execs a fresh interpreter, which keeps an ignored disposition), so a Ctrl-C during their
    start-up cannot print a KeyboardInterrupt traceback. Only the main thread can change signal
    handlers; elsewhere this does nothing and the stage ignores them once it runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


class Liveness:
    """Per stage: the last heartbeat and the start of the microbatch it is computing (0: none),
    on ``time.monotonic``. Created before the stage processes and passed to them at spawn."""

    def __init__(self, num_stages: int) -> None:
        ctx = mp.get_context("spawn")
        self.beats = ctx.RawArray("d", num_stages)
        self.steps = ctx.RawArray("d", num_stages)

    def beat(self, rank: int) -> None:
        self.beats[rank] = time.monotonic()

    def start_beating(self, rank: int) -> None:
        """Beat now and then every HEARTBEAT_S from a daemon thread, for the process's life."""
        self.beat(rank)

        def run() -> None:
            while True:
                time.sleep(HEARTBEAT_S)
                self.beat(rank)

        threading.Thread(target=run, name=f"fastpp-heartbeat-{rank}", daemon=True).start()

    @contextlib.contextmanager
    def step(self, rank: int) -> Iterator[None]:
        """Mark ``rank`` as computing for the duration of the block."""
        self.steps[rank] = time.monotonic()
        try:
            yield
        finally:
            self.steps[rank] = 0.0

    def stalled(self, timeout_s: float, beating: range, now: float | None = None) -> str | None:
        """Why a stage has made no progress for more than ``timeout_s`` (None if all have).
        ``beating``: the ranks that run a heartbeat (the stage processes)."""
        now = time.monotonic() if now is None else now
        for rank in range(len(self.steps)):
            if rank in beating and now - self.beats[rank] > timeout_s:
                return (
                    f"stage {rank} stopped responding: no heartbeat for {now - self.beats[rank]:.1f} s "
                    f"(stage timeout {timeout_s:g} s)"
                )
            started = self.steps[rank]
            if started and now - started > timeout_s:
                return (
                    f"stage {rank} has been computing one microbatch for {now - started:.1f} s "
                    f"(stage timeout {timeout_s:g} s)"
                )
        return None

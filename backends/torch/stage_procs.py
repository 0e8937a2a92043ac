"""Stage processes 1..P-1: spawn them, wait until each has loaded, tell them to connect, watch
for deaths, and end them.

They ignore SIGINT and SIGTERM (stage_liveness): they end on the pipeline's STOP message, or
are killed (SIGKILL) when the engine gives up on them.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait

from fastpp.backends.torch.stage_liveness import Liveness, stop_signals_ignored_by_children
from fastpp.backends.torch.stage_runtime import StageSpec, stage_main

log = logging.getLogger(__name__)


class StageStartError(RuntimeError):
    """A stage process failed to start (load error, early exit, or load timeout)."""


class StageProcesses:
    """Processes of stages 1..P-1 (none when P = 1)."""

    def __init__(self, spec: StageSpec, liveness: Liveness) -> None:
        self.spec = spec
        self.liveness = liveness
        self.procs: list[mp.process.BaseProcess] = []
        self._conns: list = []  # to each stage, open until :meth:`connect`
        self._stopping = threading.Event()

    def spawn(self, load_timeout_s: float) -> None:
        """Start every stage and return once all have loaded their weights.

        Raises :class:`StageStartError` (with the stage's own message) if one fails or exits.
        """
        ctx = mp.get_context("spawn")  # fork would copy stage 0's torch threads and locks
        conns = {}
        t0 = time.monotonic()
        for rank in range(1, self.spec.num_stages):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=stage_main,
                args=(rank, self.spec, child, self.liveness),
                name=f"fastpp-stage-{rank}",
                daemon=True,
            )
            with stop_signals_ignored_by_children():
                proc.start()
            child.close()
            self.procs.append(proc)
            self._conns.append(parent)
            conns[parent] = rank
        log.info("loading stages 1..%d in %d process(es)", self.spec.num_stages - 1, len(self.procs))
        deadline = time.monotonic() + load_timeout_s
        waiting = dict(conns)
        sentinels = {p.sentinel: i + 1 for i, p in enumerate(self.procs)}
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                self.terminate()
                raise StageStartError(
                    f"stages {sorted(waiting.values())} did not load within {load_timeout_s:.0f} s"
                )
            for ready in wait(list(waiting) + list(sentinels), timeout=left):
                if ready in sentinels:
                    rank = sentinels[ready]
                    if any(r == rank for r in waiting.values()):
                        msg = self._drain_error(conns, rank)
                        self.terminate()
                        raise StageStartError(
                            msg
                            or f"stage {rank} exited with code {self.procs[rank - 1].exitcode} while loading"
                        )
                    continue
                try:
                    kind, value = ready.recv()  # type: ignore[union-attr]
                except EOFError:
                    continue  # its sentinel reports the exit
                if kind == "error":
                    self.terminate()
                    raise StageStartError(value)
                log.info("stage %d loaded (%.1f s)", waiting.pop(ready), time.monotonic() - t0)

    def connect(self) -> None:
        """Tell every stage to join the process group (stage 0 is about to)."""
        for conn in self._conns:
            conn.send(("connect",))
            conn.close()
        self._conns.clear()

    @staticmethod
    def _drain_error(conns: dict, rank: int) -> str:
        for conn, r in conns.items():
            if r == rank and conn.poll():
                try:
                    kind, value = conn.recv()
                except EOFError:
                    return ""
                if kind == "error":
                    return value
        return ""

    def watch(self, on_death: Callable[[str], None]) -> None:
        """Call ``on_death(message)`` from a daemon thread if a stage exits before :meth:`stop`."""
        if not self.procs:
            return

        def run() -> None:
            wait([p.sentinel for p in self.procs])
            if self._stopping.is_set():
                return
            on_death(self.deaths(wait_s=1.0))

        threading.Thread(target=run, name="fastpp-stage-watch", daemon=True).start()

    def deaths(self, wait_s: float = 0.0) -> str:
        """Which stages have exited, and how ("" if none); waits up to ``wait_s`` for one to."""
        deadline = time.monotonic() + wait_s
        while True:
            dead = [
                f"stage {i + 1} process (pid {p.pid}) exited with code {p.exitcode}"
                for i, p in enumerate(self.procs)
                if p.exitcode is not None
            ]
            if dead or time.monotonic() >= deadline:
                return "; ".join(dead)
            time.sleep(0.05)

    def stopping(self) -> None:
        """Say that exits from now on are expected."""
        self._stopping.set()

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self.terminate()

    def terminate(self) -> None:
        """End every stage still running (they ignore SIGTERM: SIGKILL), expectedly."""
        self._stopping.set()
        self.kill()

    def kill(self) -> None:
        """SIGKILL every stage still running; unless :meth:`stopping` was said, the watcher reports
        the deaths (the engine fails, naming why it killed them)."""
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(5)
        for conn in self._conns:
            conn.close()
        self._conns.clear()

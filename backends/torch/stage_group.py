"""Stages 1..P-1 joined to stage 0 (the engine's process): spawn and load them, rendezvous,
watch that every stage makes progress, and end them.

The rendezvous goes through a torch.distributed FileStore in a private temporary folder (no
listening socket for a store), removed when the group closes; gloo's own connections use the
loopback interface (``GLOO_SOCKET_IFNAME=lo`` unless set). Collective operations time out
(:func:`~fastpp.backends.torch.stage_liveness.collective_timeout`), well after the watchdog
would have named a stalled stage.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from fastpp.backends.torch.stage_liveness import Liveness, collective_timeout, loopback_gloo
from fastpp.backends.torch.stage_procs import StageProcesses
from fastpp.backends.torch.stage_runtime import StageSpec

log = logging.getLogger(__name__)

WATCH_EVERY_S = 0.5


class StageGroup:
    """``StageGroup.spawn(spec, ...)`` loads stages 1..P-1; ``connect()`` once stage 0 has loaded."""

    def __init__(self, spec: StageSpec, liveness: Liveness, store_dir: Path, procs: StageProcesses) -> None:
        self.spec = spec
        self.liveness = liveness
        self.procs = procs
        self._store_dir = store_dir

    @classmethod
    def spawn(cls, spec: StageSpec, liveness: Liveness, load_timeout_s: float) -> StageGroup:
        """Start the stage processes and return once each has loaded its layers (raises
        StageStartError naming the stage otherwise; nothing is left running)."""
        loopback_gloo()
        store_dir = Path(tempfile.mkdtemp(prefix="fastpp-rendezvous-"))  # mode 0700
        spec = dataclasses.replace(spec, store_path=str(store_dir / "store"))
        procs = StageProcesses(spec, liveness)
        try:
            procs.spawn(load_timeout_s)
        except BaseException:  # a load error, or a stop signal while loading
            procs.terminate()
            shutil.rmtree(store_dir, ignore_errors=True)
            raise
        return cls(spec, liveness, store_dir, procs)

    def connect(self) -> None:
        """Join stage 0 (this process) and the stage processes in one gloo process group."""
        self.procs.connect()
        if dist.is_initialized():  # left by an earlier engine of this process that stopped
            dist.destroy_process_group()  # uncleanly (a dead stage): its peers are gone
        dist.init_process_group(
            "gloo",
            init_method=f"file://{self.spec.store_path}",
            rank=0,
            world_size=self.spec.num_stages,
            timeout=collective_timeout(self.spec.stage_timeout_s),
        )
        log.info("pipeline connected: %d stages over gloo on the loopback interface", self.spec.num_stages)

    def close(self, timeout_s: float, clean: bool) -> None:
        """Wait up to ``timeout_s`` for the stages to end (they got STOP), kill any left, leave the
        process group (only after a ``clean`` stop: a dead peer can hang it) and remove the store."""
        self.procs.stopping()
        self.procs.join(timeout_s)
        if clean and dist.is_initialized():
            dist.destroy_process_group()
        shutil.rmtree(self._store_dir, ignore_errors=True)


def watch_progress(
    liveness: Liveness,
    timeout_s: float,
    num_stages: int,
    stopped: threading.Event,
    oldest_inflight: Callable[[], float | None],
    on_stall: Callable[[str], None],
) -> None:
    """From a daemon thread, until ``stopped``: call ``on_stall(why)`` once if a stage process
    stops beating, a stage computes one microbatch longer than ``timeout_s``, or the oldest
    microbatch in flight (its launch time on ``time.monotonic``) has not come back within
    ``timeout_s`` per stage and one more."""
    beating = range(1, num_stages)
    round_trip_s = timeout_s * (num_stages + 1)

    def run() -> None:
        while not stopped.wait(WATCH_EVERY_S):
            now = time.monotonic()
            why = liveness.stalled(timeout_s, beating, now)
            launched = oldest_inflight()
            if why is None and launched is not None and now - launched > round_trip_s:
                why = (
                    f"a microbatch has not come back through the {num_stages} stage(s) in "
                    f"{now - launched:.1f} s (stage timeout {timeout_s:g} s)"
                )
            if why is not None:
                on_stall(why)
                return

    threading.Thread(target=run, name="fastpp-watchdog", daemon=True).start()

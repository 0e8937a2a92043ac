"""Waiting for a real engine's environment that is still being built beside the test run.

.ci/run builds the SGLang and vLLM environments (scripts/engines/setup_*.sh, mostly downloads)
in the background while the rest of the suite runs. Each setup holds an exclusive lock on
``<venv>.setup.lock`` for as long as it runs (scripts/engines/common.sh); a real-engine test
takes the lock shared before it looks for the environment, so it never starts on a half-built
venv, and reads the exit status the setup left in the file. With no setup ever run here (no
lock file) it returns at once.
"""

from __future__ import annotations

import fcntl
import time
from pathlib import Path

SETUP_TIMEOUT_S = 1800.0


def setup_lock(venv: Path) -> Path:
    """The lock file scripts/engines/common.sh holds while it builds ``venv``."""
    return venv.with_name(venv.name + ".setup.lock")


def wait_for_setup(venv: Path, timeout_s: float = SETUP_TIMEOUT_S) -> float:
    """Block until no setup of ``venv`` runs; the seconds waited. ``TimeoutError`` naming the
    lock when one still runs after ``timeout_s``; ``RuntimeError`` when the last setup failed
    (the exit status it wrote into the lock file, or none: it was killed)."""
    lock = setup_lock(venv)
    if not lock.exists():
        return 0.0
    start = time.monotonic()
    with lock.open("rb") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                waited = time.monotonic() - start
                if waited > timeout_s:
                    msg = f"the setup of {venv} still runs after {waited:.0f} s (it holds {lock})"
                    raise TimeoutError(msg) from None
                time.sleep(1.0)
                continue
            status = f.read().decode().strip()
            fcntl.flock(f, fcntl.LOCK_UN)
            if status != "0":
                ended = f"exit status {status}" if status else "no exit status: it was killed"
                raise RuntimeError(
                    f"the setup of {venv} failed ({ended}): its log is {venv.parent}/setup_*.log "
                    "under .ci/run; rerun scripts/engines/setup_*.sh to see why"
                )
            return time.monotonic() - start

"""The lock a real engine's setup holds while it builds (scripts/engines/common.sh) and the wait
the real-engine tests make on it (tests/engine_setup.py), so that .ci/run can build the engines
beside the rest of the suite."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from engine_setup import setup_lock, wait_for_setup

COMMON = Path(__file__).resolve().parents[1] / "scripts" / "engines" / "common.sh"
pytestmark = pytest.mark.skipif(shutil.which("flock") is None, reason="no flock(1): setups take no lock")


def _setup_running(engines: Path, hold_s: float, status: int = 0) -> subprocess.Popen[bytes]:
    """A stand-in setup: sources common.sh as setup_*.sh do, works for ``hold_s``, then exits
    with ``status``."""
    script = (
        f"set -euo pipefail; VENV_NAME=demo-1.0; source {COMMON}; echo locked; sleep {hold_s}; exit {status}"
    )
    proc = subprocess.Popen(
        ["bash", "-c", script],
        env={"FASTPP_ENGINES_DIR": str(engines), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        start_new_session=True,  # its sleep holds the lock too: stopped with it (os.killpg)
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"locked\n"
    return proc


def test_no_setup_ever_run_means_no_wait(tmp_path):
    assert wait_for_setup(tmp_path / "demo-1.0") == 0.0


def test_a_test_waits_until_the_running_setup_exits(tmp_path):
    proc = _setup_running(tmp_path, 2.0)
    assert setup_lock(tmp_path / "demo-1.0").exists()
    waited = wait_for_setup(tmp_path / "demo-1.0")
    assert waited > 0.5 and proc.wait(timeout=10) == 0  # it waited for the setup to end
    assert wait_for_setup(tmp_path / "demo-1.0") < 0.5  # a finished setup's lock file is free


def test_a_setup_that_outlasts_the_timeout_is_named(tmp_path):
    proc = _setup_running(tmp_path, 30.0)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=r"demo-1\.0 still runs after .*demo-1\.0\.setup\.lock"):
            wait_for_setup(tmp_path / "demo-1.0", timeout_s=1.0)
        assert time.monotonic() - start < 10
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_failed_setup_is_named_with_its_exit_status(tmp_path):
    proc = _setup_running(tmp_path, 0.5, status=3)
    with pytest.raises(RuntimeError, match=r"setup of .*demo-1\.0 failed \(exit status 3\)"):
        wait_for_setup(tmp_path / "demo-1.0")
    assert proc.wait(timeout=10) == 3
    _setup_running(tmp_path, 0.0).wait(timeout=10)  # a later setup that succeeds clears it
    assert wait_for_setup(tmp_path / "demo-1.0") < 0.5


def test_a_killed_setup_is_named(tmp_path):
    proc = _setup_running(tmp_path, 30.0)
    os.killpg(proc.pid, signal.SIGKILL)  # no EXIT trap runs: the file stays empty
    proc.wait()
    with pytest.raises(RuntimeError, match="no exit status: it was killed"):
        wait_for_setup(tmp_path / "demo-1.0")

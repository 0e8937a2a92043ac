"""Run ``fastpp serve`` as a subprocess on a free port: for tests and benchmarks that talk to it
over loopback (needs httpx)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx

from fastpp.backends.ports import free_port

# `fastpp` in this interpreter. Not `-m fastpp.cli.app`: as __main__ the app module would be a
# second copy, without the subcommands that register themselves on fastpp.cli.app.
FASTPP_COMMAND = (
    sys.executable,
    "-c",
    "import sys; from fastpp.cli.app import main; sys.argv[0] = 'fastpp'; main()",
)


class ServerProcess:
    """``with ServerProcess([...extra args]) as srv:`` -> ``srv.url``; logs in ``srv.log()``."""

    def __init__(self, *args: str, start_timeout_s: float = 180.0, new_session: bool = False) -> None:
        """``new_session``: its own session and process group (:meth:`signal_group` signals them
        all, as a terminal's Ctrl-C does, without reaching the caller)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [*FASTPP_COMMAND, "serve", "--port", str(self.port), *args]
        self.start_timeout_s = start_timeout_s
        self._log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # noqa: SIM115 (lives with the server)
        self.proc: subprocess.Popen | None = None
        self.new_session = new_session

    def __enter__(self) -> ServerProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            self.args, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=self.new_session
        )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server not healthy within {self.start_timeout_s} s:\n{self.log()}")

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """Ctrl-C the server and wait for it; returns its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the server's whole process group (needs ``new_session``)."""
        assert self.proc is not None and self.new_session
        os.killpg(self.proc.pid, sig)

    def log(self) -> str:
        self._log.flush()
        with open(self._log.name) as f:
            return f.read()

    def stage_pids(self) -> list[int]:
        """PIDs of the stage processes (spawned children; not multiprocessing's resource tracker)."""
        assert self.proc is not None
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True)
        pids = []
        for pid in map(int, out.stdout.split()):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"spawn_main" in f.read():
                    pids.append(pid)
        return pids

    def metrics(self) -> dict[str, float]:
        """``/metrics`` samples as ``name{label="value",...}`` (labels sorted, model_name dropped)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(self.url + "/metrics", timeout=10).text
        values = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k != "model_name")
                values[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
        return values

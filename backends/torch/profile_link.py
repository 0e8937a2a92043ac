"""Link cost between two stage processes: torch.distributed gloo point to point on 127.0.0.1.

Two subprocesses (one intra-op thread each) play ping-pong: rank 0 sends a message (an
int64 header, then a ``[rows, hidden]`` tensor, as the engine sends a microbatch) and rank 1
answers with an 8-byte ack. With ``rtt(0)`` the round trip of a header-only message, the one-way
time of a message is ``rtt(rows) - rtt(0) / 2``; a weighted least-squares line through those
points gives ``latency_s + bytes / bandwidth_bytes_per_s`` (the profile's alpha-beta link).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from fastpp.backends.ports import free_port

WARMUP = 3  # untimed ping-pongs per size
# The MINIMUM round trip of the repeats is kept, not the median: a process blocked in recv waits
# for a CPU time slice when the machine is busy (on 2 shared cores round trips measured 0.25 ms
# or 4-8 ms, bimodal), which is the load of the moment, not the link.
DEFAULT_REPEATS = 50
STARTUP_TIMEOUT_S = 120.0  # spawning two processes that import torch, on a busy 2-core machine


@dataclass(frozen=True, slots=True)
class LinkMeasurement:
    latency_s: float  # fitted alpha: one-way time of a message of 0 payload bytes
    bandwidth_bytes_per_s: float  # fitted beta
    points: tuple[tuple[int, float], ...]  # (payload bytes, measured one-way seconds), rows > 0


def _worker(rank: int, port: int, hidden: int, dtype_name: str, rows: Sequence[int], repeats: int) -> None:
    """One side of the ping-pong; rank 0 prints the round trips as JSON ``{rows: seconds}``."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=STARTUP_TIMEOUT_S),
    )
    dtype = getattr(torch, dtype_name)
    header = torch.zeros(1, dtype=torch.int64)
    ack = torch.zeros(1, dtype=torch.int64)
    try:
        if rank == 1:  # echo side: receive a message, answer with the ack, until rows < 0
            while True:
                dist.recv(header, src=0)
                n = int(header[0])
                if n < 0:
                    return
                if n:
                    dist.recv(torch.empty(n, hidden, dtype=dtype), src=0)
                dist.send(ack, dst=0)
        sizes = (0, *rows)
        payloads = {n: torch.randn(n, hidden).to(dtype) for n in sizes}
        rtt = {n: float("inf") for n in sizes}
        for i in range(WARMUP + repeats):  # sizes interleaved: a busy spell hits every size a little
            for n in sizes:
                t0 = time.perf_counter()
                header[0] = n
                dist.send(header, dst=1)
                if n:
                    dist.send(payloads[n], dst=1)
                dist.recv(ack, src=1)
                if i >= WARMUP:
                    rtt[n] = min(rtt[n], time.perf_counter() - t0)
        header[0] = -1
        dist.send(header, dst=1)
        print(json.dumps(rtt), flush=True)
    finally:
        dist.destroy_process_group()


def measure_link(
    hidden_size: int,
    dtype_name: str,
    rows: Sequence[int],
    repeats: int = DEFAULT_REPEATS,
    timeout_s: float = STARTUP_TIMEOUT_S,
) -> LinkMeasurement:
    """Measure the gloo loopback link for messages of ``rows`` x ``hidden_size`` elements of
    ``dtype_name`` ("float32", "bfloat16"). The two sides are ``python -m`` subprocesses (no
    ``multiprocessing`` re-import of the caller's main module). Raises RuntimeError when one
    fails or they time out; both are killed then, nothing is left running."""
    if not rows or min(rows) < 1:
        raise ValueError(f"rows must be positive counts, got {list(rows)}")
    cmd = [
        sys.executable,
        "-m",
        __name__,
        str(free_port()),
        str(hidden_size),
        dtype_name,
        ",".join(str(n) for n in rows),
        str(repeats),
    ]
    procs = [
        subprocess.Popen([*cmd, str(rank)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in (0, 1)
    ]
    try:
        deadline = time.monotonic() + timeout_s
        while procs[0].poll() is None:
            failed = procs[1].poll()
            if failed not in (None, 0) or time.monotonic() > deadline:
                why = f"exit code {failed}" if failed else f"no result in {timeout_s:.0f} s"
                raise RuntimeError(f"link measurement failed: echo process {why}: {_tail(procs[1])}")
            time.sleep(0.05)
        out, err = procs[0].communicate()
        if procs[0].returncode != 0:
            raise RuntimeError(f"link measurement failed (exit code {procs[0].returncode}): {err[-2000:]}")
        procs[1].wait(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    rtt = {int(k): float(v) for k, v in json.loads(out.strip().splitlines()[-1]).items()}
    return fit_link(rtt, hidden_size * _elem_bytes(dtype_name))


def _tail(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        return "(still running)"
    return (proc.stderr.read() if proc.stderr else "")[-2000:]


def _elem_bytes(dtype_name: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}[dtype_name]


def fit_link(rtt: dict[int, float], bytes_per_row: int) -> LinkMeasurement:
    """Alpha-beta fit of round trips ``rtt[rows]`` (rows 0 = header only); see the module doc."""
    half = rtt[0] / 2
    sizes = sorted(n for n in rtt if n > 0)
    points = tuple((n * bytes_per_row, max(rtt[n] - half, 1e-9)) for n in sizes)
    b = np.array([0.0] + [p[0] for p in points])
    t = np.array([half] + [p[1] for p in points])
    w = 1.0 / t  # relative residuals: small and large messages count alike
    A = np.column_stack([np.ones_like(b), b]) * w[:, None]
    (alpha, inv_bw), *_ = np.linalg.lstsq(A, t * w, rcond=None)
    if inv_bw <= 0:  # noise swamped the size dependence: the biggest message sets the bandwidth
        alpha, inv_bw = half, max(points[-1][1] - half, 1e-9) / points[-1][0]
    return LinkMeasurement(max(float(alpha), 0.0), float(1.0 / inv_bw), points)


if __name__ == "__main__":  # python -m fastpp.backends.torch.profile_link PORT HIDDEN DTYPE ROWS REPEATS RANK
    _port, _hidden, _dtype, _rows, _repeats, _rank = sys.argv[1:7]
    _worker(int(_rank), int(_port), int(_hidden), _dtype, [int(n) for n in _rows.split(",")], int(_repeats))

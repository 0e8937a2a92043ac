"""``fastpp serve`` under abuse, signals and stalls (issue 27), over loopback:

- body-size limit (413 before reading, also for a chunked body), slow and silent connections
  (408 / closed after --read-timeout), a flood of idle sockets past --max-connections that
  cannot starve /health;
- mixed streamed and non-streamed load with random client cancellations: /metrics adds up and
  every KV block comes back; then SIGINT to the whole process group mid-load (a terminal's
  Ctrl-C): 503 for new requests and /health, open requests finished or ended with a clean
  OpenAI error (streams: an error event and ``data: [DONE]``), the record dir holds every
  request the engine took with its end reason, exit 0, no traceback;
- a stage stopped (SIGSTOP) mid-load: found within --stage-timeout, every open request ends
  with an error naming the stage, /health 503, exit 1; and Ctrl-C in that state (no stage
  timeout reached) exits 0 within the shutdown timeout and a few seconds;
- SIGTERM to an idle server exits 0 with its one stop line; a second SIGTERM exits at once;
- the cheap option checks fail before any model is loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
import httpx  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from fastpp.backends.openai_server.launcher import ServerProcess  # noqa: E402
from fastpp.backends.ports import free_port  # noqa: E402
from fastpp.cli.app import app  # noqa: E402

pytestmark = pytest.mark.slow  # each server start costs seconds

KV_BLOCKS = 128
READ_TIMEOUT_S = 2
MAX_CONNECTIONS = 48
MAX_BODY = 64 * 1024
TINY = ("--model", "random:tiny", "--kv-blocks", str(KV_BLOCKS), "--block-size", "4", "--log-level", "info")
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def record_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("chaos-run")


@pytest.fixture(scope="module")
def server(record_dir):
    args = (
        *TINY,
        "--pp",
        "2",
        "--record-dir",
        str(record_dir),
        "--max-queue",
        "64",
        "--shutdown-timeout",
        "3",
        "--read-timeout",
        str(READ_TIMEOUT_S),
        "--max-connections",
        str(MAX_CONNECTIONS),
        "--max-body-bytes",
        str(MAX_BODY),
    )
    with ServerProcess(*args, new_session=True) as srv:
        yield srv


def wait_idle(srv: ServerProcess, timeout_s: float = 60.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        m = srv.metrics()
        ended = sum(v for k, v in m.items() if k.startswith("fastpp_request_success_total"))
        if (
            m["fastpp_num_requests_running"] == 0
            and m["fastpp_num_requests_waiting"] == 0
            and ended == m["fastpp_requests_received_total"]
            and m["fastpp_kv_blocks_free"] == KV_BLOCKS
        ):
            return m
        assert time.monotonic() < deadline, f"server not idle: {m}"
        time.sleep(0.2)


def test_bodies_over_the_limit_get_413_before_they_are_read(server):
    big = json.dumps({"prompt": list(range(40_000)), "max_tokens": 1}).encode()
    assert len(big) > MAX_BODY
    r = httpx.post(server.url + "/v1/completions", content=big, headers=JSON, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
    assert r.headers["connection"] == "close"

    def chunks():  # no Content-Length: cut off as it passes the limit
        for _ in range(50):
            yield b"[" * 10_000

    r = httpx.post(server.url + "/v1/completions", content=chunks(), headers=JSON, timeout=30)
    assert r.status_code == 413 and "--max-body-bytes" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2}, timeout=30)
    assert r.status_code == 200, r.text


def test_silent_and_half_sent_connections_are_closed_after_the_read_timeout(server):
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    t0 = time.monotonic()
    assert silent.recv(100) == b""  # closed by the server, nothing said
    assert time.monotonic() - t0 < READ_TIMEOUT_S + 3
    half = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    half.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"prompt"'
    )
    head = half.recv(4096)
    assert head.startswith(b"HTTP/1.1 408"), head
    silent.close()
    half.close()


def test_a_flood_of_idle_connections_cannot_starve_health(server):
    flood = [
        socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(3 * MAX_CONNECTIONS)
    ]
    try:
        t0 = time.monotonic()
        r = httpx.get(server.url + "/health", timeout=10)
        assert r.status_code == 200 and time.monotonic() - t0 < 3
        time.sleep(0.3)
        closed = 0
        for s in flood:
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                closed += s.recv(1) == b""
        assert closed >= len(flood) - MAX_CONNECTIONS  # the longest-idle ones made room
    finally:
        for s in flood:
            s.close()


class Tally:
    """Every request's fate, as its client saw it."""

    def __init__(self) -> None:
        self.fates: Counter = Counter()
        self.unexpected: list[str] = []
        self.stop_new = False  # a well-behaved client stops sending once the server stops


async def one_request(client: httpx.AsyncClient, rng: random.Random, tally: Tally) -> None:
    n = rng.randrange(2, 40)
    stream = rng.random() < 0.5
    chat = rng.random() < 0.5
    body: dict = {"max_tokens": n, "ignore_eos": True, "temperature": rng.choice([0, 0.8]), "stream": stream}
    text = "".join(chr(rng.randrange(97, 123)) for _ in range(rng.randrange(1, 60)))
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body |= {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}
    cancel = rng.random() < 0.3
    try:
        if not stream:
            r = await client.post(path, json=body, timeout=rng.uniform(0.01, 0.3) if cancel else 60)
            fate_of_response(r.status_code, r.json(), n, tally)
            return
        async with client.stream("POST", path, json=body, timeout=60) as r:
            if r.status_code != 200:
                fate_of_response(r.status_code, json.loads(await r.aread()), n, tally)
                return
            events = []
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if cancel:
                        tally.fates["cancelled"] += 1
                        return  # leaving the block closes the connection mid-stream
        fate_of_stream(events, tally)
    except httpx.TimeoutException:
        tally.fates["cancelled"] += 1
    except httpx.ConnectError:
        tally.fates["not connected (server gone)"] += 1
    except httpx.HTTPError as exc:
        tally.unexpected.append(f"{type(exc).__name__}: {exc}")


def fate_of_response(status: int, body: dict, n: int, tally: Tally) -> None:
    if status == 200:
        if body["usage"]["completion_tokens"] == n:
            tally.fates["completed"] += 1
        else:
            tally.unexpected.append(f"200 with {body['usage']} for {n} tokens")
    elif status == 503 and body["error"]["code"] == "shutting_down":
        tally.fates["refused: shutting down"] += 1
    elif status == 503 and "shutting down" in body["error"]["message"]:
        tally.fates["ended by the shutdown"] += 1
    elif status == 503 and "stage 1" in body["error"]["message"]:
        tally.fates["failed: stage 1 stalled"] += 1
    else:
        tally.unexpected.append(f"{status}: {body}")


def fate_of_stream(events: list[str], tally: Tally) -> None:
    if not events or events[-1] != "[DONE]":
        tally.unexpected.append(f"stream without [DONE]: {events[-2:]}")
        return
    last = json.loads(events[-2])
    if "error" not in last:
        tally.fates["completed"] += 1
    elif "shutting down" in last["error"]["message"]:
        tally.fates["ended by the shutdown"] += 1
    elif "stage 1" in last["error"]["message"]:
        tally.fates["failed: stage 1 stalled"] += 1
    else:
        tally.unexpected.append(f"stream error {last}")


async def load(
    url: str,
    seconds: float,
    tally: Tally,
    seed: int,
    clients: int = 6,
    during: tuple[float, object] | None = None,
) -> None:
    """``clients`` loops of random requests for ``seconds``; ``during = (at_s, fn)`` calls fn (in
    a thread) that long into the load."""
    deadline = time.monotonic() + seconds

    async def worker(k: int) -> None:
        rng = random.Random(seed * 100 + k)
        async with httpx.AsyncClient(base_url=url) as client:
            while time.monotonic() < deadline and not tally.stop_new:
                await one_request(client, rng, tally)

    async def event() -> None:
        if during is not None:
            await asyncio.sleep(during[0])
            await asyncio.to_thread(during[1])

    await asyncio.gather(*(worker(k) for k in range(clients)), event())


def test_chaos_then_ctrl_c_to_the_process_group_accounts_for_every_request(server, record_dir):
    calm = Tally()
    for seed in range(1, 6):  # rounds of load until some requests completed and some were cancelled
        asyncio.run(load(server.url, 3.0, calm, seed=seed))
        if calm.fates["completed"] > 5 and calm.fates["cancelled"] > 0:
            break
    assert not calm.unexpected, calm.unexpected
    assert calm.fates["completed"] > 5 and calm.fates["cancelled"] > 0, calm.fates
    m = wait_idle(server)  # every cancelled request ended and gave its KV back; the counts add up
    assert m["fastpp_kv_cache_usage_ratio"] == 0

    tally = Tally()
    seen: dict = {}

    streaming_started = threading.Event()

    def long_stream() -> None:  # open when the signal comes: the drain lasts while it runs
        body = {"prompt": [1, 2, 3], "max_tokens": 505, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
            streaming_started.set()
            assert r.status_code == 200, r.read()
            fate_of_stream([line[6:] for line in r.iter_lines() if line.startswith("data: ")], tally)

    def ctrl_c() -> None:
        streaming = threading.Thread(target=long_stream)
        streaming.start()
        assert streaming_started.wait(30)  # its response has begun: it was admitted
        server.signal_group(signal.SIGINT)
        time.sleep(0.15)
        tally.stop_new = True
        seen["health"] = httpx.get(server.url + "/health", timeout=10)
        seen["new"] = httpx.post(
            server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}, timeout=10
        )
        seen["metrics"] = server.metrics()  # nothing new is admitted: the final received count
        streaming.join()

    asyncio.run(load(server.url, 30.0, tally, seed=10, during=(2.0, ctrl_c)))
    assert server.proc is not None
    assert server.proc.wait(30) == 0
    log = server.log()
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]
    assert "stopped on SIGINT: free KV blocks per stage at shutdown: [128, 128] of 128" in log, log[-2000:]
    assert seen["health"].status_code == 503 and seen["health"].json()["status"] == "shutting down"
    assert seen["new"].status_code == 503 and seen["new"].json()["error"]["code"] == "shutting_down"
    assert not tally.unexpected, tally.unexpected
    assert tally.fates["completed"] > 0, tally.fates
    records = [json.loads(x) for x in (record_dir / "requests.jsonl").read_text().splitlines()]
    assert len(records) == seen["metrics"]["fastpp_requests_received_total"]  # every request, once
    assert len({r["req_id"] for r in records}) == len(records)
    reasons = Counter(r["finish_reason"] for r in records)
    assert set(reasons) <= {"length", "aborted"}, reasons
    completed = calm.fates["completed"] + tally.fates["completed"]
    assert reasons["length"] >= completed  # a cancelled request may have finished first
    shutdown_ends = sum("shutting down" in (r.get("detail") or "") for r in records)
    assert shutdown_ends == tally.fates["ended by the shutdown"]
    assert json.loads((record_dir / "summary.json").read_text())["completed"] == reasons["length"]


def test_a_stopped_stage_fails_open_requests_naming_it_and_the_server_exits_1(tmp_path):
    with ServerProcess(
        *TINY, "--pp", "2", "--stage-timeout", "3", "--record-dir", str(tmp_path), new_session=True
    ) as srv:
        (stage1,) = srv.stage_pids()
        tally = Tally()
        seen: dict = {}

        def stop_stage() -> None:
            srv_proc = srv.proc
            assert srv_proc is not None
            os.kill(stage1, signal.SIGSTOP)
            tally.stop_new = True
            t0 = time.monotonic()
            time.sleep(1.0)  # requests being parsed now are submitted; nothing after
            seen["metrics"] = srv.metrics()
            while srv_proc.poll() is None and time.monotonic() - t0 < 30:
                time.sleep(0.1)
            seen["exit_s"] = time.monotonic() - t0

        asyncio.run(load(srv.url, 30.0, tally, seed=3, during=(1.5, stop_stage)))
        assert srv.proc is not None and srv.proc.wait(10) == 1
        assert seen["exit_s"] < 15, seen  # 3 s stage timeout, then the shutdown
        assert not tally.unexpected, tally.unexpected
        assert tally.fates["failed: stage 1 stalled"] > 0, tally.fates
        log = srv.log()
        assert "stage 1 stopped responding: no heartbeat for" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
    records = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(records) == seen["metrics"]["fastpp_requests_received_total"]
    failed = [r for r in records if "stage 1 stopped responding" in (r.get("detail") or "")]
    # with those whose clients gave up while the stage was stopped (their abort could not land)
    assert tally.fates["failed: stage 1 stalled"] <= len(failed)
    assert len(failed) <= tally.fates["failed: stage 1 stalled"] + tally.fates["cancelled"]


def test_ctrl_c_with_a_stopped_stage_exits_promptly_without_a_crash():
    with ServerProcess(*TINY, "--pp", "2", "--shutdown-timeout", "1", new_session=True) as srv:
        (stage1,) = srv.stage_pids()
        tally = Tally()

        def stop_then_ctrl_c() -> None:
            os.kill(stage1, signal.SIGSTOP)
            time.sleep(0.5)
            tally.stop_new = True
            srv.signal_group(signal.SIGINT)

        t0 = time.monotonic()
        asyncio.run(load(srv.url, 30.0, tally, seed=4, clients=3, during=(1.0, stop_then_ctrl_c)))
        assert srv.proc is not None and srv.proc.wait(20) == 0
        assert time.monotonic() - t0 < 15
        assert not tally.unexpected, tally.unexpected
        log = srv.log()
        assert "Traceback" not in log and "the stage processes were killed" in log, log[-3000:]


def test_sigterm_to_an_idle_server_exits_0_with_one_stop_line():
    with ServerProcess(*TINY, "--pp", "1") as srv:
        assert srv.proc is not None
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(20) == 0
        log = srv.log()
        assert "stopped on SIGTERM: free KV blocks per stage at shutdown: [128] of 128" in log
        assert "Traceback" not in log


def test_a_second_signal_exits_at_once_even_with_a_stopped_stage():
    with ServerProcess(*TINY, "--pp", "2", "--shutdown-timeout", "30", new_session=True) as srv:
        assert srv.proc is not None
        (stage1,) = srv.stage_pids()
        tally = Tally()
        seen: dict = {}

        def twice() -> None:
            held = httpx.Client(base_url=srv.url, timeout=60)  # one request surely open
            body = {"prompt": [1, 2, 3], "max_tokens": 400, "ignore_eos": True, "stream": True}
            response = held.send(held.build_request("POST", "/v1/completions", json=body), stream=True)
            assert response.status_code == 200
            os.kill(stage1, signal.SIGSTOP)  # the open requests cannot finish: the drain waits
            tally.stop_new = True
            srv.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            t0 = time.monotonic()
            srv.signal_group(signal.SIGTERM)
            srv.proc.wait(10)
            seen["exit_s"] = time.monotonic() - t0
            held.close()

        asyncio.run(load(srv.url, 30.0, tally, seed=5, clients=2, during=(1.0, twice)))
        assert srv.proc.returncode == 128 + signal.SIGTERM and seen["exit_s"] < 3, seen
        log = srv.log()
        assert "SIGTERM again: exiting now" in log and "Traceback" not in log, log[-2000:]
        time.sleep(0.5)
        with pytest.raises(ProcessLookupError):
            os.kill(stage1, 0)  # the stage went with it


def run_cli(args: list[str]):
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return CliRunner().invoke(app, ["serve", *args])
    finally:  # serve configures logging onto CliRunner's stream
        root.handlers[:] = handlers
        root.setLevel(level)


def test_cheap_option_checks_fail_before_loading(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text("{}")
    (tmp_path / "file").write_text("")
    cases = [
        (["--port", "99999"], "--port must be in 1..65535, got 99999"),
        (["--port", str(busy.getsockname()[1])], "already in use"),
        (["--record-dir", str(tmp_path / "file")], "exists and is not a folder"),
        (["--record-dir", str(tmp_path / "run")], "holds an earlier run (summary.json); pass --overwrite"),
        (["--max-body-bytes", "10"], "--max-body-bytes must be >= 1024"),
        (["--stage-timeout", "0"], "--stage-timeout must be > 0"),
        (["--log-level", "loud"], "--log-level must be one of debug, info, warning, error, got 'loud'"),
        # any case is a level: the check after it is the one that fails
        (["--log-level", "WARNING", "--max-body-bytes", "10"], "--max-body-bytes must be >= 1024"),
        (
            ["--backend", "sglang", "--shutdown-timeout", "3"],
            "--shutdown-timeout apply to --backend torch only",
        ),
    ]
    try:
        for args, message in cases:
            t0 = time.monotonic()
            port = [] if "--port" in args else ["--port", str(free_port())]  # 8000 may be taken here
            res = run_cli(["--model", "smollm2", *port, *args])
            assert res.exit_code == 2, (args, res.output)
            assert message in " ".join(res.output.split()), (args, res.output)
            assert "Traceback" not in res.output and time.monotonic() - t0 < 10, args  # no model loaded
    finally:
        busy.close()

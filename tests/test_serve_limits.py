"""The server's limits and liveness parts without a server: the request guard's body limit and
read deadline, the option checks that run before loading, and the stage watchdog's verdicts."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("torch")

from fastpp.backends.openai_server.guard import RequestGuard  # noqa: E402
from fastpp.backends.openai_server.serve_config import ServeConfig, check_port, check_record_dir  # noqa: E402
from fastpp.backends.torch.stage_liveness import Liveness, collective_timeout  # noqa: E402


def guarded(messages, headers=(), max_body=1024, read_timeout_s=5.0):
    """Run the guard over ``messages`` (what the client sends, in order; a float: a pause of that
    many seconds before the next); returns what it sent back and what the app received."""
    sent: list[dict] = []
    seen: list[bytes] = []
    queue = list(messages)

    async def receive():
        while queue and isinstance(queue[0], float):
            await asyncio.sleep(queue.pop(0))
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    async def app(scope, receive, send):
        message = await receive()
        seen.append(message["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "headers": [(b"content-type", b"application/json"), *headers],
    }
    guard = RequestGuard(
        app, None, lambda status: None, max_body_bytes=max_body, read_timeout_s=read_timeout_s
    )
    asyncio.run(guard(scope, receive, send))
    return sent, seen


def body(data: bytes, more: bool = False) -> dict:
    return {"type": "http.request", "body": data, "more_body": more}


def test_a_declared_length_over_the_limit_is_refused_unread():
    sent, seen = guarded([body(b"x" * 10)], headers=[(b"content-length", b"5000")])
    assert sent[0]["status"] == 413 and (b"connection", b"close") in sent[0]["headers"]
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == "request_too_large" and "5000" in error["message"] and not seen


def test_a_chunked_body_is_cut_off_at_the_limit_and_a_small_one_reaches_the_app_whole():
    sent, seen = guarded([body(b"x" * 600, more=True), body(b"x" * 600, more=True), body(b"")])
    assert sent[0]["status"] == 413 and not seen
    sent, seen = guarded([body(b'{"a":', more=True), body(b"1}")])
    assert sent[0]["status"] == 200 and seen == [b'{"a":1}']


def test_a_body_slower_than_the_read_timeout_gets_408():
    sent, seen = guarded([body(b"{", more=True), 1.0, body(b"}")], read_timeout_s=0.2)
    assert sent[0]["status"] == 408 and not seen
    assert json.loads(sent[1]["body"])["error"]["code"] == "request_timeout"


def test_a_bad_content_length_is_400():
    sent, _ = guarded([body(b"{}")], headers=[(b"content-length", b"-1")])
    assert sent[0]["status"] == 400


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("port", 0, "--port must be in 1..65535"),
        ("port", 70000, "--port must be in 1..65535"),
        ("shutdown_timeout_s", 0.0, "--shutdown-timeout must be > 0"),
        ("max_body_bytes", 10, "--max-body-bytes"),
        ("max_connections", 0, "--max-connections"),
        ("api_key", " ", "--api-key must not be empty"),
        ("log_level", "loud", "--log-level must be one of debug, info, warning, error, got 'loud'"),
        ("log_level", "INFO", "--log-level must be one of"),  # the CLI passes it lower-cased
    ],
)
def test_serve_config_names_the_option(field, value, message):
    with pytest.raises(ValueError, match=message):
        ServeConfig(**{field: value})


def test_a_port_in_use_and_bad_record_dirs_are_refused(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(ValueError, match="already in use"):
            check_port("127.0.0.1", busy.getsockname()[1])
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="exists and is not a folder"):
        check_record_dir(tmp_path / "f", overwrite=False)
    run = tmp_path / "run"
    run.mkdir()
    (run / "requests.jsonl").write_text("")
    with pytest.raises(ValueError, match="holds an earlier run"):
        check_record_dir(run, overwrite=False)
    check_record_dir(run, overwrite=True)
    check_record_dir(tmp_path / "new" / "deeper", overwrite=False)  # created
    assert (tmp_path / "new" / "deeper").is_dir()


def test_the_watchdog_names_a_stage_that_stopped_beating_or_is_stuck_computing():
    live = Liveness(3)
    now = 1000.0
    for rank in range(3):
        live.beats[rank] = now - 1
    assert live.stalled(5.0, range(1, 3), now) is None
    live.beats[2] = now - 7
    why = live.stalled(5.0, range(1, 3), now)
    assert why is not None and why.startswith("stage 2 stopped responding: no heartbeat for 7.0 s")
    live.beats[2] = now
    live.steps[0] = now - 9  # stage 0 beats no heartbeat (it is the engine's own thread)
    why = live.stalled(5.0, range(1, 3), now)
    assert why is not None and why.startswith("stage 0 has been computing one microbatch for 9.0 s")
    with live.step(1):
        assert live.steps[1] > 0
    assert live.steps[1] == 0


def test_the_collective_timeout_is_finite_and_above_the_stage_timeout():
    assert collective_timeout(30.0).total_seconds() == 60.0
    assert collective_timeout(100.0).total_seconds() == 200.0

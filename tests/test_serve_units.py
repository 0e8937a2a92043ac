"""The server's parts without a server: the request guard's last-resort 500, /metrics as
``prometheus_client`` writes it, and request validation."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
prometheus = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from fastpp.backends.openai_server.guard import RequestGuard  # noqa: E402
from fastpp.backends.openai_server.metrics import make_registry, render  # noqa: E402
from fastpp.backends.openai_server.protocol import (  # noqa: E402
    DEFAULT_MAX_TOKENS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    APIError,
    parse_chat,
    parse_completion,
)
from fastpp.backends.torch.engine_state import EngineCounters  # noqa: E402


def run_guard(app, path="/v1/completions", headers=(), api_key=None):
    counts: dict[int, int] = {}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [(b"content-type", b"application/json"), *headers],
    }
    guard = RequestGuard(app, api_key, lambda s: counts.__setitem__(s, counts.get(s, 0) + 1))
    asyncio.run(guard(scope, receive, send))  # never raises: the connection stays usable
    return sent, counts


def test_an_unhandled_error_is_answered_500_counted_and_not_reraised():
    async def broken(scope, receive, send):
        raise RuntimeError("boom")

    sent, counts = run_guard(broken)
    assert sent[0]["status"] == 500 and counts == {500: 1}
    assert json.loads(sent[1]["body"])["error"]["type"] == "server_error" and not sent[1]["more_body"]


def test_an_error_after_the_response_started_ends_that_response():
    async def half(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
        raise RuntimeError("boom")

    sent, counts = run_guard(half)
    assert counts == {200: 1} and sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


def test_the_guard_checks_the_key_only_on_v1():
    async def ok(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    assert run_guard(ok, api_key="k")[0][0]["status"] == 401
    assert run_guard(ok, api_key="k", headers=[(b"authorization", b"Bearer k")])[0][0]["status"] == 200
    assert run_guard(ok, path="/metrics", api_key="k")[0][0]["status"] == 200


def fake_engine(counters: EngineCounters):
    """What read_engine reads: the engine's published snapshot and its thread-safe counts."""
    sched = SimpleNamespace(
        num_admitted=2, num_parked=0, kv_used_tokens=1, kv_capacity_tokens=3, num_retractions=2
    )
    snapshot = SimpleNamespace(
        stats=sched, counters=counters, stage_busy_s=(1.5, 2.0), stage0_free_blocks=1000
    )
    return SimpleNamespace(
        snapshot=snapshot, config=SimpleNamespace(kv_blocks=1024), num_queued=1, num_received=12345679
    )


def test_metrics_keep_every_digit_escape_labels_and_name_no_gauge_total():
    c = EngineCounters(2)
    c.generated_tokens = 12345678  # hand-formatted "%g" wrote 1.23457e+07
    c.ended = {"length": 3}
    c.ttft.add(0.3)
    name = 'my "model"\\x\n'
    page, content_type = render(make_registry(fake_engine(c), name, {200: 5, 500: 1}))
    assert content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(page.decode())}
    (tokens,) = families["fastpp_generation_tokens"].samples
    assert tokens.value == 12345678 and tokens.labels == {"model_name": name}
    assert families["fastpp_requests_received"].samples[0].value == 12345679
    codes = {s.labels["code"]: s.value for s in families["fastpp_http_responses"].samples}
    assert codes == {"200": 5, "500": 1}
    assert not [n for n, f in families.items() if f.type == "gauge" and n.endswith("_total")]
    ttft = {
        s.labels.get("le"): s.value
        for s in families["fastpp_time_to_first_token_seconds"].samples
        if s.name.endswith("_bucket")
    }
    assert ttft["0.25"] == 0 and ttft["0.5"] == 1 and ttft["+Inf"] == 1
    # OpenMetrics when the scraper asks for it
    page, content_type = render(make_registry(fake_engine(c), "m", {}), "application/openmetrics-text")
    assert content_type.startswith("application/openmetrics-text") and page.endswith(b"# EOF\n")


def test_registries_are_per_app():
    c = EngineCounters(1)
    a, b = (make_registry(fake_engine(c), n, {}) for n in ("a", "b"))
    assert a is not b and a is not prometheus.REGISTRY
    assert b'model_name="b"' in render(b)[0] and b'model_name="a"' not in render(b)[0]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "x", "top_p": 0}, "top_p"),
        ({"prompt": "x", "best_of": 2}, "best_of"),
        ({"prompt": "x", "logprobs": 0}, "logprobs"),
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "mystery": 1}, "mystery"),
        ({"prompt": "x", "tools": [{"type": "function"}]}, "tools"),  # a chat field, unknown to completions
    ],
)
def test_completion_fields_that_would_be_ignored_are_refused(body, param):
    with pytest.raises(APIError) as info:
        parse_completion(body)
    assert info.value.status == 400 and info.value.param == param


def test_null_means_not_sent_and_no_op_values_pass():
    req = parse_completion(
        {
            "prompt": "x",
            "best_of": 1,
            "echo": False,
            "suffix": None,
            "logit_bias": {},
            "user": "u",
            "frobnicate": None,
        }
    )
    assert req.max_tokens is None and req.max_tokens_param == "max_tokens"
    req, msgs = parse_chat(
        {
            "messages": [{"role": "user", "content": "hi", "name": None}],
            "tools": [],
            "tool_choice": "none",
            "response_format": {"type": "text"},
            "modalities": ["text"],
            "parallel_tool_calls": True,
            "max_completion_tokens": 5,
        }
    )
    assert req.max_tokens == 5 and req.max_tokens_param == "max_completion_tokens"
    assert msgs == [("user", "hi")]


def test_without_max_tokens_completions_default_to_16_and_chat_to_the_limit():
    req = parse_completion({"prompt": "x"})
    assert req.max_tokens is None and req.default_max_tokens == DEFAULT_MAX_TOKENS == 16
    req, _ = parse_chat({"messages": [{"role": "user", "content": "hi"}]})
    assert req.max_tokens is None and req.default_max_tokens is None
    req, _ = parse_chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7})
    assert req.max_tokens == 7


@pytest.mark.parametrize(
    "stop, param, words",
    [
        ("", "stop", "an empty stop string is not allowed"),
        (["a", ""], "stop[1]", "an empty stop string is not allowed"),
        (
            ["a", "x" * (MAX_STOP_CHARS + 1)],
            "stop[1]",
            f"a stop string has at most {MAX_STOP_CHARS} characters",
        ),
        (["a"] * (MAX_STOP_STRINGS + 1), "stop", f"at most {MAX_STOP_STRINGS} stop strings, got 5"),
        ([1], "stop", "must be a string or a list of strings"),
    ],
)
def test_bad_stop_strings_are_refused_naming_the_item(stop, param, words):
    for parse, body in (
        (parse_completion, {"prompt": "x"}),
        (parse_chat, {"messages": [{"role": "user", "content": "x"}]}),
    ):
        with pytest.raises(APIError) as info:
            parse(body | {"stop": stop})
        assert info.value.param == param and f"'{param}': {words}" in info.value.message, info.value.message
    assert parse_completion({"prompt": "x", "stop": ["a", "b"]}).stop == ("a", "b")

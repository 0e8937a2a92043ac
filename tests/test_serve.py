"""``fastpp serve --backend torch`` over loopback: the official ``openai`` client, ``fastpp bench``,
OpenAI-style errors, the queue limit, client disconnects, and a stage process that dies."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
import httpx  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from fastpp.backends.bench.config import BenchConfig  # noqa: E402
from fastpp.backends.openai_server.launcher import ServerProcess  # noqa: E402
from fastpp.backends.torch import random_weights, reference_generate  # noqa: E402
from fastpp.cli.app import app  # noqa: E402

MAX_QUEUE = 6
KV_BLOCKS = 256


@pytest.fixture(scope="module")
def server():
    args = ("--model", "random:tiny", "--pp", "2", "--kv-blocks", str(KV_BLOCKS), "--block-size", "4",
            "--max-queue", str(MAX_QUEUE), "--policy", "static:64", "--log-level", "warning")
    with ServerProcess(*args) as srv:
        yield srv


def wait_idle(srv: ServerProcess, timeout_s: float = 60.0) -> dict[str, float]:
    """Metrics once nothing runs or waits and stage 0's KV is all free again."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = srv.metrics()
        if (m["fastpp_num_requests_running"] == 0 and m["fastpp_num_requests_waiting"] == 0
                and m["fastpp_kv_blocks_free"] == KV_BLOCKS):
            return m
        assert time.monotonic() < deadline, f"server not idle: {m}"
        time.sleep(0.2)


def test_openai_client_completions_and_chat(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    (model,) = [m.id for m in client.models.list()]
    assert model == "random-tiny"
    prompt = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100]  # token ids ("Hello world")
    want = reference_generate(random_weights("tiny"), prompt, 9)
    got = client.completions.create(model=model, prompt=prompt, max_tokens=9, temperature=0)
    assert got.choices[0].finish_reason == "length"
    assert got.usage.prompt_tokens == 11 and got.usage.completion_tokens == 9 and got.usage.total_tokens == 20
    assert got.choices[0].text == bytes(want).decode("utf-8", errors="replace")
    # streamed, with a final usage chunk: the deltas add up to the same text
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=9, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == got.choices[0].text
    assert chunks[-1].usage.completion_tokens == 9 and chunks[-2].choices[0].finish_reason == "length"
    # chat, non-streamed and streamed
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    chat = client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 6
    parts = list(client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
    assert parts[0].choices[0].delta.role == "assistant"
    streamed = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert streamed == chat.choices[0].message.content
    assert parts[-1].usage.completion_tokens == 6
    # sampling with a seed is reproducible
    a, b = (client.completions.create(model=model, prompt="abc", max_tokens=8, temperature=0.8, seed=7)
            for _ in range(2))
    assert a.choices[0].text == b.choices[0].text and a.usage.completion_tokens == 8


def test_bad_requests_get_openai_error_bodies(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    cases = [
        (dict(prompt="x", max_tokens=0), "max_tokens"),
        (dict(prompt="x", temperature=7), "temperature"),
        (dict(prompt="x", n=3), "n"),
        (dict(prompt="x", logprobs=2), "logprobs"),
        (dict(prompt=["a", "b"]), "prompt"),
        (dict(prompt="x" * 600), "prompt"),
        (dict(prompt=[1, 2, 100000]), "prompt"),
    ]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model="random-tiny", **kwargs)
        assert info.value.body["param"] == param, (kwargs, info.value.body)
        assert info.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="random-tiny", prompt="x" * 600)
    assert "does not fit the context of 512" in info.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="random-tiny", messages=[{"role": "wizard", "content": "x"}])
    assert info.value.body["param"] == "messages[0].role"
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", timeout=10)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    assert httpx.get(server.url + "/v1/nope", timeout=10).json()["error"]["type"] == "not_found_error"


def test_fastpp_bench_drives_the_server(server, tmp_path):
    out = tmp_path / "bench.jsonl"
    args = ["bench", "--base-url", server.url, "-w", "random:40:12", "-n", "16", "-r", "20", "--seed", "3",
            "--max-concurrency", str(MAX_QUEUE - 1), "-o", str(out), "--output-details", "-q"]
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.stdout + res.stderr
    assert "Successful requests:                     16" in res.stdout
    record = json.loads(out.read_text())
    expected = BenchConfig(workload="random:40:12", num_prompts=16, request_rate=20, seed=3).requests()
    assert record["completed"] == 16
    assert record["output_lens"] == [r.output_len for r in expected]
    assert record["total_output_tokens"] == sum(r.output_len for r in expected)
    m = wait_idle(server)
    assert m['fastpp_chunk_budget_microbatches_total{chunk_budget="64"}'] == m["fastpp_microbatches_total"]
    assert m["fastpp_generation_tokens_total"] >= record["total_output_tokens"]


def test_queue_over_the_limit_answers_503_and_admitted_requests_finish(server):
    async def one(client: httpx.AsyncClient, k: int) -> tuple[int, dict]:
        body = {"prompt": "y" * 300, "max_tokens": 4, "ignore_eos": True, "temperature": 0}
        r = await client.post("/v1/completions", json=body)
        return r.status_code, r.json()

    async def burst() -> list[tuple[int, dict]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            return await asyncio.gather(*(one(client, k) for k in range(30)))

    results = asyncio.run(burst())
    codes = [c for c, _ in results]
    assert set(codes) <= {200, 503} and codes.count(503) > 0 and codes.count(200) >= MAX_QUEUE
    for code, body in results:
        if code == 503:
            assert body["error"]["code"] == "queue_full"
        else:
            assert body["usage"]["completion_tokens"] == 4
    wait_idle(server)


def test_a_client_that_disconnects_aborts_its_request_and_frees_its_kv(server):
    before = server.metrics().get('fastpp_request_success_total{finished_reason="aborted"}', 0)
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                      json={"prompt": "z" * 100, "max_tokens": 400, "ignore_eos": True, "stream": True}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")  # generation is under way; now hang up
    m = wait_idle(server)
    assert m['fastpp_request_success_total{finished_reason="aborted"}'] == before + 1
    assert m["fastpp_generation_tokens_total"] > 0
    # a non-streamed request whose client gives up while tokens keep coming is aborted too
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", timeout=1.0,
                   json={"prompt": "z" * 100, "max_tokens": 400, "ignore_eos": True})
    m = wait_idle(server)
    assert m['fastpp_request_success_total{finished_reason="aborted"}'] == before + 2
    assert m['fastpp_http_responses_total{code="499"}'] >= 1


def test_a_dead_stage_is_reported_and_the_server_exits():
    with ServerProcess("--model", "random:tiny", "--pp", "2", "--log-level", "info") as srv:
        (stage1,) = srv.stage_pids()
        os.kill(stage1, signal.SIGKILL)
        assert srv.proc is not None
        srv.proc.wait(60)  # exits by itself: no hang
        assert srv.proc.returncode == 1
        assert f"stage 1 process (pid {stage1}) exited with code -9" in srv.log()


@pytest.mark.parametrize("args, message", [
    (["--model", "random:nope"], "unknown model config 'nope'"),
    (["--model", "/no/such/dir"], "expected 'smollm2', 'random:<config>'"),
    (["--backend", "sglang", "--model", "/no/such/dir"], "not a model directory"),
    (["--backend", "sglang", "--kv-blocks", "8"], "--kv-blocks apply to --backend torch only"),
    (["--backend", "sglang", "--model", "/no/such/dir", "--policy", "predictive"], "pass --profile FILE"),
    (["--backend", "sglang", "--model", "/no/such/dir", "--policy", "nope"], "unknown chunk policy 'nope'"),
    (["--bogus"], "unknown arguments for --backend torch: --bogus"),
    (["--model", "random:tiny", "--pp", "3"], "num_stages 3 exceeds the model's 2 layers"),
    (["--model", "random:tiny", "--policy", "predictive"], "pass --profile FILE"),
    (["--model", "random:tiny", "--policy", "nope"], "unknown chunk policy 'nope'"),
])
def test_serve_refuses_bad_options_before_starting(args, message):
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        res = CliRunner().invoke(app, ["serve", *args])
    finally:  # serve configures logging onto CliRunner's stream, which closes after the call
        root.handlers[:] = handlers
        root.setLevel(level)
    assert res.exit_code == 2
    assert message in " ".join(res.output.split()), res.output

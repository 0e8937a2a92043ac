"""``fastpp bench`` when requests fail: failed vs aborted counts, the reasons, the exit code, and
the hints for a server that wants an API key (against tests/fake_openai_server.py)."""

from __future__ import annotations

import asyncio

import pytest
from fake_openai_server import FakeOpenAIServer
from typer.testing import CliRunner

import fastpp.cli.bench_cmd  # noqa: F401  (registers `bench` until cli/app.py lists it)
from fastpp.backends.bench import BenchConfig, BenchError, format_result, run_bench, run_bench_async
from fastpp.cli.app import app
from fastpp.types import FinishReason, Request


@pytest.fixture
def no_api_key(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def reqs(n: int, output_len: int = 4) -> list[Request]:
    return [Request(i, 0.0, 8, output_len) for i in range(n)]


def bench_cli(srv: FakeOpenAIServer, *args: str):
    base = ["bench", "--base-url", srv.url, "-w", "random:16:4:1", "-n", "2", "--warmup-requests", "0"]
    return CliRunner().invoke(app, [*base, *args], catch_exceptions=False)


# ---- failed, not aborted ------------------------------------------------------------------------


def test_a_wrong_model_fails_every_request_with_exit_1_and_the_reason_even_with_q(serve):
    srv = serve(ttft_s=0.002, itl_s=0.001, checks_model=True)
    res = bench_cli(srv, "-m", "wrongmodel", "-q")
    assert res.exit_code == 1, res.stdout + res.stderr
    assert "Successful requests:                     0" in res.stdout
    assert "Failed requests:                         2" in res.stdout
    assert "Aborted requests:                        0" in res.stdout
    assert "2 of 2 sent requests failed:" in res.stderr
    assert "2 x HTTP 404: The model `wrongmodel` does not exist." in res.stderr
    assert "no request succeeded (all 2 failed)" in res.stderr


def test_some_failures_are_summarized_on_stderr_and_exit_0(serve):
    srv = serve(ttft_s=0.002, itl_s=0.001, fail_every=2)
    res = bench_cli(srv, "-q", "--max-concurrency", "1")  # one at a time: the second fails
    assert res.exit_code == 0, res.stdout + res.stderr
    assert "Successful requests:                     1" in res.stdout
    assert "Failed requests:                         1" in res.stdout
    assert "1 x HTTP 400: fake failure of request 2" in res.stderr
    assert "no request succeeded" not in res.stderr


def test_a_good_run_exits_0_with_no_failure_lines(serve):
    res = bench_cli(serve(ttft_s=0.002, itl_s=0.001), "-q")
    assert res.exit_code == 0, res.stdout + res.stderr
    assert "Failed requests:                         0" in res.stdout and "failed" not in res.stderr


def test_a_stop_aborts_what_is_in_flight_and_keeps_the_failures_apart(serve):
    srv = serve(ttft_s=0.01, itl_s=0.02, fail_every=2)  # requests 2 and 4 fail at once

    async def stopped_mid_run():
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.4, stop.set)  # 1 and 3 need 1.2 s each
        cfg = BenchConfig(base_url=srv.url, warmup_requests=0, max_concurrency=4)
        return await run_bench_async(cfg, requests=reqs(4, output_len=60), stop=stop)

    res = asyncio.run(stopped_mid_run())
    assert res.is_interrupted and len(res.records) == 4
    assert all(r.finish_reason == FinishReason.ABORTED for r in res.records)
    assert res.summary["num_failed"] == 2 and res.summary["num_aborted"] == 2
    assert len(res.aborted_ids) == 2 and all("cancelled" in res.records[i].detail for i in res.aborted_ids)
    assert all(r.detail.startswith("HTTP 400") for r in res.failed_records)
    text = format_result(res)
    assert "Failed requests:                         2" in text
    assert "Aborted requests:                        2" in text


def test_connection_errors_and_timeouts_are_failures(serve):
    with FakeOpenAIServer() as gone:  # started then stopped: its port refuses connections
        url = gone.url
    res = run_bench(BenchConfig(base_url=url, model="m", warmup_requests=0), requests=reqs(2))
    assert res.summary["num_failed"] == 2 and res.summary["num_aborted"] == 0
    slow = serve(ttft_s=0.005, itl_s=0.02)
    res = run_bench(
        BenchConfig(base_url=slow.url, warmup_requests=0, timeout_s=0.1), requests=reqs(2, output_len=50)
    )
    assert res.summary["num_failed"] == 2 and res.summary["num_aborted"] == 0
    assert {r.detail for r in res.failed_records} == {"timed out after 0.1 s"}


# ---- base URL and API key -------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["/v1", "/v1/"])
def test_a_base_url_ending_in_v1_is_the_servers_root(serve, suffix):
    srv = serve(ttft_s=0.002, itl_s=0.001)
    res = run_bench(BenchConfig(base_url=srv.url + suffix, warmup_requests=0), requests=reqs(2))
    assert res.config.base_url == srv.url and res.model == "fake-model"
    assert res.summary["completed"] == 2 and srv.stats.paths == ["/v1/completions"] * 2


def test_listing_models_without_the_key_says_to_set_openai_api_key(serve, no_api_key):
    srv = serve(api_key="sekret")
    with pytest.raises(
        BenchError, match=r"HTTP 401\); the server wants an API key: set OPENAI_API_KEY"
    ) as exc:
        run_bench(BenchConfig(base_url=srv.url), requests=reqs(1))
    assert "pass --model" not in str(exc.value)


def test_a_refused_key_says_so(serve, monkeypatch):
    srv = serve(api_key="sekret")
    monkeypatch.setenv("OPENAI_API_KEY", "wrong")
    with pytest.raises(BenchError, match="refused the key in OPENAI_API_KEY"):
        run_bench(BenchConfig(base_url=srv.url), requests=reqs(1))
    with pytest.raises(
        BenchError, match=r"warm-up request failed \(HTTP 401: Invalid API key\); .*OPENAI_API_KEY"
    ):
        run_bench(BenchConfig(base_url=srv.url, model="fake-model"), requests=reqs(1))
    monkeypatch.setenv("OPENAI_API_KEY", "sekret")
    res = run_bench(BenchConfig(base_url=srv.url, warmup_requests=0), requests=reqs(2))
    assert res.summary["completed"] == 2


def test_other_model_list_errors_still_suggest_model(serve):
    srv = serve()
    with pytest.raises(BenchError, match=r"/v1/models \(HTTP 404\); pass --model"):
        run_bench(BenchConfig(base_url=srv.url + "/nowhere"), requests=reqs(1))

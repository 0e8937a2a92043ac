"""/metrics latency histograms (TTFT, ITL, TPOT, E2E, queue time) from 1 ms, under FastPP's names
and vLLM's current ones."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from fastpp.backends.openai_server.metrics import VLLM_NAMES, make_registry, render  # noqa: E402
from fastpp.backends.torch.engine_state import EngineCounters  # noqa: E402
from fastpp.types import RequestRecord  # noqa: E402


def engine_with(counters: EngineCounters) -> SimpleNamespace:
    stats = SimpleNamespace(
        num_admitted=3, num_parked=1, kv_used_tokens=1, kv_capacity_tokens=4, num_retractions=2
    )
    snapshot = SimpleNamespace(stats=stats, counters=counters, stage_busy_s=(1.0,), stage0_free_blocks=9)
    return SimpleNamespace(
        snapshot=snapshot, config=SimpleNamespace(kv_blocks=16), num_queued=5, num_received=7
    )


def ended(arrived: float, scheduled: float, token_times: list[float]) -> RequestRecord:
    return RequestRecord(
        0,
        arrived,
        8,
        len(token_times),
        num_generated=len(token_times),
        scheduled_at=scheduled,
        first_token_at=token_times[0],
        finished_at=token_times[-1],
        token_times=token_times,
    )


def scrape(counters: EngineCounters) -> dict:
    page, _ = render(make_registry(engine_with(counters), "m", {200: 1}))
    return {f.name: f for f in text_string_to_metric_families(page.decode())}


def buckets(family, **labels) -> dict[str, float]:
    return {
        s.labels["le"]: s.value
        for s in family.samples
        if s.name.endswith("_bucket") and all(s.labels.get(k) == v for k, v in labels.items())
    }


def test_itl_e2e_and_queue_histograms_count_each_request():
    c = EngineCounters(2)
    # queued 4 ms, first token at 20 ms, then gaps of 3 ms and 30 ms; ends at 53 ms
    c.count_end("length", ended(0.0, 0.004, [0.020, 0.023, 0.053]))
    c.count_end("aborted", ended(1.0, 1.5, [3.0]))  # one token: no gap
    fam = scrape(c)
    itl = buckets(fam["fastpp_inter_token_latency_seconds"])
    assert itl["0.001"] == 0 and itl["0.0025"] == 0 and itl["0.005"] == 1 and itl["0.025"] == 1
    assert itl["0.05"] == 2 and itl["+Inf"] == 2
    e2e = buckets(fam["fastpp_e2e_request_latency_seconds"])
    assert e2e["0.05"] == 0 and e2e["0.1"] == 1 and e2e["1.5"] == 1 and e2e["2.0"] == 2  # le: inclusive
    queue = buckets(fam["fastpp_request_queue_time_seconds"])
    assert queue["0.001"] == 0 and queue["0.005"] == 1 and queue["0.5"] == 2
    (total,) = [s.value for s in fam["fastpp_request_queue_time_seconds"].samples if s.name.endswith("_sum")]
    assert total == pytest.approx(0.504)


@pytest.mark.parametrize(
    "name",
    [
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "time_per_output_token_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
    ],
)
def test_every_latency_histogram_starts_at_one_millisecond(name):
    c = EngineCounters(1)
    c.count_end("length", ended(0.0, 0.0002, [0.0005, 0.0009]))  # all sub-millisecond
    fam = scrape(c)
    bounds = list(buckets(fam[f"fastpp_{name}"]))
    assert bounds[0] == "0.001" and bounds[-1] == "+Inf"
    assert buckets(fam[f"fastpp_{name}"])["0.001"] == 1


def test_vllm_names_mirror_ours_with_the_engine_label():
    c = EngineCounters(1)
    c.count_end("length", ended(0.0, 0.01, [0.1, 0.2]))
    c.count_end("aborted", ended(0.0, 0.01, [0.1]))
    c.ended = {"length": 1, "aborted": 1}
    fam = scrape(c)
    for ours, theirs in VLLM_NAMES.items():
        mine, vllm = fam[f"fastpp_{ours}"], fam[f"vllm:{theirs}"]
        assert mine.type == vllm.type, ours
        assert all(s.labels["engine"] == "0" and s.labels["model_name"] == "m" for s in vllm.samples)
    for name in (
        "num_requests_running",
        "num_requests_waiting",
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
    ):
        assert f"vllm:{name}" in fam  # the names vLLM's dashboards query
    assert fam["vllm:num_requests_running"].samples[0].value == 3
    assert fam["vllm:num_requests_waiting"].samples[0].value == 5
    e2e = "e2e_request_latency_seconds"
    assert buckets(fam[f"vllm:{e2e}"]) == buckets(fam[f"fastpp_{e2e}"])
    reasons = {s.labels["finished_reason"] for s in fam["vllm:request_success"].samples}
    assert reasons == {"length", "abort"}  # vLLM's label for an aborted request
    ours = {s.labels["finished_reason"] for s in fam["fastpp_request_success"].samples}
    assert ours == {"length", "aborted"}
    assert "vllm:stage_busy_seconds" not in fam  # FastPP-only families keep only our name

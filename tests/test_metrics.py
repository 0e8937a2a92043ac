"""fastpp.metrics on hand-built records whose answers can be worked out on paper."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from fastpp.metrics import (
    bubble_fraction,
    format_summary,
    iteration_bubble_fraction,
    meets_slo,
    percentiles,
    pipeline_fields,
    slo_attainment,
    stage_busy_seconds,
    summarize,
)
from fastpp.run_files import (
    read_iterations_csv,
    read_records_jsonl,
    read_run,
    write_iterations_csv,
    write_records_jsonl,
    write_run,
)
from fastpp.types import ITERATION_FIELDS, SLO, FinishReason, IterationRecord, RequestRecord

SGLANG_KEYS = [
    "backend",
    "request_rate",
    "duration",
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_throughput",
    "concurrency",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    "max_itl_ms",
] + [
    f"{s}_{m}_ms"
    for m in ("e2e_latency", "ttft", "tpot", "itl")
    for s in ("mean", "median", "std", "p90", "p95", "p99")
]


def rec(
    req_id, arrived, token_times, *, reason=FinishReason.LENGTH, prompt_len=10, scheduled=None, finished=None
) -> RequestRecord:
    """A record that generated ``token_times`` (times in seconds) and ended with ``reason``."""
    return RequestRecord(
        req_id=req_id,
        arrived_at=arrived,
        prompt_len=prompt_len,
        output_len=len(token_times),
        num_generated=len(token_times),
        scheduled_at=arrived if scheduled is None else scheduled,
        first_token_at=token_times[0] if token_times else None,
        finished_at=finished if finished is not None else (token_times or [None])[-1],
        finish_reason=reason,
        token_times=list(token_times),
    )


def rejected(req_id, arrived) -> RequestRecord:
    return RequestRecord(
        req_id,
        arrived,
        10,
        4,
        scheduled_at=None,
        finished_at=arrived,
        finish_reason=FinishReason.REJECTED,
        detail="prompt too long",
    )


def test_percentiles_match_numpy_and_empty_is_nan():
    values = np.random.default_rng(0).exponential(size=101)
    got = percentiles(values)
    assert list(got) == [50, 90, 95, 99]
    for p, v in got.items():
        assert v == pytest.approx(np.percentile(values, p))
    assert all(math.isnan(v) for v in percentiles([], ps=(50, 99)).values())


def test_definitions_on_a_small_run():
    records = [
        rec(0, 0.0, [1.0, 1.5, 2.5]),  # ttft 1000, tpot 750, itl 500 1000, e2e 2500
        rec(1, 1.0, [1.5]),  # one token: ttft 500, no tpot, no itl, e2e 500
        rec(2, 2.0, [3.0, 3.25], reason=FinishReason.STOP, scheduled=2.5),  # tpot 250
    ]
    s = summarize(records, backend="unit", request_rate=2.0)
    for key in SGLANG_KEYS:
        assert key in s
    assert (s["backend"], s["request_rate"], s["completed"]) == ("unit", 2.0, 3)
    assert s["duration"] == pytest.approx(3.25)  # last finish - first arrival
    assert s["total_output_tokens"] == 6 and s["total_input_tokens"] == 30
    assert s["output_throughput"] == pytest.approx(6 / 3.25)
    assert s["mean_ttft_ms"] == pytest.approx(np.mean([1000, 500, 1000]))
    # TPOT excludes the one-token output instead of counting it as zero
    assert s["mean_tpot_ms"] == pytest.approx(500.0)
    assert s["median_tpot_ms"] == pytest.approx(500.0)
    assert s["std_tpot_ms"] == pytest.approx(250.0)
    # ITL: every within-request gap, never the gap between two requests
    itl = [500.0, 1000.0, 250.0]
    assert s["mean_itl_ms"] == pytest.approx(np.mean(itl))
    assert s["p99_itl_ms"] == pytest.approx(np.percentile(itl, 99))
    assert s["max_itl_ms"] == pytest.approx(1000.0)
    assert s["p90_e2e_latency_ms"] == pytest.approx(np.percentile([2500, 500, 1250], 90))
    assert s["concurrency"] == pytest.approx((2.5 + 0.5 + 1.25) / 3.25)
    assert s["max_output_tokens_per_s"] == 3.0  # tokens at 1.0, 1.5, 1.5 in second [1, 2)
    assert s["max_in_flight_requests"] == 2  # our instantaneous peak
    assert s["max_concurrent_requests"] == 2  # sglang's: seconds [1, 2) and [2, 3) hold two each
    assert s["max_queueing_delay_ms"] == pytest.approx(500.0)
    assert "slo_met" not in s


def test_failed_and_unfinished_requests_are_counted_not_measured():
    unfinished = RequestRecord(
        3, 0.5, 10, 8, num_generated=2, scheduled_at=0.6, first_token_at=0.9, token_times=[0.9, 1.0]
    )
    aborted = rec(4, 0.0, [0.2, 0.6], reason=FinishReason.ABORTED)
    records = [rec(0, 0.0, [1.0, 2.0]), rejected(1, 0.1), aborted, unfinished]
    s = summarize(records)
    assert (s["completed"], s["num_requests"]) == (1, 4)
    assert (s["num_rejected"], s["num_aborted"], s["num_unfinished"]) == (1, 1, 1)
    assert s["mean_ttft_ms"] == pytest.approx(1000.0)
    assert s["max_in_flight_requests"] == 3  # rejected-on-arrival adds nothing
    assert s["max_concurrent_requests"] == 1  # sglang counts completed requests only


def test_empty_input_gives_nan_not_an_error():
    s = summarize([], slo=SLO())
    assert s["completed"] == 0 and s["num_requests"] == 0
    assert math.isnan(s["p90_ttft_ms"]) and math.isnan(s["mean_itl_ms"])
    assert math.isnan(s["request_throughput"])
    assert s["slo_met"] is False and math.isnan(s["slo_attainment"])
    assert "Serving Benchmark Result" in format_summary(s)


def test_slo_met_at_the_boundary():
    slo = SLO(ttft_s=2.0, tpot_s=0.2)
    # ten requests, all TTFT 2.0 s and TPOT 0.2 s: P90 equals the SLO exactly -> met
    on_edge = [rec(i, 0.1 * i, [0.1 * i + 2.0, 0.1 * i + 2.2]) for i in range(10)]
    s = summarize(on_edge, slo=slo)
    assert s["slo_met"] and meets_slo(s, slo)
    assert s["slo_attainment"] == 1.0
    assert (s["slo_ttft_ms"], s["slo_tpot_ms"]) == (2000.0, 200.0)
    # 1 ms over on TPOT for every request -> not met
    over = [rec(i, 0.0, [2.0, 2.201]) for i in range(10)]
    assert not summarize(over, slo=slo)["slo_met"]
    # 2 of 10 over on TTFT: P90 is interpolated above the SLO -> not met; 1 of 10 over: met
    mixed = [rec(i, 0.0, [2.5 if i < 2 else 1.0, 3.0 if i < 2 else 1.1]) for i in range(10)]
    assert not meets_slo(summarize(mixed), slo)
    assert meets_slo(summarize(mixed[1:] + [rec(9, 0.0, [1.0, 1.1])]), slo)


def test_attainment_counts_rejected_and_aborted_as_misses():
    slo = SLO(ttft_s=1.0, tpot_s=0.1)
    records = [
        rec(0, 0.0, [0.5, 0.55]),  # meets both
        rec(1, 0.0, [0.9]),  # one token: needs TTFT only -> meets
        rec(2, 0.0, [2.0, 2.05]),  # TTFT miss
        rec(3, 0.0, [0.5, 1.0]),  # TPOT miss
        rejected(4, 0.0),
        rec(5, 0.0, [0.1, 0.15], reason=FinishReason.ABORTED),
    ]
    assert slo_attainment(records, slo) == pytest.approx(2 / 6)
    s = summarize(records, slo=slo)
    assert s["slo_attainment"] == pytest.approx(2 / 6)
    assert s["ttft_attainment"] == pytest.approx(3 / 6)
    assert s["tpot_attainment"] == pytest.approx(3 / 6)
    assert math.isnan(slo_attainment([], slo))


def test_format_summary_has_the_sglang_layout():
    s = summarize([rec(0, 0.0, [1.0, 1.5, 2.5]), rec(1, 1.0, [1.5])], slo=SLO(), request_rate=4.0)
    text = format_summary(s)
    lines = text.splitlines()
    assert lines[0] == "{:=^50}".format(" Serving Benchmark Result ")
    assert lines[-1] == "=" * 50
    for heading in (
        "End-to-End Latency",
        "Time to First Token",
        "Time per Output Token (excl. 1st token)",
        "Inter-Token Latency",
        "SLO",
    ):
        assert f"{heading:-^50}" in lines
    for label in (
        "Backend:",
        "Successful requests:",
        "Benchmark duration (s):",
        "Total input tokens:",
        "Total generated tokens:",
        "Request throughput (req/s):",
        "Output token throughput (tok/s):",
        "Peak output token throughput (tok/s):",
        "Peak concurrent requests:",
        "Total token throughput (tok/s):",
        "Concurrency:",
        "Mean E2E Latency (ms):",
        "P99 TTFT (ms):",
        "Median TPOT (ms):",
        "Max ITL (ms):",
    ):
        assert any(line.startswith(label) for line in lines), label
    assert "{:<40} {:<10}".format("Successful requests:", 2) in lines
    assert "{:<40} {:<10.2f}".format("Mean TTFT (ms):", 750.0) in lines
    assert "SLO" not in format_summary(summarize([rec(0, 0.0, [1.0])]))


def it(stage, start, end, mb_id=0, slot=0) -> IterationRecord:
    return IterationRecord(mb_id, stage, slot, start, end, 8, 8, 0, 0, 64, 0, 64, "test")


def test_bubble_fraction_of_a_two_stage_schedule():
    # stage 0 runs [0,2) and [2,3); stage 1 runs [2,4) and [4,5): window [0, 5]
    schedule = [it(0, 0, 2, 0), it(0, 2, 3, 1), it(1, 2, 4, 0), it(1, 4, 5, 1)]
    assert stage_busy_seconds(schedule, 2) == ([3.0, 3.0], 0.0, 5.0)
    assert iteration_bubble_fraction(schedule, 2) == pytest.approx([2 / 5, 2 / 5])
    # an explicit window clips iterations; an idle third stage is all bubble
    assert iteration_bubble_fraction(schedule, 3, start=2.0, end=4.0) == pytest.approx([0.5, 0.0, 1.0])
    # overlapping iterations on one stage count once
    assert stage_busy_seconds([it(0, 0, 2), it(0, 1, 3), it(0, 1.5, 2.5)], 1)[0] == [3.0]
    assert all(math.isnan(b) for b in iteration_bubble_fraction([], 2))
    with pytest.raises(ValueError, match="stage"):
        iteration_bubble_fraction(schedule, 1)


def test_bubble_fraction_is_the_idle_share_of_the_window():
    assert bubble_fraction([3.0, 5.0, 6.0], 1.0, 6.0) == pytest.approx([0.4, 0.0, 0.0])
    assert all(math.isnan(b) for b in bubble_fraction([1.0], 2.0, 2.0))
    assert pipeline_fields([1.0, 3.0], 0.0, 4.0) == {
        "bubble_fraction": [0.75, 0.25],
        "mean_bubble_fraction": 0.5,
    }


def test_writers_round_trip(tmp_path):
    records = [rec(0, 0.0, [1.0, 1.5]), rejected(1, 0.2)]
    lines = write_records_jsonl(records, tmp_path / "r.jsonl").read_text().splitlines()
    assert [json.loads(line)["req_id"] for line in lines] == [0, 1]
    assert json.loads(lines[0])["itl_ms"] == [500.0]
    iters = [it(0, 0.0, 1.0), it(1, 1.0, 2.0, mb_id=1)]
    with write_iterations_csv(iters, tmp_path / "i.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["stage"]) for r in rows] == [0, 1] and rows[0]["reason"] == "test"


def test_the_fast_writers_write_what_the_record_dicts_say(tmp_path):
    """write_records_jsonl computes all gaps in one numpy pass: its lines must be those of
    ``json.dumps(r.to_dict())``; write_iterations_csv must be csv.DictWriter's file."""
    records = [
        rec(0, 0.0, [1.0, 1.5, 2.25, 2.2500001]),
        rejected(1, 0.2),
        rec(2, 0.1, [0.7]),
        rec(3, 0.3, [1.0 / 3, 2.0 / 3, 0.9999]),
    ]
    lines = write_records_jsonl(records, tmp_path / "r.jsonl").read_text().splitlines()
    assert lines == [json.dumps(r.to_dict()) for r in records]
    iters = [
        it(0, 0.0, 1.0 / 3),
        it(1, 1.0 / 3, 2.0, mb_id=1),
        it(0, 2.0, 2.5, mb_id=2),
        it(1, 2.5, 3.0, mb_id=2),
        it(0, 3.0, 3.5, mb_id=3),
    ]
    iters[2].reason, iters[3].reason, iters[4].reason = "", 'shrunk, "quoted"\nline', "plain"
    with (tmp_path / "ref.csv").open("w", newline="") as f:
        ref = csv.DictWriter(f, fieldnames=list(ITERATION_FIELDS))
        ref.writeheader()
        ref.writerows(i.to_dict() for i in iters)
    got = write_iterations_csv(iters, tmp_path / "i.csv").read_text()
    assert got == (tmp_path / "ref.csv").read_text()


def test_a_run_folder_reads_back_what_was_written(tmp_path):
    records = [rec(0, 0.0, [1.0, 1.5, 2.25]), rejected(1, 0.2)]
    iters = [it(0, 0.0, 1.0), it(1, 1.0, 2.0, mb_id=1)]
    paths = write_run(tmp_path / "run", records, iters, {"completed": 1}, stage_names=["a", "b"])
    assert sorted(paths) == ["iterations", "records", "summary", "timeline"]
    back = read_run(tmp_path / "run")
    assert back.summary == {"completed": 1}
    assert back.iterations == iters
    assert [r.to_dict() for r in back.records] == [r.to_dict() for r in records]
    assert back.records[0].tpot_s == pytest.approx(records[0].tpot_s)


def test_run_folder_readers_name_the_bad_line(tmp_path):
    write_iterations_csv([it(0, 0.0, 1.0)], tmp_path / "i.csv")
    text = (tmp_path / "i.csv").read_text().replace(",8,8,", ",eight,8,", 1)
    (tmp_path / "i.csv").write_text(text)
    with pytest.raises(ValueError, match=r"i.csv, line 2: field num_tokens"):
        read_iterations_csv(tmp_path / "i.csv")
    (tmp_path / "r.jsonl").write_text('{"req_id": 0}\n')
    with pytest.raises(ValueError, match=r"r.jsonl, line 1: missing field 'arrived_at'"):
        read_records_jsonl(tmp_path / "r.jsonl")
    with pytest.raises(FileNotFoundError, match="no summary.json"):
        read_run(tmp_path)


def test_tpot_without_token_times_comes_from_a_completed_requests_finish():
    """Records of a run that kept no per-token times (a goodput probe's) still have a TPOT:
    a completed request's last token came at its finish. Unfinished or aborted: unknown."""
    done = RequestRecord(
        0, 1.0, 10, 5, num_generated=5, first_token_at=2.0, finished_at=3.0, finish_reason=FinishReason.LENGTH
    )
    assert done.tpot_s == pytest.approx(0.25)
    timed = RequestRecord(
        0,
        1.0,
        10,
        5,
        num_generated=5,
        first_token_at=2.0,
        finished_at=3.0,
        finish_reason=FinishReason.LENGTH,
        token_times=[2.0, 2.1, 2.2, 2.3, 2.6],
    )
    assert timed.tpot_s == pytest.approx(0.15)  # the token times win where kept
    running = RequestRecord(1, 1.0, 10, 5, num_generated=3, first_token_at=2.0)
    aborted = RequestRecord(
        2,
        1.0,
        10,
        5,
        num_generated=3,
        first_token_at=2.0,
        finished_at=9.0,
        finish_reason=FinishReason.ABORTED,
    )
    assert running.tpot_s is None and aborted.tpot_s is None

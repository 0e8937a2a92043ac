"""Reporting a bench run: sglang's console block and its JSONL line (``--output-file``).

The console block is ``sglang.benchmark.serving``'s, line for line and in its order (header,
the Goodput section when ``--goodput`` is given, E2E, TTFT, TPOT, ITL); FastPP adds two short
sections before the closing rule: failures (failed requests, as vLLM's bench labels them, and
those aborted by a stop) and, with an SLO, the P90 verdict of ``fastpp simulate``.

The JSONL record has sglang's keys in its order: ``tag, backend, dataset_name, request_rate,
max_concurrency, sharegpt_output_len, random_input_len, random_output_len, random_range_ratio,
server_info``, the results (``duration`` ... ``max_concurrent_requests``), then sglang's goodput
keys when an SLO is given, then FastPP's own keys (``max_itl_ms``, the SLO verdict,
``num_failed``, ``num_aborted``, ``total_input_tokens_server``, ``workload``, ``model``, ...).
Where we differ, the value says so rather than the key lying:

- ``dataset_name`` is ``random`` for a ``random:IN:OUT[:RATIO]`` workload, with IN, OUT and RATIO
  in ``random_input_len``, ``random_output_len``, ``random_range_ratio`` (null for other
  workloads); another FastPP workload writes its own name, a replay ``replay:<trace>``;
  ``workload`` keeps the full spec.
- ``request_rate`` is written as sglang writes it: a number, ``Infinity`` for all at once (as
  Python's json module writes inf), ``"trace"`` for a replay (its own timestamps).
- ``total_output_tokens_retokenized`` is null without ``--tokenizer``; ``sharegpt_output_len``
  and ``accept_length`` are null (no ShareGPT dataset, no speculative decoding).
- ``max_in_flight_requests`` is FastPP's instantaneous peak (what ``fastpp simulate`` reports as
  ``max_concurrent_requests``; here that key is sglang's fullest 1-second bucket).

Other NaN statistics (nothing completed) are written as null. ``--output-details`` adds sglang's
per-request lists (seconds; a failed request has output length 0 and ttft null).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from fastpp.backends.bench.runner import BenchResult
from fastpp.run_files import json_safe
from fastpp.types import FinishReason

_COMPLETED = (FinishReason.LENGTH, FinishReason.STOP)
_HEAD = (  # (label, summary key, is_int): sglang's header lines in its order
    ("Successful requests:", "completed", True),
    ("Benchmark duration (s):", "duration", False),
    ("Total input tokens:", "total_input_tokens", True),
    ("Total input text tokens:", "total_input_text_tokens", True),
    ("Total generated tokens:", "total_output_tokens", True),
    ("Total generated tokens (retokenized):", "total_output_tokens_retokenized", True),
    ("Request throughput (req/s):", "request_throughput", False),
    ("Input token throughput (tok/s):", "input_throughput", False),
    ("Output token throughput (tok/s):", "output_throughput", False),
    ("Peak output token throughput (tok/s):", "max_output_tokens_per_s", False),
    ("Peak concurrent requests:", "max_concurrent_requests", True),
    ("Total token throughput (tok/s):", "total_throughput", False),
    ("Concurrency:", "concurrency", False),
)
_SECTIONS = (  # heading, key stem, console name
    ("End-to-End Latency", "e2e_latency", "E2E Latency"),
    ("Time to First Token", "ttft", "TTFT"),
    ("Time per Output Token (excl. 1st token)", "tpot", "TPOT"),
    ("Inter-Token Latency", "itl", "ITL"),
)
_STATS = ("Mean", "Median", "P90", "P95", "P99")
_LATENCY_KEYS = tuple(
    f"{s}_{stem}_ms" for _, stem, _ in _SECTIONS for s in ("mean", "median", "std", "p90", "p95", "p99")
)
_RESULT_KEYS = (  # sglang's result keys after server_info, in its order
    "duration",
    "completed",
    "total_input_tokens",
    "total_input_text_tokens",
    "total_input_vision_tokens",
    "total_output_tokens",
    "total_output_tokens_retokenized",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_throughput",
    *_LATENCY_KEYS,
    "concurrency",
    "accept_length",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
)


def _line(label: str, value: object, is_int: bool) -> str:
    if value is None or isinstance(value, bool):
        value, is_int = {None: "n/a", True: "yes", False: "no"}[value], True
    return ("{:<40} {:<10}" if is_int else "{:<40} {:<10.2f}").format(label, value)


def traffic_rate(result: BenchResult) -> float | str:
    """The rate as sglang shows and writes it: requests/s (inf: all at once) or ``trace``."""
    return "trace" if result.config.replay is not None else result.config.request_rate


def format_result(result: BenchResult) -> str:
    """sglang's console block for the run, then FastPP's failure and SLO lines."""
    s, cfg = result.summary, result.config
    limit = cfg.max_concurrency
    lines = [
        f"{' Serving Benchmark Result ':=^50}",
        _line("Backend:", s["backend"], True),
        _line("Traffic request rate:", traffic_rate(result), True),
        _line("Max request concurrency:", "not set" if limit is None else limit, True),
    ]
    lines += [_line(label, s.get(key), is_int) for label, key, is_int in _HEAD]
    if result.goodput is not None:
        lines += _goodput_lines(result.goodput)
    for heading, stem, short in _SECTIONS:
        lines.append(f"{heading:-^50}")
        lines += [_line(f"{name} {short} (ms):", s[f"{name.lower()}_{stem}_ms"], False) for name in _STATS]
        if stem == "itl":
            lines.append(_line("Max ITL (ms):", s["max_itl_ms"], False))
    lines += [
        f"{'Failures':-^50}",
        _line("Failed requests:", s.get("num_failed", 0), True),
        _line("Aborted requests:", s.get("num_aborted", 0), True),
    ]
    if "slo_met" in s:
        lines += [
            f"{'SLO (P90)':-^50}",
            _line("SLO TTFT (ms):", s["slo_ttft_ms"], False),
            _line("SLO TPOT (ms):", s["slo_tpot_ms"], False),
            _line("SLO met (P90 TTFT and P90 TPOT):", s["slo_met"], True),
        ]
    lines.append("=" * 50)
    return "\n".join(lines)


def _goodput_lines(goodput: dict[str, Any]) -> list[str]:
    """sglang's Goodput section."""
    slos = " ".join(f"{key}:{ms:g}" for key, ms in goodput["goodput_slos_ms"].items())
    lines = [
        f"{'Goodput':-^50}",
        _line("SLOs (ms):", slos, True),
        _line("Request goodput (req/s):", goodput["request_goodput"], False),
        _line("SLO attainment (%):", goodput["slo_attainment"] * 100, False),
    ]
    lines += [
        _line(f"{key.upper()} SLO attainment (%):", value * 100, False)
        for key, value in goodput["slo_attainment_by_metric"].items()
    ]
    return lines


def failure_lines(result: BenchResult, limit: int = 3) -> list[str]:
    """A short account of failed requests (not those a stop cancelled): the count and the most
    common reasons."""
    reasons = Counter(r.detail for r in result.failed_records)
    if not reasons:
        return []
    lines = [f"{sum(reasons.values())} of {len(result.records)} sent requests failed:"]
    lines += [f"  {n} x {reason}" for reason, n in reasons.most_common(limit)]
    if len(reasons) > limit:
        lines.append(f"  ... and {len(reasons) - limit} other reasons")
    return lines


def jsonl_record(result: BenchResult, *, details: bool = False) -> dict[str, Any]:
    """The run as one JSON-ready dict (see the module docstring for the key order)."""
    cfg, s = result.config, result.summary
    lengths = cfg.random_lengths
    record: dict[str, Any] = {
        "tag": cfg.tag,
        "backend": s["backend"],
        "dataset_name": cfg.dataset_name,
        "request_rate": None,  # set below, after json_safe: inf is kept as sglang writes it
        "max_concurrency": cfg.max_concurrency,
        "sharegpt_output_len": None,
        "random_input_len": lengths.max_in if lengths else None,
        "random_output_len": lengths.max_out if lengths else None,
        "random_range_ratio": lengths.range_ratio if lengths else None,
        "server_info": result.server_info,
    }
    record.update({key: s.get(key) for key in _RESULT_KEYS})
    if result.goodput is not None:
        record.update(result.goodput)
    for key, value in s.items():  # FastPP's own summary keys
        if key not in record and key != "request_rate":
            record[key] = value
    record.update(
        workload=cfg.workload,  # None for a replay
        model=result.model,
        base_url=cfg.base_url,
        seed=cfg.seed,
        num_prompts=len(result.requests),
        num_not_sent=result.num_not_sent,
        interrupted=result.is_interrupted,
        warmup_requests=cfg.warmup_requests,
        tokenizer=cfg.tokenizer,
        extra_request_body=cfg.extra_request_body,
    )
    if details:  # sglang's lists, one entry per sent request, seconds
        recs = result.records
        ok = [r.finish_reason in _COMPLETED for r in recs]
        record.update(
            input_lens=[r.prompt_len for r in recs],
            output_lens=[r.num_generated if is_ok else 0 for r, is_ok in zip(recs, ok, strict=True)],
            ttfts=[r.ttft_s if is_ok else None for r, is_ok in zip(recs, ok, strict=True)],
            itls=[
                [b - a for a, b in zip(r.token_times, r.token_times[1:], strict=False)] if is_ok else []
                for r, is_ok in zip(recs, ok, strict=True)
            ],
            generated_texts=list(result.generated_texts),
            errors=[r.detail for r in recs],
        )
    safe = json_safe(record)
    rate = traffic_rate(result)
    safe["request_rate"] = rate if isinstance(rate, str) or not math.isnan(rate) else None
    return safe


def append_jsonl(result: BenchResult, path: str | Path, *, details: bool = False) -> Path:
    """Append the run's record as one line to ``path`` (created with its folders if missing).
    An all-at-once run's ``request_rate`` is written ``Infinity``, as sglang's file has it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(jsonl_record(result, details=details)) + "\n")
    return path

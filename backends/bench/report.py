"""Reporting a bench run: sglang's console block and its JSONL line (``--output-file``).

The JSONL record uses ``sglang.benchmark.serving``'s keys, in its order and with its meanings:
``tag, backend, dataset_name, request_rate, max_concurrency, sharegpt_output_len,
random_input_len, random_output_len, random_range_ratio, server_info``, then the results
(``fastpp.metrics.summarize``'s keys, which are sglang's, with ``total_output_tokens_retokenized``
after ``total_output_tokens`` and ``max_concurrent_requests`` as sglang counts it: the fullest
1-second bucket), then sglang's goodput keys when an SLO is given, then FastPP's own keys.
Where we differ, the value says so rather than the key lying:

- ``dataset_name`` is ``random`` for a ``random:IN:OUT[:RATIO]`` workload, with IN, OUT and RATIO
  in ``random_input_len``, ``random_output_len``, ``random_range_ratio`` (null for other
  workloads); another FastPP workload writes its own name, a replay ``replay:<trace>``;
  ``workload`` keeps the full spec.
- ``total_output_tokens_retokenized`` and ``sharegpt_output_len`` are null: the bench has no
  tokenizer to re-count the text with, and no ShareGPT dataset.
- ``max_in_flight_requests`` is FastPP's instantaneous peak (what ``fastpp simulate`` reports
  as ``max_concurrent_requests``).

NaN and inf are written as null, as elsewhere in FastPP (so ``request_rate`` is null both for
"all at once" and for a replay; ``dataset_name`` tells them apart). ``--output-details`` adds
sglang's per-request lists in seconds.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from fastpp.backends.bench.runner import BenchResult
from fastpp.metrics import format_summary
from fastpp.run_files import json_safe
from fastpp.types import FinishReason

_COMPLETED = (FinishReason.LENGTH, FinishReason.STOP)


def format_result(result: BenchResult) -> str:
    """sglang's console block, with its "Max request concurrency" line that the shared
    ``format_summary`` leaves out (it knows no client limit)."""
    lines = format_summary(result.summary).splitlines()
    limit = result.config.max_concurrency
    row = "{:<40} {:<10}".format("Max request concurrency:", "not set" if limit is None else limit)
    at = next((i + 1 for i, line in enumerate(lines) if line.startswith("Traffic request rate:")), 1)
    lines.insert(at, row)
    return "\n".join(lines)


def failure_lines(result: BenchResult, limit: int = 3) -> list[str]:
    """A short account of failed requests: the count and the most common reasons."""
    reasons = Counter(r.detail for r in result.records if r.finish_reason not in _COMPLETED)
    if not reasons:
        return []
    lines = [f"{sum(reasons.values())} of {len(result.records)} sent requests failed:"]
    lines += [f"  {n} x {reason}" for reason, n in reasons.most_common(limit)]
    if len(reasons) > limit:
        lines.append(f"  ... and {len(reasons) - limit} other reasons")
    return lines


def jsonl_record(result: BenchResult, *, details: bool = False) -> dict[str, Any]:
    """The run as one JSON-ready dict (see the module docstring for the key order)."""
    cfg = result.config
    lengths = cfg.random_lengths
    record: dict[str, Any] = {
        "tag": cfg.tag,
        "backend": result.summary["backend"],
        "dataset_name": cfg.dataset_name,
        "request_rate": result.summary["request_rate"],
        "max_concurrency": cfg.max_concurrency,
        "sharegpt_output_len": None,
        "random_input_len": lengths.max_in if lengths else None,
        "random_output_len": lengths.max_out if lengths else None,
        "random_range_ratio": lengths.range_ratio if lengths else None,
        "server_info": result.server_info,
    }
    for key, value in result.summary.items():
        if key not in record:
            record[key] = value
        if key == "total_output_tokens":
            record["total_output_tokens_retokenized"] = None  # no tokenizer in the bench
    if cfg.slo is not None:  # sglang's goodput keys (its GoodputMetrics)
        s = result.summary
        record.update(
            goodput_slos_ms={"ttft": cfg.slo.ttft_s * 1e3, "tpot": cfg.slo.tpot_s * 1e3},
            request_goodput=(s["slo_attainment"] * len(result.records) / s["duration"]
                             if s["duration"] else None),
            slo_attainment_by_metric={"ttft": s["ttft_attainment"], "tpot": s["tpot_attainment"]},
        )
    record.update(
        workload=cfg.workload if cfg.replay is None else None,
        model=result.model,
        base_url=cfg.base_url,
        seed=cfg.seed,
        num_prompts=len(result.requests),
        num_not_sent=result.num_not_sent,
        interrupted=result.is_interrupted,
    )
    if details:  # sglang's lists, one entry per sent request, seconds
        recs = result.records
        ok = [r.finish_reason in _COMPLETED for r in recs]
        record.update(
            input_lens=[r.prompt_len for r in recs],
            output_lens=[r.num_generated for r in recs],
            ttfts=[r.ttft_s if is_ok else None for r, is_ok in zip(recs, ok, strict=True)],
            itls=[[b - a for a, b in zip(r.token_times, r.token_times[1:], strict=False)] if is_ok else []
                  for r, is_ok in zip(recs, ok, strict=True)],
            errors=[r.detail for r in recs],
        )
    return json_safe(record)


def append_jsonl(result: BenchResult, path: str | Path, *, details: bool = False) -> Path:
    """Append the run's record as one line to ``path`` (created with its folders if missing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(jsonl_record(result, details=details)) + "\n")
    return path

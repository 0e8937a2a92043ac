"""Serving metrics from run records, keyed like ``sglang.benchmark.serving``.

Units: records hold seconds (``fastpp.types``); every latency key in a summary is in milliseconds
(suffix ``_ms``), durations in seconds, throughputs per second. Definitions (PAPER.md section 1):

- TTFT = first_token_at - arrived_at; E2E = finished_at - arrived_at;
- TPOT = (last_token_at - first_token_at) / (n - 1), only for outputs of n >= 2 tokens;
- ITL = every gap between consecutive tokens of one request;
- queueing delay = scheduled_at - arrived_at.

Latency and throughput keys count completed requests only (finish reason ``length`` or ``stop``),
as sglang counts successful ones. Per-request SLO attainment counts every request, so rejected,
aborted and unfinished requests are misses. Undefined statistics (no samples) are NaN, never an
exception. Reporting (``format_summary``) and file writers sit at the bottom of this module.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain

import numpy as np

from fastpp.types import SLO, FinishReason, IterationRecord, RequestRecord

DEFAULT_PERCENTILES = (50, 90, 95, 99)
# Clock slack when comparing a latency against an SLO: float subtraction of two run-clock
# instants can land a hair above an exactly-met objective (2.1 - 0.1 > 2.0). 1 ns, in ms.
SLO_SLACK_MS = 1e-6
_COMPLETED = (FinishReason.LENGTH, FinishReason.STOP)
_LATENCIES = ("e2e_latency", "ttft", "tpot", "itl")  # sglang's key stems, in its order
_STAT_KEYS = ("mean", "median", "std", "p90", "p95", "p99")  # sglang's per-latency statistics


def percentiles(values: Iterable[float], ps: Sequence[float] = DEFAULT_PERCENTILES) -> dict:
    """``{p: np.percentile(values, p)}`` with linear interpolation (sglang's choice).

    Empty input maps every p to NaN instead of raising.
    """
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=float)
    if arr.size == 0:
        return {p: math.nan for p in ps}
    return {p: float(v) for p, v in zip(ps, np.percentile(arr, list(ps)), strict=True)}


def _stats(stem: str, values_ms: np.ndarray) -> dict:
    """mean/median/std/p90/p95/p99 of one latency under sglang's key names; NaN when empty.

    Reorders ``values_ms`` in place (the percentiles partition it rather than copy 4M ITLs).
    """
    if values_ms.size == 0:
        return dict.fromkeys((f"{s}_{stem}_ms" for s in _STAT_KEYS), math.nan)
    mean, std = float(values_ms.mean()), float(values_ms.std())  # std: ddof=0, as np.std
    p50, p90, p95, p99 = np.percentile(values_ms, (50, 90, 95, 99), overwrite_input=True)
    stats = (mean, float(p50), std, float(p90), float(p95), float(p99))
    return {f"{s}_{stem}_ms": v for s, v in zip(_STAT_KEYS, stats, strict=True)}


def _rate(amount: float, duration_s: float) -> float:
    return amount / duration_s if duration_s > 0 else math.nan


def _meets(p90_ttft_ms: float, p90_tpot_ms: float, slo: SLO) -> bool:
    """The goodput test. NaN TTFT (nothing completed) fails; NaN TPOT (only one-token outputs)
    passes, because TPOT is undefined for them, exactly as in per-request attainment."""
    ttft_ok = p90_ttft_ms <= slo.ttft_s * 1e3 + SLO_SLACK_MS
    tpot_ok = math.isnan(p90_tpot_ms) or p90_tpot_ms <= slo.tpot_s * 1e3 + SLO_SLACK_MS
    return bool(ttft_ok and tpot_ok)


def meets_slo(summary: Mapping, slo: SLO) -> bool:
    """True iff the summary's P90 TTFT and P90 TPOT both meet ``slo`` (the paper's goodput
    criterion: goodput is the highest arrival rate at which this holds)."""
    return _meets(summary["p90_ttft_ms"], summary["p90_tpot_ms"], slo)


def _attainment(records: Sequence[RequestRecord], slo: SLO) -> tuple[float, float, float]:
    """(both, ttft-only, tpot-only) fractions of ALL records meeting their own objectives.

    Only completed requests can attain; a one-token output meets the TPOT objective vacuously.
    """
    if not records:
        return math.nan, math.nan, math.nan
    ttft_ok = tpot_ok = both_ok = 0
    ttft_max, tpot_max = slo.ttft_s + SLO_SLACK_MS / 1e3, slo.tpot_s + SLO_SLACK_MS / 1e3
    for r in records:
        if r.finish_reason not in _COMPLETED or r.first_token_at is None:
            continue
        t_ok = r.first_token_at - r.arrived_at <= ttft_max
        tpot = r.tpot_s
        p_ok = tpot is None or tpot <= tpot_max
        ttft_ok += t_ok
        tpot_ok += p_ok
        both_ok += t_ok and p_ok
    n = len(records)
    return both_ok / n, ttft_ok / n, tpot_ok / n


def slo_attainment(records: Sequence[RequestRecord], slo: SLO) -> float:
    """Share of all requests whose own TTFT and own TPOT meet ``slo`` (NaN for no requests).

    Rejected, aborted and unfinished requests count as misses; a one-token output needs TTFT only.
    """
    return _attainment(records, slo)[0]


def _peak_in_system(records: Sequence[RequestRecord]) -> int:
    """Most requests present at once: each counts from arrival until it leaves (finished_at;
    never, if unfinished). Departures sort before arrivals at equal times, so a request rejected
    on arrival adds nothing."""
    arrivals = np.fromiter((r.arrived_at for r in records), float, count=len(records))
    departures = np.array([r.finished_at for r in records if r.finished_at is not None], float)
    times = np.concatenate([arrivals, departures])
    deltas = np.concatenate([np.ones(arrivals.size, np.int64), -np.ones(departures.size, np.int64)])
    order = np.lexsort((deltas, times))
    return max(0, int(np.cumsum(deltas[order]).max(initial=0)))


def per_second_peak_concurrency(records: Sequence[RequestRecord]) -> int:
    """sglang.benchmark.serving's ``max_concurrent_requests``: over completed requests, seconds
    count from the first one's arrival; a request counts in every whole-second bucket from the
    one it arrived in to the one it ended in; the answer is the fullest bucket. (Our own
    instantaneous peak is ``max_in_flight_requests``.)"""
    done = [r for r in records if r.finish_reason in _COMPLETED and r.finished_at is not None]
    if not done:
        return 0
    t0 = min(r.arrived_at for r in done)
    first = np.array([int(r.arrived_at - t0) for r in done])
    last = np.array([int(r.finished_at - t0) for r in done])  # type: ignore[operator]
    deltas = np.zeros(int(last.max()) + 2, np.int64)
    np.add.at(deltas, first, 1)
    np.add.at(deltas, last + 1, -1)
    return int(np.cumsum(deltas).max())


def summarize(
    records: Sequence[RequestRecord],
    *,
    duration_s: float | None = None,
    slo: SLO | None = None,
    backend: str = "fastpp-sim",
    request_rate: float | None = None,
) -> dict:
    """One run's summary dict: sglang.benchmark.serving keys first, then FastPP's additions.

    ``duration_s`` defaults to last finish - first arrival over all records (0.0 when there are
    none, which makes throughputs NaN). ``request_rate`` is stored as given (None: unknown).
    Additions: ``num_requests, num_rejected, num_aborted, num_unfinished, num_retractions,
    num_parked`` and queueing-delay stats over every scheduled request; with ``slo``:
    ``slo_ttft_ms, slo_tpot_ms, slo_met`` (goodput criterion on the P90s) and the per-request
    ``slo_attainment, ttft_attainment, tpot_attainment`` over all requests.
    Runs in O(tokens) numpy work plus one Python pass per request.
    """
    records = list(records)
    done = [r for r in records if r.finish_reason in _COMPLETED and r.first_token_at is not None]
    if duration_s is None:
        ends = [r.finished_at for r in records if r.finished_at is not None]
        first = min((r.arrived_at for r in records), default=0.0)
        duration_s = max(0.0, max(ends, default=first) - first)

    arrived = np.array([r.arrived_at for r in done], float)
    first_tok = np.array([r.first_token_at for r in done], float)
    finished = np.array([math.nan if r.finished_at is None else r.finished_at for r in done])
    e2e_ms = (finished - arrived)[~np.isnan(finished)] * 1e3
    ttft_ms = (first_tok - arrived) * 1e3
    tpot_ms = np.array([t for r in done if (t := r.tpot_s) is not None], float) * 1e3
    # itl: concatenate every token time once; keep the gaps whose two ends share a request.
    lengths = np.fromiter((len(r.token_times) for r in done), np.int64, count=len(done))
    all_times = chain.from_iterable(r.token_times for r in done)
    tok_at = np.fromiter(all_times, float, count=int(lengths.sum()))
    gaps = np.diff(tok_at)
    same_req = np.ones(gaps.size, bool)
    cuts = np.cumsum(lengths)[:-1] - 1  # gap index from a request's last token to the next's first
    same_req[cuts[(cuts >= 0) & (cuts < gaps.size)]] = False
    itl_ms = np.multiply(gaps, 1e3, out=gaps)[same_req]

    total_in = int(sum(r.prompt_len for r in done))
    total_out = int(sum(r.num_generated for r in done))
    t0 = min((r.arrived_at for r in records), default=0.0)
    since_t0 = np.subtract(tok_at, t0, out=tok_at)  # tok_at is not needed after this
    # astype truncates toward zero, which is floor for the clamped (non-negative) offsets
    buckets = np.maximum(since_t0, 0.0, out=since_t0).astype(np.int64)
    summary: dict = {
        "backend": backend,
        "request_rate": request_rate,
        "duration": float(duration_s),
        "completed": len(done),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": _rate(len(done), duration_s),
        "input_throughput": _rate(total_in, duration_s),
        "output_throughput": _rate(total_out, duration_s),
        "total_throughput": _rate(total_in + total_out, duration_s),
    }
    for stem, values in zip(_LATENCIES, (e2e_ms, ttft_ms, tpot_ms, itl_ms), strict=True):
        summary.update(_stats(stem, values))
    summary["max_itl_ms"] = float(itl_ms.max()) if itl_ms.size else math.nan
    summary["concurrency"] = _rate(float(e2e_ms.sum()) / 1e3, duration_s)
    summary["max_output_tokens_per_s"] = float(np.bincount(buckets).max()) if buckets.size else 0.0
    summary["max_concurrent_requests"] = per_second_peak_concurrency(records)

    # FastPP additions
    summary["max_in_flight_requests"] = _peak_in_system(records)
    queue_ms = np.array([r.queueing_s for r in records if r.scheduled_at is not None], float) * 1e3
    summary.update(
        num_requests=len(records),
        num_rejected=sum(r.finish_reason == FinishReason.REJECTED for r in records),
        num_aborted=sum(r.finish_reason == FinishReason.ABORTED for r in records),
        num_unfinished=sum(r.finish_reason is None for r in records),
        num_retractions=int(sum(r.num_retractions for r in records)),
        num_parked=int(sum(r.num_parked for r in records)),
        mean_queueing_delay_ms=float(queue_ms.mean()) if queue_ms.size else math.nan,
        p99_queueing_delay_ms=percentiles(queue_ms, (99,))[99],
        max_queueing_delay_ms=float(queue_ms.max()) if queue_ms.size else math.nan,
    )
    if slo is not None:
        both, ttft_att, tpot_att = _attainment(records, slo)
        summary.update(
            slo_ttft_ms=slo.ttft_s * 1e3,
            slo_tpot_ms=slo.tpot_s * 1e3,
            slo_met=_meets(summary["p90_ttft_ms"], summary["p90_tpot_ms"], slo),
            slo_attainment=both,
            ttft_attainment=ttft_att,
            tpot_attainment=tpot_att,
        )
    return summary


# ---- pipeline bubbles ----------------------------------------------------------------------------


def bubble_fraction(stage_busy_s: Sequence[float], start: float, end: float) -> list[float]:
    """The bubble fraction, defined once: per stage, the share of the window [start, end] it
    sat idle, ``1 - busy / (end - start)`` (floored at 0). NaN for every stage of an empty
    window. Runs report it over [first arrival, last end] (``RunResult.bubble_fraction``)."""
    span = end - start
    if not span > 0:
        return [math.nan] * len(stage_busy_s)
    return [max(0.0, 1.0 - busy / span) for busy in stage_busy_s]


def pipeline_fields(stage_busy_s: Sequence[float], start: float, end: float) -> dict:
    """The summary keys a pipeline run adds: per-stage and mean bubble fraction over
    [start, end], rounded to 4 places."""
    bubbles = bubble_fraction(stage_busy_s, start, end)
    return {
        "bubble_fraction": [round(b, 4) for b in bubbles],
        "mean_bubble_fraction": round(sum(bubbles) / len(bubbles), 4) if bubbles else math.nan,
    }


def stage_busy_seconds(
    iterations: Sequence[IterationRecord],
    num_stages: int,
    start: float | None = None,
    end: float | None = None,
) -> tuple[list[float], float, float]:
    """Per stage, the seconds of the window [start, end] it spent running microbatches, and the
    window. The window defaults to the first iteration start .. the last iteration end over all
    stages. Overlapping iterations on one stage count once (union of intervals). Raises
    ValueError for a stage index outside 0..num_stages-1."""
    if num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    stage = np.fromiter((it.stage for it in iterations), np.int64, count=len(iterations))
    t_start = np.fromiter((it.started_at for it in iterations), float, count=len(iterations))
    t_end = np.fromiter((it.finished_at for it in iterations), float, count=len(iterations))
    if stage.size and (stage.min() < 0 or stage.max() >= num_stages):
        bad = int(stage.min()) if stage.min() < 0 else int(stage.max())
        raise ValueError(f"iteration stage must be in 0..{num_stages - 1}, got {bad}")
    w0 = float(t_start.min()) if start is None and stage.size else start
    w1 = float(t_end.max()) if end is None and stage.size else end
    if w0 is None or w1 is None or not w1 > w0:
        return [0.0] * num_stages, 0.0, 0.0
    s, e = np.clip(t_start, w0, w1), np.clip(t_end, w0, w1)
    busy = []
    for k in range(num_stages):
        mask = stage == k
        order = np.argsort(s[mask], kind="stable")
        ss, ee = s[mask][order], e[mask][order]
        # union length: interval i adds [max(s_i, max(e_<i)), e_i]; the earlier interval that
        # reached max(e_<i) started before s_i, so it already covers everything below that.
        reach = np.concatenate([[-np.inf], np.maximum.accumulate(ee)[:-1]])
        busy.append(float(np.clip(ee - np.maximum(ss, reach), 0.0, None).sum()))
    return busy, w0, w1


def iteration_bubble_fraction(
    iterations: Sequence[IterationRecord],
    num_stages: int,
    start: float | None = None,
    end: float | None = None,
) -> list[float]:
    """``bubble_fraction`` of the stage busy time that ``iterations`` show (window defaults as
    in ``stage_busy_seconds``)."""
    busy, w0, w1 = stage_busy_seconds(iterations, num_stages, start, end)
    return bubble_fraction(busy, w0, w1)


# ---- reporting -----------------------------------------------------------------------------------

_HEAD = (  # (label, key, is_int) of sglang's header lines that a summary can fill
    ("Backend:", "backend", True),
    ("Traffic request rate:", "request_rate", True),
    ("Successful requests:", "completed", True),
    ("Benchmark duration (s):", "duration", False),
    ("Total input tokens:", "total_input_tokens", True),
    ("Total generated tokens:", "total_output_tokens", True),
    ("Request throughput (req/s):", "request_throughput", False),
    ("Input token throughput (tok/s):", "input_throughput", False),
    ("Output token throughput (tok/s):", "output_throughput", False),
    ("Peak output token throughput (tok/s):", "max_output_tokens_per_s", False),
    ("Peak concurrent requests:", "max_concurrent_requests", True),
    ("Total token throughput (tok/s):", "total_throughput", False),
    ("Concurrency:", "concurrency", False),
)
_SECTIONS = (
    ("End-to-End Latency", "e2e_latency", "E2E Latency"),
    ("Time to First Token", "ttft", "TTFT"),
    ("Time per Output Token (excl. 1st token)", "tpot", "TPOT"),
    ("Inter-Token Latency", "itl", "ITL"),
)
_STATS = ("Mean", "Median", "P90", "P95", "P99")  # console names; lower-cased they key the dict
_SCHED = (
    ("Rejected requests:", "num_rejected", True),
    ("Aborted requests:", "num_aborted", True),
    ("Unfinished requests:", "num_unfinished", True),
    ("Retractions:", "num_retractions", True),
    ("Parked decodes:", "num_parked", True),
    ("Mean queueing delay (ms):", "mean_queueing_delay_ms", False),
    ("P99 queueing delay (ms):", "p99_queueing_delay_ms", False),
    ("Max queueing delay (ms):", "max_queueing_delay_ms", False),
)
_SLO = (
    ("SLO TTFT (ms):", "slo_ttft_ms", False),
    ("SLO TPOT (ms):", "slo_tpot_ms", False),
    ("SLO met (P90 TTFT and P90 TPOT):", "slo_met", True),
    ("SLO attainment (%):", "slo_attainment", False),
    ("TTFT attainment (%):", "ttft_attainment", False),
    ("TPOT attainment (%):", "tpot_attainment", False),
)


def _line(label: str, value: object, is_int: bool) -> str:
    if value is None or isinstance(value, bool):
        value, is_int = {None: "n/a", True: "yes", False: "no"}[value], True
    return ("{:<40} {:<10}" if is_int else "{:<40} {:<10.2f}").format(label, value)


def _block(rows: Sequence[tuple[str, str, bool]], summary: Mapping) -> list[str]:
    lines = []
    for label, key, is_int in rows:
        if key in summary:
            value = summary[key]
            if key.endswith("attainment") and value is not None:
                value = 100.0 * value
            lines.append(_line(label, value, is_int))
    return lines


def format_summary(summary: Mapping, title: str = "Serving Benchmark Result") -> str:
    """The console block of sglang.benchmark.serving for ``summary``; lines whose keys are
    missing are skipped (so an sglang JSONL record formats too). FastPP's scheduler counters and
    the SLO get their own sections after sglang's, the latter only when ``slo_*`` keys exist."""
    lines = [f"{' ' + title + ' ':=^50}"]
    lines += _block(_HEAD, summary)
    for heading, stem, short in _SECTIONS:
        rows = [(f"{name} {short} (ms):", f"{name.lower()}_{stem}_ms", False) for name in _STATS]
        if stem == "itl":
            rows.append(("Max ITL (ms):", "max_itl_ms", False))
        lines += [f"{heading:-^50}", *_block(rows, summary)]
    if any(key in summary for _, key, _ in _SCHED):
        lines += [f"{'Scheduler':-^50}", *_block(_SCHED, summary)]
    if "slo_met" in summary:
        lines += [f"{'SLO':-^50}", *_block(_SLO, summary)]
    lines.append("=" * 50)
    return "\n".join(lines)

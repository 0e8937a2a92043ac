"""Rich tables for the CLI: side-by-side summaries and workload listings."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from rich.table import Table

# (label, summary key, format) rows of the side-by-side table
SUMMARY_ROWS: tuple[tuple[str, str, str], ...] = (
    ("completed / sent", "_completed", ""),
    ("throughput (req/s)", "request_throughput", "{:.2f}"),
    ("output (tok/s)", "output_throughput", "{:.0f}"),
    ("P50 TTFT (ms)", "median_ttft_ms", "{:.0f}"),
    ("P90 TTFT (ms)", "p90_ttft_ms", "{:.0f}"),
    ("P99 TTFT (ms)", "p99_ttft_ms", "{:.0f}"),
    ("P50 TPOT (ms)", "median_tpot_ms", "{:.1f}"),
    ("P90 TPOT (ms)", "p90_tpot_ms", "{:.1f}"),
    ("P99 TPOT (ms)", "p99_tpot_ms", "{:.1f}"),
    ("P99 ITL (ms)", "p99_itl_ms", "{:.1f}"),
    (
        "mean E2E (s)",
        "mean_e2e_latency_ms",
        "{:.2f}",
    ),
    ("P99 queueing (s)", "p99_queueing_delay_ms", "{:.2f}"),
    ("queue steady", "queue_steady", ""),
    ("SLO met (P90s)", "slo_met", ""),
    ("SLO attainment", "slo_attainment", "{:.1%}"),
    ("KV pool (tokens)", "kv_capacity_tokens", "{:,}"),
    ("retractions", "num_retractions", "{}"),
    ("stage idle (mean)", "mean_bubble_fraction", "{:.1%}"),
    ("microbatches", "num_microbatches", "{:,}"),
    ("sim wall time (s)", "sim_wall_s", "{:.2f}"),
)

_SECONDS = {"mean_e2e_latency_ms", "p99_queueing_delay_ms"}


def _cell(summary: Mapping, key: str, fmt: str) -> str:
    if key == "_completed":
        return f"{summary.get('completed', 0)} / {summary.get('num_requests', 0)}"
    value = summary.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "[green]yes[/]" if value else "[red]no[/]"
    if key in _SECONDS:
        value = value / 1e3
    return fmt.format(value) if fmt else str(value)


def summary_table(summaries: Sequence[Mapping], title: str) -> Table:
    """Metrics as rows, one column per deployment (the label in ``summary['deployment']``)."""
    table = Table(title=title, title_justify="left")
    table.add_column("metric", no_wrap=True)
    for s in summaries:
        table.add_column(
            f"{s.get('deployment', '?')}\n{s.get('policy', '')}", justify="right", overflow="fold"
        )
    for label, key, fmt in SUMMARY_ROWS:
        table.add_row(label, *(_cell(s, key, fmt) for s in summaries))
    return table


def workloads_table(rows: Sequence[Mapping], samples: int) -> Table:
    """One row per workload (statistics of ``samples`` draws); sources go in the caption,
    numbered, so the table stays narrow."""
    table = Table(
        title=f"Built-in workloads (tokens; statistics of {samples:,} samples)",
        title_justify="left",
        caption_justify="left",
    )
    table.add_column("name", no_wrap=True)
    for col in ("in mean", "in p50", "in p90", "out mean", "out p50", "out p90"):
        table.add_column(col, justify="right")
    table.add_column("src", justify="right")
    sources: list[str] = []
    for r in rows:
        if r["source"] not in sources:
            sources.append(r["source"])
        table.add_row(
            r["name"],
            f"{r['input_mean']:.0f}",
            f"{r['input_median']:.0f}",
            f"{r['input_p90']:.0f}",
            f"{r['output_mean']:.0f}",
            f"{r['output_median']:.0f}",
            f"{r['output_p90']:.0f}",
            f"[{sources.index(r['source']) + 1}]",
        )
    table.caption = "\n".join(f"[{i + 1}] {src}" for i, src in enumerate(sources))
    return table

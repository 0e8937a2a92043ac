"""The figures a result path calls for, drawn into one folder: the library side of ``fastpp plot``.

Scenario: a user points at what ``fastpp simulate``, a sweep or ``fastpp goodput --json`` wrote
and gets the paper-style figures (PAPER.md section 5) without naming columns:

- simulate folder: TTFT / TPOT / E2E CDFs across runs, chunk budget over time, and one stage
  timeline per run (kinds ``cdf``, ``chunk``, ``timeline``);
- sweep table: goodput bars when a goodput column has values, P90 latency against rate when the
  rate varies, attainment (and goodput) against SLO scale when slo_scale varies (kinds
  ``goodput``, ``rate``, ``slo``). Axes that vary but are not on the figure (model, gpu, ...)
  split it into one file per value, named ``<figure>_<axis>-<value>...``;
- goodput JSON: every probe's P90s against its rate (kind ``rate``), or goodput bars (``goodput``).

``kind="auto"`` makes every figure the data supports; a named kind the data cannot make raises
:class:`PlotInputError` saying why. SLO lines come from the data's ``slo_ttft_ms`` /
``slo_tpot_ms`` columns unless given. Latencies in ms, rates in requests per second.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, get_args

from fastpp.sim.plot_inputs import (
    PlotInputError,
    PlotKind,
    Row,
    RunData,
    detect,
    has_values,
    load_goodput_json,
    load_results,
    load_run_dir,
    num,
    num_rows,
    probe_rows,
    select_runs,
    unique,
    varies,
)
from fastpp.sim.plots import (
    FORMATS,
    attainment_vs_slo_scale,
    chunk_over_time,
    goodput_bars,
    latency_cdf,
    latency_vs_rate,
    stage_timeline,
    timeline_window,
)

PLOT_KINDS: tuple[str, ...] = get_args(PlotKind)
KINDS_BY_SOURCE = {  # what each input can make, in the order auto makes them
    "run_dir": ("cdf", "chunk", "timeline"),
    "sweep": ("goodput", "rate", "slo"),
    "goodput": ("rate", "goodput"),
}
_SOURCE_NAMES = {
    "run_dir": "`fastpp simulate` folder",
    "sweep": "sweep results table",
    "goodput": "`fastpp goodput --json` file",
}
FACET_KEYS = {  # axes that split a sweep figure into one file per value
    "goodput": ("model", "gpu", "slo_scale"),
    "rate": ("workload", "model", "gpu", "slo_scale"),
    "slo": ("model", "gpu", "rate"),  # workloads are panels of one figure
}
PLOTS_DIR = "plots"  # default output folder, next to the result
Progress = Callable[[str], None]  # gets one line per choice made and per figure drawn


class _Figures:
    """The files written so far; each figure drawn through :meth:`draw` is timed and logged."""

    def __init__(self, progress: Progress | None) -> None:
        self.paths: list[Path] = []
        self.log: Progress = progress or (lambda _line: None)

    def draw(self, make: Callable[..., list[Path]], *args: object, **kwargs: object) -> None:
        began = time.perf_counter()
        written = make(*args, **kwargs)
        self.paths += written
        if written:
            exts = ", ".join(p.suffix for p in written)
            self.log(f"drew {written[0].with_suffix('')} ({exts}) in {time.perf_counter() - began:.1f} s")


def plot_results(
    path: str | Path,
    out_dir: str | Path | None = None,
    *,
    kind: PlotKind = "auto",
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    formats: Sequence[str] = FORMATS,
    progress: Progress | None = None,
) -> list[Path]:
    """Draw the figures for the result at ``path`` into ``out_dir`` (default: a ``plots``
    folder beside it or inside it) and return the files written. ``progress`` gets a line
    saying what is plotted (and, for a folder of several simulate runs, which one: the newest),
    then one line per figure as it is written."""
    if kind not in PLOT_KINDS:
        raise PlotInputError(f"kind must be one of {', '.join(PLOT_KINDS)}, got {kind!r}")
    source, where = detect(path)
    allowed = KINDS_BY_SOURCE[source]
    if kind != "auto" and kind not in allowed:
        raise PlotInputError(
            f"{path}: a {_SOURCE_NAMES[source]} makes {', '.join(allowed)} plots, not {kind}"
        )
    figures = _Figures(progress)
    notes: list[str] = []
    if source == "run_dir":
        selection = select_runs(where)
        notes += selection.notes
        where = selection.path
    out = Path(out_dir) if out_dir is not None else (where if where.is_dir() else where.parent) / PLOTS_DIR
    slo = (slo_ttft_ms, slo_tpot_ms)
    wanted = allowed if kind == "auto" else (kind,)
    if source == "run_dir":
        runs = _distinct_labels(load_run_dir(where, notes))
        for note in notes:
            figures.log(note)
        figures.log(f"plotting {where}: {_describe_runs(runs)}")
        _run_dir(figures, runs, out, wanted, slo, formats)
    elif source == "sweep":
        rows = load_results(where)
        context = _context(rows)
        figures.log(f"plotting {where}: {context + ', ' if context else ''}{len(rows)} rows")
        _sweep(figures, rows, out, wanted, slo, formats)
    else:
        results = load_goodput_json(where)
        context = _context(results, skip=("policy",))
        searched = ", ".join(f"{r.get('deployment')} {r.get('policy')}" for r in results)
        figures.log(
            f"plotting {where}: {context + ', ' if context else ''}{len(results)} goodput "
            f"search(es): {searched}"
        )
        _goodput(figures, results, out, wanted, slo, formats)
    paths = figures.paths
    if not paths:
        raise PlotInputError(f"{path}: nothing to plot as {kind}: {_why_empty(source)}")
    return paths


def _why_empty(source: str) -> str:
    if source == "run_dir":
        return "no run folder with requests.jsonl/.parquet or iterations.csv/.parquet"
    if source == "sweep":
        return (
            "no goodput values, no varying rate with p90_ttft_ms / p90_tpot_ms, and no "
            "varying slo_scale with slo_attainment or goodput"
        )
    return "no probes with a rate"


def _common(rows: Sequence[Row], key: str) -> Any:
    """The value every row that has ``key`` agrees on, else None."""
    values = unique(r[key] for r in rows if r.get(key) not in (None, ""))
    return values[0] if len(values) == 1 else None


def _slo(rows: Sequence[Row], given: float | None, key: str) -> float | None:
    if given is not None:
        return given
    value = _common(rows, key)
    return None if value is None or math.isnan(num({key: value}, key)) else float(value)


def _context(rows: Sequence[Row], skip: Sequence[str] = ()) -> str:
    """``Qwen2.5-14B on A100-40GB-PCIe, sharegpt, static:2048, SLO 2000/200 ms``: the setting
    the rows share (model, GPU, workload, policy, SLO TTFT/TPOT), for titles."""
    model, gpu, workload, policy = (
        None if k in skip else _common(rows, k) for k in ("model", "gpu", "workload", "policy")
    )
    where = " on ".join(str(v) for v in (model, gpu) if v is not None)
    ttft, tpot = (None if "slo" in skip else _common(rows, k) for k in ("slo_ttft_ms", "slo_tpot_ms"))
    slo = f"SLO {_fmt(ttft)}/{_fmt(tpot)} ms TTFT/TPOT" if ttft is not None and tpot is not None else ""
    return ", ".join(str(s) for s in (where, workload, policy, slo) if s)


def _distinct_labels(runs: list[RunData]) -> list[RunData]:
    """The runs, each labelled so no two share a label: recorded run folders plotted side by
    side may differ in model, GPU or workload (added to the label where they do), or only in
    their folder (added last)."""
    summaries = [r.summary for r in runs]
    differ = [k for k in ("model", "gpu", "workload") if varies(summaries, k)]
    labelled = [
        r
        if not differ
        else RunData(
            r.run_id,
            r.summary,
            r.requests,
            r.iterations,
            " ".join([r.label, *(str(r.summary.get(k)) for k in differ)]),
        )
        for r in runs
    ]
    counts = {lbl: [r.label for r in labelled].count(lbl) for lbl in {r.label for r in labelled}}
    return [
        r
        if counts[r.label] == 1
        else RunData(r.run_id, r.summary, r.requests, r.iterations, f"{r.label} ({r.run_id})")
        for r in labelled
    ]


def _describe_runs(runs: Sequence[RunData]) -> str:
    """``Qwen2.5-32B on A100-40GB-PCIe, azure-conv ..., 4 deployments: tp4 static:2048, ...``"""
    context = _context([r.summary for r in runs], skip=("policy",))
    names = ", ".join(r.label for r in runs)
    return f"{context + ', ' if context else ''}{len(runs)} run(s): {names}"


def _facets(rows: Sequence[Row], keys: Sequence[str]) -> list[tuple[str, str, list[Row]]]:
    """Split rows by the ``keys`` that vary: (file-name suffix, title part, rows) per value.
    The title part names the setting of the group: model, gpu, workload, then the split keys."""
    split = [k for k in keys if varies(rows, k)]
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in split), []).append(r)
    facets = []
    for values, group in groups.items():
        pairs = list(zip(split, values, strict=True))
        suffix = "".join("_" + re.sub(r"[^A-Za-z0-9.]+", "-", f"{k} {_fmt(v)}").strip("-") for k, v in pairs)
        shown = [_FACET_TITLES.get(k, k + " {}").format(_fmt(v)) for k, v in pairs]
        setting = _context(group, skip=split)
        facets.append((suffix, ", ".join(p for p in (setting, *shown) if p), group))
    return facets


_FACET_TITLES = {"rate": "{} req/s", "slo_scale": "SLO x{}", "model": "{}", "gpu": "{}", "workload": "{}"}


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _title(head: str, *parts: str) -> str:
    rest = ", ".join(p for p in parts if p)
    return f"{head}\n{rest}" if rest else head


# ---- per source ----------------------------------------------------------------------------------


def _run_dir(
    figures: _Figures,
    runs: list[RunData],
    out: Path,
    wanted: Sequence[str],
    slo: tuple[float | None, float | None],
    formats: Sequence[str],
) -> None:
    summaries = [r.summary for r in runs]
    context = _context(summaries)
    if "cdf" in wanted and any(r.requests for r in runs):
        requests = {r.label: r.requests for r in runs if r.requests}
        for metric, slo_ms in (
            ("ttft", _slo(summaries, slo[0], "slo_ttft_ms")),
            ("tpot", _slo(summaries, slo[1], "slo_tpot_ms")),
            ("e2e", None),
        ):
            figures.draw(
                latency_cdf,
                requests,
                out / f"cdf_{metric}",
                metric=metric,
                slo_ms=slo_ms,
                log_x=metric != "tpot",
                formats=formats,
                title=_title(f"{metric.upper()} CDF", context),
            )
    with_iterations = [r for r in runs if num_rows(r.iterations)]
    if "chunk" in wanted and with_iterations:
        figures.draw(
            chunk_over_time,
            {r.label: r.iterations for r in with_iterations},
            out / "chunk_over_time",
            formats=formats,
            title=_title("Chunk budget (stage 0)", context),
        )
    if "timeline" in wanted and with_iterations:
        start, end, chosen_by = _common_window(with_iterations)
        for r in with_iterations:
            pp = num(r.summary, "pp")
            own = _context([r.summary], skip=("slo", "policy"))  # the label names the policy
            figures.draw(
                stage_timeline,
                r.iterations,
                out / f"timeline_{r.run_id}",
                formats=formats,
                num_stages=int(pp) if pp >= 1 else None,
                start=start,
                end=end,
                title=_title(f"{r.label}: stages busy and idle", own)
                + (
                    f"\nsame window for every deployment: {chosen_by}'s 40 most prefill-heavy microbatches"
                    if len(with_iterations) > 1
                    else ""
                ),
            )


def _common_window(runs: Sequence[RunData]) -> tuple[float, float, str]:
    """One timeline window for every deployment of a run, so their timelines compare: the
    longest of their own default windows (the deployment with the slowest microbatches still
    shows 40 of them), and the run it came from."""
    windows = {r.label: timeline_window(r.iterations) for r in runs}
    label = max(windows, key=lambda k: windows[k][1] - windows[k][0])
    start, end = windows[label]
    return start, end, label


def _sweep(
    figures: _Figures,
    rows: list[dict[str, Any]],
    out: Path,
    wanted: Sequence[str],
    slo: tuple[float | None, float | None],
    formats: Sequence[str],
) -> None:
    if "goodput" in wanted:
        have = [r for r in rows if not math.isnan(num(r, "goodput"))]
        for suffix, shown, group in _facets(have, FACET_KEYS["goodput"]):
            figures.draw(
                goodput_bars, group, out / f"goodput{suffix}", formats=formats, title=_title("Goodput", shown)
            )
    if "rate" in wanted:
        have = [
            r
            for r in rows
            if math.isfinite(num(r, "rate"))
            and (has_values([r], "p90_ttft_ms") or has_values([r], "p90_tpot_ms"))
        ]
        if len(wanted) == 1 or varies(have, "rate"):
            _latency_facets(figures, have, out / "latency_vs_rate", "P90 latency vs rate", slo, formats)
    if "slo" in wanted:
        have = [r for r in rows if math.isfinite(num(r, "slo_scale"))]
        if len(wanted) == 1 or varies(have, "slo_scale"):
            for metric, name in (("slo_attainment", "slo_scale"), ("goodput", "slo_scale_goodput")):
                for suffix, shown, group in _facets(have, FACET_KEYS["slo"]):
                    if has_values(group, metric):
                        head = "SLO attainment" if metric == "slo_attainment" else "Goodput"
                        figures.draw(
                            attainment_vs_slo_scale,
                            group,
                            out / f"{name}{suffix}",
                            metric=metric,
                            formats=formats,
                            title=_title(f"{head} vs SLO scale", shown),
                        )


def _latency_facets(
    figures: _Figures,
    rows: Sequence[Row],
    stem: Path,
    head: str,
    slo: tuple[float | None, float | None],
    formats: Sequence[str],
) -> None:
    for suffix, shown, group in _facets(rows, FACET_KEYS["rate"]):
        figures.draw(
            latency_vs_rate,
            group,
            stem.with_name(stem.name + suffix),
            formats=formats,
            log_ttft=True,
            slo_ttft_ms=_slo(group, slo[0], "slo_ttft_ms"),
            slo_tpot_ms=_slo(group, slo[1], "slo_tpot_ms"),
            title=_title(head, shown),
        )


def _goodput(
    figures: _Figures,
    results: list[dict[str, Any]],
    out: Path,
    wanted: Sequence[str],
    slo: tuple[float | None, float | None],
    formats: Sequence[str],
) -> None:
    if "rate" in wanted:
        rows = [r for r in probe_rows(results) if math.isfinite(num(r, "rate"))]
        if rows:
            _latency_facets(figures, rows, out / "goodput_probes", "Goodput search probes", slo, formats)
    if "goodput" in wanted:
        figures.draw(
            goodput_bars,
            results,
            out / "goodput",
            formats=formats,
            title=_title("Goodput", _context(results)),
        )

"""Figures of FastPP results, after PAPER.md section 5: goodput bars per workload and system,
P90 latency against rate, latency CDFs, chunk budget over time, per-stage busy/idle timelines,
and SLO attainment against SLO scale.

Every figure function takes plain data (row dicts; see ``fastpp.sim.plot_inputs`` for the
loaders), an output path stem and options; it writes ``<stem>.<fmt>`` for each of ``formats``
and returns those paths. ``fastpp.sim.plot_report.plot_results`` picks the figures a result
path calls for (``fastpp plot``). The shared style, axes and legends live in
``fastpp.sim.plot_style``; the figures over the run clock (chunk budget, stage timelines) in
``fastpp.sim.plot_timeline``, re-exported here.

matplotlib is the optional ``fastpp[plots]`` extra, imported only inside these functions, so the
simulator and the CLI never load it. Figures are ``matplotlib.figure.Figure`` objects, never
pyplot's: a Figure renders headless through its own Agg canvas, so there is no global figure list
to leak and no need for ``matplotlib.use("Agg")``, which would switch a notebook's backend behind
its back. Output is deterministic: matplotlib's default style whatever the user's matplotlibrc,
a fixed SVG hash salt, and no date or software version in the files.
Units: latencies in ms, run-clock times in seconds, rates in requests per second.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from fastpp.sim.plot_inputs import (
    SERIES_KEYS,
    PlotInputError,
    Row,
    RunData,
    load_goodput_json,
    load_results,
    load_run_dir,
    num,
    system_label,
    unique,
)
from fastpp.sim.plot_style import (
    FORMATS,
    SLO_LINE,
    colors,
    compact_axis,
    compact_number,
    figure,
    legend_below,
    log_axis,
    same_as,
    save,
    styles,
    suptitle,
)
from fastpp.sim.plot_timeline import chunk_over_time, rolling_median, stage_timeline, timeline_window

__all__ = [  # the loaders live in plot_inputs (no matplotlib there) and are re-exported here
    "FORMATS",
    "PlotInputError",
    "RunData",
    "attainment_vs_slo_scale",
    "chunk_over_time",
    "goodput_bars",
    "latency_cdf",
    "latency_vs_rate",
    "load_goodput_json",
    "load_results",
    "load_run_dir",
    "request_latencies_ms",
    "rolling_median",
    "stage_timeline",
    "timeline_window",
    "compact_number",
]

CdfMetric = Literal["ttft", "tpot", "e2e"]
_COMPLETED = ("length", "stop")  # finish reasons of requests that produced their output


def _mean_by(rows: Sequence[Row], key: Callable[[Row], tuple], metric: str) -> dict[tuple, float]:
    """Mean of ``metric`` per key over the rows where it is a number (repeated grid points, such
    as seeds, average); an infinity stays infinite."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        v = num(r, metric)
        if not math.isnan(v):
            groups.setdefault(key(r), []).append(v)
    return {k: float(np.mean(v)) for k, v in groups.items()}


def _series(
    rows: Sequence[Row], x: str, metric: str, series: Sequence[str]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per system with any x value, the sorted x values and the mean metric at each (NaN where
    none)."""
    means = _mean_by(rows, lambda r: (system_label(r, series), num(r, x)), metric)
    out = {}
    for s in unique(system_label(r, series) for r in rows):
        xs = sorted({v for r in rows if system_label(r, series) == s and math.isfinite(v := num(r, x))})
        if xs:
            out[s] = (np.array(xs), np.array([means.get((s, v), math.nan) for v in xs]))
    return out


# ---- figures -------------------------------------------------------------------------------------


def goodput_bars(
    rows: Sequence[Row],
    out: str | Path,
    *,
    metric: str = "goodput",
    group_by: str = "workload",
    series: Sequence[str] = SERIES_KEYS,
    ylabel: str = "goodput (req/s)",
    title: str | None = None,
    formats: Sequence[str] = FORMATS,
) -> list[Path]:
    """Grouped bars like the paper's Figure 9: one group per ``group_by`` value (workload), one
    bar per system, height = ``metric``. A zero bar is marked "0"; a missing one is left out."""
    groups = unique(str(r.get(group_by) or "") for r in rows)
    systems = unique(system_label(r, series) for r in rows)
    values = _mean_by(rows, lambda r: (str(r.get(group_by) or ""), system_label(r, series)), metric)
    palette = colors(systems)
    width = 0.8 / max(1, len(systems))
    with figure((max(5.0, 1.1 + len(groups) * (0.5 + 0.28 * len(systems))), 3.6)) as (fig, axs):
        ax = axs[0, 0]
        for j, s in enumerate(systems):
            offset = (j - (len(systems) - 1) / 2) * width
            pts = [(i + offset, values[(g, s)]) for i, g in enumerate(groups) if (g, s) in values]
            if not pts:
                continue
            xs, hs = zip(*pts, strict=True)
            ax.bar(xs, hs, width * 0.95, label=s or "all", color=palette[s])
            for x, h in pts:
                if h == 0:
                    ax.text(x, 0, "0", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(groups)), groups)
        fig_chars = fig.get_figwidth() * 12  # characters of 9 pt text per figure width
        if sum(len(g) + 2 for g in groups) > fig_chars:  # labels would touch: slant them
            ax.tick_params(axis="x", labelrotation=25)
            for label in ax.get_xticklabels():
                label.set_horizontalalignment("right")
        ax.set_xlim(-0.5, len(groups) - 0.5)
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, None if any(v > 0 for v in values.values()) else 1.0)
        ax.grid(axis="x", visible=False)
        suptitle(fig, title)
        legend_below(fig, [ax])
        return save(fig, out, formats)


def latency_vs_rate(
    rows: Sequence[Row],
    out: str | Path,
    *,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    x: str = "rate",
    ttft_key: str = "p90_ttft_ms",
    tpot_key: str = "p90_tpot_ms",
    log_ttft: bool = False,
    series: Sequence[str] = SERIES_KEYS,
    title: str | None = None,
    formats: Sequence[str] = FORMATS,
) -> list[Path]:
    """Two panels, P90 TTFT and P90 TPOT against arrival rate, one line per system, the SLOs as
    dashed lines. An infinite P90 (too many failed requests, or a goodput probe stopped early on
    that objective) is a triangle on the top edge.
    Rows with a boolean ``ok`` column (goodput probes) draw infeasible points hollow."""
    systems = unique(system_label(r, series) for r in rows)
    style_of = styles(systems)
    with figure((9.0, 3.8), 1, 2) as (fig, axs):
        panels = ((axs[0, 0], ttft_key, slo_ttft_ms, "TTFT"), (axs[0, 1], tpot_key, slo_tpot_ms, "TPOT"))
        by_panel = {key: _series(rows, x, key, series) for _, key, _, _ in panels}
        same = same_as(
            {
                s: np.concatenate(
                    [np.concatenate(lines[s]) if s in lines else [np.nan] for lines in by_panel.values()]
                )
                for s in systems
            }
        )
        for ax, key, slo, name in panels:
            here = {
                s: t
                for s, t in same_as({s: np.concatenate(v) for s, v in by_panel[key].items()}).items()
                if s not in same
            }
            if here:  # coinciding in this panel only: said above it, off the data
                note = "lines coincide: " + "; ".join(f"{s} = {t}" for s, t in here.items())
                ax.set_title(textwrap.fill(note, 80), loc="left", fontsize=7, color="0.4")
            for s, (xs, ys) in by_panel[key].items():
                style = style_of[s]
                finite = np.where(np.isfinite(ys), ys, np.nan)
                label = (s or "all") + (f" (= {same[s]})" if s in same else "")
                ax.plot(
                    xs,
                    finite,
                    marker=style["marker"],
                    markersize=4,
                    color=style["color"],
                    linestyle=style["linestyle"],
                    label=label,
                )
                off = xs[np.isinf(ys)]
                if off.size:
                    ax.plot(
                        off,
                        np.full(off.size, 0.98),
                        marker="^",
                        linestyle="none",
                        color=style["color"],
                        transform=ax.get_xaxis_transform(),
                        clip_on=False,
                    )
                hollow = [
                    (num(r, x), num(r, key))
                    for r in rows
                    if r.get("ok") is False and system_label(r, series) == s and math.isfinite(num(r, key))
                ]
                if hollow:
                    ax.plot(
                        *zip(*hollow, strict=True),
                        marker="o",
                        markersize=7,
                        linestyle="none",
                        markerfacecolor="white",
                        markeredgecolor=style["color"],
                    )
            if slo is not None and math.isfinite(slo):
                ax.axhline(slo, **SLO_LINE, label=f"{name} SLO {slo:g} ms")
            ax.set_xlabel("arrival rate (req/s)")
            ax.set_ylabel(f"P90 {name} (ms)")
            shown = np.array([num(r, key) for r in rows], float)
            if key == ttft_key and log_ttft and np.any((shown > 0) & np.isfinite(shown)):
                log_axis(ax, "y", shown)  # a log axis needs a positive value
            else:
                ax.set_ylim(bottom=0)
                compact_axis(ax, "y")
        drawn = [any(not np.all(np.isnan(ys)) for _, ys in by_panel[key].values()) for _, key, _, _ in panels]
        if drawn[0] != drawn[1]:  # a panel with nothing to draw takes the other's rates
            empty, full = (axs[0, 0], axs[0, 1]) if drawn[1] else (axs[0, 1], axs[0, 0])
            empty.set_xlim(full.get_xlim())
        notes = (["hollow: infeasible probe"] if any(r.get("ok") is False for r in rows) else []) + (
            ["▲: P90 above the axis (failed requests, or a probe stopped early past the SLO)"]
            if any(math.isinf(num(r, k)) for r in rows for k in (ttft_key, tpot_key))
            else []
        )
        if notes:
            fig.text(0.99, 0.01, "; ".join(notes), ha="right", fontsize=7, color="0.4")
        suptitle(fig, title)
        legend_below(fig, [axs[0, 0], axs[0, 1]])
        return save(fig, out, formats)


def request_latencies_ms(requests: Sequence[Row], metric: CdfMetric) -> np.ndarray:
    """Per request of ``RequestRecord.to_dict`` rows, its TTFT, TPOT or E2E in ms; inf for one
    that did not complete; TPOT leaves out outputs of fewer than two tokens (undefined)."""
    values = []
    for r in requests:
        done = r.get("finish_reason") in _COMPLETED
        if metric == "ttft":
            values.append((num(r, "first_token_at") - num(r, "arrived_at")) * 1e3 if done else math.inf)
        elif metric == "e2e":
            values.append((num(r, "finished_at") - num(r, "arrived_at")) * 1e3 if done else math.inf)
        elif not done:  # tpot
            values.append(math.inf)
        elif num(r, "num_generated") >= 2 and r.get("itl_ms"):  # else TPOT is undefined
            values.append(sum(r["itl_ms"]) / (num(r, "num_generated") - 1))
    return np.array(values, float)


def latency_cdf(
    requests_by_system: Mapping[str, Sequence[Row]],
    out: str | Path,
    *,
    metric: CdfMetric = "ttft",
    slo_ms: float | None = None,
    log_x: bool = False,
    title: str | None = None,
    formats: Sequence[str] = FORMATS,
) -> list[Path]:
    """Empirical CDF of per-request TTFT, TPOT or E2E latency, one line per system, over all its
    requests: failed ones never arrive, so a curve that stops below 1 shows the failed share.
    With ``slo_ms``, a dashed vertical line, and each legend entry gives the share within it.
    Systems differ in colour and line style; one whose latencies equal an earlier system's says
    so in its legend entry. The legend sits below the axes, off the curves."""
    if metric not in ("ttft", "tpot", "e2e"):
        raise ValueError(f"metric must be ttft, tpot or e2e, got {metric!r}")
    values = {s: np.sort(request_latencies_ms(r, metric)) for s, r in requests_by_system.items()}
    values = {s: v for s, v in values.items() if v.size}
    style_of = styles(list(values))
    same = same_as(values)
    with figure((6.4, 4.2)) as (fig, axs):
        ax = axs[0, 0]
        for s, v in values.items():
            finite = v[np.isfinite(v)]
            label = f"{s} (n={v.size}"
            if finite.size < v.size:
                label += f", {v.size - finite.size} failed"
            if slo_ms is not None:
                label += f", {np.mean(v <= slo_ms):.0%} within SLO"
            if s in same:
                label += f"; same as {same[s]}"
            xs, ys = _cdf_points(finite, v.size)
            style = style_of[s]
            ax.plot(
                xs,
                ys,
                drawstyle="steps-post",
                color=style["color"],
                linestyle=style["linestyle"],
                linewidth=1.4,
                label=label + ")",
            )
        if slo_ms is not None:
            ax.axvline(slo_ms, **SLO_LINE, label=f"SLO {slo_ms:g} ms")
        ax.set_xlabel(f"{metric.upper()} (ms)")
        ax.set_ylabel("share of requests")
        ax.set_ylim(0, 1.02)
        everything = np.concatenate([v for v in values.values()] or [np.zeros(0)])
        if log_x and np.any(np.isfinite(everything) & (everything > 0)):
            log_axis(ax, "x", everything)
        else:
            compact_axis(ax, "x")
        suptitle(fig, title or f"{metric.upper()} CDF")
        legend_below(fig, [ax], ncols=1 if len(values) > 2 else 2)
        return save(fig, out, formats)


MAX_CDF_POINTS = 2000  # per curve: more steps than a figure has pixels only slow the drawing


def _cdf_points(finite: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray]:
    """The steps of the empirical CDF of sorted ``finite`` values out of ``total`` requests,
    thinned to at most MAX_CDF_POINTS evenly spaced quantiles (the last point kept)."""
    xs = np.concatenate([finite[:1], finite])  # empty when no request finished: no steps
    ys = np.arange(xs.size) / max(total, 1)
    if xs.size > MAX_CDF_POINTS:
        keep = np.unique(np.linspace(0, xs.size - 1, MAX_CDF_POINTS).round().astype(int))
        xs, ys = xs[keep], ys[keep]
    return xs, ys


def attainment_vs_slo_scale(
    rows: Sequence[Row],
    out: str | Path,
    *,
    metric: str = "slo_attainment",
    x: str = "slo_scale",
    panel_by: str | None = "workload",
    series: Sequence[str] = SERIES_KEYS,
    title: str | None = None,
    formats: Sequence[str] = FORMATS,
) -> list[Path]:
    """Per system, ``metric`` (per-request SLO attainment, or goodput) against the SLO scale,
    read from loose (1.0) on the left to strict (0.2) on the right; one panel per value of
    ``panel_by`` (workload), sharing the y axis."""
    is_share = metric.endswith("attainment")
    systems = unique(system_label(r, series) for r in rows)
    style_of = styles(systems)
    panels = unique(str(r.get(panel_by) or "") for r in rows) if panel_by else [""]
    ncols = min(len(panels), 4)
    nrows = math.ceil(len(panels) / ncols)
    with figure((1.0 + 3.2 * ncols, 0.9 + 2.9 * nrows), nrows, ncols) as (fig, axs):
        flat = list(axs.flat)
        whole = {
            p: _series(
                [r for r in rows if not panel_by or str(r.get(panel_by) or "") == p], x, metric, series
            )
            for p in panels
        }
        same = same_as(
            {
                s: np.concatenate(
                    [np.concatenate(lines[s]) if s in lines else [np.nan] for lines in whole.values()]
                )
                for s in systems
            }
        )
        for ax, panel in zip(flat, panels, strict=False):
            group = [r for r in rows if not panel_by or str(r.get(panel_by) or "") == panel]
            lines = _series(group, x, metric, series)
            for s, (xs, ys) in lines.items():
                ax.plot(
                    xs,
                    ys * 100 if is_share else ys,
                    markersize=4,
                    **style_of[s],
                    label=(s or "all") + (f" (= {same[s]})" if s in same else ""),
                    clip_on=False,
                )  # zeros on the axis
            ax.invert_xaxis()
            ax.set_xlabel("SLO scale")
            if panel:
                ax.set_title(panel, fontsize=9)
            if is_share:
                ax.set_ylim(0, 102)
        top = max((num(r, metric) for r in rows if math.isfinite(num(r, metric))), default=0.0)
        for i, ax in enumerate(flat):
            if i >= len(panels):
                ax.set_visible(False)
            elif not is_share:
                ax.set_ylim(0, top * 1.05 if top > 0 else 1.0)
            if i % ncols == 0:
                ax.set_ylabel(
                    "requests within SLO (%)"
                    if is_share
                    else "goodput (req/s)"
                    if metric == "goodput"
                    else metric
                )
        suptitle(fig, title)
        legend_below(fig, flat[: len(panels)])
        return save(fig, out, formats)

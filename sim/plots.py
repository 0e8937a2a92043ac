"""Figures of FastPP results, after PAPER.md section 5: goodput bars per workload and system,
P90 latency against rate, latency CDFs, chunk budget over time, per-stage busy/idle timelines,
and SLO attainment against SLO scale.

Every figure function takes plain data (row dicts; see ``fastpp.sim.plot_inputs`` for the
loaders), an output path stem and options; it writes ``<stem>.<fmt>`` for each of ``formats``
and returns those paths. ``fastpp.sim.plot_report.plot_results`` picks the figures a result
path calls for (``fastpp plot``).

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from fastpp.metrics import iteration_bubble_fraction
from fastpp.sim.plot_inputs import (
    SERIES_KEYS,
    Columns,
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

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [  # the loaders live in plot_inputs (no matplotlib there) and are re-exported here
    "FORMATS", "PlotInputError", "RunData", "attainment_vs_slo_scale", "chunk_over_time",
    "goodput_bars", "latency_cdf", "latency_vs_rate", "load_goodput_json", "load_results",
    "load_run_dir", "request_latencies_ms", "rolling_median", "stage_timeline", "timeline_window",
]

FORMATS: tuple[str, ...] = ("png", "svg")
DPI = 150  # PNG resolution
_METADATA: dict[str, dict[str, None]] = {  # drop dates and versions, so files are reproducible
    "png": {"Software": None},
    "svg": {"Date": None, "Creator": None},
    "pdf": {"CreationDate": None, "Creator": None, "Producer": None},
}
_RC = {
    "svg.hashsalt": "fastpp",  # SVG element ids are hashes: a fixed salt makes them repeatable
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
}
PHASE_COLORS = {"prefill": "#4C72B0", "decode": "#55A868", "mixed": "#DD8452"}
SLO_LINE = {"color": "0.35", "linestyle": "--", "linewidth": 1.0}
CdfMetric = Literal["ttft", "tpot", "e2e"]
_COMPLETED = ("length", "stop")  # finish reasons of requests that produced their output


# ---- plumbing ------------------------------------------------------------------------------------


def _matplotlib() -> ModuleType:
    try:
        import matplotlib
        import matplotlib.style  # noqa: F401  (a subpackage: not loaded by `import matplotlib`)
    except ImportError as exc:
        raise ImportError("plots need matplotlib, which the `fastpp[plots]` extra installs: "
                          "pip install 'fastpp[plots]'") from exc
    return matplotlib


@contextmanager
def _figure(figsize: tuple[float, float], nrows: int = 1, ncols: int = 1
            ) -> Iterator[tuple[Figure, Any]]:
    """A constrained-layout Figure and its axes grid, under FastPP's fixed style (the style must
    still hold when saving, since the SVG hash salt is read then)."""
    mpl = _matplotlib()
    from matplotlib.figure import Figure

    with mpl.style.context("default"), mpl.rc_context(_RC):
        fig = Figure(figsize=figsize, layout="constrained")
        yield fig, fig.subplots(nrows, ncols, squeeze=False)


def _save(fig: Figure, out: str | Path, formats: Sequence[str]) -> list[Path]:
    stem = Path(out)
    if stem.suffix in (".png", ".svg", ".pdf"):
        stem = stem.with_suffix("")
    if not formats:
        raise ValueError("formats must name at least one of png, svg, pdf")
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        if fmt not in _METADATA:
            raise ValueError(f"format must be one of {', '.join(_METADATA)}, got {fmt!r}")
        path = stem.with_name(f"{stem.name}.{fmt}")
        fig.savefig(path, format=fmt, dpi=DPI, metadata=_METADATA[fmt])
        paths.append(path)
        # The layout is in figure coordinates, the same for every format: keep it, don't redo it.
        fig.set_layout_engine("none")
    return paths


def _suptitle(fig: Figure, title: str | None) -> None:
    """The figure title, each line wrapped to the figure's width (long run descriptions)."""
    if title:
        width = max(30, int(fig.get_figwidth() * 12))  # characters per line at 10 pt
        fig.suptitle("\n".join(textwrap.fill(line, width) for line in title.splitlines()),
                     fontsize=10)


def compact_number(value: float) -> str:
    """A tick label that stays short: 0.5, 20, 500, 2k, 50k, 1.5M (never ``100000``)."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _log_axis(ax: Axes, which: Literal["x", "y"], values: np.ndarray | None = None) -> None:
    """Log scale labelled 100, 200, 500, 1k ... (plain numbers read faster than 2 x 10^2).
    Over more than three decades of ``values`` only the powers of ten are labelled, so the
    labels never run into each other."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if which == "x":
        ax.set_xscale("log")
        axis = ax.xaxis
    else:
        ax.set_yscale("log")
        axis = ax.yaxis
    subs: tuple[float, ...] = (1.0, 2.0, 5.0)
    if values is not None:
        finite = values[np.isfinite(values) & (values > 0)]
        if finite.size and np.log10(finite.max() / finite.min()) > 3:
            subs = (1.0,)
    axis.set_major_locator(LogLocator(subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: compact_number(v)))
    axis.set_minor_formatter(NullFormatter())


class _CompactFormatter:
    """Tick labels of one linear axis on one scale: 0, 2500, 5000 below 10,000; 0, 20k, 40k
    (or M, G) above, chosen from the largest tick so that an axis never mixes the two."""

    @staticmethod
    def make() -> Any:
        from matplotlib.ticker import Formatter

        class Compact(Formatter):
            scale, suffix = 1.0, ""

            def format_ticks(self, values: Sequence[float]) -> list[str]:
                top = max((abs(v) for v in values), default=0.0)
                self.scale, self.suffix = next(((s, x) for s, x in ((1e9, "G"), (1e6, "M"), (1e4, "k"))
                                                if top >= s), (1.0, ""))
                if self.suffix == "k":
                    self.scale = 1e3
                return [self(v) for v in values]

            def __call__(self, x: float, pos: int | None = None) -> str:
                return f"{x / self.scale:.4g}{self.suffix}"

        return Compact()


def _compact_axis(ax: Axes, which: Literal["x", "y"], nbins: int = 7) -> None:
    """A linear axis with at most ``nbins`` short labels (20k, 40k: see :class:`_CompactFormatter`)."""
    from matplotlib.ticker import MaxNLocator

    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_locator(MaxNLocator(nbins=nbins, steps=[1, 2, 2.5, 5, 10]))
    axis.set_major_formatter(_CompactFormatter.make())


def _colors(systems: Sequence[str]) -> dict[str, Any]:
    colormaps = _matplotlib().colormaps
    palette = colormaps["tab10"].colors if len(systems) <= 10 else colormaps["tab20"].colors
    return {s: palette[i % len(palette)] for i, s in enumerate(systems)}


LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _styles(systems: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per system a colour, a line style and a marker, all three distinct from its neighbours',
    so that series which coincide still show (a dashed line over a solid one)."""
    colors = _colors(systems)
    return {s: {"color": colors[s], "linestyle": LINESTYLES[i % len(LINESTYLES)],
                "marker": MARKERS[i % len(MARKERS)]} for i, s in enumerate(systems)}


def _same_as(series: Mapping[str, np.ndarray]) -> dict[str, str]:
    """For each series equal to an earlier one (same values), the name of that earlier one."""
    out: dict[str, str] = {}
    names = list(series)
    for i, s in enumerate(names):
        for t in names[:i]:
            a, b = series[s], series[t]
            if t not in out and a.shape == b.shape and np.array_equal(a, b, equal_nan=True):
                out[s] = t
                break
    return out


def _legend_below(fig: Figure, axes: Sequence[Axes], ncols: int = 3) -> None:
    """One legend for all ``axes``, below them, outside the data."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    if handles:
        fig.legend(handles.values(), handles.keys(), loc="outside lower center",
                   ncols=min(len(handles), ncols), fontsize=8)


def _mean_by(rows: Sequence[Row], key: Callable[[Row], tuple], metric: str) -> dict[tuple, float]:
    """Mean of ``metric`` per key over the rows where it is a number (repeated grid points, such
    as seeds, average); an infinity stays infinite."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        v = num(r, metric)
        if not math.isnan(v):
            groups.setdefault(key(r), []).append(v)
    return {k: float(np.mean(v)) for k, v in groups.items()}


def _series(rows: Sequence[Row], x: str, metric: str, series: Sequence[str]
            ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per system with any x value, the sorted x values and the mean metric at each (NaN where
    none)."""
    means = _mean_by(rows, lambda r: (system_label(r, series), num(r, x)), metric)
    out = {}
    for s in unique(system_label(r, series) for r in rows):
        xs = sorted({v for r in rows if system_label(r, series) == s
                     and math.isfinite(v := num(r, x))})
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
    colors = _colors(systems)
    width = 0.8 / max(1, len(systems))
    with _figure((max(5.0, 1.1 + len(groups) * (0.5 + 0.28 * len(systems))), 3.6)) as (fig, axs):
        ax = axs[0, 0]
        for j, s in enumerate(systems):
            offset = (j - (len(systems) - 1) / 2) * width
            pts = [(i + offset, values[(g, s)]) for i, g in enumerate(groups) if (g, s) in values]
            if not pts:
                continue
            xs, hs = zip(*pts, strict=True)
            ax.bar(xs, hs, width * 0.95, label=s or "all", color=colors[s])
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
        _suptitle(fig, title)
        _legend_below(fig, [ax])
        return _save(fig, out, formats)


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
    dashed lines. An infinite P90 (too many failed requests) is a triangle on the top edge.
    Rows with a boolean ``ok`` column (goodput probes) draw infeasible points hollow."""
    systems = unique(system_label(r, series) for r in rows)
    styles = _styles(systems)
    with _figure((9.0, 3.8), 1, 2) as (fig, axs):
        panels = ((axs[0, 0], ttft_key, slo_ttft_ms, "TTFT"), (axs[0, 1], tpot_key, slo_tpot_ms, "TPOT"))
        by_panel = {key: _series(rows, x, key, series) for _, key, _, _ in panels}
        same = _same_as({s: np.concatenate([np.concatenate(lines[s]) if s in lines else [np.nan]
                                            for lines in by_panel.values()]) for s in systems})
        for ax, key, slo, name in panels:
            here = {s: t for s, t in _same_as({s: np.concatenate(v) for s, v in by_panel[key].items()}
                                               ).items() if s not in same}
            if here:  # coinciding in this panel only: said above it, off the data
                note = "lines coincide: " + "; ".join(f"{s} = {t}" for s, t in here.items())
                ax.set_title(textwrap.fill(note, 80), loc="left", fontsize=7, color="0.4")
            for s, (xs, ys) in by_panel[key].items():
                style = styles[s]
                finite = np.where(np.isfinite(ys), ys, np.nan)
                label = (s or "all") + (f" (= {same[s]})" if s in same else "")
                ax.plot(xs, finite, marker=style["marker"], markersize=4, color=style["color"],
                        linestyle=style["linestyle"], label=label)
                off = xs[np.isinf(ys)]
                if off.size:
                    ax.plot(off, np.full(off.size, 0.98), marker="^", linestyle="none",
                            color=style["color"], transform=ax.get_xaxis_transform(), clip_on=False)
                hollow = [(num(r, x), num(r, key)) for r in rows if r.get("ok") is False
                          and system_label(r, series) == s and math.isfinite(num(r, key))]
                if hollow:
                    ax.plot(*zip(*hollow, strict=True), marker="o", markersize=7, linestyle="none",
                            markerfacecolor="white", markeredgecolor=style["color"])
            if slo is not None and math.isfinite(slo):
                ax.axhline(slo, **SLO_LINE, label=f"{name} SLO {slo:g} ms")
            ax.set_xlabel("arrival rate (req/s)")
            ax.set_ylabel(f"P90 {name} (ms)")
            shown = np.array([num(r, key) for r in rows], float)
            if key == ttft_key and log_ttft and np.any((shown > 0) & np.isfinite(shown)):
                _log_axis(ax, "y", shown)  # a log axis needs a positive value
            else:
                ax.set_ylim(bottom=0)
                _compact_axis(ax, "y")
        notes = (["hollow: infeasible probe"] if any(r.get("ok") is False for r in rows) else []) + (
            ["▲: infinite P90 (failed requests)"] if any(
                math.isinf(num(r, k)) for r in rows for k in (ttft_key, tpot_key)) else [])
        if notes:
            fig.text(0.99, 0.01, "; ".join(notes), ha="right", fontsize=7, color="0.4")
        _suptitle(fig, title)
        _legend_below(fig, [axs[0, 0], axs[0, 1]])
        return _save(fig, out, formats)


def request_latencies_ms(requests: Sequence[Row], metric: CdfMetric) -> np.ndarray:
    """Per request of ``RequestRecord.to_dict`` rows, its TTFT, TPOT or E2E in ms; inf for one
    that did not complete; TPOT leaves out outputs of fewer than two tokens (undefined)."""
    values = []
    for r in requests:
        done = r.get("finish_reason") in _COMPLETED
        if metric == "ttft":
            values.append((num(r, "first_token_at") - num(r, "arrived_at")) * 1e3 if done
                          else math.inf)
        elif metric == "e2e":
            values.append((num(r, "finished_at") - num(r, "arrived_at")) * 1e3 if done
                          else math.inf)
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
    styles = _styles(list(values))
    same = _same_as(values)
    with _figure((6.4, 4.2)) as (fig, axs):
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
            style = styles[s]
            ax.plot(xs, ys, drawstyle="steps-post", color=style["color"],
                    linestyle=style["linestyle"], linewidth=1.4, label=label + ")")
        if slo_ms is not None:
            ax.axvline(slo_ms, **SLO_LINE, label=f"SLO {slo_ms:g} ms")
        ax.set_xlabel(f"{metric.upper()} (ms)")
        ax.set_ylabel("share of requests")
        ax.set_ylim(0, 1.02)
        everything = np.concatenate([v for v in values.values()] or [np.zeros(0)])
        if log_x and np.any(np.isfinite(everything) & (everything > 0)):
            _log_axis(ax, "x", everything)
        else:
            _compact_axis(ax, "x")
        _suptitle(fig, title or f"{metric.upper()} CDF")
        _legend_below(fig, [ax], ncols=1 if len(values) > 2 else 2)
        return _save(fig, out, formats)


MAX_CDF_POINTS = 2000  # per curve: more steps than a figure has pixels only slow the drawing


def _cdf_points(finite: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray]:
    """The steps of the empirical CDF of sorted ``finite`` values out of ``total`` requests,
    thinned to at most MAX_CDF_POINTS evenly spaced quantiles (the last point kept)."""
    xs = np.concatenate([finite[:1], finite])
    ys = np.arange(finite.size + 1) / max(total, 1)
    if xs.size > MAX_CDF_POINTS:
        keep = np.unique(np.linspace(0, xs.size - 1, MAX_CDF_POINTS).round().astype(int))
        xs, ys = xs[keep], ys[keep]
    return xs, ys


def rolling_median(values: np.ndarray, window: int) -> np.ndarray:
    """Median of the ``window`` values centred on each (shorter at the ends)."""
    values = np.asarray(values, float)
    half = max(1, window) // 2
    width = 2 * half + 1
    out = np.empty(values.size)
    if values.size >= width:
        from numpy.lib.stride_tricks import sliding_window_view

        out[half: values.size - half] = np.median(sliding_window_view(values, width), axis=1)
        edges = [*range(half), *range(values.size - half, values.size)]
    else:
        edges = list(range(values.size))
    for i in edges:
        out[i] = np.median(values[max(0, i - half): i + half + 1])
    return out


def _columns(table: Columns | Sequence[Row], names: Sequence[str]) -> dict[str, np.ndarray]:
    """``names`` of an iterations table (columns, or rows of dicts) as float arrays; a missing
    column is NaN."""
    if isinstance(table, Mapping):
        n = len(next(iter(table.values()))) if table else 0
        out = {}
        for k in names:
            col = table.get(k)
            out[k] = (np.full(n, math.nan) if col is None or col.dtype.kind not in "fiub"
                      else np.asarray(col, float))
        return out
    return {k: np.array([num(r, k) for r in table], float) for k in names}


MAX_TIME_BINS = 1500  # chunk-over-time envelope: about one bin per pixel column


def chunk_over_time(
    iterations_by_system: Mapping[str, Columns | Sequence[Row]],
    out: str | Path,
    *,
    stage: int = 0,
    window: int = 25,
    title: str | None = None,
    formats: Sequence[str] = FORMATS,
) -> list[Path]:
    """The chunk budget the policy chose for each microbatch (rows of ``stage``, where it is
    decided) against its start time: a pale band from the smallest to the largest budget per
    time bin (each microbatch's step when there are few), a bold rolling median over ``window``
    microbatches, one colour and line style per system."""
    styles = _styles(list(iterations_by_system))
    with _figure((7.0, 3.8)) as (fig, axs):
        ax = axs[0, 0]
        medians: dict[str, np.ndarray] = {}
        drawn = []
        for s, its in iterations_by_system.items():
            cols = _columns(its, ("stage", "started_at", "chunk_budget"))
            keep = (cols["stage"] == stage) & np.isfinite(cols["started_at"])
            if not keep.any():
                continue
            order = np.argsort(cols["started_at"][keep], kind="stable")
            t, c = cols["started_at"][keep][order], cols["chunk_budget"][keep][order]
            color, style = styles[s]["color"], styles[s]["linestyle"]
            if t.size > 2 * MAX_TIME_BINS:
                edges = np.linspace(t[0], t[-1], MAX_TIME_BINS + 1)
                which = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, MAX_TIME_BINS - 1)
                lo = np.full(MAX_TIME_BINS, np.inf)
                hi = np.full(MAX_TIME_BINS, -np.inf)
                np.minimum.at(lo, which, c)
                np.maximum.at(hi, which, c)
                seen = np.isfinite(lo)
                ax.fill_between(edges[:-1][seen], lo[seen], hi[seen], step="post", color=color,
                                alpha=0.18, linewidth=0)
            else:
                ax.plot(t, c, drawstyle="steps-post", color=color, alpha=0.25, linewidth=0.8)
            med = rolling_median(c, window)
            step = max(1, t.size // (4 * MAX_TIME_BINS))
            ax.plot(t[::step], med[::step], color=color, linestyle=style, linewidth=1.8, label=s)
            medians[s] = med
            drawn.append(s)
        same = _same_as(medians)
        if same:
            ax.text(0.0, 1.01, "; ".join(f"{s} = {t}" for s, t in same.items()),
                    transform=ax.transAxes, ha="left", va="bottom", fontsize=7, color="0.4")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("chunk budget (tokens)")
        ax.set_ylim(bottom=0)
        _compact_axis(ax, "x")
        _suptitle(fig, title or "Chunk budget per microbatch")
        ax.text(1.0, 1.01, f"bold: rolling median of {window}; pale: range", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=7, color="0.4")
        _legend_below(fig, [ax])
        return _save(fig, out, formats)


def _phases(cols: Mapping[str, np.ndarray]) -> np.ndarray:
    """Which phases each microbatch holds (as in the Chrome-trace timeline)."""
    prefill = np.nan_to_num(cols["num_prefill_tokens"]) > 0
    decode = np.nan_to_num(cols["num_decode_reqs"]) > 0
    return np.where(prefill & decode, "mixed", np.where(prefill, "prefill", "decode"))


_TIMELINE_COLUMNS = ("stage", "started_at", "finished_at", "num_prefill_tokens", "num_decode_reqs")


def timeline_window(iterations: Columns | Sequence[Row], num_microbatches: int = 40
                    ) -> tuple[float, float]:
    """The ``num_microbatches`` consecutive stage-0 microbatches carrying the most prefill tokens
    (the earliest such run on ties), as (start, end) run-clock seconds: where prefill and decode
    meet and bubbles form. A quiet decode-only tail, which the middle of a run often is, would
    show little."""
    cols = _columns(iterations, _TIMELINE_COLUMNS)
    ok = np.isfinite(cols["started_at"]) & np.isfinite(cols["finished_at"])
    first = ok & (cols["stage"] == 0)
    if not first.any():
        first = ok
    if not first.any():
        raise ValueError("a timeline needs at least one iteration row with start and finish times")
    order = np.lexsort((cols["num_prefill_tokens"][first], cols["finished_at"][first],
                        cols["started_at"][first]))
    t0, t1 = cols["started_at"][first][order], cols["finished_at"][first][order]
    prefill = np.nan_to_num(cols["num_prefill_tokens"][first][order])
    k = min(t0.size, max(1, num_microbatches))
    sums = np.convolve(prefill, np.ones(k), mode="valid")  # sums[i]: microbatches i .. i+k-1
    i0 = int(np.argmax(sums))
    return float(t0[i0]), float(t1[i0 + k - 1])


MAX_TIMELINE_BARS = 4000  # per stage; more are merged where they touch (drawing stays fast)


def stage_timeline(
    iterations: Columns | Sequence[Row],
    out: str | Path,
    *,
    num_stages: int | None = None,
    start: float | None = None,
    end: float | None = None,
    num_microbatches: int = 40,
    title: str | None = None,
    formats: Sequence[str] = FORMATS,
) -> list[Path]:
    """Gantt chart of what each pipeline stage ran over [start, end] (run-clock seconds),
    microbatches coloured prefill / decode / mixed, each stage's idle share in its label.
    The window defaults to the ``num_microbatches`` consecutive stage-0 microbatches with the
    most prefill tokens (:func:`timeline_window`); pass ``start`` and ``end`` to show the same
    window for several deployments."""
    cols = _columns(iterations, _TIMELINE_COLUMNS)
    ok = np.isfinite(cols["started_at"]) & np.isfinite(cols["finished_at"])
    if not ok.any():
        raise ValueError("stage_timeline needs at least one iteration row")
    cols = {k: v[ok] for k, v in cols.items()}
    n = num_stages or int(np.nanmax(cols["stage"])) + 1
    if start is None or end is None:
        w0, w1 = timeline_window(cols, num_microbatches)
        start = w0 if start is None else start
        end = start + (w1 - w0) if end is None else end
    if not end > start:
        raise ValueError(f"the window must have end > start, got {start:g} .. {end:g} s")
    shown = (cols["finished_at"] > start) & (cols["started_at"] < end)
    cols = {k: v[shown] for k, v in cols.items()}
    spans = [SimpleNamespace(stage=int(k), started_at=a, finished_at=b) for k, a, b in zip(
        cols["stage"], cols["started_at"], cols["finished_at"], strict=True)]
    idle = iteration_bubble_fraction(spans, n, start, end)
    length = end - start
    in_s = length > 5.0
    unit = 1.0 if in_s else 1e3
    phases = _phases(cols)
    x0 = (np.maximum(cols["started_at"], start) - start) * unit
    x1 = (np.minimum(cols["finished_at"], end) - start) * unit
    with _figure((8.0, 1.5 + 0.45 * n)) as (fig, axs):
        from matplotlib.patches import Patch

        ax = axs[0, 0]
        dense = shown.sum() > 60 * n  # bars a few pixels wide: white edges would hide them
        for k in range(n):
            for phase, color in PHASE_COLORS.items():
                sel = (cols["stage"] == k) & (phases == phase)
                if sel.any():
                    bars = _merged_bars(x0[sel], x1[sel])
                    ax.broken_barh(bars, (k - 0.4, 0.8), facecolors=color,
                                   edgecolors="none" if dense else "white",
                                   linewidths=0 if dense else 0.4)
        ax.set_yticks(range(n), [f"stage {k}  (idle {idle[k]:.0%})" for k in range(n)])
        ax.set_ylim(n - 0.5, -0.5)  # stage 0 on top
        ax.set_xlim(0, length * unit)
        _compact_axis(ax, "x", nbins=8)
        ax.set_xlabel(f"{'s' if in_s else 'ms'} since t = {start:.3f} s "
                      f"(window {compact_number(length * unit)} {'s' if in_s else 'ms'})")
        ax.grid(axis="y", visible=False)
        _suptitle(fig, title)
        present = [p for p in PHASE_COLORS if (phases == p).any()]
        fig.legend([Patch(color=PHASE_COLORS[p]) for p in present], present,
                   loc="outside lower center", ncols=3)
        return _save(fig, out, formats)


def _merged_bars(x0: np.ndarray, x1: np.ndarray) -> list[tuple[float, float]]:
    """(start, width) bars; beyond MAX_TIMELINE_BARS, bars that touch or overlap are merged
    (on one stage of one phase they only do at a shared boundary), so the picture is the same."""
    order = np.argsort(x0, kind="stable")
    x0, x1 = x0[order], x1[order]
    if x0.size > MAX_TIMELINE_BARS:
        reach = np.maximum.accumulate(x1)
        new = np.concatenate([[True], x0[1:] > reach[:-1] + 1e-12])
        groups = np.cumsum(new) - 1
        starts = x0[new]
        ends = np.zeros(starts.size)
        np.maximum.at(ends, groups, x1)
        x0, x1 = starts, ends
    return [(float(a), float(b - a)) for a, b in zip(x0, x1, strict=True)]


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
    styles = _styles(systems)
    panels = unique(str(r.get(panel_by) or "") for r in rows) if panel_by else [""]
    ncols = min(len(panels), 4)
    nrows = math.ceil(len(panels) / ncols)
    with _figure((1.0 + 3.2 * ncols, 0.9 + 2.9 * nrows), nrows, ncols) as (fig, axs):
        flat = list(axs.flat)
        whole = {p: _series([r for r in rows if not panel_by or str(r.get(panel_by) or "") == p],
                            x, metric, series) for p in panels}
        same = _same_as({s: np.concatenate([np.concatenate(lines[s]) if s in lines else [np.nan]
                                            for lines in whole.values()]) for s in systems})
        for ax, panel in zip(flat, panels, strict=False):
            group = [r for r in rows if not panel_by or str(r.get(panel_by) or "") == panel]
            lines = _series(group, x, metric, series)
            for s, (xs, ys) in lines.items():
                ax.plot(xs, ys * 100 if is_share else ys, markersize=4, **styles[s],
                        label=(s or "all") + (f" (= {same[s]})" if s in same else ""),
                        clip_on=False)  # zeros on the axis
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
                ax.set_ylabel("requests within SLO (%)" if is_share else
                              "goodput (req/s)" if metric == "goodput" else metric)
        _suptitle(fig, title)
        _legend_below(fig, flat[:len(panels)])
        return _save(fig, out, formats)

"""Figures over the run clock: the chunk budget per microbatch, and per-stage Gantt timelines.

Scenario: a 15-minute replay on PP=4 has 160,000 iteration rows per deployment. Both figures read
them as columns (``fastpp.sim.plot_inputs.read_columns``) and never loop over rows in Python: the
chunk figure draws a min/max band per time bin and a thinned rolling median; the timeline merges
touching bars past ``MAX_TIMELINE_BARS``. :func:`timeline_window` finds the default window, and
``stage_timeline(start=, end=)`` shows one window for several deployments (``fastpp plot`` does),
so their timelines compare. Times in run-clock seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from fastpp.metrics import iteration_bubble_fraction
from fastpp.sim.plot_inputs import Columns, Row
from fastpp.sim.plot_style import (
    FORMATS,
    columns,
    compact_axis,
    compact_number,
    figure,
    legend_below,
    same_as,
    save,
    styles,
    suptitle,
)

PHASE_COLORS = {"prefill": "#4C72B0", "decode": "#55A868", "mixed": "#DD8452"}


def rolling_median(values: np.ndarray, window: int) -> np.ndarray:
    """Median of the ``window`` values centred on each (shorter at the ends)."""
    values = np.asarray(values, float)
    half = max(1, window) // 2
    width = 2 * half + 1
    out = np.empty(values.size)
    if values.size >= width:
        from numpy.lib.stride_tricks import sliding_window_view

        out[half : values.size - half] = np.median(sliding_window_view(values, width), axis=1)
        edges = [*range(half), *range(values.size - half, values.size)]
    else:
        edges = list(range(values.size))
    for i in edges:
        out[i] = np.median(values[max(0, i - half) : i + half + 1])
    return out


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
    style_of = styles(list(iterations_by_system))
    with figure((7.0, 3.8)) as (fig, axs):
        ax = axs[0, 0]
        medians: dict[str, np.ndarray] = {}
        drawn = []
        for s, its in iterations_by_system.items():
            cols = columns(its, ("stage", "started_at", "chunk_budget"))
            keep = (cols["stage"] == stage) & np.isfinite(cols["started_at"])
            if not keep.any():
                continue
            order = np.argsort(cols["started_at"][keep], kind="stable")
            t, c = cols["started_at"][keep][order], cols["chunk_budget"][keep][order]
            color, style = style_of[s]["color"], style_of[s]["linestyle"]
            if t.size > 2 * MAX_TIME_BINS:
                edges = np.linspace(t[0], t[-1], MAX_TIME_BINS + 1)
                which = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, MAX_TIME_BINS - 1)
                lo = np.full(MAX_TIME_BINS, np.inf)
                hi = np.full(MAX_TIME_BINS, -np.inf)
                np.minimum.at(lo, which, c)
                np.maximum.at(hi, which, c)
                seen = np.isfinite(lo)
                ax.fill_between(
                    edges[:-1][seen], lo[seen], hi[seen], step="post", color=color, alpha=0.18, linewidth=0
                )
            else:
                ax.plot(t, c, drawstyle="steps-post", color=color, alpha=0.25, linewidth=0.8)
            med = rolling_median(c, window)
            step = max(1, t.size // (4 * MAX_TIME_BINS))
            ax.plot(t[::step], med[::step], color=color, linestyle=style, linewidth=1.8, label=s)
            medians[s] = med
            drawn.append(s)
        same = same_as(medians)
        if same:
            ax.text(
                0.0,
                1.01,
                "; ".join(f"{s} = {t}" for s, t in same.items()),
                transform=ax.transAxes,
                ha="left",
                va="bottom",
                fontsize=7,
                color="0.4",
            )
        ax.set_xlabel("time (s)")
        ax.set_ylabel("chunk budget (tokens)")
        ax.set_ylim(bottom=0)
        compact_axis(ax, "x")
        suptitle(fig, title or "Chunk budget per microbatch")
        ax.text(
            1.0,
            1.01,
            f"bold: rolling median of {window}; pale: range",
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=7,
            color="0.4",
        )
        legend_below(fig, [ax])
        return save(fig, out, formats)


def _phases(cols: Mapping[str, np.ndarray]) -> np.ndarray:
    """Which phases each microbatch holds (as in the Chrome-trace timeline)."""
    prefill = np.nan_to_num(cols["num_prefill_tokens"]) > 0
    decode = np.nan_to_num(cols["num_decode_reqs"]) > 0
    return np.where(prefill & decode, "mixed", np.where(prefill, "prefill", "decode"))


_TIMELINE_COLUMNS = ("stage", "started_at", "finished_at", "num_prefill_tokens", "num_decode_reqs")


def timeline_window(iterations: Columns | Sequence[Row], num_microbatches: int = 40) -> tuple[float, float]:
    """The ``num_microbatches`` consecutive stage-0 microbatches carrying the most prefill tokens
    (the earliest such run on ties), as (start, end) run-clock seconds: where prefill and decode
    meet and bubbles form. A quiet decode-only tail, which the middle of a run often is, would
    show little."""
    cols = columns(iterations, _TIMELINE_COLUMNS)
    ok = np.isfinite(cols["started_at"]) & np.isfinite(cols["finished_at"])
    first = ok & (cols["stage"] == 0)
    if not first.any():
        first = ok
    if not first.any():
        raise ValueError("a timeline needs at least one iteration row with start and finish times")
    order = np.lexsort(
        (cols["num_prefill_tokens"][first], cols["finished_at"][first], cols["started_at"][first])
    )
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
    cols = columns(iterations, _TIMELINE_COLUMNS)
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
    spans = [
        SimpleNamespace(stage=int(k), started_at=a, finished_at=b)
        for k, a, b in zip(cols["stage"], cols["started_at"], cols["finished_at"], strict=True)
    ]
    idle = iteration_bubble_fraction(spans, n, start, end)
    length = end - start
    in_s = length > 5.0
    unit = 1.0 if in_s else 1e3
    phases = _phases(cols)
    x0 = (np.maximum(cols["started_at"], start) - start) * unit
    x1 = (np.minimum(cols["finished_at"], end) - start) * unit
    with figure((8.0, 1.5 + 0.45 * n)) as (fig, axs):
        from matplotlib.patches import Patch

        ax = axs[0, 0]
        dense = shown.sum() > 60 * n  # bars a few pixels wide: white edges would hide them
        for k in range(n):
            for phase, color in PHASE_COLORS.items():
                sel = (cols["stage"] == k) & (phases == phase)
                if sel.any():
                    bars = _merged_bars(x0[sel], x1[sel])
                    ax.broken_barh(
                        bars,
                        (k - 0.4, 0.8),
                        facecolors=color,
                        edgecolors="none" if dense else "white",
                        linewidths=0 if dense else 0.4,
                    )
        ax.set_yticks(range(n), [f"stage {k}  (idle {idle[k]:.0%})" for k in range(n)])
        ax.set_ylim(n - 0.5, -0.5)  # stage 0 on top
        ax.set_xlim(0, length * unit)
        compact_axis(ax, "x", nbins=8)
        ax.set_xlabel(
            f"{'s' if in_s else 'ms'} since t = {start:.3f} s "
            f"(window {compact_number(length * unit)} {'s' if in_s else 'ms'})"
        )
        ax.grid(axis="y", visible=False)
        suptitle(fig, title)
        present = [p for p in PHASE_COLORS if (phases == p).any()]
        fig.legend(
            [Patch(color=PHASE_COLORS[p]) for p in present], present, loc="outside lower center", ncols=3
        )
        return save(fig, out, formats)


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

"""What every FastPP figure shares: matplotlib loaded on first use, a fixed style, reproducible
files, short tick labels, one colour + line style + marker per system, legends outside the data.

Scenario: a figure of a 15-minute replay has latencies from 100 ms to 500 s on one axis and four
systems, two of which may coincide. Plain ``{v:g}`` labels then read ``100000200000`` and a legend
inside the axes covers the curves; here log axes over more than three decades label only powers
of ten, linear axes use one compact scale (``20k``), series differ in colour, line style and marker,
and :func:`same_as` finds the series whose values equal an earlier one, so a figure can say so.

matplotlib is the optional ``fastpp[plots]`` extra, imported only inside these functions.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from fastpp.sim.plot_inputs import Columns, Row, num

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FORMATS: tuple[str, ...] = ("png", "svg")
DPI = 150  # PNG resolution
METADATA: dict[str, dict[str, None]] = {  # drop dates and versions, so files are reproducible
    "png": {"Software": None},
    "svg": {"Date": None, "Creator": None},
    "pdf": {"CreationDate": None, "Creator": None, "Producer": None},
}
RC = {
    "svg.hashsalt": "fastpp",  # SVG element ids are hashes: a fixed salt makes them repeatable
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
}
SLO_LINE = {"color": "0.35", "linestyle": "--", "linewidth": 1.0}

# ---- plumbing ------------------------------------------------------------------------------------


def matplotlib_module() -> ModuleType:
    try:
        import matplotlib
        import matplotlib.style  # noqa: F401  (a subpackage: not loaded by `import matplotlib`)
    except ImportError as exc:
        raise ImportError(
            "plots need matplotlib, which the `fastpp[plots]` extra installs: pip install 'fastpp[plots]'"
        ) from exc
    return matplotlib


@contextmanager
def figure(figsize: tuple[float, float], nrows: int = 1, ncols: int = 1) -> Iterator[tuple[Figure, Any]]:
    """A constrained-layout Figure and its axes grid, under FastPP's fixed style (the style must
    still hold when saving, since the SVG hash salt is read then)."""
    mpl = matplotlib_module()
    from matplotlib.figure import Figure

    with mpl.style.context("default"), mpl.rc_context(RC):
        fig = Figure(figsize=figsize, layout="constrained")
        yield fig, fig.subplots(nrows, ncols, squeeze=False)


def save(fig: Figure, out: str | Path, formats: Sequence[str]) -> list[Path]:
    stem = Path(out)
    if stem.suffix in (".png", ".svg", ".pdf"):
        stem = stem.with_suffix("")
    if not formats:
        raise ValueError("formats must name at least one of png, svg, pdf")
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        if fmt not in METADATA:
            raise ValueError(f"format must be one of {', '.join(METADATA)}, got {fmt!r}")
        path = stem.with_name(f"{stem.name}.{fmt}")
        fig.savefig(path, format=fmt, dpi=DPI, metadata=METADATA[fmt])
        paths.append(path)
        # The layout is in figure coordinates, the same for every format: keep it, don't redo it.
        fig.set_layout_engine("none")
    return paths


def suptitle(fig: Figure, title: str | None) -> None:
    """The figure title, each line wrapped to the figure's width (long run descriptions)."""
    if title:
        width = max(30, int(fig.get_figwidth() * 12))  # characters per line at 10 pt
        fig.suptitle("\n".join(textwrap.fill(line, width) for line in title.splitlines()), fontsize=10)


def compact_number(value: float) -> str:
    """A tick label that stays short: 0.5, 20, 500, 2k, 50k, 1.5M (never ``100000``)."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def log_axis(ax: Axes, which: Literal["x", "y"], values: np.ndarray | None = None) -> None:
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


class CompactFormatter:
    """Tick labels of one linear axis on one scale: 0, 2500, 5000 below 10,000; 0, 20k, 40k
    (or M, G) above, chosen from the largest tick so that an axis never mixes the two."""

    @staticmethod
    def make() -> Any:
        from matplotlib.ticker import Formatter

        class Compact(Formatter):
            scale, suffix = 1.0, ""

            def format_ticks(self, values: Sequence[float]) -> list[str]:
                top = max((abs(v) for v in values), default=0.0)
                self.scale, self.suffix = next(
                    ((s, x) for s, x in ((1e9, "G"), (1e6, "M"), (1e4, "k")) if top >= s), (1.0, "")
                )
                if self.suffix == "k":
                    self.scale = 1e3
                return [self(v) for v in values]

            def __call__(self, x: float, pos: int | None = None) -> str:
                return f"{x / self.scale:.4g}{self.suffix}"

        return Compact()


def compact_axis(ax: Axes, which: Literal["x", "y"], nbins: int = 7) -> None:
    """A linear axis with at most ``nbins`` short labels (20k, 40k: see :class:`CompactFormatter`)."""
    from matplotlib.ticker import MaxNLocator

    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_locator(MaxNLocator(nbins=nbins, steps=[1, 2, 2.5, 5, 10]))
    axis.set_major_formatter(CompactFormatter.make())


def colors(systems: Sequence[str]) -> dict[str, Any]:
    colormaps = matplotlib_module().colormaps
    palette = colormaps["tab10"].colors if len(systems) <= 10 else colormaps["tab20"].colors
    return {s: palette[i % len(palette)] for i, s in enumerate(systems)}


LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def styles(systems: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per system a colour, a line style and a marker, all three distinct from its neighbours',
    so that series which coincide still show (a dashed line over a solid one)."""
    palette = colors(systems)
    return {
        s: {
            "color": palette[s],
            "linestyle": LINESTYLES[i % len(LINESTYLES)],
            "marker": MARKERS[i % len(MARKERS)],
        }
        for i, s in enumerate(systems)
    }


def same_as(series: Mapping[str, np.ndarray]) -> dict[str, str]:
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


def legend_below(fig: Figure, axes: Sequence[Axes], ncols: int = 3) -> None:
    """One legend for all ``axes``, below them, outside the data."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    if handles:
        fig.legend(
            handles.values(),
            handles.keys(),
            loc="outside lower center",
            ncols=min(len(handles), ncols),
            fontsize=8,
        )


def columns(table: Columns | Sequence[Row], names: Sequence[str]) -> dict[str, np.ndarray]:
    """``names`` of an iterations table (columns, or rows of dicts) as float arrays; a missing
    column is NaN."""
    if isinstance(table, Mapping):
        n = len(next(iter(table.values()))) if table else 0
        out = {}
        for k in names:
            col = table.get(k)
            out[k] = (
                np.full(n, math.nan)
                if col is None or col.dtype.kind not in "fiub"
                else np.asarray(col, float)
            )
        return out
    return {k: np.array([num(r, k) for r in table], float) for k in names}

"""``fastpp plot``: figures of a simulate or run folder, a sweep table or goodput JSON
(matplotlib is loaded only when the command runs)."""

# ruff: noqa: E501  (Typer's Annotated option declarations read best one per line, as in app.py)

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fastpp.cli.common import console, err_console, fail, positive, writable_dir
from fastpp.sim.plot_inputs import PlotKind


def plot(
    results: Annotated[
        Path,
        typer.Argument(
            help="A `fastpp simulate` output folder, a sweep results.jsonl/.csv (or its folder), a `fastpp goodput --json` file, or a `fastpp goodput --plot` folder.",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Output folder (default: plots/ inside RESULTS, or beside a file)."),
    ] = None,
    kind: Annotated[
        PlotKind,
        typer.Option(
            "--kind",
            "-k",
            help="auto makes every figure the data supports. Sweeps: goodput, rate, slo; goodput JSON: goodput, rate; simulate folders: cdf, chunk, timeline.",
        ),
    ] = "auto",
    slo_ttft_ms: Annotated[
        float | None, typer.Option(help="TTFT SLO line in ms (default: the data's slo_ttft_ms).")
    ] = None,
    slo_tpot_ms: Annotated[
        float | None, typer.Option(help="TPOT SLO line in ms (default: the data's slo_tpot_ms).")
    ] = None,
) -> None:
    """Draw paper-style figures (PNG and SVG) of simulation, sweep or goodput results.

    A folder holding several `fastpp simulate` runs (runs/simulate after several invocations)
    plots the newest of them and says so; pass a run's own folder to plot another. What is
    plotted and each figure as it is drawn are logged to stderr; the files written go to stdout."""
    positive(slo_ttft_ms, "--slo-ttft-ms")
    positive(slo_tpot_ms, "--slo-tpot-ms")
    if out is not None:
        writable_dir(out, "--out")
    draw(results, out, kind=kind, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms)


def draw(
    results: Path,
    out: Path | None = None,
    *,
    kind: PlotKind = "auto",
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
) -> None:
    """Plot ``results`` and print the files written (also used by `sweep --plot`, `goodput --plot`)."""
    from fastpp.sim.plot_inputs import PlotInputError

    try:
        from fastpp.sim.plot_report import plot_results

        paths = plot_results(
            results, out, kind=kind, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, progress=_log
        )
    except (PlotInputError, ImportError, OSError) as exc:
        fail(str(exc))
        return
    for path in paths:
        console.print(str(path), soft_wrap=True, highlight=False, markup=False)


def _log(line: str) -> None:
    err_console.print(line, style="dim", soft_wrap=True, highlight=False, markup=False)

"""``fastpp sweep``: run a grid of simulations or goodput searches into one tidy table.

Axes come from repeatable options, each value also a comma list (``-r 1,2 -r 4``), and from a
``--grid FILE.toml`` whose keys are the option names; an option given on the command line
replaces that key of the file. Defaults live in ``SweepGrid`` and the executors.
"""

# ruff: noqa: E501  (as in cli/app.py: Typer's Annotated option declarations read best one per line)

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from fastpp.cli.common import console, err_console, fail, writable_dir
from fastpp.cli.options import (
    AdmissionOpt,
    AsyncBatchDepthOpt,
    ChunkCandidatesOpt,
    DataDirOpt,
    QueueOrderOpt,
    RetractionOpt,
)

if TYPE_CHECKING:  # the library is imported when the command runs, keeping `fastpp --help` fast
    from fastpp.sim.sweep import PointExecutor, SweepPlan, SweepResult

# Columns the result table shows per metric (all columns are in results.csv).
_SHOWN = {
    "simulate": ("p90_ttft_ms", "p90_tpot_ms", "output_throughput", "slo_attainment", "slo_met"),
    "goodput": ("goodput", "margin", "attainment", "num_probes"),
    "best-static": ("goodput", "margin", "attainment", "num_candidates"),
}
SWEEP_RUNS = Path("runs/sweep")  # each sweep without --out gets a new folder here
_AXES_SHOWN = (
    "metric",
    "workload",
    "model",
    "gpu",
    "deploy",
    "policy",
    "chunk",
    "slo_scale",
    "rate",
    "seeds",
)


def sweep(
    workload: Annotated[
        list[str] | None,
        typer.Option("--workload", "-w", help="Workload axis (repeat or comma list). [default: azure-conv]"),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy", "-p", help="Policy axis, e.g. static:512,predictive. [default: static:2048]"
        ),
    ] = None,
    rate: Annotated[
        list[str] | None,
        typer.Option("--rate", "-r", help="Rate axis, req/s (metric simulate only). [default: 4.0]"),
    ] = None,
    chunk: Annotated[
        list[str] | None,
        typer.Option(
            "--chunk",
            help="Static chunk axis: adds static:N policies; with --best-static, the candidates. [default for best-static: 128..2048 step 128]",
        ),
    ] = None,
    deploy: Annotated[
        list[str] | None,
        typer.Option(
            "--deploy",
            "-d",
            help="Deployment axis: pp4, tp4, pp2tp2 (pp4@POLICY pins a policy). [default: pp4]",
        ),
    ] = None,
    gpu: Annotated[
        list[str] | None,
        typer.Option(
            "--gpu",
            help="GPU axis: names, or NAME:bf16_tflops=..,hbm_gbps=..,memory_gib=.. (repeat the option). [default: A100-40GB-PCIe]",
        ),
    ] = None,
    model: Annotated[
        list[str] | None, typer.Option("--model", "-m", help="Model axis. [default: Qwen2.5-32B]")
    ] = None,
    slo_scale: Annotated[
        list[str] | None,
        typer.Option("--slo-scale", help="SLO scale axis: factors on the base SLO. [default: 1]"),
    ] = None,
    metric: Annotated[
        str | None,
        typer.Option(
            "--metric", help="What each point computes: simulate, goodput or best-static. [default: simulate]"
        ),
    ] = None,
    best_static: Annotated[
        bool,
        typer.Option(
            "--best-static",
            help="Find the static chunk with the highest goodput per workload/deployment/GPU/model/SLO scale.",
        ),
    ] = False,
    seeds: Annotated[
        int | None,
        typer.Option(
            "--seeds",
            help="Seeds 0..N-1: one simulate row each, pooled per goodput probe. [default: 1 for simulate, 2 for goodput]",
        ),
    ] = None,
    num_requests: Annotated[
        int | None,
        typer.Option(
            "--num-requests",
            "-n",
            help="Requests per seed (for goodput: a probe's starting length, doubled while its verdict is unsettled). [default: 1000 / the goodput length rule]",
        ),
    ] = None,
    precision: Annotated[
        float | None, typer.Option("--precision", help="Goodput bracket width, req/s. [default: 0.1]")
    ] = None,
    steady: Annotated[
        bool | None,
        typer.Option(
            "--steady/--no-steady",
            help="Goodput: fail a probe whose queue still grows; --no-steady judges the SLO alone, as the paper's fixed 1,000-prompt runs did (use with -n). [default: --steady]",
        ),
    ] = None,
    slo_ttft_ms: Annotated[
        float | None, typer.Option(help="Base TTFT SLO in ms, before --slo-scale. [default: 2000]")
    ] = None,
    slo_tpot_ms: Annotated[
        float | None, typer.Option(help="Base TPOT SLO in ms, before --slo-scale. [default: 200]")
    ] = None,
    grid: Annotated[
        Path | None,
        typer.Option(
            "--grid",
            help="TOML file of what to sweep: the axes and the run settings as keys, named as their options (lists for axes); the execution options (--executor, --workers, --ray-address, --out, --overwrite, --json, --plot) stay on the command line.",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option("--workers", help="Worker processes for --executor process. [default: CPU count]"),
    ] = None,
    executor: Annotated[str, typer.Option("--executor", help="process, serial or ray.")] = "process",
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            help="Ray cluster to join; 'auto' falls back to a local instance. [default: auto]",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Output folder: results.jsonl and results.csv. A folder with rows of this grid is resumed; one with rows of another grid is refused unless --overwrite. [default: a new folder per sweep, runs/sweep/YYYYmmdd-HHMMSS]",
        ),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite", help="Let --out replace another grid's results (and plots) in its folder."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result rows as JSON.")] = False,
    plot: Annotated[
        bool, typer.Option("--plot", help="Also draw the figures (PNG and SVG) into OUT/plots.")
    ] = False,
    profile: Annotated[
        str | None,
        typer.Option(
            help="Sweep on this profile instead of the analytic model (a JSON file or a shipped profile's name); it fixes the model, GPU, pp and tp."
        ),
    ] = None,
    host_loop: Annotated[
        str | None,
        typer.Option(
            "--host-loop",
            help="free-slots, batch-queue (vLLM) or blocking-launch, as `fastpp simulate`. [default: free-slots]",
        ),
    ] = None,
    chunk_candidates: ChunkCandidatesOpt = None,
    admission: AdmissionOpt = None,
    retraction: RetractionOpt = None,
    queue_order: QueueOrderOpt = None,
    async_batch_depth: AsyncBatchDepthOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Sweep a grid of points in parallel; resumes from the rows already in --out."""
    from fastpp.cli.run_dirs import RunDirError, fresh_run_dir, refuse_other_command
    from fastpp.sim.sweep import grid_from_mapping, load_grid_file, make_executor, plan_sweep
    from fastpp.sim.sweep_table import RESULTS_JSONL

    try:
        models, gpus = _split(model, option="-m"), _split_gpus(gpu)
    except ValueError as exc:
        fail(str(exc))
        return
    if profile is not None and (models or gpus):
        models, gpus = _profile_axes(profile, models, gpus)
    try:
        values: dict[str, Any] = load_grid_file(grid) if grid is not None else {}
        values.update(
            {
                k: v
                for k, v in {
                    "workload": _split(workload, option="-w"),
                    "policy": _split(policy, option="-p"),
                    "rate": _split(rate, float, "--rate"),
                    "chunk": _split(chunk, int, "--chunk"),
                    "deploy": _split(deploy, option="-d"),
                    "gpu": gpus,
                    "model": models,
                    "slo_scale": _split(slo_scale, float, "--slo-scale"),
                    "metric": metric,
                    "best_static": best_static or None,
                    "seeds": seeds,
                    "num_requests": num_requests,
                    "precision": precision,
                    "steady": steady,
                    "slo_ttft_ms": slo_ttft_ms,
                    "slo_tpot_ms": slo_tpot_ms,
                    "profile": profile,
                    "host_loop": host_loop,
                    "admission": admission,
                    "retraction": retraction,
                    "queue_order": queue_order,
                    "pp_async_batch_depth": async_batch_depth,
                    "chunk_candidates": chunk_candidates,
                    "data_dir": data_dir,
                }.items()
                if v is not None
            }
        )
        runner = make_executor(executor, workers=workers, ray_address=ray_address)
        sweep_grid = grid_from_mapping(values)
        sweep_grid.expand()  # a bad grid fails before any folder is made
        if out is None:
            out = fresh_run_dir(SWEEP_RUNS)
        else:
            writable_dir(out)
            refuse_other_command(out, RESULTS_JSONL)
        plan = plan_sweep(sweep_grid, out)
        others = _other_grid_rows(plan)
        if others:
            if not overwrite:
                raise RunDirError(
                    f"--out {out} holds {others} rows of another sweep grid; pass "
                    "--overwrite to replace them, or give another --out (without --out, each sweep "
                    "gets its own folder); a folder is resumed only by the grid that wrote it"
                )
            clear_sweep_dir(out)
            plan = plan_sweep(sweep_grid, out)
    except (ValueError, OSError, ImportError) as exc:
        fail(str(exc))
        return
    if plan.num_skipped == 0 and not as_json:
        err_console.print(f"[dim]sweep folder {out} (resume an interrupted sweep with -o {out})[/]")
    for note in plan.notes:
        err_console.print(f"[yellow]{note}[/]")
    try:
        result = _execute(plan, runner, quiet=as_json or not sys.stderr.isatty())
    except ValueError as exc:
        fail(str(exc))
        return
    if as_json:
        from fastpp.run_files import json_safe

        print(
            json.dumps(
                json_safe(
                    {
                        "out_dir": str(out),
                        "num_points": result.num_points,
                        "num_run": result.num_run,
                        "num_skipped": result.num_skipped,
                        "rows": result.rows,
                    }
                )
            )
        )
        return
    console.print(
        _results_table(
            result.rows,
            f"sweep: {result.num_points} points, {result.num_run} run, {result.num_skipped} resumed",
        )
    )
    for row in result.best_static:
        group = f"{row['workload']} {row['model']} on {row['gpu']} {row['deploy']} SLO x{row['slo_scale']:g}"
        if row["chunk"] is None:
            console.print(f"best static chunk for {group}: none ({row['reason']})")
        else:
            console.print(
                f"best static chunk for {group}: [bold]{row['chunk']}[/] "
                f"(goodput {row['goodput']:.4g} req/s of {row['num_candidates']} candidates)"
            )
    console.print(f"table in {result.jsonl_path} and {result.csv_path}")
    if plot:
        from fastpp.cli.plot_cmd import draw

        draw(result.jsonl_path)


def _profile_axes(
    profile: str, models: list[str] | None, gpus: list[str] | None
) -> tuple[list[str] | None, list[str] | None]:
    """With ``--profile``, a ``-m`` / ``--gpu`` naming the profile's own model and GPU adds
    nothing (dropped); naming another is an error naming both (fastpp.cli.profile_conflict)."""
    from fastpp.cli.profile_conflict import check_names_against, profile_model_and_gpu

    try:
        actual_model, actual_gpu = profile_model_and_gpu(profile)
    except (ValueError, OSError) as exc:
        fail(f"--profile {profile}: {exc}")
    check_names_against(profile, actual_model, actual_gpu, models or [], gpus or [])
    return None, None


def _other_grid_rows(plan: SweepPlan) -> int:
    """Rows in the plan's folder that are no point of its grid (another sweep wrote them)."""
    own = {p.point_id for p in plan.points} | {t.point_id for t in plan.targets}
    return sum(1 for point_id in plan.rows if point_id not in own)


def clear_sweep_dir(out: Path) -> None:
    """Remove what a sweep wrote in ``out``: its two tables and its plots folder of figures."""
    from fastpp.cli.run_dirs import clear_plots
    from fastpp.sim.sweep import RESULTS_CSV, RESULTS_JSONL

    for name in (RESULTS_JSONL, RESULTS_CSV):
        (out / name).unlink(missing_ok=True)
    clear_plots(out)


def _split(
    values: list[str] | None, convert: Callable[[str], Any] = str, option: str = ""
) -> list[Any] | None:
    """Repeated options and comma lists as one list (None when not given; [] when given empty).
    An empty item inside a list (``1,,2``, ``1,2,``) is refused: it is a typo, not a value."""
    if values is None:
        return None
    for text in values:
        if text.strip() and any(not v.strip() for v in text.split(",")):
            name = f"{option} " if option else ""
            raise ValueError(f"{name}{text!r} has an empty item between its commas")
    items = [v.strip() for text in values for v in text.split(",") if v.strip()]
    try:
        return [convert(v) for v in items]
    except ValueError:
        bad = next(v for v in items if not _converts(convert, v))
        raise ValueError(f"{option} takes {convert.__name__} values, got {bad!r}") from None


def _split_gpus(values: list[str] | None) -> list[str] | None:
    """``_split`` for --gpu, where a GPU given by its datasheet (NAME:key=value,...) is one item
    whose commas separate its numbers, not GPUs."""
    if values is None:
        return None
    _split([text for text in values if ":" not in text], option="--gpu")  # refuses empty items
    return [g.strip() for text in values for g in ([text] if ":" in text else text.split(",")) if g.strip()]


def _converts(convert: Callable[[str], Any], text: str) -> bool:
    try:
        convert(text)
    except ValueError:
        return False
    return True


def _execute(plan: SweepPlan, runner: PointExecutor, *, quiet: bool) -> SweepResult:
    """Run the plan under a progress bar over points (stderr; hidden when ``quiet``)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fastpp.sim.sweep import execute_plan

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        disable=quiet,
    ) as bar:
        task = bar.add_task("sweep points", total=len(plan.todo))
        return execute_plan(plan, runner, lambda done, total: bar.update(task, completed=done, total=total))


def _results_table(rows: Sequence[dict[str, Any]], title: str) -> Table:
    """The axes that vary across ``rows`` and the key metrics of the metrics present."""
    axes = [c for c in _AXES_SHOWN if len({str(r.get(c)) for r in rows}) > 1] or ["deploy", "policy"]
    metrics = list(dict.fromkeys(c for m in dict.fromkeys(r["metric"] for r in rows) for c in _SHOWN[m]))
    table = Table(title=title, title_justify="left")
    for col in axes + metrics:
        table.add_column(col, justify="left" if col in axes else "right", overflow="fold")
    for row in rows:
        style = "bold green" if row["metric"] == "best-static" else None
        table.add_row(*(_fmt(row.get(c)) for c in axes + metrics), style=style)
    return table


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4g}"
    return str(value)

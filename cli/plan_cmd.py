"""``fastpp plan``: the layout (dp x tp x pp), chunk policy and balancer that serve the most
requests per second within the SLO on N GPUs, ranked, with the commands that run it."""

# ruff: noqa: E501  (Typer's Annotated option declarations read best one per line)

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from fastpp.cli.common import console, err_console, fail, gamma_needs_cv, slo_from_flags, writable_dir
from fastpp.cli.options import ArrivalOpt, ChunkCandidatesOpt, CvOpt, DataDirOpt


def plan(
    model: Annotated[
        str,
        typer.Option(
            "--model",
            "-m",
            help="Model name, or a Hugging Face config.json / model directory (dense Llama, Qwen2, Qwen3, Mistral).",
        ),
    ] = "Qwen2.5-32B",
    gpu: Annotated[
        str,
        typer.Option(
            "--gpu",
            help="GPU name; 'list' shows the known ones and which are calibrated; an uncalibrated GPU by its datasheet: NAME:bf16_tflops=..,hbm_gbps=..,memory_gib=..[,interconnect=pcie4][,family=A100].",
        ),
    ] = "A100-40GB-PCIe",
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs to deploy on (a power of two).")] = 4,
    workload: Annotated[
        str, typer.Option("--workload", "-w", help="Length distribution (see `fastpp workloads`).")
    ] = "azure-conv",
    arrival: ArrivalOpt = None,
    cv: CvOpt = None,
    slo_ttft_ms: Annotated[float | None, typer.Option(help="P90 TTFT SLO in ms. [default: 2000]")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option(help="P90 TPOT SLO in ms. [default: 200]")] = None,
    policies: Annotated[
        str | None,
        typer.Option(
            "--policies",
            help="Narrow or widen the policy grid: comma list of static (chunks 128..1024 step 128, 1536, 2048), static:N, greedy, predictive, slack, any other chunk policy of `fastpp policies` (greedy:tile), specs such as predictive+ds, and ds (only +ds) or no-ds. [default: static, greedy, predictive and slack, each with and without +ds]",
        ),
    ] = None,
    layouts: Annotated[
        str | None,
        typer.Option(
            "--layouts",
            help="Only these layouts, comma list: pp4, tp4, pp2tp2, dp2pp2, dp4 (dp4 of one GPU). [default: every layout that fits]",
        ),
    ] = None,
    profile: Annotated[
        list[str] | None,
        typer.Option(
            "--profile",
            help="Plan on measured costs: a profile (from `fastpp profile`, also --from-records) or a shipped profile's name; each fixes one layout. Repeat to compare layouts.",
        ),
    ] = None,
    interconnect: Annotated[
        str | None, typer.Option(help="GPU-GPU link: pcie4, nvlink3, nvlink4. [default: the GPU's]")
    ] = None,
    host_loop: Annotated[
        str | None,
        typer.Option(
            "--host-loop", help="free-slots, batch-queue (vLLM) or blocking-launch. [default: free-slots]"
        ),
    ] = None,
    async_depths: Annotated[
        str | None,
        typer.Option(
            "--pp-async-batch-depth",
            help="Async batch depths to try each pipelined candidate at, comma list such as 0,1: SGLang's flag of that name, microbatches in flight beyond one per stage (not with --host-loop batch-queue). [default: 0]",
        ),
    ] = None,
    queue_orders: Annotated[
        str | None,
        typer.Option(
            "--queue-orders",
            help="Queue orders to try each candidate with, comma list: fcfs, late_last (a request past its SLO TTFT waits behind those that can still meet theirs). [default: fcfs]",
        ),
    ] = None,
    chunk_candidates: ChunkCandidatesOpt = None,
    data_dir: DataDirOpt = None,
    seeds: Annotated[int, typer.Option(help="Seeds pooled per goodput probe.")] = 2,
    precision: Annotated[float, typer.Option(help="Goodput bracket width per replica, req/s.")] = 0.25,
    num_requests: Annotated[
        int | None,
        typer.Option(
            "--num-requests",
            "-n",
            help="Requests per seed a probe starts with. [default: the goodput length rule]",
        ),
    ] = None,
    operating_point: Annotated[
        float,
        typer.Option("--operating-point", help="Latency is shown at this share of each candidate's goodput."),
    ] = 0.8,
    steady: Annotated[
        bool,
        typer.Option(
            "--steady/--no-steady",
            help="As `fastpp goodput`: --no-steady judges fixed runs by the SLO alone (use with -n; no lengthening, no confirmation).",
        ),
    ] = True,
    exhaustive: Annotated[
        bool,
        typer.Option(
            "--exhaustive", help="Search every candidate fully (no bound pruning, no challenge probe)."
        ),
    ] = False,
    workers: Annotated[
        int | None,
        typer.Option("--workers", help="Worker processes for --executor process. [default: CPU count]"),
    ] = None,
    executor: Annotated[
        str, typer.Option("--executor", help="process, serial or ray (the sweep's executors).")
    ] = "process",
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="Ray cluster to join. [default: auto]")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Plan folder: plan.jsonl (finished candidates, reused by a rerun) and plan.json.",
        ),
    ] = Path("runs/plan"),
    model_path: Annotated[
        str | None,
        typer.Option(
            help="Model path or hub name the serve commands use. [default: the model's Hugging Face repository]"
        ),
    ] = None,
    show_all: Annotated[
        bool, typer.Option("--all", help="Show every candidate (default: the top 15).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="Write figures (goodput per candidate, goodput vs bound, latency at the operating point) into this folder.",
        ),
    ] = None,
) -> None:
    """Plan a deployment: rank dp x tp x pp layouts and policies by goodput on N GPUs."""
    from fastpp.sim.hardware import GPUS

    if gpu.strip().lower() == "list":
        _wide().print(_gpu_table())
        return
    from fastpp.scheduler_config import parse_chunk_candidates
    from fastpp.sim.plan_job import SearchSettings
    from fastpp.sim.planner import PlanConfig

    if seeds < 1:
        fail(f"--seeds must be >= 1, got {seeds}")
    for option, given_text in (
        ("--policies", policies),
        ("--layouts", layouts),
        ("--queue-orders", queue_orders),
    ):
        if given_text is not None and not given_text.strip(" ,"):
            fail(f"{option} is empty; leave it out for the default")
    slo = slo_from_flags(slo_ttft_ms, slo_tpot_ms)
    try:
        settings = SearchSettings(
            seeds=tuple(range(seeds)),
            precision=precision,
            num_requests=num_requests,
            operating_share=operating_point,
            require_steady=steady,
        )
        gamma_needs_cv(arrival, cv)
        config = PlanConfig(
            model=model,
            gpu=gpu,
            num_gpus=gpus,
            workload=workload,
            arrival=arrival or "poisson",
            cv=1.0 if cv is None else cv,
            slo=slo,
            policies=policies or "",
            layouts=tuple(layouts.split(",")) if layouts else None,
            profiles=tuple(profile or ()),
            interconnect=interconnect,
            host_loop=host_loop or "free-slots",
            async_depths=_depths(async_depths),
            queue_orders=tuple(w.strip() for w in queue_orders.split(",") if w.strip())
            if queue_orders
            else ("fcfs",),
            chunk_candidates=parse_chunk_candidates(chunk_candidates) if chunk_candidates else None,
            data_dir=data_dir,
            settings=settings,
            prune=not exhaustive,
        )
    except ValueError as exc:
        fail(str(exc))
        return
    if out is not None:
        from fastpp.cli.run_dirs import RunDirError, refuse_other_command
        from fastpp.sim.planner import PLAN_JSONL

        writable_dir(out)
        try:
            refuse_other_command(out, PLAN_JSONL)
        except RunDirError as exc:
            fail(str(exc))
    if plot is not None:
        writable_dir(plot, "--plot")
    quiet = as_json or not sys.stderr.isatty()
    try:
        result = _run(config, executor, workers, ray_address, out, quiet)
    except (ValueError, OSError, ImportError) as exc:
        fail(str(exc))
        return
    _report(result, config, model_path, out, plot, as_json, show_all, known_gpu=gpu in GPUS)


def _depths(text: str | None) -> tuple[int, ...]:
    """``--pp-async-batch-depth 0,1`` -> (0, 1); ValueError naming the flag and the bad entry."""
    if text is None:
        return (0,)
    words = [w.strip() for w in text.split(",") if w.strip()]
    bad = [w for w in words if not w.isdigit()]
    if bad or not words:
        raise ValueError(
            f"--pp-async-batch-depth takes a comma list of integers >= 0 such as 0,1, got {text!r}"
        )
    return tuple(int(w) for w in words)


def _run(config, executor, workers, ray_address, out, quiet):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fastpp.sim.planner import plan_deployment

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        disable=quiet,
    ) as bar:
        task = bar.add_task("candidates", total=None)

        def progress(done: int, total: int, label: str) -> None:
            bar.update(
                task,
                completed=done,
                total=total,
                description=f"candidates{f' (last: {label})' if label else ''}",
            )

        return plan_deployment(
            config,
            executor=executor,
            workers=workers,
            ray_address=ray_address,
            out_dir=out,
            progress=progress,
        )


def _report(result, config, model_path, out, plot, as_json, show_all, known_gpu) -> None:
    from fastpp.run_files import json_safe, write_json
    from fastpp.sim.models import HF_REPOS
    from fastpp.sim.plan_report import excluded_table, ranked_table, serve_commands, verdict
    from fastpp.sim.sweep_grid import static_chunk

    best = result.best
    # a config.json given as -m: the engines load its folder (weights beside it), not the file
    asked = Path(config.model).parent if Path(config.model).is_file() else config.model
    path = model_path or HF_REPOS.get(result.model) or (str(asked) if not config.profiles else "MODEL")
    profile = config.profiles[0] if len(config.profiles) == 1 else None
    data = result.to_dict()
    if best is not None:
        if profile is None and static_chunk(best.candidate.policy) is None and out is not None:
            # a dynamic policy reads the deployment's costs: the profile the plan simulated
            from fastpp.profile import save_profile
            from fastpp.sim.planner import replica_profile

            prof = replica_profile(config, best.candidate.layout)
            profile = str(out / f"{prof.name}.json")
            save_profile(prof, profile)
        data["commands"] = serve_commands(result, best, path, profile)
    if out is not None:
        write_json(data, out / "plan.json")
    if as_json:
        print(json.dumps(json_safe(data)))
    else:
        wide = _wide()
        wide.print(ranked_table(result, None if show_all else 15))
        if result.excluded:
            wide.print(excluded_table(result))
        for line in verdict(result):
            console.print(line, markup=False, highlight=False)
        if best is not None:
            for key, text in data["commands"].items():
                console.print(f"{key}: {text}", markup=False, highlight=False, soft_wrap=True)
        for note in result.notes:
            console.print(f"note: {note}", markup=False, highlight=False, style="yellow")
        if not known_gpu and result.gpu_note.startswith("uncalibrated"):
            console.print(f"{result.gpu}: {result.gpu_note}", style="yellow", markup=False)
    if plot is not None:
        from fastpp.sim.plan_plots import plot_plan

        paths = plot_plan(result, plot)
        if not as_json:
            console.print(f"figures: {', '.join(str(p) for p in paths)}", markup=False)
    if best is None:
        raise typer.Exit(1)


def _wide() -> Console:
    """The terminal's console, or one 150 columns wide when output goes to a file or pipe (the
    ranked table has 13 columns)."""
    return console if sys.stdout.isatty() else Console(width=max(console.width, 150))


def _gpu_table() -> Table:
    from fastpp.sim.hardware import DATASHEET_KEYS, GPUS, calibration_note

    table = Table(title="GPUs the planner knows", title_justify="left", caption_justify="left")
    for col in ("name", "BF16 TFLOP/s", "HBM GB/s", "memory GiB", "link", "cost model"):
        table.add_column(col, overflow="fold")
    for g in GPUS.values():
        table.add_row(
            g.name,
            f"{g.peak_bf16_flops / 1e12:.0f}",
            f"{g.hbm_bytes_per_s / 1e9:.0f}",
            f"{g.memory_bytes / 1024**3:.1f}",
            g.interconnect,
            calibration_note(g),
        )
    table.caption = (
        "any other GPU, uncalibrated: --gpu 'NAME:"
        + ",".join(f"{k}=.." for k in DATASHEET_KEYS)
        + "' ("
        + "; ".join(f"{k}: {v}" for k, v in DATASHEET_KEYS.items())
        + ")"
    )
    return table

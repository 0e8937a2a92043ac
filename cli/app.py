"""The ``fastpp`` command line. Commands parse options and delegate to the library; defaults
live in the config dataclasses (an option left unset takes the dataclass default)."""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from fastpp.cli.options import (
    ArrivalOpt,
    ChunkCandidatesOpt,
    CvOpt,
    DataDirOpt,
    ReplayOpt,
    ReplaySpeedOpt,
    ReplayStartOpt,
    ReplayWindowOpt,
    WorkloadOpt,
)
from fastpp.cli.render import summary_table, workloads_table

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="FastPP: pipeline-parallel LLM serving policies, simulator and backends.",
)
console = Console()
err_console = Console(stderr=True)


def _given(cls: type, **values: Any) -> dict[str, Any]:
    """Only the options the user set, so the dataclass defaults stay the single source."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in values.items() if v is not None and k in names}


def _fail(message: str) -> None:
    err_console.print(f"[red]error:[/] {message}")
    raise typer.Exit(2)


@app.command()
def simulate(
    workload: WorkloadOpt = None,
    rate: Annotated[float | None, typer.Option("--rate", "-r", help="Arrival rate, requests/s. [default: 4.0]")] = None,
    num_requests: Annotated[int | None, typer.Option("--num-requests", "-n", help="Requests to send. [default: 1000]")] = None,
    duration: Annotated[float | None, typer.Option("--duration", help="Send requests for this many seconds instead of -n.")] = None,
    arrival: ArrivalOpt = None,
    cv: CvOpt = None,
    replay: ReplayOpt = None,
    replay_start: ReplayStartOpt = None,
    replay_window: ReplayWindowOpt = None,
    replay_speed: ReplaySpeedOpt = None,
    data_dir: DataDirOpt = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Model name. [default: Qwen2.5-32B]")] = None,
    gpu: Annotated[str | None, typer.Option(help="GPU name. [default: A100-40GB-PCIe]")] = None,
    deploy: Annotated[list[str] | None, typer.Option("--deploy", "-d", help="Deployment like pp4, tp4, pp2tp2, optionally with its own policy: pp4@static:512. Repeat to compare. [default: tp4, pp4, pp4@static:512, pp4@predictive]")] = None,
    profile: Annotated[str | None, typer.Option(help="Profile JSON to simulate instead of the analytic model.")] = None,
    policy: Annotated[str | None, typer.Option("--policy", "-p", help="Policy spec, e.g. static:2048 (see `fastpp policies`).")] = None,
    chunk: Annotated[int | None, typer.Option(help="Shortcut for --policy static:CHUNK.")] = None,
    chunk_candidates: ChunkCandidatesOpt = None,
    slo_ttft_ms: Annotated[float | None, typer.Option(help="TTFT SLO in ms. [default: 2000]")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option(help="TPOT SLO in ms. [default: 200]")] = None,
    seed: Annotated[int | None, typer.Option(help="Workload seed. [default: 0]")] = None,
    max_time: Annotated[float | None, typer.Option(help="Stop at this simulated second; abort what is left.")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder.")] = Path("runs/simulate"),
    timeline: Annotated[bool, typer.Option(help="Write a Chrome-trace timeline per deployment.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summaries as JSON.")] = False,
) -> None:
    """Simulate a deployment serving a workload; compare PP and TP side by side."""
    from fastpp.scheduler_config import parse_chunk_candidates
    from fastpp.sim.run import DEFAULT_COMPARISON, DeploymentConfig, WorkloadConfig, parse_deployment
    from fastpp.types import SLO

    try:
        if chunk is not None and policy is not None:
            _fail("give --policy or --chunk, not both")
        wl_values = _given(
            WorkloadConfig, name=workload, rate=rate, num_requests=num_requests, duration_s=duration,
            arrival=arrival, cv=cv, replay=replay, replay_start_s=replay_start,
            replay_window_s=replay_window, replay_speed=replay_speed, seed=seed, data_dir=data_dir,
        )
        if duration is not None and num_requests is None:
            wl_values["num_requests"] = None  # a duration replaces the default request count
        wl = WorkloadConfig(**wl_values)
        slo = SLO(
            (slo_ttft_ms if slo_ttft_ms is not None else SLO().ttft_s * 1e3) / 1e3,
            (slo_tpot_ms if slo_tpot_ms is not None else SLO().tpot_s * 1e3) / 1e3,
        )
        base = DeploymentConfig(**_given(
            DeploymentConfig, model=model, gpu=gpu, profile_path=profile,
            policy=f"static:{chunk}" if chunk is not None else policy,
            chunk_candidates=parse_chunk_candidates(chunk_candidates) if chunk_candidates else None,
        ), slo=slo)
        if profile is not None:  # the file fixes pp/tp: -d may only name policies, on the file's shape
            shape = base.load_profile()
            deployments = [base]
            if deploy:
                deployments = []
                for d in deploy:
                    pp, tp, pol = parse_deployment(d)
                    if (pp, tp) != (shape.pp, shape.tp):
                        raise ValueError(f"-d {d}: the profile {profile} is for pp{shape.pp}tp{shape.tp}")
                    deployments.append(base.with_parallel(pp, tp, pol))
        else:
            specs = deploy or list(DEFAULT_COMPARISON)
            deployments = [base.with_parallel(*parse_deployment(d)) for d in specs]
        requests = wl.requests()
    except (ValueError, OSError) as exc:
        _fail(str(exc))
        return
    _run_and_report(wl, deployments, requests, out, timeline, as_json, max_time)


def _run_and_report(wl, deployments, requests, out: Path, timeline: bool, as_json: bool,
                    max_time: float | None) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fastpp.sim.output import write_json, write_run
    from fastpp.sim.run import run_simulation

    runs = []
    quiet = as_json or not sys.stderr.isatty()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, disable=quiet) as bar:
        for dep in deployments:
            task = bar.add_task(f"simulating {dep.label}", total=len(requests))
            try:
                run = run_simulation(
                    wl, dep, requests=requests, max_time_s=max_time,
                    progress=lambda done, total, t=task: bar.update(t, completed=done),
                )
            except (ValueError, OSError) as exc:
                _fail(f"{dep.label}: {exc}")
                return
            runs.append(run)
            write_run(run, out, timeline=timeline)
    summaries = [r.summary for r in runs]
    write_json(summaries, out / "summary.json")
    if as_json:
        from fastpp.run_files import json_safe

        console.print_json(json.dumps(json_safe(summaries)))
        return
    first = runs[0]
    title = (f"{first.profile.model.name} on {first.profile.gpu} ({first.profile.interconnect}), "
             f"{wl.describe()}, SLO {first.deployment.slo.ttft_s * 1e3:.0f}/"
             f"{first.deployment.slo.tpot_s * 1e3:.0f} ms")
    console.print(summary_table(summaries, title))
    for r in runs:
        for note in r.summary.get("notes", []):
            console.print(f"[yellow]{r.deployment.label}: {note}[/]")
    console.print(f"outputs in {out}/ (summary.json, *_requests.jsonl, *_iterations.csv"
                  f"{', *_timeline.json for Perfetto' if timeline else ''})")


@app.command()
def goodput(
    workload: Annotated[str | None, typer.Option("--workload", "-w", help="Length distribution. [default: azure-conv]")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Model name. [default: Qwen2.5-32B]")] = None,
    gpu: Annotated[str | None, typer.Option(help="GPU name. [default: A100-40GB-PCIe]")] = None,
    deploy: Annotated[list[str] | None, typer.Option("--deploy", "-d", help="Deployment(s), e.g. pp4@predictive; repeat to compare. [default: pp4]")] = None,
    policy: Annotated[str | None, typer.Option("--policy", "-p", help="Policy spec for deployments that name none. [default: static:2048]")] = None,
    seeds: Annotated[int, typer.Option(help="Seeds per probe (first seed .. first seed + N-1), records pooled.")] = 2,
    first_seed: Annotated[int, typer.Option(help="First workload seed of each probe.")] = 0,
    precision: Annotated[float, typer.Option(help="Stop when the bracket is narrower than this, req/s.")] = 0.1,
    low: Annotated[float, typer.Option(help="First probe, req/s (the search expands below it if needed).")] = 0.5,
    high: Annotated[float, typer.Option(help="Upper bracket guess, req/s (expands above if feasible).")] = 8.0,
    num_requests: Annotated[int | None, typer.Option("--num-requests", "-n", help="Requests per seed per probe. [default: enough arrivals for a steady queue]")] = None,
    attainment: Annotated[float | None, typer.Option(help="Use the attainment criterion: this share of requests must meet both SLOs.")] = None,
    steady: Annotated[bool, typer.Option("--steady/--no-steady", help="Fail a probe whose queue still grows. --no-steady judges the SLO alone, as the paper's fixed 1,000-prompt runs did (use with -n).")] = True,
    slo_ttft_ms: Annotated[float, typer.Option(help="TTFT SLO in ms.")] = 2000.0,
    slo_tpot_ms: Annotated[float, typer.Option(help="TPOT SLO in ms.")] = 200.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write goodput.json and its figures (probes against rate, goodput bars) into this folder.")] = None,
) -> None:
    """Highest Poisson rate at which a deployment meets the SLO (P90 TTFT and P90 TPOT)."""
    from fastpp.run_files import json_safe
    from fastpp.sim.goodput import slo_goodput
    from fastpp.sim.run import DeploymentConfig, WorkloadConfig, build_scheduler, parse_deployment
    from fastpp.types import SLO

    try:
        wl = WorkloadConfig(**_given(WorkloadConfig, name=workload))
        base = DeploymentConfig(**_given(DeploymentConfig, model=model, gpu=gpu, policy=policy),
                                slo=SLO(slo_ttft_ms / 1e3, slo_tpot_ms / 1e3))
        deployments = [base.with_parallel(*parse_deployment(d)) for d in (deploy or ["pp4"])]
        if seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {seeds}")
        if first_seed < 0:
            raise ValueError(f"--first-seed must be >= 0, got {first_seed}")
    except ValueError as exc:
        _fail(str(exc))
        return
    for dep in deployments:  # a bad policy or shape fails now, not after an earlier search
        try:
            build_scheduler(dep.load_profile(), dep)
        except ValueError as exc:
            _fail(f"{dep.label}: {exc}")
            return
    if not steady and not as_json:
        err_console.print("[yellow]--no-steady: probes are judged by the SLO alone; a run that ends "
                          "before its queue (or KV cache) fills may pass at a rate that a longer "
                          "run would not sustain[/]")
    results = []
    for dep in deployments:
        if not as_json:
            err_console.print(f"[bold]{dep.label} {dep.policy}[/]: searching ...")
        try:
            res = slo_goodput(
                wl, dep, seeds=tuple(range(first_seed, first_seed + seeds)),
                num_requests=num_requests, precision=precision,
                low=low, high=high, criterion="p90" if attainment is None else "attainment",
                attainment=attainment or 0.9, require_steady=steady,
                progress=None if as_json else lambda p: err_console.print(f"  {p.describe()}"),
            )
        except ValueError as exc:
            _fail(f"{dep.label}: {exc}")
            return
        results.append({"deployment": dep.label, "policy": dep.policy, **res.to_dict()})
        if not as_json:
            console.print(f"[bold]{dep.label} {dep.policy}[/]: {res.describe().splitlines()[0]}")
    if as_json:
        console.print_json(json.dumps(json_safe(results)))
    if plot is not None:
        from fastpp.cli.plot_cmd import draw
        from fastpp.sim.output import write_json

        plot.mkdir(parents=True, exist_ok=True)
        draw(write_json(results, plot / "goodput.json"), plot, slo_ttft_ms=slo_ttft_ms,
             slo_tpot_ms=slo_tpot_ms)


@app.command()
def workloads(
    data_dir: Annotated[str | None, typer.Option(help="Folder with the real traces.")] = None,
    samples: Annotated[int, typer.Option(help="Samples drawn per workload for the statistics.")] = 20000,
) -> None:
    """List the built-in workloads with their length statistics."""
    from fastpp.workloads import WORKLOADS, WorkloadError, workload_stats

    rows, missing = [], []
    for name in WORKLOADS:
        try:
            rows.append(workload_stats(name, n=samples, data_dir=data_dir))
        except WorkloadError as exc:
            missing.append(f"{name}: {exc}")
    console.print(workloads_table(rows))
    for line in missing:
        console.print(f"[yellow]unavailable[/] {line}")


@app.command()
def policies() -> None:
    """List the chunk policies and decode balancers a --policy spec can name."""
    from rich.table import Table

    from fastpp.policies import BALANCERS, POLICIES

    for title, table_src in (("chunk policies", POLICIES), ("decode balancers (after +)", BALANCERS)):
        table = Table(title=title, title_justify="left")
        for col in ("name", "what it is", "optional :ARG"):
            table.add_column(col)
        for name, info in table_src.items():
            table.add_row(name, info.summary, info.argument or "-")
        console.print(table)
    console.print("spec: NAME[:ARG][+BALANCER[:ARG]], e.g. static:512, greedy:p90, predictive+ds")


def _register_subcommands() -> None:
    """Commands defined in their own modules add themselves to ``app`` on import."""
    import importlib

    for name in ("fastpp.cli.sweep_cmd", "fastpp.cli.plot_cmd", "fastpp.cli.bench_cmd", "fastpp.cli.profile_cmd",
                 "fastpp.cli.serve_cmd"):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a real missing dependency inside the module
                raise


_register_subcommands()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    app()


if __name__ == "__main__":
    main()

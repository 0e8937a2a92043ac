"""``fastpp simulate``: one workload on one or more deployments, side by side."""

# ruff: noqa: E501  (Typer's Annotated option declarations read best one per line)

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from fastpp.cli.common import (
    console,
    err_console,
    fail,
    gamma_needs_cv,
    given,
    positive,
    slo_from_flags,
    writable_dir,
)
from fastpp.cli.options import (
    AdmissionOpt,
    ArrivalOpt,
    AsyncBatchDepthOpt,
    ChunkCandidatesOpt,
    CvOpt,
    DataDirOpt,
    QueueOrderOpt,
    ReplayOpt,
    ReplaySpeedOpt,
    ReplayStartOpt,
    ReplayWindowOpt,
    RetractionOpt,
    WorkloadOpt,
)
from fastpp.cli.profile_conflict import check_profile_against
from fastpp.cli.render import summary_table


def simulate(
    workload: WorkloadOpt = None,
    rate: Annotated[
        float | None, typer.Option("--rate", "-r", help="Arrival rate, requests/s. [default: 4.0]")
    ] = None,
    num_requests: Annotated[
        int | None, typer.Option("--num-requests", "-n", help="Requests to send. [default: 1000]")
    ] = None,
    duration: Annotated[
        float | None, typer.Option("--duration", help="Send requests for this many seconds instead of -n.")
    ] = None,
    arrival: ArrivalOpt = None,
    cv: CvOpt = None,
    replay: ReplayOpt = None,
    replay_start: ReplayStartOpt = None,
    replay_window: ReplayWindowOpt = None,
    replay_speed: ReplaySpeedOpt = None,
    data_dir: DataDirOpt = None,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model name. [default: Qwen2.5-32B]")
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            help="GPU name, or an uncalibrated one by its datasheet: NAME:bf16_tflops=..,hbm_gbps=..,memory_gib=.. (`fastpp plan --gpu list`). [default: A100-40GB-PCIe]"
        ),
    ] = None,
    deploy: Annotated[
        list[str] | None,
        typer.Option(
            "--deploy",
            "-d",
            help="Deployment like pp4, tp4, pp2tp2, optionally with its own policy: pp4@static:512. Repeat to compare. [default: tp4, pp4, pp4@static:512, pp4@predictive]",
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            help="Profile to simulate instead of the analytic model: a JSON file, or a shipped profile's name (cpu_smollm2-135m_pp2, ...)."
        ),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option("--policy", "-p", help="Policy spec, e.g. static:2048 (see `fastpp policies`)."),
    ] = None,
    chunk: Annotated[int | None, typer.Option(help="Shortcut for --policy static:CHUNK.")] = None,
    chunk_candidates: ChunkCandidatesOpt = None,
    admission: AdmissionOpt = None,
    retraction: RetractionOpt = None,
    queue_order: QueueOrderOpt = None,
    async_batch_depth: AsyncBatchDepthOpt = None,
    host_loop: Annotated[
        str | None,
        typer.Option(
            "--host-loop",
            help="How the host launches microbatches: free-slots (our engines, SGLang on GPUs), batch-queue (vLLM's engine-core loop: slots strictly in turn, the host blocks on the oldest output) or blocking-launch (free slots, but the host computes stage 0 itself and folds in returned tokens only between its launches: SGLang on CPU). [default: free-slots]",
        ),
    ] = None,
    slo_ttft_ms: Annotated[float | None, typer.Option(help="TTFT SLO in ms. [default: 2000]")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option(help="TPOT SLO in ms. [default: 200]")] = None,
    seed: Annotated[int | None, typer.Option(help="Workload seed. [default: 0]")] = None,
    max_time: Annotated[
        float | None, typer.Option(help="Stop at this simulated second (> 0); abort what is left.")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Output folder; one that holds another run is refused unless --overwrite. [default: a new folder per run, runs/simulate/YYYYmmdd-HHMMSS]",
            show_default=False,
        ),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Clear the run already in --out (its summary.json, run folders and plots) instead of refusing.",
        ),
    ] = False,
    timeline: Annotated[bool, typer.Option(help="Write a Chrome-trace timeline per deployment.")] = True,
    table_format: Annotated[
        str,
        typer.Option(
            "--table-format",
            help="How each run's request and iteration tables are written: text (requests.jsonl, iterations.csv) or parquet (requests.parquet, iterations.parquet: typed columns, written in C, for pandas / polars / DuckDB; needs pyarrow, pip install 'fastpp[parquet]').",
        ),
    ] = "text",
    as_json: Annotated[bool, typer.Option("--json", help="Print the summaries as JSON.")] = False,
) -> None:
    """Simulate a deployment serving a workload; compare PP and TP side by side."""
    from fastpp.scheduler_config import parse_chunk_candidates
    from fastpp.sim.run import DeploymentConfig, WorkloadConfig, check_deployment, deployments_for

    if chunk is not None and policy is not None:
        fail("give --policy or --chunk, not both")
    _check_replay_options(
        replay,
        {"--replay-start": replay_start, "--replay-window": replay_window, "--replay-speed": replay_speed},
        {
            "--workload": workload,
            "--rate": rate,
            "--num-requests": num_requests,
            "--duration": duration,
            "--arrival": arrival,
            "--cv": cv,
            "--seed": seed,
        },
    )
    positive(max_time, "--max-time")
    gamma_needs_cv(arrival, cv)
    slo = slo_from_flags(slo_ttft_ms, slo_tpot_ms)
    try:
        wl_values = given(
            WorkloadConfig,
            name=workload,
            rate=rate,
            num_requests=num_requests,
            duration_s=duration,
            arrival=arrival,
            cv=cv,
            replay=replay,
            replay_start_s=replay_start,
            replay_window_s=replay_window,
            replay_speed=replay_speed,
            seed=seed,
            data_dir=data_dir,
        )
        if duration is not None and num_requests is None:
            wl_values["num_requests"] = None  # a duration replaces the default request count
        wl = WorkloadConfig(**wl_values)
        base = DeploymentConfig(
            **given(
                DeploymentConfig,
                model=model,
                gpu=gpu,
                profile_path=profile,
                policy=f"static:{chunk}" if chunk is not None else policy,
                chunk_candidates=parse_chunk_candidates(chunk_candidates) if chunk_candidates else None,
                host_loop=host_loop,
                admission_reserve=admission,
                retraction=retraction,
                queue_order=queue_order,
                async_batch_depth=async_batch_depth,
            ),
            slo=slo,
        )
        deployments = deployments_for(base, deploy)
        for dep in deployments:
            check_deployment(dep)
        requests = wl.requests()
    except (ValueError, OSError) as exc:
        fail(str(exc))
    check_profile_against(profile, model, gpu, deployments[0])
    _check_table_format(table_format)
    out = _out_dir(out, overwrite)
    _run_and_report(wl, deployments, requests, out, timeline, as_json, max_time, table_format)


def _check_replay_options(
    replay: str | None, replay_options: dict[str, object], synthetic_options: dict[str, object]
) -> None:
    """Fail on options the run would ignore: the --replay-* ones without --replay, or those of
    synthetic arrivals with it (a trace brings its own arrival times and lengths)."""
    if replay is None:
        if given_names := [name for name, value in replay_options.items() if value is not None]:
            fail(
                f"{', '.join(given_names)} {'applies' if len(given_names) == 1 else 'apply'} to --replay only"
            )
    elif given_names := [name for name, value in synthetic_options.items() if value is not None]:
        verb = "does" if len(given_names) == 1 else "do"
        fail(
            f"{', '.join(given_names)} {verb} not apply to --replay {replay} (the trace brings its own "
            "arrival times and lengths); narrow it with --replay-start / --replay-window, "
            "scale its rate with --replay-speed"
        )


DEFAULT_RUNS = Path("runs/simulate")  # each run without --out gets a new folder in here


def _out_dir(out: Path | None, overwrite: bool) -> Path:
    """The run's folder: a new one under DEFAULT_RUNS, or ``out`` checked (writable, and holding
    no other run unless ``overwrite`` clears it)."""
    from fastpp.cli.run_dirs import RunDirError, claim_out_dir, fresh_run_dir

    try:
        if out is None:
            writable_dir(DEFAULT_RUNS)
            return fresh_run_dir(DEFAULT_RUNS)
        writable_dir(out)
        return claim_out_dir(out, overwrite=overwrite)
    except (RunDirError, OSError) as exc:
        fail(str(exc))


def _check_table_format(table_format: str) -> None:
    """Fail before simulating when the tables cannot be written as asked."""
    from fastpp.run_files import TABLE_FORMATS

    if table_format not in TABLE_FORMATS:
        fail(f"--table-format must be one of {', '.join(TABLE_FORMATS)}, got {table_format!r}")
    if table_format == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            fail("--table-format parquet needs pyarrow: pip install 'fastpp[parquet]'")


def _run_and_report(
    wl,
    deployments,
    requests,
    out: Path,
    timeline: bool,
    as_json: bool,
    max_time: float | None,
    table_format: str = "text",
) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fastpp.cli.forked_writes import ForkedWrites
    from fastpp.run_files import json_safe, write_json
    from fastpp.sim.output import write_simulation
    from fastpp.sim.run import run_simulation

    runs = []
    writes = ForkedWrites()  # each run's files are written while the next run simulates
    quiet = as_json or not sys.stderr.isatty()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        disable=quiet,
    ) as bar:
        for dep in deployments:
            task = bar.add_task(f"simulating {dep.label}", total=len(requests))
            try:
                run = run_simulation(
                    wl,
                    dep,
                    requests=requests,
                    max_time_s=max_time,
                    progress=lambda done, total, t=task: bar.update(t, completed=done),
                )
            except (ValueError, OSError) as exc:
                fail(f"{dep.label}: {exc}")
            runs.append(run)
            write_simulation(run, out, timeline=timeline, submit=writes.submit, table_format=table_format)
    summaries = [r.summary for r in runs]
    write_json(summaries, out / "summary.json")
    if failed := writes.wait():
        fail(f"could not write {', '.join(failed)} (the errors are above)")
    if as_json:
        console.print_json(json.dumps(json_safe(summaries)))
        return
    first = runs[0]
    title = (
        f"{first.profile.model.name} on {first.profile.gpu} ({first.profile.interconnect}), "
        f"{wl.describe()}, SLO {first.deployment.slo.ttft_s * 1e3:.0f}/"
        f"{first.deployment.slo.tpot_s * 1e3:.0f} ms"
    )
    console.print(summary_table(summaries, title))
    for r in runs:
        for note in r.summary.get("notes", []):
            console.print(f"[yellow]{r.deployment.label}: {note}[/]")
    tables = (
        "requests.parquet, iterations.parquet"
        if table_format == "parquet"
        else "requests.jsonl, iterations.csv"
    )
    files = f"summary.json, {tables}" + (", timeline.json for Perfetto" if timeline else "")
    console.print(
        f"outputs in {out}/: summary.json, and one folder per deployment ({files}); "
        f"figures: fastpp plot {out}",
        markup=False,
        highlight=False,
    )

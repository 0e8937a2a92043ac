"""``fastpp goodput``: the highest arrival rate (Poisson, or gamma with ``--arrival``) at which
a deployment meets the SLO."""

# ruff: noqa: E501  (Typer's Annotated option declarations read best one per line)

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

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
    RetractionOpt,
)


def goodput(
    ctx: typer.Context,
    workload: Annotated[
        str | None, typer.Option("--workload", "-w", help="Length distribution. [default: azure-conv]")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model name. [default: Qwen2.5-32B]")
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            help="GPU name, or an uncalibrated one by its datasheet: NAME:bf16_tflops=..,hbm_gbps=..,memory_gib=.. (`fastpp plan --gpu list`). [default: A100-40GB-PCIe]"
        ),
    ] = None,
    arrival: ArrivalOpt = None,
    cv: CvOpt = None,
    deploy: Annotated[
        list[str] | None,
        typer.Option(
            "--deploy", "-d", help="Deployment(s), e.g. pp4@predictive; repeat to compare. [default: pp4]"
        ),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy", "-p", help="Policy spec for deployments that name none. [default: static:2048]"
        ),
    ] = None,
    seeds: Annotated[
        int, typer.Option(help="Seeds per probe (first seed .. first seed + N-1), records pooled.")
    ] = 2,
    first_seed: Annotated[int, typer.Option(help="First workload seed of each probe.")] = 0,
    precision: Annotated[
        float | None,
        typer.Option(
            help="Stop when the bracket is narrower than this, req/s. [default: 0.1; --protocol fixed: the grid step]"
        ),
    ] = None,
    low: Annotated[
        float, typer.Option(help="First probe, req/s (the search expands below it if needed).")
    ] = 2.0,
    high: Annotated[
        float, typer.Option(help="Upper bracket guess, req/s (expands above if feasible).")
    ] = 8.0,
    num_requests: Annotated[
        int | None,
        typer.Option(
            "--num-requests",
            "-n",
            help="Requests per seed a probe starts with; probes whose verdict is unsettled are lengthened (doubled, up to 16x). [default: enough arrivals for a steady queue]",
        ),
    ] = None,
    attainment: Annotated[
        float | None,
        typer.Option(help="Use the attainment criterion: this share of requests must meet both SLOs."),
    ] = None,
    protocol: Annotated[
        str,
        typer.Option(
            "--protocol",
            help="steady: the sustained-rate search; fixed: fixed runs of -n prompts (default 1000) per rate 1..11, judged on the P90s (the paper's benchmark); azure / cnn-reversed: the paper's presets (400 / 1,000 prompts). See docs/GOODPUT.md.",
        ),
    ] = "steady",
    steady: Annotated[
        bool,
        typer.Option(
            "--steady/--no-steady",
            help="Fail a probe whose queue still grows. --no-steady judges the SLO alone, as the paper's fixed 1,000-prompt runs did (use with -n).",
        ),
    ] = True,
    slo_ttft_ms: Annotated[float | None, typer.Option(help="TTFT SLO in ms. [default: 2000]")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option(help="TPOT SLO in ms. [default: 200]")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="Write goodput.json and its figures (probes against rate, goodput bars) into this folder; one that holds another goodput.json is refused unless --overwrite.",
        ),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite", help="Let --plot replace the goodput.json and figures already in its folder."
        ),
    ] = False,
    profile: Annotated[
        str | None,
        typer.Option(
            help="Profile to search on instead of the analytic model: a JSON file (from `fastpp profile`), or a shipped profile's name; it fixes pp and tp (-d may name policies on its shape)."
        ),
    ] = None,
    host_loop: Annotated[
        str | None,
        typer.Option(
            "--host-loop",
            help="How the host launches microbatches: free-slots, batch-queue (vLLM) or blocking-launch (as `fastpp simulate`). [default: free-slots]",
        ),
    ] = None,
    chunk_candidates: ChunkCandidatesOpt = None,
    admission: AdmissionOpt = None,
    retraction: RetractionOpt = None,
    queue_order: QueueOrderOpt = None,
    async_batch_depth: AsyncBatchDepthOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Highest arrival rate at which a deployment meets the SLO (P90 TTFT and P90 TPOT):
    Poisson arrivals, or bursty gamma arrivals with --arrival gamma --cv."""
    from fastpp.run_files import json_safe, write_json
    from fastpp.scheduler_config import parse_chunk_candidates
    from fastpp.sim.goodput import slo_goodput
    from fastpp.sim.run import DeploymentConfig, WorkloadConfig, check_deployment, deployments_for

    slo = slo_from_flags(slo_ttft_ms, slo_tpot_ms)
    if seeds < 1:
        fail(f"--seeds must be >= 1, got {seeds}")
    if first_seed < 0:
        fail(f"--first-seed must be >= 0, got {first_seed}")
    if attainment is not None and not 0 < attainment <= 1:  # NaN included
        fail(f"--attainment must be in (0, 1] (a share of requests), got {attainment}")
    if num_requests is not None and num_requests < 2:
        fail(f"--num-requests (-n) must be >= 2 per seed, got {num_requests}")
    positive(precision, "--precision")
    positive(low, "--low")
    positive(high, "--high")
    if not low < high:
        fail(f"--low must be below --high, got --low {low:g} and --high {high:g}")
    if protocol != "steady":
        ignored = {
            "--low": _typed(ctx, "low"),
            "--high": _typed(ctx, "high"),
            "--attainment": attainment is not None,
        }
        if given_names := [name for name, value in ignored.items() if value]:
            fail(
                f"{', '.join(given_names)}: --protocol {protocol} probes a fixed grid of rates and "
                "judges the P90s; these apply to --protocol steady only"
            )
    gamma_needs_cv(arrival, cv)
    try:
        wl = WorkloadConfig(**given(WorkloadConfig, name=workload, arrival=arrival, cv=cv, data_dir=data_dir))
        base = DeploymentConfig(
            **given(
                DeploymentConfig,
                model=model,
                gpu=gpu,
                policy=policy,
                profile_path=profile,
                host_loop=host_loop,
                admission_reserve=admission,
                retraction=retraction,
                queue_order=queue_order,
                async_batch_depth=async_batch_depth,
                chunk_candidates=parse_chunk_candidates(chunk_candidates) if chunk_candidates else None,
            ),
            slo=slo,
        )
        deployments = deployments_for(base, deploy or (None if profile else ["pp4"]))
        if profile is not None:  # the file's own shape, in labels and results
            shape = base.load_profile()
            deployments = [d.with_parallel(shape.pp, shape.tp, d.policy) for d in deployments]
    except (ValueError, OSError) as exc:
        fail(str(exc))
    for dep in deployments:  # a bad policy or shape fails now, not after an earlier search
        try:
            check_deployment(dep)
        except ValueError as exc:
            fail(f"{dep.label}: {exc}")
    from fastpp.cli.profile_conflict import check_profile_against, model_and_gpu

    check_profile_against(profile, model, gpu, deployments[0])
    if plot is not None:
        from fastpp.cli.run_dirs import RunDirError, claim_result_dir
        from fastpp.sim.plot_inputs import GOODPUT_JSON

        writable_dir(plot, "--plot")
        try:
            claim_result_dir(plot, GOODPUT_JSON, overwrite=overwrite, option="--plot")
        except RunDirError as exc:
            fail(str(exc))
    if not steady and not as_json:
        err_console.print(
            "[yellow]--no-steady: probes are judged by the SLO alone; a run that ends "
            "before its queue (or KV cache) fills may pass at a rate that a longer "
            "run would not sustain[/]"
        )
    try:
        from fastpp.sim.goodput_fixed import parse_protocol

        fixed = parse_protocol(protocol, num_requests)
    except ValueError as exc:
        fail(f"--protocol: {exc}")
    if fixed is not None and wl.arrival != "poisson":
        fail(f"--arrival {wl.arrival}: --protocol {protocol} sends Poisson arrivals (the paper's fixed runs)")
    results = []
    for dep in deployments:
        if not as_json:
            err_console.print(f"[bold]{dep.label} {dep.policy}[/]: searching ...")
        try:
            if fixed is not None:
                from fastpp.sim.goodput_fixed import fixed_goodput

                res = fixed_goodput(
                    wl,
                    dep,
                    fixed,
                    seeds=tuple(range(first_seed, first_seed + seeds)),
                    precision=precision,
                    progress=None if as_json else lambda p: err_console.print(f"  {p.describe()}"),
                )
            else:
                res = slo_goodput(
                    wl,
                    dep,
                    seeds=tuple(range(first_seed, first_seed + seeds)),
                    num_requests=num_requests,
                    precision=precision or 0.1,  # a given 0 was refused above
                    low=low,
                    high=high,
                    criterion="p90" if attainment is None else "attainment",
                    attainment=0.9 if attainment is None else attainment,
                    require_steady=steady,
                    progress=None if as_json else lambda p: err_console.print(f"  {p.describe()}"),
                )
        except ValueError as exc:
            fail(f"{dep.label}: {exc}")
        dep_model, dep_gpu = model_and_gpu(dep)  # the profile's, when there is one
        results.append(
            {
                "deployment": dep.label,
                "policy": dep.policy,
                "model": dep_model,
                "gpu": dep_gpu,
                "workload": wl.name,
                "arrival": wl.arrival,
                "cv": wl.cv if wl.arrival == "gamma" else None,
                "slo_ttft_ms": slo.ttft_s * 1e3,
                "slo_tpot_ms": slo.tpot_s * 1e3,
                "protocol": protocol,
                "admission": dep.admission_reserve,
                "retraction": dep.retraction,
                "queue_order": dep.queue_order,
                "async_batch_depth": dep.async_batch_depth,
                **res.to_dict(),
            }
        )
        if not as_json:  # the verdict and its notes (a cap reached, a budget spent), not the probes
            console.print(f"[bold]{dep.label} {dep.policy}[/]: {res.describe().splitlines()[0]}")
            for note in res.notes:
                console.print(f"  note: {escape(note)}")
    if as_json:
        console.print_json(json.dumps(json_safe(results)))
    if plot is not None:
        from fastpp.cli.plot_cmd import draw
        from fastpp.sim.plot_inputs import GOODPUT_JSON

        draw(
            write_json(results, plot / GOODPUT_JSON),
            plot,
            slo_ttft_ms=slo.ttft_s * 1e3,
            slo_tpot_ms=slo.tpot_s * 1e3,
        )


def _typed(ctx: typer.Context, name: str) -> bool:
    """Whether the user gave option ``name`` rather than leaving its default (compared by name:
    Typer may bring its own copy of Click's ParameterSource)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name != "DEFAULT"

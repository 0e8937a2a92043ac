"""``fastpp profile``: write a deployment profile, analytic (a named GPU and model), measured on
the CPU engine (``--backend torch``), or fitted to a recorded run of any engine
(``--from-records DIR``, ``fastpp.records_profile``).

Defaults live in ``TorchProfileConfig`` / ``ProfileGrid`` and ``analytic_profile``; an option left
unset takes theirs.
"""

# ruff: noqa: E501  (as in cli/app.py: Typer's Annotated option declarations read best one per line)

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from fastpp.cli.common import console, err_console, fail, given, writable_file

BACKENDS = ("analytic", "torch")
ANALYTIC_MODEL, ANALYTIC_GPU, ANALYTIC_DEPLOY = "Qwen2.5-32B", "A100-40GB-PCIe", "pp4"


def profile(
    backend: Annotated[
        str | None,
        typer.Option(
            help="analytic: roofline model of a named GPU; torch: measure the CPU engine on this machine. [default: analytic]"
        ),
    ] = None,
    from_records: Annotated[
        Path | None,
        typer.Option(
            "--from-records",
            help="Fit the profile to a recorded run folder instead (any engine: fastpp serve --record-dir with the torch, SGLang or vLLM backend, or one deployment's folder inside a fastpp simulate -o folder).",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help=f"Model name. [default: {ANALYTIC_MODEL}; torch: smollm2-135m; --from-records: the run's recorded shape] With --from-records also a Hugging Face directory or config.json.",
        ),
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            help=f"GPU name (analytic only), or an uncalibrated one by its datasheet: NAME:bf16_tflops=..,hbm_gbps=..,memory_gib=.. (`fastpp plan --gpu list`). [default: {ANALYTIC_GPU}]"
        ),
    ] = None,
    deploy: Annotated[
        str | None,
        typer.Option(
            "--deploy",
            "-d",
            help=f"pp4, tp4, pp2tp2 ... (torch: ppN only). [default: {ANALYTIC_DEPLOY}; torch: pp2]",
        ),
    ] = None,
    pp: Annotated[int | None, typer.Option("--pp", help="Pipeline stages (instead of --deploy).")] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Where to write the JSON. [default: ./<profile name>.json]"),
    ] = None,
    weights: Annotated[
        str | None,
        typer.Option(
            help="torch: random (seeded, no download) or smollm2 (the real SmolLM2-135M weights). [default: random]"
        ),
    ] = None,
    dtype: Annotated[str | None, typer.Option(help="torch: float32 or bfloat16. [default: float32]")] = None,
    threads: Annotated[
        int | None, typer.Option(help="torch: intra-op threads per stage, as the engine runs. [default: 1]")
    ] = None,
    kv_tokens: Annotated[
        int | None,
        typer.Option(help="torch: KV pool per stage written into the profile, tokens. [default: 16384]"),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="torch: a coarse grid (fewer shapes, 2 repeats), about 4x faster.")
    ] = False,
    max_tokens: Annotated[
        int | None,
        typer.Option(help="torch: largest microbatch of the linear table, tokens. [default: 1024]"),
    ] = None,
    repeats: Annotated[
        int | None, typer.Option(help="torch: timed runs per shape at least (median kept). [default: 3]")
    ] = None,
    no_link: Annotated[
        bool,
        typer.Option(
            "--no-link",
            help="torch: skip the gloo link measurement (an assumed link is written and said so).",
        ),
    ] = False,
    concurrent_load: Annotated[
        bool,
        typer.Option(
            "--concurrent-load",
            help="torch, pp >= 2: time each stage while the other stages loop forward passes in their own processes, as they compute at once when serving.",
        ),
    ] = False,
) -> None:
    """Write a profile: analytic (roofline calibrated on measured GPU tables), measured on the CPU engine, or fitted to a recorded run (--from-records)."""
    if pp is not None and pp < 1:
        fail(f"--pp must be >= 1, got {pp}")
    if out is not None:
        writable_file(out, "--out", f"the JSON file's path, such as {out / 'profile.json'}")
    if from_records is not None:
        others = {
            "--backend": backend,
            "--gpu": gpu,
            "--deploy": deploy,
            "--pp": pp,
            "--weights": weights,
            "--dtype": dtype,
            "--threads": threads,
            "--kv-tokens": kv_tokens,
            "--max-tokens": max_tokens,
            "--repeats": repeats,
            "--quick": quick or None,
            "--no-link": no_link or None,
            "--concurrent-load": concurrent_load or None,
        }
        given_flags = [name for name, value in others.items() if value is not None]
        if given_flags:
            fail(
                f"{', '.join(given_flags)} cannot be combined with --from-records (the run's setup says what ran)"
            )
        _from_records(from_records, model, out)
        return
    backend = backend or "analytic"
    if backend not in BACKENDS:
        fail(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if deploy is not None and pp is not None:
        fail("give --deploy or --pp, not both")
    if backend == "analytic":
        torch_only = {
            "--weights": weights,
            "--dtype": dtype,
            "--threads": threads,
            "--kv-tokens": kv_tokens,
            "--max-tokens": max_tokens,
            "--repeats": repeats,
            "--quick": quick or None,
            "--no-link": no_link or None,
            "--concurrent-load": concurrent_load or None,
        }
        given = [name for name, value in torch_only.items() if value is not None]
        if given:
            fail(f"{', '.join(given)} apply to --backend torch only")
        _analytic(
            model or ANALYTIC_MODEL,
            gpu or ANALYTIC_GPU,
            deploy or (f"pp{pp}" if pp is not None else ANALYTIC_DEPLOY),
            out,
        )
        return
    if gpu is not None:
        fail("--gpu applies to --backend analytic only (the torch backend measures this machine's CPU)")
    _torch(
        model,
        deploy,
        pp,
        out,
        weights,
        dtype,
        threads,
        kv_tokens,
        quick,
        max_tokens,
        repeats,
        no_link,
        concurrent_load,
    )


def _save(profile, path: Path) -> None:
    """``save_profile``, failing with the path and the reason (not a traceback) on an OS error."""
    from fastpp.profile import save_profile

    try:
        save_profile(profile, path)
    except OSError as exc:
        fail(f"--out {path}: cannot write the profile ({exc.strerror or exc})")


def _from_records(run_dir: Path, model: str | None, out: Path | None) -> None:
    from fastpp.records_profile import profile_from_records
    from fastpp.sim.models import resolve_model

    if not run_dir.is_dir():
        fail(f"--from-records {run_dir}: not a folder")
    runs = [d for d in sorted(run_dir.iterdir()) if d.is_dir() and (d / "summary.json").is_file()]
    if runs and not (run_dir / "requests.jsonl").is_file() and not (run_dir / "requests.parquet").is_file():
        names = ", ".join(d.name for d in runs[:4]) + (" ..." if len(runs) > 4 else "")
        fail(
            f"--from-records {run_dir} holds {len(runs)} run folder(s) ({names}), one per "
            f"deployment: give one of them, e.g. --from-records {runs[0]}"
        )
    try:
        shape = None if model is None else resolve_model(model)
    except ValueError as exc:
        fail(f"--model: {exc}")
        return
    try:
        result = profile_from_records(run_dir, model=shape)
    except (OSError, ValueError) as exc:  # a missing file, or a field the fit needs
        fail(str(exc))
        return
    path = out or Path(f"{result.profile.name}.json")
    _save(result.profile, path)
    for line in result.summary_lines():
        console.print(line)
    console.print(f"wrote {path}; simulate with: fastpp simulate --profile {path}")


def _analytic(model: str, gpu: str, deploy: str, out: Path | None) -> None:
    from fastpp.sim.analytic import analytic_profile
    from fastpp.sim.run import parse_deployment

    try:
        pp, tp, _ = parse_deployment(deploy)
        prof = analytic_profile(model, gpu, pp, tp)
    except ValueError as exc:
        fail(str(exc))
        return
    path = out or Path(f"{prof.name}.json")
    _save(prof, path)
    st = prof.stages
    console.print(
        f"wrote {path}: {prof.model.name} on {prof.gpu} pp={pp} tp={tp}, "
        f"KV pool {prof.kv_capacity_tokens:,} tokens, stage layers {[s.num_layers for s in st]}"
    )


def _torch(
    model,
    deploy,
    pp,
    out,
    weights,
    dtype,
    threads,
    kv_tokens,
    quick,
    max_tokens,
    repeats,
    no_link,
    concurrent_load=False,
) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fastpp.sim.run import parse_deployment

    try:
        from fastpp.backends.torch.profile_config import ProfileGrid, TorchProfileConfig
        from fastpp.backends.torch.profiler import profile_torch, write_torch_profile
    except ImportError as exc:
        fail(f"--backend torch needs torch (pip install -e '.[torch]'): {exc}")
        return
    try:
        if deploy is not None:
            pp, tp, policy = parse_deployment(deploy)
            if tp != 1 or policy is not None:
                raise ValueError(f"--backend torch profiles pipeline stages only (ppN), got {deploy!r}")
        grid = ProfileGrid.quick() if quick else ProfileGrid()
        if max_tokens is not None:
            grid = grid.with_max_tokens(max_tokens)
        if repeats is not None:
            grid = replace(grid, repeats=repeats)
        config = TorchProfileConfig(
            **given(
                TorchProfileConfig,
                model=model,
                pp=pp,
                weights=weights,
                dtype=dtype,
                num_threads=threads,
                kv_capacity_tokens=kv_tokens,
                measure_link=False if no_link else None,
                concurrent_load=concurrent_load or None,
            ),
            grid=grid,
        )
    except ValueError as exc:
        fail(str(exc))
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        disable=not sys.stderr.isatty(),
    ) as bar:
        task = bar.add_task("profiling", total=None)
        try:
            result = profile_torch(
                config,
                progress=lambda what, done, total: bar.update(
                    task, description=f"profiling {what}", completed=done, total=total
                ),
            )
        except (ValueError, RuntimeError, OSError) as exc:
            fail(str(exc))
            return
    path = out or Path(f"{result.profile.name}.json")
    path = write_torch_profile(result, path)
    for line in result.summary_lines():
        console.print(line)
    console.print(f"wrote {path}; simulate with: fastpp simulate --profile {path}")

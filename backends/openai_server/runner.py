"""Start the engine and the HTTP server together; stop both, whichever fails first.

If a stage process dies or stalls, the engine fails every open request with an error, the
server logs which stage and why, stops accepting connections and returns exit code 1: no hang.
On SIGINT or SIGTERM it drains and returns 0 (lifecycle.py).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import uvicorn

from fastpp.backends.openai_server.app import ServerState, create_app
from fastpp.backends.openai_server.connections import guarded_protocol
from fastpp.backends.openai_server.lifecycle import DrainingServer, StopRequested, StopSignals, drain
from fastpp.backends.openai_server.serve_config import ServeConfig
from fastpp.backends.torch.engine import EngineConfig, PipelineEngine
from fastpp.backends.torch.model import split_layers
from fastpp.backends.torch.text import load_text
from fastpp.backends.torch.weights_source import WeightsSource
from fastpp.metrics import pipeline_fields, summarize
from fastpp.profile import DTYPE_BYTES
from fastpp.run_files import write_run
from fastpp.run_setup import SETUP_KEY, RunSetup

log = logging.getLogger("fastpp.serve")

CLOSE_WAIT_S = 3  # uvicorn: how long responses still going may take once the server closes


def run_server(source: WeightsSource, config: EngineConfig, serve: ServeConfig | None = None) -> int:
    """Serve until a stop signal (exit code 0) or until the engine fails (exit code 1).

    The checks that need no model (``serve.check()``) run first and raise ``ValueError``. With
    ``serve.record_dir`` (and ``config.record``), the run is written there once the engine has
    stopped, in the simulator's run-folder format (:func:`write_recorded_run`)."""
    serve = serve or ServeConfig()
    max_connections = serve.check()
    signals = StopSignals()
    signals.install()
    try:
        return _load_and_serve(source, config, serve, max_connections, signals)
    finally:
        signals.restore()


def _load_and_serve(
    source: WeightsSource,
    config: EngineConfig,
    serve: ServeConfig,
    max_connections: int,
    signals: StopSignals,
) -> int:
    engine: PipelineEngine | None = None
    try:
        log.info("loading %s: tokenizer", source.served_name)
        tokenizer, template = load_text(source)
        engine = PipelineEngine(source, replace(config, eos_token_id=tokenizer.eos_token_id))
        signals.on_exit_now = engine.kill_stages
        engine.start()
        signals.serving = True  # from now on a signal drains
    except StopRequested:
        if engine is not None:
            engine.shutdown(timeout_s=1.0)
        log.info("stopped before serving (%s)", signals.name)
        return 0
    state = ServerState(
        engine,
        tokenizer,
        template,
        source.served_name,
        serve.max_queue,
        api_key=serve.api_key,
        max_body_bytes=serve.max_body_bytes,
        read_timeout_s=serve.read_timeout_s,
    )
    forced = False

    async def drain_on_signal() -> None:
        nonlocal forced
        forced = await drain(state, engine, serve.shutdown_timeout_s, signals.name)

    uv_config = uvicorn.Config(
        create_app(state),
        host=serve.host,
        port=serve.port,
        log_level=serve.log_level,
        http=guarded_protocol(serve.read_timeout_s, max_connections),
        timeout_keep_alive=serve.keep_alive_s,  # type: ignore[arg-type]
        timeout_graceful_shutdown=CLOSE_WAIT_S,
        lifespan="off",
    )
    if serve.log_level == "info":  # uvicorn's start and stop lines: ours say it
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    server = DrainingServer(uv_config, signals, drain_on_signal)

    def on_failure(message: str) -> None:
        log.error("stopping the server: %s", message)
        state.draining = True
        server.should_exit = True

    engine.on_failure(on_failure)
    _warn_short_kv(engine, config)
    log.info(
        "serving %s on http://%s:%d (%d stage(s), policy %s%s); Ctrl-C stops it",
        source.served_name,
        serve.host,
        serve.port,
        config.num_stages,
        config.policy,
        ", API key required on /v1" if serve.api_key else "",
    )
    try:
        server.run()
    finally:
        signals.serving, signals.stopping = False, True  # a signal from here on exits at once
        state.tokenizer_pool.shutdown(wait=False, cancel_futures=True)
        engine.shutdown(timeout_s=10.0)
        if serve.record_dir is not None:
            try:
                write_recorded_run(engine, serve.record_dir)
            except OSError as exc:  # checked before loading; the disk may still fill up
                log.error("could not write the record dir %s: %s", serve.record_dir, exc)
        _log_stopped(engine, config, signals, forced)
    failed = engine.error is not None and not forced
    if failed:
        log.error("engine failed: %s", engine.error)
        return 1
    return 0


def _warn_short_kv(engine: PipelineEngine, config: EngineConfig) -> None:
    """A warning when the KV cache holds fewer tokens than the model's context: then it, not the
    context, bounds every request (and the max_model_len /v1/models reports)."""
    kv_tokens = engine.scheduler_config.kv_capacity_tokens
    context = engine.model_config.max_context
    if kv_tokens < context:
        log.warning(
            "the KV cache holds %d tokens (--kv-blocks %d x --block-size %d), fewer than the model's "
            "context of %d: a request's prompt + output is limited to %d tokens (max_model_len)",
            kv_tokens,
            config.kv_blocks,
            config.block_size,
            context,
            kv_tokens,
        )


def _log_stopped(engine: PipelineEngine, config: EngineConfig, signals: StopSignals, forced: bool) -> None:
    kv = (
        f"free KV blocks per stage at shutdown: {engine.final_free_blocks} of {config.kv_blocks}"
        if engine.final_free_blocks is not None
        else "stage KV not reported (the pipeline failed)"
    )
    how = f"on {signals.name}" if signals.name else "after an engine failure"
    extra = "; the stage processes were killed (they did not hand back their work)" if forced else ""
    log.info("stopped %s: %s%s", how, kv, extra)


def write_recorded_run(engine: PipelineEngine, out: Path) -> None:
    """What a simulation run writes, for a real one (``fastpp.run_files``): compare them file by
    file, or turn it into a profile."""
    records = sorted(engine.recorded_requests, key=lambda r: r.req_id)
    iterations = engine.recorded_iterations
    summary = summarize(records, slo=engine.config.slo, backend="fastpp-torch") if records else {}
    if records:
        start = min(r.arrived_at for r in records)
        end = max(r.finished_at for r in records if r.finished_at is not None)
        summary.update(
            pp=engine.config.num_stages,
            policy=engine.config.policy,
            num_microbatches=len({it.mb_id for it in iterations}),
            **pipeline_fields(engine.stage_busy_s, start, end),
        )
    summary[SETUP_KEY] = engine_setup(engine).to_dict()
    write_run(
        out, records, iterations, summary, stage_names=[f"stage {i}" for i in range(engine.config.num_stages)]
    )
    log.info("wrote %d requests and %d stage iterations to %s", len(records), len(iterations), out)


def engine_setup(engine: PipelineEngine) -> RunSetup:
    """What ran: the run folder's ``setup`` (fastpp.run_setup), from which a profile can be fitted."""
    cfg = engine.config
    model = engine.model_config
    layers = split_layers(model.num_layers, cfg.num_stages)
    return RunSetup(
        engine="fastpp-torch",
        device="CPU",
        pp=cfg.num_stages,
        tp=1,
        policy=cfg.policy,
        scheduler=engine.scheduler_config,
        model=model.to_model_shape(DTYPE_BYTES[cfg.dtype]),
        layers_per_stage=tuple(len(r) for r in layers),
        dtype=cfg.dtype,
    )

"""Start the engine and the HTTP server together; stop both, whichever fails first.

If a stage process dies, the engine fails every open request with an error, the server logs
which stage died and why, stops accepting connections and returns exit code 1: no hang.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import uvicorn

from fastpp.backends.openai_server.app import ServerState, create_app
from fastpp.backends.torch.engine import EngineConfig, PipelineEngine
from fastpp.backends.torch.model import split_layers
from fastpp.backends.torch.text import load_text
from fastpp.backends.torch.weights_source import WeightsSource
from fastpp.metrics import pipeline_fields, summarize
from fastpp.profile import DTYPE_BYTES
from fastpp.run_files import write_run
from fastpp.run_setup import SETUP_KEY, RunSetup

log = logging.getLogger("fastpp.serve")

GRACEFUL_SHUTDOWN_S = 5


def run_server(source: WeightsSource, config: EngineConfig, host: str = "127.0.0.1", port: int = 8000,
               max_queue: int = 256, log_level: str = "info", record_dir: Path | None = None,
               api_key: str | None = None) -> int:
    """Serve until interrupted (exit code 0) or until the engine fails (exit code 1).

    With ``record_dir`` (and ``config.record``), the run is written there once the engine has
    stopped, in the simulator's run-folder format (:func:`write_recorded_run`). With ``api_key``,
    /v1/* needs ``Authorization: Bearer <api_key>``."""
    tokenizer, template = load_text(source)
    engine = PipelineEngine(source, replace(config, eos_token_id=tokenizer.eos_token_id))
    engine.start()
    state = ServerState(engine, tokenizer, template, source.served_name, max_queue, api_key=api_key)
    server = uvicorn.Server(uvicorn.Config(create_app(state), host=host, port=port, log_level=log_level,
                                           timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S))

    def on_failure(message: str) -> None:
        log.error("stopping the server: %s", message)
        server.should_exit = True

    engine.on_failure(on_failure)
    log.info("serving %s on http://%s:%d (%d stage(s), policy %s%s)", source.served_name, host, port,
             config.num_stages, config.policy, ", API key required on /v1" if api_key else "")
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it already handled: a normal stop
        pass
    finally:
        state.tokenizer_pool.shutdown(wait=False, cancel_futures=True)
        engine.shutdown()
        if engine.final_free_blocks is not None:
            log.info("free KV blocks per stage at shutdown: %s of %d", engine.final_free_blocks,
                     config.kv_blocks)
        if record_dir is not None:
            write_recorded_run(engine, record_dir)
    if engine.error is not None:
        log.error("engine failed: %s", engine.error)
        return 1
    return 0


def write_recorded_run(engine: PipelineEngine, out: Path) -> None:
    """What a simulation run writes, for a real one (``fastpp.run_files``): compare them file by
    file, or turn it into a profile."""
    records = sorted(engine.recorded_requests, key=lambda r: r.req_id)
    iterations = engine.recorded_iterations
    summary = summarize(records, slo=engine.config.slo, backend="fastpp-torch") if records else {}
    if records:
        start = min(r.arrived_at for r in records)
        end = max(r.finished_at for r in records if r.finished_at is not None)
        summary.update(pp=engine.config.num_stages, policy=engine.config.policy,
                       num_microbatches=len({it.mb_id for it in iterations}),
                       **pipeline_fields(engine.stage_busy_s, start, end))
    summary[SETUP_KEY] = engine_setup(engine).to_dict()
    write_run(out, records, iterations, summary,
              stage_names=[f"stage {i}" for i in range(engine.config.num_stages)])
    log.info("wrote %d requests and %d stage iterations to %s", len(records), len(iterations), out)


def engine_setup(engine: PipelineEngine) -> RunSetup:
    """What ran: the run folder's ``setup`` (fastpp.run_setup), from which a profile can be fitted."""
    cfg = engine.config
    model = engine.model_config
    layers = split_layers(model.num_layers, cfg.num_stages)
    return RunSetup(engine="fastpp-torch", device="CPU", pp=cfg.num_stages, tp=1, policy=cfg.policy,
                    scheduler=engine.scheduler_config,
                    model=model.to_model_shape(DTYPE_BYTES[cfg.dtype]),
                    layers_per_stage=tuple(len(r) for r in layers), dtype=cfg.dtype)

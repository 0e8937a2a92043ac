"""Start the engine and the HTTP server together; stop both, whichever fails first.

If a stage process dies, the engine fails every open request with an error, the server logs
which stage died and why, stops accepting connections and returns exit code 1: no hang.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import uvicorn

from fastpp.backends.openai_server.app import ServerState, create_app
from fastpp.backends.torch.engine import EngineConfig, PipelineEngine
from fastpp.backends.torch.text import load_text
from fastpp.backends.torch.weights_source import WeightsSource

log = logging.getLogger("fastpp.serve")

GRACEFUL_SHUTDOWN_S = 5


def run_server(source: WeightsSource, config: EngineConfig, host: str = "127.0.0.1", port: int = 8000,
               max_queue: int = 256, log_level: str = "info",
               on_stop: Callable[[PipelineEngine], None] | None = None, api_key: str | None = None) -> int:
    """Serve until interrupted (exit code 0) or until the engine fails (exit code 1).

    ``on_stop(engine)`` runs once the engine has stopped (e.g. to write its recorded runs);
    ``api_key``: /v1/* then needs ``Authorization: Bearer <api_key>``."""
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
        if on_stop is not None:
            on_stop(engine)
    if engine.error is not None:
        log.error("engine failed: %s", engine.error)
        return 1
    return 0

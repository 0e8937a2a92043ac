"""FastAPI routes: /v1/completions, /v1/chat/completions (SSE streaming, usage), /v1/models,
/health and /metrics, with OpenAI-style error bodies for every 4xx and 5xx answer."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fastpp.backends.openai_server.generation import ClientDisconnected, Delta, Generation
from fastpp.backends.openai_server.metrics import render
from fastpp.backends.openai_server.protocol import APIError, GenerationRequest, parse_chat, parse_completion
from fastpp.backends.torch.engine import EngineDeadError
from fastpp.backends.torch.text import ChatTemplate, Tokenizer

log = logging.getLogger(__name__)

CLIENT_CLOSED = 499  # nginx's "client closed request": logged for a non-streamed request whose client left


@dataclass
class ServerState:
    engine: Any  # a PipelineEngine
    tokenizer: Tokenizer
    template: ChatTemplate
    model_name: str
    max_queue: int  # answer 503 when this many requests wait for admission
    created: int = field(default_factory=lambda: int(time.time()))
    http_counts: dict[int, int] = field(default_factory=dict)

    def count(self, status: int) -> None:
        self.http_counts[status] = self.http_counts.get(status, 0) + 1


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="fastpp", docs_url=None, redoc_url=None)
    app.state.fastpp = state

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        state.count(exc.status)
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(APIError(exc.status_code, str(exc.detail), type_=kind).body(),
                            status_code=exc.status_code)

    @app.get("/health")
    async def health() -> Response:
        eng = state.engine
        if not eng.is_alive:
            return JSONResponse({"status": "error", "error": eng.error or "engine stopped"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": state.created, "owned_by": "fastpp",
            "max_model_len": state.engine.model_config.max_context}]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(render(state.engine, state.model_name, state.http_counts),
                                 media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = parse_completion(await _json(request))
        if req.prompt_ids is not None:
            ids = list(req.prompt_ids)
        else:
            ids = state.tokenizer.encode(req.prompt_text or "")
        return await _respond(state, request, req, ids, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        req, messages = parse_chat(await _json(request))
        ids = state.tokenizer.encode(state.template.render(messages))
        return await _respond(state, request, req, ids, chat=True)

    return app


async def _json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}") from None


async def _respond(state: ServerState, request: Request, req: GenerationRequest, ids: list[int],
                   chat: bool) -> Response:
    eng = state.engine
    if req.model is not None and req.model != state.model_name:
        raise APIError(404, f"model {req.model!r} does not exist; this server serves {state.model_name!r}",
                       param="model", type_="not_found_error", code="model_not_found")
    if not eng.is_alive:
        raise APIError(503, f"engine stopped: {eng.error or 'shutting down'}", type_="server_error")
    if eng.num_queued >= state.max_queue:
        raise APIError(503, f"server overloaded: {eng.num_queued} requests waiting "
                       f"(limit {state.max_queue}); retry later", type_="server_overloaded",
                       code="queue_full")
    try:
        eng.check_prompt(ids)
    except ValueError as exc:
        raise APIError(400, str(exc), param="messages" if chat else "prompt",
                       code="context_length_exceeded" if "fit" in str(exc) else None) from None
    gen = Generation(eng, state.tokenizer, req, ids, request.is_disconnected)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    if req.stream:
        state.count(200)
        return StreamingResponse(_sse(state, gen, rid, created, chat), media_type="text/event-stream")
    try:
        text, finish = [], None
        async for d in gen.stream():
            text.append(d.text)
            finish = d.finish_reason
    except EngineDeadError as exc:
        raise APIError(503, f"engine stopped: {exc}", type_="server_error") from None
    except ClientDisconnected:
        state.count(CLIENT_CLOSED)
        return Response(status_code=CLIENT_CLOSED)  # nobody reads it; the request was aborted
    state.count(200)
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": "".join(text)}
    else:
        choice["text"] = "".join(text)
    return JSONResponse({"id": rid, "object": "chat.completion" if chat else "text_completion",
                         "created": created, "model": state.model_name, "choices": [choice],
                         "usage": _usage(len(ids), gen.completion_tokens)})


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


async def _sse(state: ServerState, gen: Generation, rid: str, created: int, chat: bool) -> AsyncIterator[str]:
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(choices: list[dict], usage: dict | None = None) -> str:
        body: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": state.model_name,
                                "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    def choice(d: Delta, first: bool) -> dict[str, Any]:
        c: dict[str, Any] = {"index": 0, "finish_reason": d.finish_reason, "logprobs": None}
        if chat:
            c["delta"] = ({"role": "assistant"} if first else {}) | ({"content": d.text} if d.text or first
                                                                     else {})
        else:
            c["text"] = d.text
        return c

    first = True
    try:
        async for d in gen.stream():
            yield chunk([choice(d, first)])
            first = False
    except (APIError, EngineDeadError) as exc:
        err = exc if isinstance(exc, APIError) else APIError(503, str(exc), type_="server_error")
        yield f"data: {json.dumps(err.body())}\n\n"
    else:
        if gen.req.include_usage:
            yield chunk([], _usage(len(gen.prompt_ids), gen.completion_tokens))
    yield "data: [DONE]\n\n"

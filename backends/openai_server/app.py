"""FastAPI routes: /v1/completions, /v1/chat/completions (SSE streaming, usage), /v1/models,
/health and /metrics, with OpenAI-style error bodies for every 4xx and 5xx answer.

A generation request goes: body (413 past the size limit, read whole by the guard) -> JSON and
fields, parsed and checked in a worker thread so that no body can hold up the event loop (400
if malformed, nested too deep, not valid Unicode text, or naming the field) -> tokenizing in a
worker thread, after a context check
that needs no tokenizing where the tokenizer allows one -> prompt and ``max_tokens`` against
the context (400) -> queue limit (503) -> submitted to the engine -> the response. Nothing
before the response can start streaming, so a streamed request is admitted or refused with a
plain status like any other.

While the server stops (``draining``), /health answers 503 and new generations get 503; the
ones under way go on until the runner ends them (lifecycle.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fastpp.backends.openai_server.generation import ClientDisconnected, Delta, Generation, fit_output_budget
from fastpp.backends.openai_server.guard import RequestGuard
from fastpp.backends.openai_server.metrics import make_registry, render
from fastpp.backends.openai_server.protocol import (
    APIError,
    GenerationRequest,
    first_invalid_text,
    parse_chat,
    parse_completion,
)
from fastpp.backends.torch.engine import EngineDeadError
from fastpp.backends.torch.text import ChatTemplate, Tokenizer

log = logging.getLogger(__name__)

CLIENT_CLOSED = 499  # nginx's "client closed request": logged for a non-streamed request whose client left
TOKENIZER_THREADS = 2  # parsing and tokenizing run here, off the event loop


@dataclass
class ServerState:
    engine: Any  # a PipelineEngine
    tokenizer: Tokenizer
    template: ChatTemplate
    model_name: str
    max_queue: int  # answer 503 when this many requests wait for admission
    api_key: str | None = None  # /v1/* needs "Authorization: Bearer <api_key>" when set
    created: int = field(default_factory=lambda: int(time.time()))
    http_counts: dict[int, int] = field(default_factory=dict)
    tokenizer_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="fastpp-tokenize")
    )
    max_body_bytes: int = 4 * 1024 * 1024  # a larger body gets 413 (guard.py)
    read_timeout_s: float = 30.0  # a body not in this long after its headers gets 408
    draining: bool = False  # stopping: admit nothing new, /health says so
    open_responses: int = 0  # generations submitted whose response has not ended

    def count(self, status: int) -> None:
        self.http_counts[status] = self.http_counts.get(status, 0) + 1


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="fastpp", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.fastpp = state
    app.add_middleware(
        RequestGuard,
        api_key=state.api_key,
        count=state.count,
        max_body_bytes=state.max_body_bytes,
        read_timeout_s=state.read_timeout_s,
    )
    registry = make_registry(state.engine, state.model_name, state.http_counts)

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(
            APIError(exc.status_code, str(exc.detail), type_=kind).body(), status_code=exc.status_code
        )

    @app.get("/health")
    async def health() -> Response:
        eng = state.engine
        if not eng.is_alive:
            return JSONResponse({"status": "error", "error": eng.error or "engine stopped"}, status_code=503)
        if state.draining:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> dict:
        return {
            "object": "list",
            "data": [
                {
                    "id": state.model_name,
                    "object": "model",
                    "created": state.created,
                    "owned_by": "fastpp",
                    "max_model_len": max_model_len(state.engine),
                }
            ],
        }

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        page, content_type = render(registry, request.headers.get("accept"))
        return Response(page, media_type=content_type)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        req = await _parse(state, request, parse_completion)
        _check_model(state, req)
        if req.prompt_ids is not None:
            ids = list(req.prompt_ids)
        else:
            ids = await _tokenize(state, req, req.prompt_text or "", "prompt")
        return await _respond(state, request, req, ids, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        req, messages = await _parse(state, request, parse_chat)
        _check_model(state, req)
        try:
            pieces = state.template.pieces(messages)  # user text never becomes special tokens
        except ValueError as exc:  # the model's chat template refused the conversation
            raise APIError(400, str(exc), param="messages") from None
        add = state.template.add_special_tokens
        ids = await _tokenize(
            state,
            req,
            "".join(text for text, _ in pieces),
            "messages",
            lambda: state.tokenizer.encode_chat(pieces, add),
        )
        return await _respond(state, request, req, ids, chat=True)

    return app


def max_model_len(engine: Any) -> int:
    """The longest sequence (prompt + output) the server can hold: the model's context, or the
    KV cache's capacity in tokens when that is smaller (``--kv-blocks x --block-size``). A
    request within it is never refused for its length, and one without ``max_tokens`` stops at
    it. (The last output token's KV is never stored: an explicit ``max_tokens`` may reach one
    token past the KV capacity.)"""
    return min(engine.model_config.max_context, engine.scheduler_config.kv_capacity_tokens)


async def _parse(state: ServerState, request: Request, parse: Any) -> Any:
    """``parse(body as JSON)`` in a worker thread (the body's size is bounded by the guard)."""
    raw = await request.body()
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(state.tokenizer_pool, lambda: parse(_json(raw)))


def _json(raw: bytes) -> Any:
    try:
        body = json.loads(raw)
    except RecursionError:
        raise APIError(400, "request body is nested too deeply to parse") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise APIError(400, f"request body is not valid JSON: {exc}") from None
    where = first_invalid_text(body)
    if where is not None:
        raise APIError(
            400,
            f"'{where}': contains a lone UTF-16 surrogate (\\ud800-\\udfff), which is not valid Unicode text",
            param=where,
        )
    return body


def _check_model(state: ServerState, req: GenerationRequest) -> None:
    if req.model is not None and req.model != state.model_name:
        raise APIError(
            404,
            f"model {req.model!r} does not exist; this server serves {state.model_name!r}",
            param="model",
            type_="not_found_error",
            code="model_not_found",
        )


def _check_queue(state: ServerState) -> None:
    eng = state.engine
    if not eng.is_alive:
        raise APIError(503, f"engine stopped: {eng.error or 'shutting down'}", type_="server_error")
    if state.draining:
        raise APIError(
            503,
            "the server is shutting down; retry on another replica or later",
            type_="server_error",
            code="shutting_down",
        )
    if eng.num_queued >= state.max_queue:
        raise APIError(
            503,
            f"server overloaded: {eng.num_queued} requests waiting (limit {state.max_queue}); retry later",
            type_="server_overloaded",
            code="queue_full",
        )


async def _tokenize(
    state: ServerState,
    req: GenerationRequest,
    text: str,
    param: str,
    encode: Callable[[], list[int]] | None = None,
) -> list[int]:
    """The text's token ids (``encode()`` when given), encoded in a worker thread; a text (or a
    max_tokens) that cannot fit the context by its length alone is refused first, without
    encoding it."""
    limit = state.engine.model_config.max_context
    at_least = state.tokenizer.min_tokens(text)
    if at_least >= limit:
        raise APIError(
            400,
            f"prompt of at least {at_least} tokens ({len(text)} characters) does not fit "
            f"the context of {limit} tokens",
            param=param,
            code="context_length_exceeded",
        )
    _max_tokens(state, req, max(at_least, 1))  # 400 now if even the shortest prompt leaves no room
    _check_queue(state)  # refuse early, before spending a worker on it
    loop = asyncio.get_running_loop()
    if encode is None:
        return await loop.run_in_executor(state.tokenizer_pool, state.tokenizer.encode, text)
    return await loop.run_in_executor(state.tokenizer_pool, encode)


def _max_tokens(state: ServerState, req: GenerationRequest, prompt_len: int) -> int:
    """The output budget: as asked, refused if prompt + it exceed the context or the KV pool
    (before the queue check: a request that can never run is a 400 under any load); when not
    asked, ``req.default_max_tokens`` within what max_model_len leaves, or all it leaves when
    that is None (chat: the request ends by length at the limit, not with an error)."""
    limit = state.engine.model_config.max_context
    room = limit - prompt_len
    if req.max_tokens is None:
        left = max_model_len(state.engine) - prompt_len
        wanted = left if req.default_max_tokens is None else min(req.default_max_tokens, left)
        return fit_output_budget(state.engine, req, prompt_len, max(1, wanted))
    if req.max_tokens > room:
        raise APIError(
            400,
            f"'{req.max_tokens_param}': {req.max_tokens} output tokens after a prompt of "
            f"{prompt_len} tokens exceed the context of {limit} tokens (at most {room})",
            param=req.max_tokens_param,
            code="context_length_exceeded",
        )
    return fit_output_budget(state.engine, req, prompt_len, req.max_tokens)


async def _respond(
    state: ServerState, request: Request, req: GenerationRequest, ids: list[int], chat: bool
) -> Response:
    eng = state.engine
    param = "messages" if chat else "prompt"
    try:
        eng.check_prompt(ids)
    except ValueError as exc:
        raise APIError(
            400, str(exc), param=param, code="context_length_exceeded" if "fit" in str(exc) else None
        ) from None
    try:
        gen = Generation(
            eng, state.tokenizer, req, ids, _max_tokens(state, req, len(ids)), request.is_disconnected
        )
    except ValueError as exc:  # the sampler's own checks, should the protocol's ever differ
        raise APIError(400, str(exc)) from None
    # the queue check and the submission with no await between: a burst cannot overshoot the limit
    _check_queue(state)
    try:
        gen.start()
    except EngineDeadError as exc:
        raise APIError(503, f"engine stopped: {exc}", type_="server_error") from None
    except ValueError as exc:
        raise APIError(400, str(exc), param=param) from None
    state.open_responses += 1  # back down when the response ends, however it ends
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    if req.stream:
        return _GenerationStream(
            state, gen, _sse(state, gen, rid, created, chat), media_type="text/event-stream"
        )
    try:
        text, finish = [], None
        async for d in gen.stream():
            text.append(d.text)
            finish = d.finish_reason
    except EngineDeadError as exc:
        raise APIError(503, f"engine stopped: {exc}", type_="server_error") from None
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)  # nobody reads it; the request was aborted
    finally:
        gen.close()
        state.open_responses -= 1
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": "".join(text)}
    else:
        choice["text"] = "".join(text)
    return JSONResponse(
        {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": state.model_name,
            "choices": [choice],
            "usage": _usage(len(ids), gen.completion_tokens),
        }
    )


class _GenerationStream(StreamingResponse):
    """An SSE response that aborts its generation however the response ends, even if the body
    iterator never started (a client gone before the first byte)."""

    def __init__(
        self, state: ServerState, gen: Generation, content: AsyncIterator[str], media_type: str
    ) -> None:
        super().__init__(content, media_type=media_type)
        self.state = state
        self.gen = gen

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.gen.close()
            self.state.open_responses -= 1


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


async def _sse(state: ServerState, gen: Generation, rid: str, created: int, chat: bool) -> AsyncIterator[str]:
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(choices: list[dict], usage: dict | None = None) -> str:
        body: dict[str, Any] = {
            "id": rid,
            "object": obj,
            "created": created,
            "model": state.model_name,
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = usage
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    def choice(d: Delta, first: bool) -> dict[str, Any]:
        c: dict[str, Any] = {"index": 0, "finish_reason": d.finish_reason, "logprobs": None}
        if chat:
            c["delta"] = ({"role": "assistant"} if first else {}) | (
                {"content": d.text} if d.text or first else {}
            )
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
    except ClientDisconnected:
        return
    except Exception as exc:  # a bug: say so in the stream and end it properly, rather than cut it
        log.exception("streamed request %s failed", rid)
        err = APIError(500, f"internal server error: {exc}", type_="server_error")
        yield f"data: {json.dumps(err.body())}\n\n"
    else:
        if gen.req.include_usage:
            yield chunk([], _usage(len(gen.prompt_ids), gen.completion_tokens))
    yield "data: [DONE]\n\n"

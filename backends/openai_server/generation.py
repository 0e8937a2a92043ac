"""One generation on the engine, as an async stream of text deltas (engine thread -> event loop).

Stop strings are matched on the detokenized text: the text is cut before the match, the engine
request is ended at once (freeing its KV; counted and recorded as ``stop``; a match in the last
token of a request that ended by length relabels it ``stop``) and the finish reason is ``stop``.
While streaming, the last
``len(longest stop) - 1`` characters are held back, so a stop string split across tokens never
leaks out.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from fastpp.backends.openai_server.protocol import APIError, GenerationRequest
from fastpp.backends.torch.engine_state import EngineEvent
from fastpp.backends.torch.sampling import SamplingParams
from fastpp.backends.torch.text import Tokenizer

IDLE_CHECK_S = 0.5  # how often a non-streamed request checks that its client is still there


class ClientDisconnected(Exception):
    """The client of a non-streamed request closed its connection; the request was aborted."""


@dataclass(slots=True)
class Delta:
    text: str
    finish_reason: str | None = None  # set on the last delta: length or stop
    completion_tokens: int = 0  # tokens generated so far


class Generation:
    """One request: ``start()`` submits it to the engine, ``stream()`` yields its :class:`Delta` s,
    ``close()`` aborts it unless it ended (call it however the response ends: it is idempotent).

    The sampling parameters are built on construction, so a ``ValueError`` there (naming the
    field) comes before any response has started; so does the :class:`APIError` (400, naming
    the field and the limit) for a ``max_tokens`` the KV pool cannot hold, which the engine would
    otherwise cap silently. A ``max_tokens`` the client did not send is fitted to the pool.
    """

    def __init__(
        self,
        engine,
        tokenizer: Tokenizer,
        req: GenerationRequest,
        prompt_ids: list[int],
        max_tokens: int,
        is_disconnected: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.engine = engine
        self.req = req
        self.prompt_ids = prompt_ids
        max_tokens = fit_output_budget(engine, req, len(prompt_ids), max_tokens)
        vocab = engine.model_config.vocab_size
        outside = next((t for t in req.stop_token_ids if not 0 <= t < vocab), None)
        if outside is not None:
            raise APIError(
                400,
                f"'stop_token_ids': token id {outside} is outside the vocabulary 0..{vocab - 1}",
                param="stop_token_ids",
            )
        self.params = SamplingParams(
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos,
            text_stops=bool(req.stop),
        )
        self.detok = tokenizer.stream_decoder()
        self.is_disconnected = is_disconnected
        self.completion_tokens = 0
        self.req_id: int | None = None
        self._events: asyncio.Queue[EngineEvent] | None = None
        self._done = False
        self._checked_at = 0.0  # event-loop time of the last disconnect check

    def start(self) -> None:
        """Submit to the engine now (from the event loop); raises what ``engine.submit`` raises."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[EngineEvent] = asyncio.Queue()
        self._events = events
        self.req_id = self.engine.submit(
            self.prompt_ids, self.params, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev)
        )

    def _stop(self) -> None:
        """End the request in the engine as stopped by a stop string (the engine relabels a
        request that ended by length with the stop string in its last token)."""
        if self.req_id is not None:
            self._done = True
            self.engine.stop(self.req_id)

    def close(self) -> None:
        """Abort the request in the engine unless it already ended (frees its KV)."""
        if self.req_id is not None and not self._done:
            self._done = True
            self.engine.abort(self.req_id)

    async def stream(self) -> AsyncIterator[Delta]:
        assert self._events is not None, "start() first"
        hold = max((len(s) for s in self.req.stop), default=1) - 1
        pending = ""  # decoded, not yet yielded
        try:
            while True:
                ev = await self._next(self._events)
                self.completion_tokens += len(ev.token_ids)
                pending += self.detok.feed(ev.token_ids)
                if ev.finish_reason is not None:
                    self._done = True
                    pending += self.detok.flush()
                cut = self._find_stop(pending)
                if cut is not None:
                    self._stop()
                    yield Delta(pending[:cut], "stop", self.completion_tokens)
                    return
                if ev.finish_reason is not None:
                    yield Delta(pending, self._finish(ev), self.completion_tokens)
                    return
                emit = len(pending) - hold if self.req.stop else len(pending)
                if emit > 0:
                    yield Delta(pending[:emit], None, self.completion_tokens)
                    pending = pending[emit:]
        finally:
            self.close()  # the client went away or the server is stopping

    async def _next(self, events: asyncio.Queue[EngineEvent]) -> EngineEvent:
        """The next event; every ``IDLE_CHECK_S`` (busy or not) checks that the client is there."""
        loop = asyncio.get_running_loop()
        while True:
            if self.is_disconnected is not None and loop.time() - self._checked_at >= IDLE_CHECK_S:
                self._checked_at = loop.time()
                if await self.is_disconnected():
                    raise ClientDisconnected(f"request {self.req_id}: the client went away")
            try:
                return await asyncio.wait_for(events.get(), IDLE_CHECK_S)
            except TimeoutError:
                continue

    def _find_stop(self, text: str) -> int | None:
        hits = [i for i in (text.find(s) for s in self.req.stop) if i >= 0]
        return min(hits) if hits else None

    def _finish(self, ev: EngineEvent) -> str:
        if ev.finish_reason in ("length", "stop"):
            return ev.finish_reason
        if ev.finish_reason == "rejected":
            raise APIError(400, ev.detail, param="prompt")
        if ev.finish_reason == "error" and self.engine.is_alive:  # this request's own failure
            raise APIError(500, f"request failed: {ev.detail}", type_="server_error")
        if ev.finish_reason == "error":
            raise APIError(503, f"engine failed: {ev.detail}", type_="server_error")
        raise APIError(
            503,
            f"request {ev.finish_reason}: {ev.detail or 'the server is shutting down'}",
            type_="server_error",
        )


def fit_output_budget(engine, req: GenerationRequest, prompt_len: int, max_tokens: int) -> int:
    """``max_tokens`` if the engine can generate that many after the prompt; else a 400 naming
    the field and the limit when the client asked for it, or the limit when the server chose it."""
    room = engine.output_room(prompt_len)
    if max_tokens <= room:
        return max_tokens
    if req.max_tokens is None:
        return max(1, room)
    param = req.max_tokens_param
    raise APIError(
        400,
        f"'{param}': {max_tokens} output tokens after a prompt of {prompt_len} tokens do not "
        f"fit this server's KV cache of {engine.scheduler_config.kv_capacity_tokens} tokens "
        f"(at most {room})",
        param=param,
        code="context_length_exceeded",
    )

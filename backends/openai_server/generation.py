"""One generation on the engine, as an async stream of text deltas (engine thread -> event loop).

Stop strings are matched on the detokenized text: the text is cut before the match, the engine
request is aborted (freeing its KV) and the finish reason is ``stop``. While streaming, the last
``len(longest stop) - 1`` characters are held back, so a stop string split across tokens never
leaks out.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from fastpp.backends.openai_server.detokenize import Detokenizer
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
    """Submits one request and yields its :class:`Delta` s; aborts it if the consumer goes away."""

    def __init__(self, engine, tokenizer: Tokenizer, req: GenerationRequest, prompt_ids: list[int],
                 is_disconnected: Callable[[], Awaitable[bool]] | None = None) -> None:
        self.engine = engine
        self.req = req
        self.prompt_ids = prompt_ids
        self.detok = Detokenizer(tokenizer)
        self.is_disconnected = is_disconnected
        self.completion_tokens = 0
        self.req_id: int | None = None
        self._done = False
        self._checked_at = 0.0  # event-loop time of the last disconnect check

    def params(self) -> SamplingParams:
        r = self.req
        return SamplingParams(max_tokens=r.max_tokens, temperature=r.temperature, top_p=r.top_p, seed=r.seed,
                              stop_token_ids=r.stop_token_ids, ignore_eos=r.ignore_eos)

    async def stream(self) -> AsyncIterator[Delta]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[EngineEvent] = asyncio.Queue()
        self.req_id = self.engine.submit(self.prompt_ids, self.params(),
                                         lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev))
        hold = max((len(s) for s in self.req.stop), default=1) - 1
        pending = ""  # decoded, not yet yielded
        try:
            while True:
                ev = await self._next(events)
                self.completion_tokens += len(ev.token_ids)
                pending += self.detok.feed(ev.token_ids)
                if ev.finish_reason is not None:
                    self._done = True
                    pending += self.detok.flush()
                cut = self._find_stop(pending)
                if cut is not None:
                    if not self._done:
                        self.engine.abort(self.req_id)
                        self._done = True
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
            if not self._done:  # the client went away or the server is stopping
                self.engine.abort(self.req_id)

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

    @staticmethod
    def _finish(ev: EngineEvent) -> str:
        if ev.finish_reason in ("length", "stop"):
            return ev.finish_reason
        if ev.finish_reason == "rejected":
            raise APIError(400, ev.detail, param="prompt")
        if ev.finish_reason == "error":
            raise APIError(503, f"engine failed: {ev.detail}", type_="server_error")
        raise APIError(503, f"request {ev.finish_reason}: {ev.detail or 'the server is shutting down'}",
                       type_="server_error")

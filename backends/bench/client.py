"""The HTTP side of ``fastpp bench``: stream one OpenAI-style request into a RequestRecord.

Timing follows ``sglang.benchmark.serving``: a request's clock starts when it is sent (after any
concurrency wait), every non-empty content chunk is one token time (a chunk may carry several
tokens; ``usage.completion_tokens`` then gives the true output length), and the request ends when
the stream does (``data: [DONE]``). Times are seconds on the run's clock (``clock()``).
Failures never raise: they become ``FinishReason.ABORTED`` with the reason in ``detail`` (the
runner counts them as failed, apart from the requests a stop cancelled).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from fastpp.backends.bench.config import Backend
from fastpp.types import FinishReason, RequestRecord

_FINISH = {"length": FinishReason.LENGTH, "stop": FinishReason.STOP}
_MAX_ERROR_CHARS = 500  # error bodies are kept per request; cap them


class StreamError(Exception):
    """A request that failed after it was sent; the message goes to RequestRecord.detail."""


def error_message(body: str) -> str:
    """The ``message`` of an OpenAI-style (``{"error": {...}}``) or SGLang-style
    (``{"object": "error", "message": ...}``) error body; else the body itself, capped."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:_MAX_ERROR_CHARS]
        if isinstance(err, str):
            return err[:_MAX_ERROR_CHARS]
    return body.strip()[:_MAX_ERROR_CHARS] or "(empty body)"


def _delta_text(choice: dict[str, Any]) -> str:
    """The generated text a streamed choice carries: ``text`` (completions) or
    ``delta.content`` / ``delta.reasoning_content`` (chat; reasoning models stream their
    thinking in the latter, and those tokens count as output too)."""
    if "text" in choice:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")


@dataclass(slots=True)
class _Stream:
    """What one response stream said so far."""

    token_times: list[float]
    texts: list[str] = field(default_factory=list)  # the generated text, chunk by chunk
    finish: str | None = None  # the last non-null finish_reason
    completion_tokens: int | None = None  # usage.completion_tokens, when reported
    prompt_tokens: int | None = None  # usage.prompt_tokens, when reported
    is_done: bool = False  # saw data: [DONE]

    def feed(self, data: str, now: float) -> None:
        """Fold in one SSE ``data:`` payload that arrived at ``now``."""
        if data == "[DONE]":
            self.is_done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            raise StreamError(f"bad SSE data: {data[:200]!r}")
        if "error" in chunk or chunk.get("object") == "error":  # an error event mid-stream
            raise StreamError(f"error event: {error_message(data)}")
        usage = chunk.get("usage")
        if usage:
            self.completion_tokens = usage.get("completion_tokens", self.completion_tokens)
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
        choices = chunk.get("choices") or []
        if choices:  # n=1: only the first choice exists
            text = _delta_text(choices[0])
            if text:
                self.token_times.append(now)
                self.texts.append(text)
            self.finish = choices[0].get("finish_reason") or self.finish


@dataclass(slots=True)
class OpenAIClient:
    """Sends streaming completions to one server and endpoint; shared by all requests of a run."""

    http: httpx.AsyncClient
    base_url: str
    backend: Backend
    model: str
    timeout_s: float  # per request, send to end of stream
    clock: Callable[[], float]  # seconds since the bench start
    extra_body: Mapping[str, Any] | None = None  # --extra-request-body: merged last, so it overrides

    def payload(self, prompt: str, output_len: int) -> dict[str, Any]:
        """The JSON body: exactly ``output_len`` tokens (``ignore_eos``, an SGLang and vLLM
        extension), greedy, streamed with a final usage chunk; then ``extra_body`` merged in
        (its keys win, as sglang's ``--extra-request-body``)."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": output_len,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "temperature": 0,
        }
        if self.backend is Backend.OPENAI_CHAT:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if self.extra_body:
            body.update(self.extra_body)
        return body

    async def send(self, body: dict[str, Any], record: RequestRecord) -> tuple[int | None, str]:
        """Send ``body`` now and stream the answer into ``record`` (arrived_at = send time,
        token_times, first_token_at, num_generated, finished_at, finish_reason, detail).

        Returns the server's ``usage.prompt_tokens`` (None if not reported or failed) and the
        generated text (what arrived, also of a failed request). HTTP
        errors, dropped connections, bad streams and timeouts end as ABORTED with the reason in
        ``detail``; a cancellation does too, and is then re-raised.
        """
        stream = _Stream(record.token_times)
        record.arrived_at = self.clock()
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._stream(body, stream)
            if not stream.is_done and stream.finish is None:
                raise StreamError("stream ended before data: [DONE]")
            if not stream.token_times:
                raise StreamError("stream ended without any output token")
        except asyncio.CancelledError:
            self._abort(record, stream, "cancelled before the stream ended")
            raise
        except TimeoutError:
            self._abort(record, stream, f"timed out after {self.timeout_s:g} s")
            return None, "".join(stream.texts)
        except httpx.HTTPError as exc:
            self._abort(record, stream, f"{type(exc).__name__}: {exc}")
            return None, "".join(stream.texts)
        except StreamError as exc:
            self._abort(record, stream, str(exc))
            return None, "".join(stream.texts)
        record.finished_at = self.clock()
        record.first_token_at = stream.token_times[0]
        record.num_generated = (
            stream.completion_tokens if stream.completion_tokens is not None else len(stream.token_times)
        )
        # a server that omits finish_reason: full length means it stopped on max_tokens
        fallback = FinishReason.LENGTH if record.num_generated >= record.output_len else FinishReason.STOP
        record.finish_reason = _FINISH.get(stream.finish or "", fallback)
        return stream.prompt_tokens, "".join(stream.texts)

    async def _stream(self, body: dict[str, Any], stream: _Stream) -> None:
        async with self.http.stream("POST", self.base_url + self.backend.path, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", errors="replace")
                raise StreamError(f"HTTP {resp.status_code}: {error_message(text)}")
            async for line in resp.aiter_lines():
                # SSE: "data: <payload>" events; blank lines, comments (":...") and other fields skipped
                if line.startswith("data:"):
                    stream.feed(line[5:].strip(), self.clock())
                    if stream.is_done:
                        return

    def _abort(self, record: RequestRecord, stream: _Stream, reason: str) -> None:
        record.finished_at = self.clock()
        record.finish_reason = FinishReason.ABORTED
        record.detail = reason
        record.num_generated = len(stream.token_times)  # what arrived before the failure
        record.first_token_at = stream.token_times[0] if stream.token_times else None


async def list_models(http: httpx.AsyncClient, base_url: str, timeout_s: float) -> list[str]:
    """The model ids GET /v1/models lists (raises httpx.HTTPError or ValueError on failure)."""
    resp = await http.get(base_url + "/v1/models", timeout=timeout_s)
    resp.raise_for_status()
    return [m["id"] for m in resp.json().get("data", []) if isinstance(m, dict) and "id" in m]


SERVER_INFO_PATHS = ("/server_info", "/get_server_info")  # SGLang's current path, then its older one


async def get_server_info(http: httpx.AsyncClient, base_url: str, timeout_s: float) -> dict[str, Any] | None:
    """SGLang's GET /server_info (or the older /get_server_info) as a dict, or None where the
    server has neither (vLLM, most others) or they fail: the benchmark must not depend on it."""
    for path in SERVER_INFO_PATHS:
        try:
            resp = await http.get(base_url + path, timeout=timeout_s)
            info = resp.json() if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            info = None
        if isinstance(info, dict):
            return info
    return None

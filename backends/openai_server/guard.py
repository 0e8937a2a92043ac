"""The ASGI layer around every route: API key, JSON-only bodies, a body-size limit and read
deadline, status counting, and a 500 that keeps the connection.

- ``/v1/*`` needs ``Authorization: Bearer KEY`` when the server has an API key (401 otherwise,
  compared in constant time); ``/health`` and ``/metrics`` stay open.
- A POST to ``/v1/*`` must say ``Content-Type: application/json`` (415 otherwise): a web page can
  send a form or text/plain body cross-site without the browser asking first, never a JSON one.
- A request body is read here, whole, before any route sees it: a ``Content-Length`` over
  ``max_body_bytes`` gets 413 without a byte of the body read, a chunked body is cut off with 413
  as it passes the limit, and a body that has not arrived ``read_timeout_s`` after the headers
  gets 408. These answers close the connection (the rest of the body is never read).
- Every response status of ``/v1/*`` is counted for /metrics, 4xx and 5xx included.
- An exception no route handled becomes an OpenAI-style 500 (or, once a response has started,
  the end of that response), logged, and not re-raised: the server answers, the kept-alive
  connection stays usable, and the 500 is counted.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Callable
from typing import Any

from fastpp.backends.openai_server.protocol import APIError

log = logging.getLogger(__name__)

GUARDED_PREFIX = "/v1/"
_JSON_TYPES = ("application/json",)
_BODY_METHODS = ("POST", "PUT", "PATCH")
_CLOSE = ((b"connection", b"close"),)


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def send_error(send: Callable, error: APIError, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = json.dumps(error.body(), separators=(",", ":")).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": error.status, "headers": head})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class RequestGuard:
    """Pure ASGI middleware (inside Starlette's error middleware, outside the route handlers)."""

    def __init__(
        self,
        app: Any,
        api_key: str | None,
        count: Callable[[int], None],
        max_body_bytes: int = 4 * 1024 * 1024,
        read_timeout_s: float = 30.0,
    ) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.count = count
        self.max_body_bytes = max_body_bytes
        self.read_timeout_s = read_timeout_s

    def refusal(self, scope: dict[str, Any]) -> tuple[APIError, tuple[tuple[bytes, bytes], ...]] | None:
        if self.api_key is not None:
            auth = _header(scope, b"authorization") or ""
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key):
                return (
                    APIError(
                        401,
                        "missing or wrong API key: send 'Authorization: Bearer <key>' "
                        "(the openai client sends OPENAI_API_KEY)",
                        type_="invalid_request_error",
                        code="invalid_api_key",
                    ),
                    ((b"www-authenticate", b"Bearer"),),
                )
        if scope.get("method") == "POST":
            ctype = (_header(scope, b"content-type") or "").split(";", 1)[0].strip().lower()
            if ctype not in _JSON_TYPES:
                return (
                    APIError(
                        415,
                        f"Content-Type must be application/json, got {ctype or 'none'!r}",
                        type_="invalid_request_error",
                        code="unsupported_media_type",
                    ),
                    (),
                )
        return None

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        guarded = scope["path"].startswith(GUARDED_PREFIX)
        started = finished = False

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal started, finished
            if message["type"] == "http.response.start":
                started = True
                if guarded:
                    self.count(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True
            await send(message)

        if guarded:
            refused = self.refusal(scope)
            if refused is not None:
                await send_error(tracking_send, *refused)
                return
        if scope.get("method") in _BODY_METHODS:
            body = await self.read_body(scope, receive, tracking_send)
            if body is None:
                return  # refused (413, 408, 400) or the client left
            receive = _replay(body, receive)
        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            log.exception("unhandled error answering %s %s", scope.get("method"), scope["path"])
            try:
                if not started:
                    error = APIError(500, "internal server error (see the server log)", type_="server_error")
                    await send_error(tracking_send, error)
                elif not finished:
                    await tracking_send({"type": "http.response.body", "body": b"", "more_body": False})
            except Exception:  # the client is gone: nothing left to tell it
                log.debug("could not send the error response", exc_info=True)

    async def read_body(self, scope: dict[str, Any], receive: Callable, send: Callable) -> bytes | None:
        """The whole body, or None once it has answered why not (or the client left)."""
        limit = self.max_body_bytes
        declared = _header(scope, b"content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                error = APIError(400, f"Content-Length {declared!r} is not a byte count")
                await send_error(send, error, _CLOSE)
                return None
            if int(declared) > limit:
                await send_error(send, _too_large(limit, f"Content-Length {int(declared)}"), _CLOSE)
                return None
        chunks: list[bytes] = []
        size = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.read_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                error = APIError(
                    408, f"request body not received within {self.read_timeout_s:g} s", code="request_timeout"
                )
                await send_error(send, error, _CLOSE)
                return None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await send_error(send, _too_large(limit, "the body"), _CLOSE)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _too_large(limit: int, what: str) -> APIError:
    return APIError(
        413,
        f"request body too large: {what} exceeds the limit of {limit} bytes (the server's --max-body-bytes)",
        code="request_too_large",
    )


def _replay(body: bytes, receive: Callable) -> Callable:
    """A ``receive`` that gives the body read already, then what the connection says next (a
    disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> dict[str, Any]:
        if pending:
            return pending.pop()
        return await receive()

    return replay

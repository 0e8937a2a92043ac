"""A fake OpenAI-compatible streaming server for the bench tests (stdlib only, 127.0.0.1).

It answers /v1/completions and /v1/chat/completions with SSE: headers at once, the first token
chunk ``ttft_s`` later, then one chunk every ``itl_s`` (``tokens_per_chunk`` tokens each) up to
``max_tokens``, the last with ``finish_reason: "length"``, then a usage chunk (when asked for
with ``stream_options.include_usage``) and ``data: [DONE]``. Chat streams open with an empty
``delta.role`` chunk, as real servers do. It can fail every Nth request with an OpenAI-style 400
or drop every Nth connection halfway through its stream, refuse requests without its API key
(401) or naming another model (404, as vLLM), and it records the request bodies and the peak
number of streams open at once.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class FakeBehaviour:
    """How the fake server answers. Request numbers count from 1 in the order they arrive."""

    ttft_s: float = 0.03  # headers -> first token chunk
    itl_s: float = 0.01  # between token chunks
    tokens_per_chunk: int = 1
    fail_every: int = 0  # every Nth generation request gets HTTP 400 (0: never)
    drop_every: int = 0  # every Nth generation request loses its connection mid-stream (0: never)
    has_server_info: bool = True  # serve GET /get_server_info (SGLang has it, vLLM does not)
    model: str = "fake-model"
    api_key: str | None = None  # every route answers 401 unless sent "Authorization: Bearer <key>"
    checks_model: bool = False  # a generation request naming another model gets 404


@dataclass
class _Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    num_requests: int = 0
    num_streams: int = 0
    peak_streams: int = 0
    num_connection_errors: int = 0  # connections that ended in an exception (drops, cancels)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked transfer, as real servers
    disable_nagle_algorithm = True  # TCP_NODELAY, as uvicorn: else small chunks wait for ACKs
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read no access log
        pass

    def _json(self, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _refused_key(self) -> bool:
        """Answer 401 (and True) when the server has a key and the request lacks it."""
        key = self.server.behaviour.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return False
        error = {"message": "Invalid API key", "type": "invalid_request_error", "code": 401}
        self._json(401, {"error": error})
        return True

    def do_GET(self) -> None:
        beh = self.server.behaviour
        if self._refused_key():
            return
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": beh.model, "object": "model"}]})
        elif self.path == "/get_server_info" and beh.has_server_info:
            self._json(200, {"version": "fake-0.1", "pp_size": 1, "model_path": beh.model})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}", "code": 404}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self._refused_key():
            return
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._json(404, {"error": {"message": f"no route {self.path}", "code": 404}})
            return
        beh, stats = self.server.behaviour, self.server.stats
        if beh.checks_model and body.get("model") != beh.model:
            message = f"The model `{body.get('model')}` does not exist."
            self._json(404, {"error": {"message": message, "type": "NotFoundError", "code": 404}})
            return
        with stats.lock:
            stats.num_requests += 1
            number = stats.num_requests
            stats.bodies.append(body)
            stats.paths.append(self.path)
        if beh.fail_every and number % beh.fail_every == 0:
            self._json(
                400,
                {
                    "error": {
                        "message": f"fake failure of request {number}",
                        "type": "invalid_request_error",
                        "code": 400,
                    }
                },
            )
            return
        with stats.lock:
            stats.num_streams += 1
            stats.peak_streams = max(stats.peak_streams, stats.num_streams)
        self._streaming = True
        try:
            self._stream(
                body,
                is_chat=self.path.endswith("chat/completions"),
                drop=bool(beh.drop_every and number % beh.drop_every == 0),
            )
        except (BrokenPipeError, ConnectionResetError):  # the client went away (cancel, timeout)
            self.close_connection = True
        finally:
            self._end_stream()

    def _end_stream(self) -> None:
        """Count this stream as over, once. Called before the last event is written: a client
        that sees its stream end may send the next request at once, before this thread runs
        again, and must not find this stream still counted."""
        if self._streaming:
            self._streaming = False
            with self.server.stats.lock:
                self.server.stats.num_streams -= 1

    def _event(self, obj: Any) -> None:
        data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
        self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")

    def _stream(self, body: dict[str, Any], *, is_chat: bool, drop: bool) -> None:
        beh = self.server.behaviour
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        kind = "chat.completion.chunk" if is_chat else "text_completion"
        if is_chat:
            role = {"role": "assistant", "content": ""}  # not a token: TTFT must skip it
            self._event({"object": kind, "choices": [{"index": 0, "delta": role, "finish_reason": None}]})
        num_tokens = int(body["max_tokens"])
        num_chunks = math.ceil(num_tokens / beh.tokens_per_chunk)
        time.sleep(beh.ttft_s)
        for i in range(num_chunks):
            if drop and i == max(1, num_chunks // 2):
                self.connection.shutdown(socket.SHUT_RDWR)  # mid-chunked-body: an incomplete read
                self.close_connection = True
                return
            if i:
                time.sleep(beh.itl_s)
            n = min(beh.tokens_per_chunk, num_tokens - i * beh.tokens_per_chunk)
            text = " tok" * n
            finish = "length" if i == num_chunks - 1 else None
            choice = (
                {"index": 0, "delta": {"content": text}, "finish_reason": finish}
                if is_chat
                else {"index": 0, "text": text, "finish_reason": finish}
            )
            self._event({"object": kind, "choices": [choice]})
        if (body.get("stream_options") or {}).get("include_usage"):
            prompt = body["messages"][0]["content"] if is_chat else body["prompt"]
            prompt_tokens = len(prompt.split()) + (5 if is_chat else 1)  # + template / BOS
            self._event(
                {
                    "object": kind,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": num_tokens,
                        "total_tokens": prompt_tokens + num_tokens,
                    },
                }
            )
        self._end_stream()
        self._event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # keep-alive connections must not block shutdown
    request_queue_size = 256  # many clients connect at once

    def __init__(self, behaviour: FakeBehaviour) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.behaviour = behaviour
        self.stats = _Stats()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Stay quiet: dropped and cancelled connections are what several tests provoke."""
        self.stats.num_connection_errors += 1


class FakeOpenAIServer:
    """Context manager: ``with FakeOpenAIServer(FakeBehaviour(...)) as srv: srv.url ...``."""

    def __init__(self, behaviour: FakeBehaviour | None = None) -> None:
        self._server = _Server(behaviour or FakeBehaviour())
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def stats(self) -> _Stats:
        return self._server.stats

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

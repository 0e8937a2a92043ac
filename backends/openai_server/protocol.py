"""Request bodies of /v1/completions and /v1/chat/completions, validated into plain fields.

Every problem raises :class:`APIError` with an OpenAI-style body: ``{"error": {"message",
"type", "param", "code"}}``, where ``param`` names the offending field. Parameters we do not
implement are refused when they would change the result (``n > 1``, ``logprobs``, ``echo``,
non-zero penalties), never silently ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class APIError(Exception):
    """An error answer: HTTP ``status`` and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type_
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What both endpoints ask for, after validation."""

    prompt_text: str | None  # text to tokenize (None when the client sent token ids)
    prompt_ids: tuple[int, ...] | None
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    stream: bool
    include_usage: bool
    model: str | None


DEFAULT_MAX_TOKENS = 16  # OpenAI's completions default
MAX_STOP_STRINGS = 4


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"'{param}': {message}", param=param)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(body: dict, key: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(key, f"must be an integer, got {v!r}")
    if v < lo or (hi is not None and v > hi):
        raise _bad(key, f"must be in [{lo}, {hi if hi is not None else 'inf'}], got {v}")
    return v


def _float(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _bad(key, f"must be a number, got {v!r}")
    if not lo <= v <= hi:
        raise _bad(key, f"must be in [{lo}, {hi}], got {v}")
    return float(v)


def _bool(body: dict, key: str, default: bool) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(key, f"must be true or false, got {v!r}")
    return v


def _common(body: dict, max_tokens_keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", f"must be a string, got {model!r}")
    max_tokens = DEFAULT_MAX_TOKENS
    for key in max_tokens_keys:
        if body.get(key) is not None:
            max_tokens = _int(body, key, None, 1)  # type: ignore[assignment]
            break
    if _int(body, "n", 1, 1) != 1:
        raise _bad("n", "only n = 1 is supported")
    for key in ("presence_penalty", "frequency_penalty"):
        if _float(body, key, 0.0, -2.0, 2.0) != 0.0:
            raise _bad(key, "penalties are not supported; send 0 or omit it")
    if body.get("logprobs") not in (None, False, 0):
        raise _bad("logprobs", "log probabilities are not supported")
    if body.get("logit_bias"):
        raise _bad("logit_bias", "not supported")
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise _bad("stop", f"must be a string or a list of strings, got {stop!r}")
    if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
        raise _bad("stop", f"at most {MAX_STOP_STRINGS} non-empty strings")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(_is_int(t) for t in stop_ids):
        raise _bad("stop_token_ids", f"must be a list of integers, got {stop_ids!r}")
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("stream_options", f"must be an object, got {options!r}")
    include_usage = bool(options and options.get("include_usage"))
    if options is not None and not stream:
        raise _bad("stream_options", "only allowed when stream is true")
    seed = _int(body, "seed", None, -(2**63), 2**63 - 1)
    return dict(
        model=model, max_tokens=max_tokens, temperature=_float(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_float(body, "top_p", 1.0, 0.0, 1.0), seed=seed, stop=stops, stop_token_ids=tuple(stop_ids),
        ignore_eos=_bool(body, "ignore_eos", False), stream=stream, include_usage=include_usage,
    )


def parse_completion(body: Any) -> GenerationRequest:
    """``POST /v1/completions``: ``prompt`` is a string or a list of token ids (one prompt)."""
    fields = _common(body, ("max_tokens",))
    if body.get("echo"):
        raise _bad("echo", "not supported")
    if body.get("suffix"):
        raise _bad("suffix", "not supported")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise _bad("prompt", "must not be empty")
        return GenerationRequest(prompt, None, **fields)
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return GenerationRequest(None, tuple(prompt), **fields)
    if prompt is None:
        raise _bad("prompt", "is required")
    if isinstance(prompt, list) and len(prompt) > 1:
        raise _bad("prompt", "batched prompts are not supported; send one prompt per request")
    raise _bad("prompt", "must be a non-empty string or a non-empty list of token ids")


def parse_chat(body: Any) -> tuple[GenerationRequest, list[tuple[str, str]]]:
    """``POST /v1/chat/completions``: the request and its messages as (role, text) pairs."""
    fields = _common(body, ("max_completion_tokens", "max_tokens"))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list")
    if body.get("tools"):
        raise _bad("tools", "tool calling is not supported")
    pairs = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, "must be an object with 'role' and 'content'")
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant"):
            raise _bad(f"{where}.role", f"must be system, user or assistant, got {role!r}")
        text = _content(m.get("content"), f"{where}.content")
        pairs.append(("system" if role == "developer" else role, text))
    return GenerationRequest(None, None, **fields), pairs


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text only
        texts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise _bad(f"{where}[{j}]", "only text parts ({'type': 'text', 'text': ...}) are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(where, f"must be a string or a list of text parts, got {content!r}")

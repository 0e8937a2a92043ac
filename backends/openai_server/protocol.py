"""Request bodies of /v1/completions and /v1/chat/completions, validated into plain fields.

Every problem raises :class:`APIError` with an OpenAI-style body: ``{"error": {"message",
"type", "param", "code"}}``, where ``param`` names the offending field. No parameter is silently
ignored: a field this server does not know is refused, and a known one it does not implement
(``n > 1``, ``best_of``, ``logprobs``, ``echo``, penalties, tools and functions,
``response_format`` other than text...) is accepted only at the value that changes nothing. A
field sent as ``null`` counts as not sent.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any


class APIError(Exception):
    """An error answer: HTTP ``status`` and an OpenAI-style error body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type_: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
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
    max_tokens: int | None  # None: not given (the server picks default_max_tokens, within the limits)
    max_tokens_param: str  # the field that set it: max_tokens or max_completion_tokens
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    stream: bool
    include_usage: bool
    model: str | None
    # the output budget when max_tokens is not given: that many tokens (completions), or None: up
    # to the limit, what the context and the KV cache leave after the prompt (chat)
    default_max_tokens: int | None = None


# without max_tokens: 16 tokens for /v1/completions (OpenAI's legacy default, kept by vLLM);
# /v1/chat/completions generates until EOS, a stop, or the context or KV limit (OpenAI's and
# vLLM's chat behaviour)
DEFAULT_MAX_TOKENS = 16
CHAT_DEFAULT_MAX_TOKENS: int | None = None
# list sizes a request may carry (a 400 names the field and the limit); each is checked before
# the list is walked, so a huge list costs nothing to refuse
MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_STOP_CHARS = 1000  # per stop string: a stream holds back that many characters
MAX_STOP_TOKEN_IDS = 1024
MAX_PROMPT_TOKEN_IDS = 131_072  # a prompt sent as token ids; the model's context is checked later
MAX_MESSAGES = 2048
MAX_CONTENT_PARTS = 256  # text parts of one message
MAX_TOKEN_ID = 2**31 - 1

# fields both endpoints implement, and the ones that change nothing here (``user``: an end-user id
# for the provider's abuse monitoring; ``parallel_tool_calls``: moot, tools are refused)
_COMMON = frozenset(
    {
        "model",
        "max_tokens",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "logprobs",
        "logit_bias",
        "stop",
        "stop_token_ids",
        "stream",
        "stream_options",
        "seed",
        "temperature",
        "top_p",
        "ignore_eos",
        "user",
    }
)
_COMPLETION = _COMMON | {"prompt", "echo", "suffix", "best_of"}
_CHAT = _COMMON | {
    "messages",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "parallel_tool_calls",
    "response_format",
    "top_logprobs",
    "modalities",
}
# implemented only at the value that changes nothing: field -> (is that value?, why else refused)
_NOOP_ONLY: dict[str, tuple[Any, str]] = {
    "best_of": (lambda v: v == 1 and _is_int(v), "only best_of = 1 is supported (one sample per request)"),
    "echo": (lambda v: v is False, "echoing the prompt is not supported"),
    "suffix": (lambda v: v == "", "suffixes (insertion) are not supported"),
    "logprobs": (lambda v: v is False, "log probabilities are not supported"),
    "top_logprobs": (lambda v: False, "needs logprobs, and log probabilities are not supported"),
    "logit_bias": (lambda v: v == {}, "logit bias is not supported"),
    "response_format": (
        lambda v: v == {"type": "text"},
        "only {'type': 'text'} is supported (no JSON mode or structured output)",
    ),
    "tools": (lambda v: v == [], "tool calling is not supported"),
    "tool_choice": (lambda v: v == "none", "tool calling is not supported; only 'none' is accepted"),
    "functions": (lambda v: v == [], "function calling is not supported"),
    "function_call": (lambda v: v == "none", "function calling is not supported; only 'none' is accepted"),
    "parallel_tool_calls": (lambda v: isinstance(v, bool), "must be true or false"),
    "modalities": (lambda v: v == ["text"], "only ['text'] is supported"),
    "user": (lambda v: isinstance(v, str), "must be a string"),
}
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_fields(body: dict[str, Any], known: frozenset[str]) -> None:
    """Refuse a field that is unknown, or known but set to something this server would ignore."""
    for key, value in body.items():
        if value is None:
            continue
        if key not in known:
            raise _bad(key, "unknown parameter; this server does not support it")
        rule = _NOOP_ONLY.get(key)
        if rule is not None and not rule[0](value):
            raise _bad(key, rule[1])


def first_invalid_text(body: Any) -> str | None:
    """Where in a parsed JSON body a string holds a lone UTF-16 surrogate (``"\\ud800"``: valid
    JSON, not valid Unicode text), as a field path like ``messages[0].content``; None if nowhere.
    Iterative, so any nesting depth the JSON parser accepted is fine."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return path or "body"
        elif isinstance(value, dict):
            for k, v in value.items():
                here = f"{path}.{k}" if path else str(k)
                if _SURROGATE.search(k):
                    return here
                stack.append((here, v))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
    return None


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"'{param}': {message}", param=param)


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: an error message never echoes a huge input."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(body: dict, key: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(key, f"must be an integer, got {_short(v)}")
    if v < lo or (hi is not None and v > hi):
        raise _bad(key, f"must be in [{lo}, {hi if hi is not None else 'inf'}], got {v}")
    return v


def _float(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _bad(key, f"must be a number, got {_short(v)}")
    if not lo <= v <= hi:
        raise _bad(key, f"must be in [{lo}, {hi}], got {v}")
    return float(v)


def _bool(body: dict, key: str, default: bool) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(key, f"must be true or false, got {_short(v)}")
    return v


def _common(body: Any, max_tokens_keys: tuple[str, ...], known: frozenset[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    check_fields(body, known)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", f"must be a string, got {_short(model)}")
    max_tokens, max_tokens_param = None, max_tokens_keys[0]
    for key in max_tokens_keys:
        if body.get(key) is not None:
            max_tokens, max_tokens_param = _int(body, key, None, 1), key
            break
    if _int(body, "n", 1, 1) != 1:
        raise _bad("n", "only n = 1 is supported")
    for key in ("presence_penalty", "frequency_penalty"):
        if _float(body, key, 0.0, -2.0, 2.0) != 0.0:
            raise _bad(key, "penalties are not supported; send 0 or omit it")
    stops = _stops(body.get("stop"))
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list):
        raise _bad("stop_token_ids", f"must be a list of integers, got {_short(stop_ids)}")
    if len(stop_ids) > MAX_STOP_TOKEN_IDS:
        raise _bad("stop_token_ids", f"at most {MAX_STOP_TOKEN_IDS} token ids, got {len(stop_ids)}")
    bad_id = next((t for t in stop_ids if not (_is_int(t) and 0 <= t <= MAX_TOKEN_ID)), None)
    if stop_ids and bad_id is not None:
        raise _bad("stop_token_ids", f"must be a list of token ids (integers >= 0), got {_short(bad_id)}")
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("stream_options", f"must be an object, got {_short(options)}")
    if options is not None and not stream:
        raise _bad("stream_options", "only allowed when stream is true")
    options = options or {}
    for key in options:
        if key != "include_usage" and options[key] is not None:
            raise _bad(f"stream_options.{key}", "unknown stream option; only include_usage is supported")
    include_usage = _bool(options, "include_usage", False)
    seed = _int(body, "seed", None, -(2**63), 2**63 - 1)
    top_p = _float(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:  # the sampler's range is (0, 1]: no token would be left to sample
        raise _bad("top_p", "must be in (0, 1], got 0")
    return dict(
        model=model,
        max_tokens=max_tokens,
        max_tokens_param=max_tokens_param,
        temperature=_float(body, "temperature", 1.0, 0.0, 2.0),
        top_p=top_p,
        seed=seed,
        stop=stops,
        stop_token_ids=tuple(stop_ids),
        ignore_eos=_bool(body, "ignore_eos", False),
        stream=stream,
        include_usage=include_usage,
    )


def _stops(stop: Any) -> tuple[str, ...]:
    """``stop`` as a tuple: a string or a list of at most MAX_STOP_STRINGS strings, none empty
    (an empty one would match before the first character) nor longer than MAX_STOP_CHARS."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        items, where = [stop], ["stop"]
    elif isinstance(stop, list) and len(stop) > MAX_STOP_STRINGS:
        raise _bad("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}")
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        items, where = stop, [f"stop[{i}]" for i in range(len(stop))]
    else:
        raise _bad("stop", f"must be a string or a list of strings, got {_short(stop)}")
    for param, s in zip(where, items, strict=True):
        if not s:
            raise _bad(param, "an empty stop string is not allowed (it would match at once)")
        if len(s) > MAX_STOP_CHARS:
            raise _bad(param, f"a stop string has at most {MAX_STOP_CHARS} characters, got {len(s)}")
    return tuple(items)


def parse_completion(body: Any, max_prompt_ids: int = MAX_PROMPT_TOKEN_IDS) -> GenerationRequest:
    """``POST /v1/completions``: ``prompt`` is a string or a list of token ids (one prompt), at
    most ``max_prompt_ids`` of them."""
    fields = _common(body, ("max_tokens",), _COMPLETION)
    fields |= {"default_max_tokens": DEFAULT_MAX_TOKENS}
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise _bad("prompt", "must not be empty")
        return GenerationRequest(prompt, None, **fields)
    if isinstance(prompt, list) and len(prompt) > max_prompt_ids and _is_int(prompt[0]):
        raise _bad("prompt", f"at most {max_prompt_ids} token ids, got {len(prompt)}")
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return GenerationRequest(None, tuple(prompt), **fields)
    if prompt is None:
        raise _bad("prompt", "is required")
    if isinstance(prompt, list) and len(prompt) > 1:
        raise _bad("prompt", "batched prompts are not supported; send one prompt per request")
    raise _bad("prompt", "must be a non-empty string or a non-empty list of token ids")


def parse_chat(body: Any) -> tuple[GenerationRequest, list[tuple[str, str]]]:
    """``POST /v1/chat/completions``: the request and its messages as (role, text) pairs."""
    fields = _common(body, ("max_completion_tokens", "max_tokens"), _CHAT)
    fields |= {"default_max_tokens": CHAT_DEFAULT_MAX_TOKENS}
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list")
    if len(messages) > MAX_MESSAGES:
        raise _bad("messages", f"at most {MAX_MESSAGES} messages, got {len(messages)}")
    pairs = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, "must be an object with 'role' and 'content'")
        extra = next((k for k, v in m.items() if k not in ("role", "content") and v not in (None, [])), None)
        if extra is not None:  # name, tool_calls, ...: the template would drop them
            raise _bad(f"{where}.{extra}", "not supported; a message has only 'role' and 'content'")
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant"):
            raise _bad(f"{where}.role", f"must be system, user or assistant, got {_short(role)}")
        text = _content(m.get("content"), f"{where}.content")
        pairs.append(("system" if role == "developer" else role, text))
    return GenerationRequest(None, None, **fields), pairs


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text only
        if len(content) > MAX_CONTENT_PARTS:
            raise _bad(where, f"at most {MAX_CONTENT_PARTS} content parts, got {len(content)}")
        texts = []
        for j, part in enumerate(content):
            if not (
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            ):
                raise _bad(f"{where}[{j}]", "only text parts ({'type': 'text', 'text': ...}) are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(where, f"must be a string or a list of text parts, got {_short(content)}")

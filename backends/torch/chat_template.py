"""Chat prompts from a model's own chat template (Jinja), rendered as transformers renders it.

Where a template comes from (:func:`hf_template_source`, :func:`gguf_template_source`): a Hugging
Face directory's ``chat_template.jinja``, else the ``chat_template`` of its
``tokenizer_config.json`` (a string, or a list of named templates of which ``default`` is used);
a GGUF file's ``tokenizer.chat_template``.

How it renders (transformers' ``apply_chat_template``): an ``ImmutableSandboxedEnvironment`` with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension and ``{% generation %}``
blocks, the globals ``raise_exception`` and ``strftime_now`` and a ``tojson`` filter that leaves
HTML characters alone; the variables ``messages``, ``add_generation_prompt=True``, ``tools=None``,
``documents=None`` and the tokenizer's special tokens (``bos_token``, ``eos_token``...). The
prompt is then encoded with nothing added around it (transformers' and vLLM's
``add_special_tokens=False`` for chat): the template writes its own BOS.

Special-token text in the messages stays text (:meth:`JinjaChatTemplate.pieces`).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from fastpp.backends.torch.hf_tokenizer import json_object

# the special tokens transformers passes to a template (its special_tokens_map)
SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
_PROBE = [("user", "Hello")]  # a conversation every chat template accepts: tried when loading


@dataclass(frozen=True, slots=True)
class TemplateSource:
    """A chat template's text, where it was read (for messages) and the special tokens it sees."""

    text: str
    where: str
    special_tokens: Mapping[str, Any] = field(default_factory=dict)


class _GenerationBlocks(Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body (transformers marks assistant
    text with it for training masks; serving only needs the text)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlocks, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _variants(content: str) -> list[str]:
    """What a template may print for a message's content: itself, or trimmed (``| trim``,
    ``.strip()`` and their one-sided forms)."""
    out: list[str] = []
    for v in (content, content.strip(), content.lstrip(), content.rstrip()):
        if v not in out:
            out.append(v)
    return out


class JinjaChatTemplate:
    """A model's chat template: ``render(messages)`` is transformers' prompt text, ``pieces`` the
    same text as ``(text, is_markup)`` pieces where only the template's own special tokens are
    markup. ``markers`` are the tokenizer's special tokens (the strings it would read as control
    tokens)."""

    add_special_tokens = False  # the template writes BOS and the like itself

    def __init__(self, source: TemplateSource, markers: Iterable[str]) -> None:
        self.where = source.where
        self._variables = {k: v for k, v in source.special_tokens.items() if v is not None}
        try:
            self._template = _environment().from_string(source.text)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(
                f"{source.where}: the chat template is not valid Jinja "
                f"(template line {exc.lineno}): {exc.message}"
            ) from None
        self._markers = sorted({m for m in markers if m}, key=len, reverse=True)
        self._marker_re = re.compile("|".join(map(re.escape, self._markers))) if self._markers else None
        try:
            self.render(_PROBE)
        except ValueError as exc:
            raise ValueError(
                f"{source.where}: the chat template fails on a one-message conversation: {exc}"
            ) from None

    def render(self, messages: Sequence[tuple[str, str]]) -> str:
        """The prompt text, as ``tokenizer.apply_chat_template(messages, tokenize=False,
        add_generation_prompt=True)`` gives it; ``ValueError`` with the template's message when
        the template refuses the conversation (``raise_exception``) or fails on it."""
        chat = [{"role": role, "content": content} for role, content in messages]
        try:
            return self._template.render(
                messages=chat, tools=None, documents=None, add_generation_prompt=True, **self._variables
            )
        except Exception as exc:  # a template is a program: any failure of it is the template's
            kind = "" if isinstance(exc, jinja2.TemplateError) else f"{type(exc).__name__}: "
            raise ValueError(f"the model's chat template did not accept the messages: {kind}{exc}") from None

    def pieces(self, messages: Sequence[tuple[str, str]]) -> list[tuple[str, bool]]:
        """The prompt as ``(text, is_markup)`` pieces that join to :meth:`render`'s text. Markup is
        the template's own special tokens alone; a message's content is plain text even where it
        spells a special token, so a user cannot forge a turn.

        Which parts are content: the template is rendered a second time with each content
        replaced by a unique sentinel, and the real prompt must then read as those template
        parts with each content (or its trimmed form, for templates that ``| trim``) in its
        sentinel's place. Where that does not hold (a template that uses a content twice, drops
        it, or changes it beyond trimming), the contents cannot be located for sure, and the
        choice here is: if no content spells a special token, every special token in the prompt
        is the template's own and the prompt is split at them; otherwise the request is refused
        (``ValueError``) rather than risk reading a user's text as control tokens."""
        real = self.render(messages)
        parts = self._template_parts(messages, real)
        if parts is not None:
            return self._merged(parts)
        for i, (_, content) in enumerate(messages):
            found = self._first_marker(content)
            if found is not None:
                raise ValueError(
                    f"messages[{i}].content holds the special-token text {found!r}, and this model's "
                    f"chat template changes message content in a way that does not let the server keep "
                    f"that text from acting as a control token; remove it from the message"
                )
        return self._merged([(real, True)])

    def _first_marker(self, text: str) -> str | None:
        if self._marker_re is None:
            return None
        m = self._marker_re.search(text)
        return m.group(0) if m else None

    def _template_parts(
        self, messages: Sequence[tuple[str, str]], real: str
    ) -> list[tuple[str, bool]] | None:
        """``real`` as (template text, True) and (content, False) parts, or None where the
        contents cannot be located for sure (see :meth:`pieces`)."""
        nonce = secrets.randbits(64)
        sentinels = [f"\ue000{nonce}:{i}\ue001" for i in range(len(messages))]
        try:
            marked = self.render([(role, s) for (role, _), s in zip(messages, sentinels, strict=True)])
        except ValueError:
            return None  # the template reads the contents (it refused the sentinels)
        if any(marked.count(s) != 1 for s in sentinels):
            return None
        order = sorted(range(len(messages)), key=lambda i: marked.index(sentinels[i]))
        texts = re.split("|".join(re.escape(sentinels[i]) for i in order), marked) if order else [marked]
        # real == texts[0] + content(order[0]) + texts[1] + ... + texts[-1], each content as is
        # or trimmed: read left to right, each content's variant followed by the next template text
        if not real.startswith(texts[0]):
            return None
        parts: list[tuple[str, bool]] = [(texts[0], True)]
        pos = len(texts[0])
        for k, i in enumerate(order):
            after, last = texts[k + 1], k + 1 == len(order)
            for variant in _variants(messages[i][1]):
                end = pos + len(variant)
                follows = real[end:] == after if last else real.startswith(after, end)
                if real.startswith(variant, pos) and follows:
                    parts += [(variant, False), (after, True)]
                    pos = end + len(after)
                    break
            else:
                return None
        return parts if pos == len(real) else None

    def _merged(self, parts: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
        """Template text split at its special tokens (markup), everything else plain, adjacent
        plain text joined into one piece (as the tokenizer splits a text at its special tokens,
        so an ordinary conversation encodes as its joined text does)."""
        out: list[tuple[str, bool]] = []

        def add(text: str, markup: bool) -> None:
            if not text:
                return
            if not markup and out and not out[-1][1]:
                out[-1] = (out[-1][0] + text, False)
            else:
                out.append((text, markup))

        for text, is_template in parts:
            if not is_template or self._marker_re is None:
                add(text, False)
                continue
            pos = 0
            for m in self._marker_re.finditer(text):
                add(text[pos : m.start()], False)
                add(m.group(0), True)
                pos = m.end()
            add(text[pos:], False)
        return out


def _token_text(value: Any) -> Any:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    if isinstance(value, list):
        return [_token_text(v) for v in value]
    return value


def _special_tokens(root: Path, config: dict[str, Any]) -> dict[str, Any]:
    tokens = {
        k: _token_text(config[k]) for k in (*SPECIAL_TOKEN_KEYS, "additional_special_tokens") if k in config
    }
    map_path = root / "special_tokens_map.json"
    if map_path.is_file():  # older directories keep them here
        for k, v in json_object(map_path).items():
            tokens.setdefault(k, _token_text(v))
    return {k: v for k, v in tokens.items() if isinstance(v, str | list)}


def hf_template_source(root: str | Path) -> TemplateSource | None:
    """A Hugging Face directory's chat template (None when it has none)."""
    root = Path(root)
    cfg_path = root / "tokenizer_config.json"
    config = json_object(cfg_path) if cfg_path.is_file() else {}
    tokens = _special_tokens(root, config)
    jinja_path = root / "chat_template.jinja"
    if jinja_path.is_file():  # what transformers writes, and reads before tokenizer_config.json
        try:
            return TemplateSource(jinja_path.read_text(encoding="utf-8"), str(jinja_path), tokens)
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{jinja_path}: cannot read it: {exc}") from None
    template = config.get("chat_template")
    where = f"{cfg_path} (chat_template)"
    if template is None:
        return None
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if "default" not in named:
            raise ValueError(f"{where}: named chat templates {sorted(map(str, named))} and none is 'default'")
        template, where = named["default"], f"{cfg_path} (chat_template 'default')"
    if not isinstance(template, str):
        raise ValueError(f"{where}: expected the template's text, got {type(template).__name__}")
    return TemplateSource(template, where, tokens)


def gguf_template_source(path: str | Path, fields: Mapping[str, Any] | None = None) -> TemplateSource | None:
    """A GGUF file's ``tokenizer.chat_template`` (None when it has none), with its BOS and EOS;
    ``fields``: the file's ``GGUFReader(path).fields`` where the caller has read them."""
    if fields is None:
        from gguf import GGUFReader  # optional dependency, as for the GGUF tokenizer

        fields = GGUFReader(path).fields
    template = fields.get("tokenizer.chat_template")
    if template is None:
        return None
    tokens = fields["tokenizer.ggml.tokens"].contents()
    special = {}
    for key, name in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id")):
        token_id = fields.get(f"tokenizer.ggml.{name}")
        if token_id is not None and 0 <= int(token_id.contents()) < len(tokens):
            special[key] = tokens[int(token_id.contents())]
    return TemplateSource(str(template.contents()), f"{path} (tokenizer.chat_template)", special)

"""Tokenizers and chat templates the server uses, behind one small interface.

A model's chat prompt comes from its own chat template (Jinja, rendered as transformers renders
it: ``chat_template.JinjaChatTemplate``): a Hugging Face directory's ``chat_template.jinja`` or
``tokenizer_config.json``, SmolLM2's GGUF metadata. A directory without one gets ChatML when its
vocabulary has ``<|im_start|>``; random-weight configs use raw bytes as token ids and a plain
``role: content`` template, so every code path of the server runs without a download. Real
tokenizers are the ``tokenizers`` library's (``tokenizer.LibTokenizer``).

A chat prompt goes from the template to the tokenizer as pieces (``ChatTemplate.pieces``): the
template's own markers, which may become special tokens, and the messages' text, which never
does (a user's ``<|im_end|>`` stays text: no forged turns).
"""

from __future__ import annotations

import codecs
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fastpp.backends.torch.weights_source import WeightsSource

if TYPE_CHECKING:
    from fastpp.backends.torch.chat_template import JinjaChatTemplate

log = logging.getLogger(__name__)


class TextDecoder(Protocol):
    """Incremental detokenizer: ``feed(ids)`` returns the new text (never half a character),
    ``flush()`` what was held back at the end; special tokens are skipped."""

    def feed(self, ids: Iterable[int]) -> str: ...

    def flush(self) -> str: ...


class Tokenizer(Protocol):
    eos_token_id: int | None

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_chat(self, pieces: Sequence[tuple[str, bool]], add_special_tokens: bool = True) -> list[int]:
        """A chat prompt from ``ChatTemplate.pieces``: only pieces marked as markup may hold
        special tokens; the rest is encoded as plain text. ``add_special_tokens``: the
        tokenizer's own additions (a BOS) around it, which a model's chat template writes itself
        (``ChatTemplate.add_special_tokens``)."""
        ...

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str: ...

    def stream_decoder(self) -> TextDecoder: ...

    def min_tokens(self, text: str) -> int:
        """A lower bound on ``len(encode(text))``, computed without encoding (0 if unknown)."""
        ...

    def token_id(self, token: str) -> int | None: ...


_NOT_A_BYTE = "\ufffd"  # what an id outside 0..255 decodes to (random models with larger vocabs)


class _ByteStream:
    """Bytes to text as they come: a UTF-8 sequence cut mid-character waits for its end."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: Iterable[int], final: bool = False) -> str:
        out: list[str] = []
        run = bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
                continue
            out.append(self._utf8.decode(bytes(run), final=True))  # a non-byte id ends any sequence
            run.clear()
            out.append(_NOT_A_BYTE)
        out.append(self._utf8.decode(bytes(run), final=final))
        return "".join(out)

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255; no special tokens, no EOS. Ids >= 256 (a random model's
    larger vocabulary) decode to U+FFFD."""

    eos_token_id: int | None = None

    @property
    def vocab_size(self) -> int:
        return 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_chat(self, pieces: Sequence[tuple[str, bool]], add_special_tokens: bool = True) -> list[int]:
        return self.encode("".join(text for text, _ in pieces))  # no special tokens to guard, none to add

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return _ByteStream().feed(ids, final=True)

    def stream_decoder(self) -> _ByteStream:
        return _ByteStream()

    def min_tokens(self, text: str) -> int:
        return len(text)  # every character is at least one byte

    def token_id(self, token: str) -> int | None:
        return None


IM_START, IM_END = "<|im_start|>", "<|im_end|>"  # ChatML's turn markers


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """Renders OpenAI chat messages (role, content) into one prompt string: with the model's own
    template (``jinja``) where it has one, else ChatML (``chatml``, with ``default_system`` as the
    system turn when the conversation has none) or plain ``role: content`` lines."""

    chatml: bool
    default_system: str | None = None
    jinja: JinjaChatTemplate | None = None

    @property
    def add_special_tokens(self) -> bool:
        """Whether the tokenizer's own additions (a BOS) go around the prompt: not for a model's
        template, which writes them itself (transformers' and vLLM's ``add_special_tokens=False``);
        as before for the built-in ones."""
        return self.jinja is None

    @property
    def description(self) -> str:
        if self.jinja is not None:
            return f"the model's chat template ({self.jinja.where})"
        return "ChatML (the model has no chat template)" if self.chatml else "plain 'role: content' lines"

    def render(self, messages: Sequence[tuple[str, str]]) -> str:
        if self.jinja is not None:
            return self.jinja.render(messages)
        return "".join(text for text, _ in self.pieces(messages))

    def pieces(self, messages: Sequence[tuple[str, str]]) -> list[tuple[str, bool]]:
        """The prompt as ``(text, is_markup)`` pieces that join to :meth:`render`'s text. Markup
        is the template's special-token markers alone; all text between two markers is one
        plain piece (as the tokenizer splits a text at its special tokens), so encoding the
        pieces gives the joined text's tokens whenever the messages hold no special-token text.
        ``ValueError`` (with the template's reason) when a model's template refuses them."""
        if self.jinja is not None:
            return self.jinja.pieces(messages)
        if not self.chatml:
            return [("".join(f"{role}: {content}\n" for role, content in messages) + "assistant:", False)]
        turns = list(messages)
        if self.default_system is not None and (not turns or turns[0][0] != "system"):
            turns.insert(0, ("system", self.default_system))
        out: list[tuple[str, bool]] = []
        for role, content in turns:
            out += [(IM_START, True), (f"{role}\n{content}", False), (IM_END, True), ("\n", False)]
        out += [(IM_START, True), ("assistant\n", False)]
        return out


# SmolLM2-Instruct's template adds this system prompt when the conversation has none
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def load_text(source: WeightsSource) -> tuple[Tokenizer, ChatTemplate]:
    """The tokenizer and chat template that go with ``source``'s weights."""
    if source.kind == "random":
        vocab = source.config().vocab_size
        if vocab < 256:
            raise ValueError(f"random:{source.config_name} has a vocab of {vocab} < 256 byte tokens")
        return ByteTokenizer(), ChatTemplate(chatml=False)
    from fastpp.backends.torch import chat_template as model_template

    if source.kind == "smollm2":
        from gguf import GGUFReader

        from fastpp.backends.torch.gguf_weights import smollm2_gguf_path
        from fastpp.backends.torch.tokenizer import LibTokenizer

        path = smollm2_gguf_path()
        fields = GGUFReader(path).fields  # read once: the tokenizer and the template are both in it
        tokenizer = LibTokenizer.from_gguf(path, fields)
        found = model_template.gguf_template_source(path, fields)
        template = ChatTemplate(True, SMOLLM2_SYSTEM)  # what SmolLM2-Instruct's template renders
    else:
        from fastpp.backends.torch.hf_tokenizer import load_hf_tokenizer

        tokenizer = load_hf_tokenizer(source.path)
        found = model_template.hf_template_source(source.path)
        template = ChatTemplate(chatml=tokenizer.token_id("<|im_start|>") is not None)
    if found is not None:
        jinja = model_template.JinjaChatTemplate(found, tokenizer.special_tokens())
        template = ChatTemplate(False, jinja=jinja)
    log.info("chat prompts: %s", template.description)
    return tokenizer, template

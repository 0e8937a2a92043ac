"""Tokenizers and chat templates the server uses, behind one small interface.

SmolLM2 (and Qwen2) chat models use ChatML; random-weight configs use raw bytes as token ids and
a plain ``role: content`` template, so every code path of the server runs without a download.
Real tokenizers are the ``tokenizers`` library's (``tokenizer.LibTokenizer``).

A chat prompt goes from the template to the tokenizer as pieces (``ChatTemplate.pieces``): the
template's own markers, which may become special tokens, and the messages' text, which never
does (a user's ``<|im_end|>`` stays text: no forged turns).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from fastpp.backends.torch.weights_source import WeightsSource


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

    def encode_chat(self, pieces: Sequence[tuple[str, bool]]) -> list[int]:
        """A chat prompt from ``ChatTemplate.pieces``: only pieces marked as markup may hold
        special tokens; the rest is encoded as plain text."""
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

    def encode_chat(self, pieces: Sequence[tuple[str, bool]]) -> list[int]:
        return self.encode("".join(text for text, _ in pieces))  # no special tokens to guard

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
    """Renders OpenAI chat messages (role, content) into one prompt string."""

    chatml: bool
    default_system: str | None = None

    def render(self, messages: Sequence[tuple[str, str]]) -> str:
        return "".join(text for text, _ in self.pieces(messages))

    def pieces(self, messages: Sequence[tuple[str, str]]) -> list[tuple[str, bool]]:
        """The prompt as ``(text, is_markup)`` pieces that join to :meth:`render`'s text. Markup
        is the template's special-token markers alone; all text between two markers is one
        plain piece (as the tokenizer splits a text at its special tokens), so encoding the
        pieces gives the joined text's tokens whenever the messages hold no special-token text."""
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
    if source.kind == "smollm2":
        from fastpp.backends.torch.gguf_weights import smollm2_gguf_path
        from fastpp.backends.torch.tokenizer import LibTokenizer

        return LibTokenizer.from_gguf(smollm2_gguf_path()), ChatTemplate(True, SMOLLM2_SYSTEM)
    from fastpp.backends.torch.hf_tokenizer import load_hf_tokenizer

    tokenizer = load_hf_tokenizer(source.path)
    return tokenizer, ChatTemplate(chatml=tokenizer.token_id("<|im_start|>") is not None)

"""Tokenizers and chat templates the server uses, behind one small interface.

SmolLM2 (and Qwen2) chat models use ChatML; random-weight configs use raw bytes as token ids and
a plain ``role: content`` template, so every code path of the server runs without a download.
Real tokenizers are the ``tokenizers`` library's (``tokenizer.LibTokenizer``).
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

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return _ByteStream().feed(ids, final=True)

    def stream_decoder(self) -> _ByteStream:
        return _ByteStream()

    def min_tokens(self, text: str) -> int:
        return len(text)  # every character is at least one byte

    def token_id(self, token: str) -> int | None:
        return None


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """Renders OpenAI chat messages (role, content) into one prompt string."""

    chatml: bool
    default_system: str | None = None

    def render(self, messages: Sequence[tuple[str, str]]) -> str:
        if not self.chatml:
            return "".join(f"{role}: {content}\n" for role, content in messages) + "assistant:"
        parts = []
        if self.default_system is not None and (not messages or messages[0][0] != "system"):
            parts.append(f"<|im_start|>system\n{self.default_system}<|im_end|>\n")
        parts += [f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages]
        parts.append("<|im_start|>assistant\n")
        return "".join(parts)


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

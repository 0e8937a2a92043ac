"""Tokenizers and chat templates the server uses, behind one small interface.

SmolLM2 (and Qwen2) chat models use ChatML; random-weight configs use raw bytes as token ids and
a plain ``role: content`` template, so every code path of the server runs without a download.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from fastpp.backends.torch.weights_source import WeightsSource


class Tokenizer(Protocol):
    eos_token_id: int | None

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255; no special tokens, no EOS."""

    eos_token_id: int | None = None

    @property
    def vocab_size(self) -> int:
        return 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


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
        from fastpp.backends.torch.tokenizer import ByteBPETokenizer

        return ByteBPETokenizer.from_gguf(smollm2_gguf_path()), ChatTemplate(True, SMOLLM2_SYSTEM)
    from fastpp.backends.torch.hf_tokenizer import load_hf_tokenizer

    tokenizer = load_hf_tokenizer(source.path)
    return tokenizer, ChatTemplate(chatml="<|im_start|>" in tokenizer.vocab)

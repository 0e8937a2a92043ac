"""A Hugging Face ``tokenizer.json`` (byte-level BPE) as a :class:`ByteBPETokenizer`.

Reads the vocab, the merges (``"a b"`` strings or ``["a", "b"]`` pairs), the added tokens and
the pre-tokenizer: GPT-2's ``ByteLevel``, SmolLM's ``Digits`` + ``ByteLevel``, or a ``Split``
with its own regex + ``ByteLevel`` (Qwen2, Llama 3). A ``TemplateProcessing`` post-processor that
starts with a special token (Llama 3's ``<|begin_of_text|>``) becomes a prefix of every encoding.
Anything else (SentencePiece/Unigram models, other normalizers) is refused with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastpp.backends.torch.tokenizer import ByteBPETokenizer


class PrefixedTokenizer(ByteBPETokenizer):
    """A ByteBPETokenizer whose encodings start with fixed ids (a BOS token)."""

    prefix_ids: tuple[int, ...] = ()

    def encode(self, text: str) -> list[int]:
        return list(self.prefix_ids) + super().encode(text)


def _pre_tokenizer(spec: dict[str, Any] | None, where: Path) -> tuple[str, str | None]:
    """(known pre-tokenizer name, pattern override) for a ``pre_tokenizer`` entry."""
    if spec is None:
        parts: list[dict[str, Any]] = []
    else:
        parts = spec.get("pretokenizers", []) if spec.get("type") == "Sequence" else [spec]
    kinds = [p.get("type") for p in parts]
    if any(p.get("type") == "ByteLevel" and p.get("add_prefix_space") for p in parts):
        raise ValueError(f"{where}: ByteLevel add_prefix_space=true not supported")
    if kinds == ["ByteLevel"]:
        return "gpt2", None
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits"):
        return "smollm", None
    if kinds == ["Split", "ByteLevel"] and "Regex" in (parts[0].get("pattern") or {}):
        if parts[0].get("behavior") not in (None, "Isolated"):
            raise ValueError(f"{where}: Split behavior {parts[0].get('behavior')!r} not supported")
        return "gpt2", parts[0]["pattern"]["Regex"]
    raise ValueError(f"{where}: pre-tokenizer {kinds or None} not supported (byte-level BPE only)")


def _eos(root: Path, vocab: dict[str, int]) -> int | None:
    cfg_path = root / "tokenizer_config.json"
    if cfg_path.is_file():
        eos = json.loads(cfg_path.read_text()).get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str) and eos in vocab:
            return vocab[eos]
    model_cfg = root / "config.json"
    if model_cfg.is_file():
        eos_id = json.loads(model_cfg.read_text()).get("eos_token_id")
        if isinstance(eos_id, list) and eos_id:
            eos_id = eos_id[0]
        if isinstance(eos_id, int):
            return eos_id
    return None


def load_hf_tokenizer(root: str | Path) -> PrefixedTokenizer:
    """The tokenizer of a Hugging Face model directory (its ``tokenizer.json``)."""
    root = Path(root)
    path = root / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{root} has no tokenizer.json")
    data = json.loads(path.read_text())
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        raise ValueError(f"{path}: tokenizer model {model.get('type')!r} is not byte-level BPE")
    if data.get("normalizer"):
        raise ValueError(f"{path}: normalizer {data['normalizer'].get('type')!r} not supported")
    vocab: dict[str, int] = dict(model.get("vocab") or {})
    specials = []
    for tok in data.get("added_tokens") or []:
        vocab[tok["content"]] = tok["id"]
        if tok.get("special"):
            specials.append(tok["id"])
    size = max(vocab.values()) + 1
    tokens = [f"<unused_{i}>" for i in range(size)]
    for tok, i in vocab.items():
        tokens[i] = tok
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    pre, pattern = _pre_tokenizer(data.get("pre_tokenizer"), path)
    tokenizer = PrefixedTokenizer(tokens, merges, specials, _eos(root, vocab), pre, pattern)
    single = ((data.get("post_processor") or {}).get("single")) or []
    prefix = []
    for piece in single:
        if "SpecialToken" not in piece:
            break
        prefix.append(vocab[piece["SpecialToken"]["id"]])
    tokenizer.prefix_ids = tuple(prefix)
    return tokenizer

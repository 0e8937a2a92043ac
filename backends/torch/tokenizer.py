"""Byte-level BPE tokenizer (GPT-2 family) built from a GGUF file's vocab and merges.

Matches HF ``tokenizers`` for the pre-tokenizers it names in ``PRE_TOKENIZERS``: text is split
around special tokens, then into pre-token pieces by regex, each piece's UTF-8 bytes are mapped
to printable characters (GPT-2's byte-to-unicode table) and merged by rank. Decoding inverts
the byte mapping. Needs the ``regex`` package (for ``\\p{L}`` / ``\\p{N}``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import regex

# GPT-2's pre-token pattern
_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# GGUF ``tokenizer.ggml.pre`` -> (isolate every digit first?, pattern). SmolLM's HF tokenizer is
# Digits(individual_digits=True) followed by ByteLevel's GPT-2 regex.
PRE_TOKENIZERS: dict[str, tuple[bool, str]] = {"gpt2": (False, _GPT2), "smollm": (True, _GPT2)}
_DIGIT = regex.compile(r"(\p{N})")
_CONTROL = 3  # GGUF token_type of control (special) tokens
_MAX_CACHED_WORDS = 1 << 16  # the per-word BPE cache is cleared when it reaches this size


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable unicode characters."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


class ByteBPETokenizer:
    """``encode(text) -> ids`` and ``decode(ids) -> text``; ``decode(encode(t)) == t`` for any text.

    Special tokens written literally in the text (``<|im_start|>``) encode to their ids. No BOS
    is added (SmolLM2 adds none).
    """

    def __init__(self, tokens: Sequence[str], merges: Iterable[str], special_ids: Iterable[int],
                 eos_token_id: int | None, pre: str, pattern: str | None = None) -> None:
        """``pre`` names a known pre-tokenizer; ``pattern``, if given, replaces its split regex
        (Hugging Face ``Split`` pre-tokenizers carry their own, e.g. Qwen2's)."""
        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"pre-tokenizer {pre!r} not supported; known: {sorted(PRE_TOKENIZERS)}")
        self.split_digits, known = PRE_TOKENIZERS[pre]
        pattern = pattern or known
        self._pattern = regex.compile(pattern)
        self.tokens = list(tokens)
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.special_ids = frozenset(special_ids)
        self.eos_token_id = eos_token_id
        specials = sorted((self.tokens[i] for i in self.special_ids), key=len, reverse=True)
        self._special_re = regex.compile("(" + "|".join(regex.escape(s) for s in specials) + ")") \
            if specials else None
        self._byte_enc = _bytes_to_unicode()
        self._byte_dec = {c: b for b, c in self._byte_enc.items()}
        self._cache: dict[str, list[int]] = {}

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @staticmethod
    def from_gguf(path: str | Path) -> ByteBPETokenizer:
        """The tokenizer stored in a GGUF file's ``tokenizer.ggml.*`` metadata (model ``gpt2``)."""
        from gguf import GGUFReader  # optional dependency: only this constructor needs it

        fields = GGUFReader(path).fields
        kind = fields["tokenizer.ggml.model"].contents()
        if kind != "gpt2":
            raise ValueError(f"tokenizer model {kind!r} is not byte-level BPE ('gpt2')")
        types = fields["tokenizer.ggml.token_type"].contents()
        return ByteBPETokenizer(
            tokens=fields["tokenizer.ggml.tokens"].contents(),
            merges=fields["tokenizer.ggml.merges"].contents(),
            special_ids=[i for i, t in enumerate(types) if t == _CONTROL],
            eos_token_id=int(fields["tokenizer.ggml.eos_token_id"].contents()),
            pre=fields["tokenizer.ggml.pre"].contents(),
        )

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        parts = self._special_re.split(text) if self._special_re else [text]
        for k, part in enumerate(parts):
            if k % 2:  # captured special token
                ids.append(self.vocab[part])
                continue
            pieces = _DIGIT.split(part) if self.split_digits else [part]
            for piece in pieces:
                for word in self._pattern.findall(piece):
                    ids.extend(self._bpe(word))
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        out: list[str] = []
        buf = bytearray()
        for i in ids:
            tok = self.tokens[i]
            if i in self.special_ids:
                out.append(buf.decode("utf-8", errors="replace"))
                buf.clear()
                if not skip_special:
                    out.append(tok)
            else:
                buf.extend(self._byte_dec[c] for c in tok)
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def _bpe(self, word: str) -> list[int]:
        """Merge one pre-token's byte symbols by rank (lowest first) and map them to ids."""
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        symbols = [self._byte_enc[b] for b in word.encode("utf-8")]
        ranks = self.ranks
        while len(symbols) > 1:
            best, best_rank = -1, len(ranks)
            for j in range(len(symbols) - 1):
                r = ranks.get((symbols[j], symbols[j + 1]))
                if r is not None and r < best_rank:
                    best, best_rank = j, r
            if best < 0:
                break
            symbols[best:best + 2] = [symbols[best] + symbols[best + 1]]
        ids = [self.vocab[s] for s in symbols]
        if len(self._cache) >= _MAX_CACHED_WORDS:
            self._cache.clear()
        self._cache[word] = ids
        return ids

"""Tokenizers from the ``tokenizers`` library (Rust; what every serving engine uses).

:class:`LibTokenizer` wraps a ``tokenizers.Tokenizer``: a Hugging Face ``tokenizer.json`` loaded
as is (normalizers, pre-tokenizers, ``ignore_merges``, Sequence post-processors: all the
library's), or one built here from a GGUF file's ``tokenizer.ggml.*`` metadata (byte-level BPE,
``gpt2`` model). Encoding is linear in the text and releases the GIL, so a server can encode in a
worker thread while its event loop keeps answering. Streaming detokenization uses the library's
``decoders.DecodeStream``.

A chat prompt is encoded in pieces (:meth:`LibTokenizer.encode_chat`): only the template's own
markers may become special tokens; the messages' text is plain text, so a user who writes
``<|im_end|>`` gets those characters' tokens, never the control token (no forged turns).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Encoding, Tokenizer, decoders, models, pre_tokenizers, processors
from tokenizers.decoders import DecodeStream

_CONTROL = 3  # GGUF token_type of control (special) tokens
# GGUF ``tokenizer.ggml.pre`` -> the Hugging Face pre-tokenizer it stands for. SmolLM's is Digits
# (each digit alone) then ByteLevel's GPT-2 regex.
_GGUF_PRE = {
    "gpt2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    "smollm": lambda: pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    ),
}
# normalizers after which every normalized character came from at most this many input characters
# (NFC composes; the longest canonical decomposition is 4 characters)
_SHRINK = {None: 1, "NFD": 1, "NFKD": 1, "NFC": 4, "NFKC": 4}
# pre-tokenizer parts that keep every byte of the text (so each byte lands in exactly one token)
_LOSSLESS_PRE = {"ByteLevel", "Digits", "Split"}


class StreamDecoder:
    """Text deltas of a growing token list (special tokens skipped), never half a character.

    ``feed`` returns what the new ids add; ``flush`` at the end returns what was held back
    (an incomplete UTF-8 sequence, as U+FFFD), so the deltas add up to ``decode(ids, skip_special=True)``.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._stream = DecodeStream(skip_special_tokens=True)
        self._ids: list[int] = []
        self._sent: list[str] = []

    def feed(self, ids: Iterable[int]) -> str:
        parts = []
        for i in ids:
            self._ids.append(i)
            text = self._stream.step(self._tok, i)
            if text:
                parts.append(text)
        out = "".join(parts)
        self._sent.append(out)
        return out

    def flush(self) -> str:
        full = self._tok.decode(self._ids, skip_special_tokens=True)
        sent = "".join(self._sent)
        rest = full[len(sent) :] if full.startswith(sent) else ""
        self._sent.append(rest)
        return rest


class LibTokenizer:
    """``encode(text) -> ids`` (with the tokenizer's own special tokens, e.g. a BOS) and ``decode``."""

    def __init__(self, tokenizer: Tokenizer, eos_token_id: int | None) -> None:
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self._chars_per_token = _chars_per_token_bound(tokenizer)
        # the same tokenizer with special tokens matched as plain text (its own object: encodes
        # on other threads never see the flag change)
        self._plain = Tokenizer.from_str(tokenizer.to_str())
        self._plain.encode_special_tokens = True

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        # encode_batch_fast releases the GIL (plain encode holds it for the whole call)
        return self.tokenizer.encode_batch_fast([text], add_special_tokens=True)[0].ids

    def special_tokens(self) -> list[str]:
        """The texts the tokenizer reads as special (control) tokens."""
        return [t.content for t in self.tokenizer.get_added_tokens_decoder().values() if t.special]

    def encode_chat(self, pieces: Sequence[tuple[str, bool]], add_special_tokens: bool = True) -> list[int]:
        """A rendered chat prompt from its pieces ``(text, is_markup)``: markup (the template's
        own markers) may hold special tokens, any other text is encoded with special tokens
        read as plain text. Each piece is encoded on its own and the tokenizer's post-processor
        (a BOS) applied once (``add_special_tokens``; not for a model's own chat template, which
        writes its BOS itself), which is what encoding the joined text does when the messages
        hold no special-token text: the library splits a text at its special tokens first."""
        texts = [(text, markup) for text, markup in pieces if text]
        if not texts:
            return self.tokenizer.encode_batch_fast([""], add_special_tokens=add_special_tokens)[0].ids
        markup = iter(self.tokenizer.encode_batch_fast([t for t, m in texts if m], add_special_tokens=False))
        plain = iter(self._plain.encode_batch_fast([t for t, m in texts if not m], add_special_tokens=False))
        encs = [next(markup) if m else next(plain) for _, m in texts]
        merged = Encoding.merge(encs, growing_offsets=True)
        return self.tokenizer.post_process(merged, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special)

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self.tokenizer)

    def min_tokens(self, text: str) -> int:
        """A lower bound on ``len(encode(text))`` without encoding (0 when none is known)."""
        if self._chars_per_token is None:
            return 0
        return math.ceil(len(text) / self._chars_per_token)

    @staticmethod
    def from_file(path: str | Path, eos_token_id: int | None) -> LibTokenizer:
        """A Hugging Face ``tokenizer.json``, as the library reads it."""
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises plain Exception with its parser's message
            raise ValueError(f"{path}: not a tokenizer the tokenizers library can load: {exc}") from None
        return LibTokenizer(tok, eos_token_id)

    @staticmethod
    def from_gguf(path: str | Path, fields: Mapping[str, Any] | None = None) -> LibTokenizer:
        """The tokenizer in a GGUF file's ``tokenizer.ggml.*`` metadata (model ``gpt2``);
        ``fields``: the file's ``GGUFReader(path).fields`` where the caller has read them."""
        if fields is None:
            from gguf import GGUFReader  # optional dependency: only this constructor needs it

            fields = GGUFReader(path).fields
        kind = fields["tokenizer.ggml.model"].contents()
        if kind != "gpt2":
            raise ValueError(f"{path}: GGUF tokenizer model {kind!r} is not byte-level BPE ('gpt2')")
        pre = fields["tokenizer.ggml.pre"].contents()
        if pre not in _GGUF_PRE:
            raise ValueError(f"{path}: GGUF pre-tokenizer {pre!r} not supported; known: {sorted(_GGUF_PRE)}")
        tokens = fields["tokenizer.ggml.tokens"].contents()
        types = fields["tokenizer.ggml.token_type"].contents()
        merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"].contents()]
        tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
        tok.pre_tokenizer = _GGUF_PRE[pre]()
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens(
            [
                AddedToken(tokens[i], special=True, normalized=False)
                for i, t in enumerate(types)
                if t == _CONTROL
            ]
        )
        add_bos = fields.get("tokenizer.ggml.add_bos_token")
        if add_bos is not None and add_bos.contents():
            bos_id = int(fields["tokenizer.ggml.bos_token_id"].contents())
            bos = tokens[bos_id]
            tok.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A", special_tokens=[(bos, bos_id)]
            )
        return LibTokenizer(tok, int(fields["tokenizer.ggml.eos_token_id"].contents()))


def _parts(spec: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    if spec is None:
        return []
    return spec.get(key, []) if spec.get("type") == "Sequence" else [spec]


def _chars_per_token_bound(tokenizer: Tokenizer) -> int | None:
    """Most text characters one token can stand for, where that is knowable from the tokenizer's
    description: a byte-level BPE (every text byte in exactly one token, so a token covers at most
    its own byte length) behind no normalizer or a Unicode normal form. None otherwise (Unigram,
    WordPiece's [UNK] for a whole word, normalizers that drop characters...)."""
    spec = json.loads(tokenizer.to_str())
    model = spec.get("model") or {}
    pre = _parts(spec.get("pre_tokenizer"), "pretokenizers")
    norms = [n.get("type") for n in _parts(spec.get("normalizer"), "normalizers")]
    if model.get("type") != "BPE" or not any(p.get("type") == "ByteLevel" for p in pre):
        return None
    if any(p.get("type") not in _LOSSLESS_PRE or p.get("behavior") not in (None, "Isolated") for p in pre):
        return None
    if any(n not in _SHRINK for n in norms):
        return None
    shrink = max((_SHRINK[n] for n in norms), default=1)
    # byte-level tokens spell one byte per character; added tokens match their text literally
    longest = max((len(t) for t in (model.get("vocab") or {})), default=1)
    added = max((len(t["content"].encode("utf-8")) for t in spec.get("added_tokens") or []), default=1)
    return max(longest, added, 1) * shrink

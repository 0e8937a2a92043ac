"""Incremental detokenization: text deltas from a growing token list, never half a character."""

from __future__ import annotations

from collections.abc import Iterable

from fastpp.backends.torch.text import Tokenizer

_REPLACEMENT = "\ufffd"
_LOOKBACK = 6  # tokens re-decoded before the unsent ones, so BPE byte pieces join up


class Detokenizer:
    """Feed tokens, get the new text; ``flush`` at the end returns anything held back.

    Decodes a short window of recent tokens and emits what it adds past the text already
    sent; output ending in U+FFFD (a UTF-8 sequence cut mid-character) is held until the next
    token completes it. Special tokens (EOS) are skipped.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids[: _read] are fully sent
        self.text = ""  # everything sent so far

    def feed(self, ids: Iterable[int]) -> str:
        self.ids.extend(ids)
        return self._step(final=False)

    def flush(self) -> str:
        return self._step(final=True)

    def _step(self, final: bool) -> str:
        dec = self.tokenizer.decode
        prefix_text = dec(self.ids[self._prefix:self._read], skip_special=True)
        full = dec(self.ids[self._prefix:], skip_special=True)
        if not final and full.endswith(_REPLACEMENT):
            return ""
        new = full[len(prefix_text):] if full.startswith(prefix_text) else full
        self._prefix = max(0, len(self.ids) - _LOOKBACK)
        self._read = len(self.ids)
        self.text += new
        return new

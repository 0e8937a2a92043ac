"""``--tokenizer``: exact token counts for ``fastpp bench`` from a Hugging Face ``tokenizer.json``.

Without a tokenizer the bench sends one common word per requested token (``prompts``), which is
about right for GPT-2-style vocabularies. With one (a ``tokenizer.json`` file, or a model folder
holding one, loaded by the ``tokenizers`` library the torch engine uses) it does what
``sglang.benchmark.serving``'s random dataset does with the model's tokenizer:

- a prompt of ``prompt_len`` tokens is text that encodes to ``prompt_len - S`` tokens, where S is
  the number of special tokens (a BOS) the tokenizer adds, so the server sees ``prompt_len``;
  the run's input token count is that text count, as sglang counts it;
- ``total_output_tokens_retokenized`` counts the generated text's tokens again (no specials).

Only local files: a hub name such as ``Qwen/Qwen2-7B`` is not downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastpp.backends.bench.prompts import synthetic_prompt

_MAX_FIXES = 4  # re-encode rounds when decoded text does not encode back to the same length


@dataclass(slots=True)
class BenchTokenizer:
    """A loaded tokenizer and where it came from."""

    tokenizer: Any  # tokenizers.Tokenizer
    source: Path

    @property
    def num_special_tokens(self) -> int:
        """Special tokens the tokenizer adds around one text (a BOS, say)."""
        return int(self.tokenizer.num_special_tokens_to_add(False))

    def count(self, text: str) -> int:
        """Tokens of ``text`` without the special ones."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def count_many(self, texts: list[str]) -> list[int]:
        if not texts:
            return []
        return [len(e.ids) for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def prompt(self, prompt_len: int, seed: int, req_id: int) -> str:
        """Text that encodes to ``max(1, prompt_len - specials)`` tokens (or as close as the
        vocabulary allows): random common words, cut or extended at token boundaries."""
        target = max(1, prompt_len - self.num_special_tokens)
        text = synthetic_prompt(target, seed, req_id)
        extra = 0
        for _ in range(_MAX_FIXES):
            ids = self.tokenizer.encode(text, add_special_tokens=False).ids
            if len(ids) == target:
                return text
            if len(ids) > target:
                text = self.tokenizer.decode(ids[:target])
            else:  # words that split into several tokens: fewer words made it; add more
                extra += target - len(ids)
                text = f"{text} {synthetic_prompt(target - len(ids), seed + 1, req_id * 7919 + extra)}"
        return text


def load_tokenizer(path: str | Path) -> BenchTokenizer:
    """The tokenizer at ``path`` (a ``tokenizer.json`` or a folder holding one); ValueError
    naming ``--tokenizer`` and the path when there is none or it cannot be read."""
    root = Path(path).expanduser()
    file = root / "tokenizer.json" if root.is_dir() else root
    if not file.is_file():
        where = "has no tokenizer.json" if root.is_dir() else "is neither a folder nor a tokenizer.json file"
        raise ValueError(f"--tokenizer {path}: {where} (only local files are read, nothing is downloaded)")
    try:
        from tokenizers import Tokenizer
    except ModuleNotFoundError:
        raise ValueError("--tokenizer needs the tokenizers package: pip install tokenizers") from None
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as exc:  # the library raises plain Exception with its parser's message
        raise ValueError(
            f"--tokenizer {path}: {file} is not a tokenizer the tokenizers library reads ({exc})"
        ) from None
    return BenchTokenizer(tok, file)

"""A Hugging Face model directory's tokenizer: its ``tokenizer.json`` as the ``tokenizers``
library loads it, with the EOS id from ``tokenizer_config.json`` or ``config.json``."""

from __future__ import annotations

import json
from pathlib import Path

from fastpp.backends.torch.tokenizer import LibTokenizer


def _eos(root: Path, lib: LibTokenizer) -> int | None:
    cfg_path = root / "tokenizer_config.json"
    if cfg_path.is_file():
        eos = json.loads(cfg_path.read_text()).get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str) and lib.token_id(eos) is not None:
            return lib.token_id(eos)
    model_cfg = root / "config.json"
    if model_cfg.is_file():
        eos_id = json.loads(model_cfg.read_text()).get("eos_token_id")
        if isinstance(eos_id, list) and eos_id:
            eos_id = eos_id[0]
        if isinstance(eos_id, int):
            return eos_id
    return None


def load_hf_tokenizer(root: str | Path) -> LibTokenizer:
    """The tokenizer of a Hugging Face model directory (its ``tokenizer.json``)."""
    root = Path(root)
    path = root / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{root} has no tokenizer.json")
    lib = LibTokenizer.from_file(path, None)
    lib.eos_token_id = _eos(root, lib)
    return lib

"""A Hugging Face model directory's tokenizer: its ``tokenizer.json`` as the ``tokenizers``
library loads it, with the EOS id from ``tokenizer_config.json`` or ``config.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastpp.backends.torch.tokenizer import LibTokenizer


def json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding an object; ``ValueError`` naming the file otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read it as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _eos(root: Path, lib: LibTokenizer) -> int | None:
    cfg_path = root / "tokenizer_config.json"
    if cfg_path.is_file():
        eos = json_object(cfg_path).get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str) and lib.token_id(eos) is not None:
            return lib.token_id(eos)
    model_cfg = root / "config.json"
    if model_cfg.is_file():
        eos_id = json_object(model_cfg).get("eos_token_id")
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

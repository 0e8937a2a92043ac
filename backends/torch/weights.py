"""Model weights under Hugging Face names, from three sources: a seed, an HF directory, a GGUF file.

Every loader returns a :class:`ModelWeights` whose tensors are checked against the config's
expected names and shapes, so a loader bug fails here, not as garbage logits later. Tensors use
HF's Llama/Qwen2 naming (``model.layers.3.self_attn.q_proj.weight``, ``[out, in]`` matrices) and
the rotate-half RoPE layout.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from fastpp.backends.torch.config import ModelConfig, from_hf_config, get_config

EMBEDDING_STD = 0.02  # random embeddings: GPT-2/Llama's initializer_range


@dataclass(frozen=True, slots=True)
class ModelWeights:
    """A full model's tensors by HF name. Invariant (checked): exactly :func:`expected_shapes`."""

    config: ModelConfig
    tensors: dict[str, torch.Tensor]

    def __post_init__(self) -> None:
        want = expected_shapes(self.config)
        missing = sorted(set(want) - set(self.tensors))
        extra = sorted(set(self.tensors) - set(want))
        if missing or extra:
            raise ValueError(
                f"weights for {self.config.name!r}: {len(missing)} missing {missing[:5]}, "
                f"{len(extra)} unexpected {extra[:5]}"
            )
        for name, shape in want.items():
            got = tuple(self.tensors[name].shape)
            if got != shape:
                raise ValueError(
                    f"weights for {self.config.name!r}: {name} has shape {got}, expected {shape}"
                )

    def to(self, dtype: torch.dtype) -> ModelWeights:
        """A copy with every tensor cast to ``dtype``."""
        return ModelWeights(self.config, {k: v.to(dtype) for k, v in self.tensors.items()})


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of ``config`` holds, by HF name, with its shape."""
    c = config
    d = c.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, d)}
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (c.q_size, d),
            p + "self_attn.k_proj.weight": (c.kv_size, d),
            p + "self_attn.v_proj.weight": (c.kv_size, d),
            p + "self_attn.o_proj.weight": (d, c.q_size),
            p + "post_attention_layernorm.weight": (d,),
            p + "mlp.gate_proj.weight": (c.intermediate_size, d),
            p + "mlp.up_proj.weight": (c.intermediate_size, d),
            p + "mlp.down_proj.weight": (d, c.intermediate_size),
        }
        if c.qkv_bias:
            shapes |= {
                p + "self_attn.q_proj.bias": (c.q_size,),
                p + "self_attn.k_proj.bias": (c.kv_size,),
                p + "self_attn.v_proj.bias": (c.kv_size,),
            }
    shapes["model.norm.weight"] = (d,)
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, d)
    return shapes


# ---------------------------------------------------------------------------- (c) random
def random_weights(
    config: ModelConfig | str, seed: int = 0, dtype: torch.dtype = torch.float32
) -> ModelWeights:
    """Seeded random weights: the same ``(config, seed)`` gives bit-identical tensors.

    Embeddings (and an untied lm_head) have std ``EMBEDDING_STD``, so logits stay small. Matrices
    have std ``1/sqrt(fan_in)``, so every block's output is as large as its normalised input and
    attention and MLP shape the output (with std 0.02 everywhere the residual stream would stay the
    token's own embedding and greedy decoding would just repeat the prompt's last token).
    Norm weights are ``1 + 0.1 * N(0, 1)`` and biases ``0.1 * N(0, 1)``, so loading them matters.
    Drawn in float32 in name order, then cast.
    """
    cfg = get_config(config) if isinstance(config, str) else config
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith(".bias"):
            t = 0.1 * torch.randn(shape, generator=gen)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            t = EMBEDDING_STD * torch.randn(shape, generator=gen)
        else:
            t = torch.randn(shape, generator=gen) / math.sqrt(shape[1])
        tensors[name] = t.to(dtype)
    return ModelWeights(cfg, tensors)


# ---------------------------------------------------------------------------- (b) HF directory
def load_hf_dir(path: str | Path, dtype: torch.dtype = torch.float32) -> ModelWeights:
    """``config.json`` plus every ``*.safetensors`` file of a Llama/Qwen2 checkpoint directory.

    Drops what carries no information here (RoPE ``inv_freq`` buffers of old checkpoints, and a
    ``lm_head.weight`` duplicate when embeddings are tied); any other unknown tensor is an error.
    Needs the ``safetensors`` package.
    """
    from safetensors.torch import load_file  # optional dependency: only this loader needs it

    root = Path(path)
    config = from_hf_config(json.loads((root / "config.json").read_text()), name=root.name)
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {root}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors |= load_file(str(f))
    tensors = {k: v.to(dtype) for k, v in tensors.items() if not k.endswith("rotary_emb.inv_freq")}
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    return ModelWeights(config, tensors)

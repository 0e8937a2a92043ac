"""One pipeline stage of a Llama/Qwen2-family decoder, and the split of layers over stages.

Stage interface (what travels between stages): the hidden state ``[T, D]`` after the stage's
last layer, which is the whole residual stream. The residual is not fused into the norms, so
there is exactly one tensor to send. Stage 0 takes token ids ``[T]``; the last stage applies
the final norm and lm_head to the sampling rows only (lm_head dominates small models).
"""

from __future__ import annotations

import torch
from torch import nn

from fastpp.backends.torch.config import ModelConfig
from fastpp.backends.torch.forward_batch import ForwardBatch
from fastpp.backends.torch.kv_cache import DEFAULT_BLOCK_SIZE, PagedKVCache
from fastpp.backends.torch.layers import DecoderLayer, RMSNorm, rope_tables
from fastpp.backends.torch.layout import BatchLayout
from fastpp.backends.torch.weights import ModelWeights


def split_layers(num_layers: int, num_stages: int) -> list[range]:
    """Contiguous layer ranges per stage, as vLLM's ``get_pp_indices`` places them.

    Every stage gets ``num_layers // num_stages``; the remainder goes one layer each to the
    stages just before the last, walking backwards (stage P-2, then P-3, ...). The last stage
    never gets an extra layer because it also runs the final norm and lm_head; the first gets
    one only when the remainder is P-1. Example: 5 layers on 3 stages -> [2, 2, 1].
    """
    if num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    if num_layers < num_stages:
        raise ValueError(f"cannot split {num_layers} layers over {num_stages} stages (a stage needs >= 1)")
    sizes = [num_layers // num_stages] * num_stages
    for i in range(2, num_layers % num_stages + 2):
        sizes[-i] += 1
    bounds = [sum(sizes[:i]) for i in range(num_stages + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(num_stages)]


class StageModel(nn.Module):
    """Layers ``layer_range`` of the model, plus the embedding and/or final norm + lm_head.

    Built with its parameters on the meta device; :meth:`load_weights` (or :func:`build_stages`)
    gives them values. ``forward`` runs one microbatch and writes its K/V into ``cache``.
    """

    def __init__(
        self,
        config: ModelConfig,
        layer_range: range,
        has_embedding: bool,
        has_lm_head: bool,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if layer_range.step != 1 or not 0 <= layer_range.start < layer_range.stop <= config.num_layers:
            raise ValueError(
                f"layer_range must be a non-empty contiguous range within "
                f"0..{config.num_layers}, got {layer_range}"
            )
        self.config = config
        self.layer_range = layer_range
        self.has_embedding = has_embedding
        self.has_lm_head = has_lm_head
        self.dtype = dtype
        self.is_loaded = False
        with torch.device("meta"):
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size) if has_embedding else None
            self.layers = nn.ModuleList(DecoderLayer(config) for _ in layer_range)
            d, vocab = config.hidden_size, config.vocab_size
            self.norm = RMSNorm(d, config.rms_norm_eps) if has_lm_head else None
            self.lm_head = nn.Linear(d, vocab, bias=False) if has_lm_head else None
        cos, sin = rope_tables(config, dtype)
        self.register_buffer("cos_table", cos, persistent=False)
        self.register_buffer("sin_table", sin, persistent=False)

    def load_weights(self, weights: ModelWeights) -> None:
        """Take this stage's tensors from ``weights`` (HF names), fusing q|k|v and gate|up.

        Unfused tensors already in the stage's dtype are shared with ``weights``, not copied.
        """
        if weights.config != self.config:
            raise ValueError(f"weights are for {weights.config.name!r}, stage is for {self.config.name!r}")
        w = weights.tensors
        sd: dict[str, torch.Tensor] = {}
        if self.has_embedding:
            sd["embed_tokens.weight"] = w["model.embed_tokens.weight"]
        for j, i in enumerate(self.layer_range):
            src, dst = f"model.layers.{i}.", f"layers.{j}."
            for name in (
                "input_layernorm.weight",
                "post_attention_layernorm.weight",
                "self_attn.o_proj.weight",
                "mlp.down_proj.weight",
            ):
                sd[dst + name] = w[src + name]
            qkv = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
            sd[dst + "self_attn.qkv_proj.weight"] = torch.cat([w[f"{src}{p}.weight"] for p in qkv])
            if self.config.qkv_bias:
                sd[dst + "self_attn.qkv_proj.bias"] = torch.cat([w[f"{src}{p}.bias"] for p in qkv])
            sd[dst + "mlp.gate_up_proj.weight"] = torch.cat(
                [w[src + "mlp.gate_proj.weight"], w[src + "mlp.up_proj.weight"]]
            )
        if self.has_lm_head:
            sd["norm.weight"] = w["model.norm.weight"]
            tied = self.config.tie_word_embeddings
            sd["lm_head.weight"] = w["model.embed_tokens.weight" if tied else "lm_head.weight"]
        sd = {k: v.to(self.dtype) for k, v in sd.items()}
        self.load_state_dict(sd, strict=True, assign=True)
        self.requires_grad_(False)
        self.is_loaded = True

    def make_kv_cache(self, num_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE) -> PagedKVCache:
        """An empty paged cache shaped for this stage's layers and dtype."""
        c = self.config
        return PagedKVCache(len(self.layers), num_blocks, c.num_kv_heads, c.head_dim, block_size, self.dtype)

    @torch.inference_mode()
    def forward(self, inputs: torch.Tensor, layout: BatchLayout, cache: PagedKVCache) -> torch.Tensor:
        """Run one microbatch through this stage.

        ``inputs`` is token ids ``[T]`` (int64) on the embedding stage, else the previous stage's
        hidden states ``[T, D]``. Returns hidden states ``[T, D]``, or on the lm_head stage float32
        logits ``[S, V]`` for the sampling slices in row order (``layout.sample_req_ids``).
        The cache must hold every slice's ``context_len`` tokens (``PagedKVCache.allocate``).
        """
        # inputs: [T] or [T, D]
        if not self.is_loaded:
            raise RuntimeError("StageModel has no weights: call load_weights() first")
        if cache.num_layers != len(self.layers) or cache.k.dtype != self.dtype:
            raise ValueError(
                f"cache has {cache.num_layers} layers of {cache.k.dtype}, "
                f"stage has {len(self.layers)} of {self.dtype}"
            )
        want = (layout.num_tokens,) if self.has_embedding else (layout.num_tokens, self.config.hidden_size)
        if tuple(inputs.shape) != want:
            raise ValueError(f"inputs must have shape {want}, got {tuple(inputs.shape)}")
        fb = ForwardBatch.build(layout, cache, self.cos_table, self.sin_table)
        x = self.embed_tokens(inputs) if self.embed_tokens is not None else inputs.to(self.dtype)
        for j, layer in enumerate(self.layers):
            x = layer(x, fb, cache, j)
        if self.lm_head is None:
            return x
        assert self.norm is not None
        return self.lm_head(self.norm(x[fb.sample_rows])).float()


def build_stages(
    weights: ModelWeights, num_stages: int, dtype: torch.dtype = torch.float32
) -> list[StageModel]:
    """The model split over ``num_stages`` loaded stages (layers placed by :func:`split_layers`)."""
    ranges = split_layers(weights.config.num_layers, num_stages)
    stages = []
    for s, r in enumerate(ranges):
        stage = StageModel(
            weights.config, r, has_embedding=s == 0, has_lm_head=s == num_stages - 1, dtype=dtype
        )
        stage.load_weights(weights)
        stages.append(stage)
    return stages

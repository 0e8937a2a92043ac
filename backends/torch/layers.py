"""Decoder building blocks for ragged, paged serving: RMSNorm, RoPE, GQA attention, SwiGLU MLP.

Activations are flat ``[T, ...]`` over all tokens of a microbatch; no batch/padding dimension.
Projections are fused (q|k|v and gate|up) so a layer runs 4 matmuls; the weight loader
concatenates the checkpoint's separate matrices in that order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastpp.backends.torch.config import ModelConfig
from fastpp.backends.torch.forward_batch import ForwardBatch
from fastpp.backends.torch.kv_cache import PagedKVCache


class RMSNorm(nn.Module):
    """``w * x / rms(x)``, normalised in float32 and cast back (as HF Llama does)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D]
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_tables(config: ModelConfig, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[max_context, head_dim]`` for the rotate-half (GPT-NeoX / HF) RoPE layout.

    Computed in float32 and then cast, like HF's rotary embedding, so float32 runs match it.
    """
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.outer(torch.arange(config.max_context, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + head_dim/2) of every head by the token's angle."""
    # x: [T, NH, hd]; cos, sin: [T, hd]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


class Attention(nn.Module):
    """Grouped-query self-attention over a paged KV cache.

    Contract of ``forward``: writes the new tokens' K/V into ``cache`` at local layer ``layer``
    before attending, so each token sees its request's cached prefix and, causally, the new
    tokens of its own slice, never another request's.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.q_size
        self.kv_size = config.kv_size
        qkv_size = config.q_size + 2 * config.kv_size
        self.qkv_proj = nn.Linear(config.hidden_size, qkv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, fb: ForwardBatch, cache: PagedKVCache, layer: int) -> torch.Tensor:
        # x: [T, D] -> [T, D]
        T = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rope(q.view(T, self.num_heads, self.head_dim), fb.cos, fb.sin)
        k = apply_rope(k.view(T, self.num_kv_heads, self.head_dim), fb.cos, fb.sin)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        cache.write(layer, fb.slot_mapping, k, v)
        out = torch.empty_like(q)  # [T, H, hd]
        for c in fb.chunks:  # prefill chunks
            q_c = q[c.start : c.end].transpose(0, 1).unsqueeze(0)  # [1, H, n, hd]
            if c.is_first_chunk:
                k_c, v_c = k[c.start : c.end], v[c.start : c.end]
            else:
                k_c, v_c = cache.gather(layer, c.block_ids, c.context_len)
            o = F.scaled_dot_product_attention(
                q_c,
                k_c.transpose(0, 1).unsqueeze(0),
                v_c.transpose(0, 1).unsqueeze(0),
                attn_mask=c.mask,
                is_causal=c.is_first_chunk,
                enable_gqa=True,
            )
            out[c.start : c.end] = o.squeeze(0).transpose(0, 1)
        if fb.decodes is not None:  # decode: one padded call for all single-token slices
            d = fb.decodes
            k_d, v_d = cache.gather_padded(layer, d.block_ids)  # [B, KV, Lpad, hd]
            q_d = q[d.rows].unsqueeze(2)  # [B, H, 1, hd]
            o = F.scaled_dot_product_attention(q_d, k_d, v_d, attn_mask=d.mask, enable_gqa=True)
            out[d.rows] = o.squeeze(2)
        return self.o_proj(out.view(T, self.q_size))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))`` with gate and up fused into one matmul."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D] -> [T, D]
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm block: ``x += attn(norm(x)); x += mlp(norm(x))`` (no fused residual)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, fb: ForwardBatch, cache: PagedKVCache, layer: int) -> torch.Tensor:
        # x: [T, D] -> [T, D]
        x = x + self.self_attn(self.input_layernorm(x), fb, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))

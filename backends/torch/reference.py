"""A plain full-sequence forward of the same weights: the oracle the paged engine is tested against.

Deliberately independent of ``layers.py``: unfused projections straight from the HF-named
tensors, GQA by repeating KV heads, and explicit ``softmax(q k^T / sqrt(d) + causal mask) v``
instead of SDPA; no KV cache, no paging, every step recomputes the whole sequence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from fastpp.backends.torch.weights import ModelWeights


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # x: [S, D]
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    # x: [NH, S, hd]; positions 0 .. S-1, rotate-half pairs (i, i + hd/2)
    S, d = x.shape[1], x.shape[2]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    ang = torch.arange(S, dtype=torch.float32)[:, None] * inv_freq[None, :]  # [S, hd/2]
    cos, sin = ang.cos().repeat(1, 2).to(x.dtype), ang.sin().repeat(1, 2).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


@torch.inference_mode()
def reference_logits(weights: ModelWeights, token_ids: Sequence[int]) -> torch.Tensor:
    """Float32 logits ``[S, V]`` at every position of ``token_ids`` (causal, from position 0)."""
    c = weights.config
    w = weights.tensors
    S = len(token_ids)
    x = w["model.embed_tokens.weight"][torch.tensor(list(token_ids), dtype=torch.int64)]  # [S, D]
    causal = torch.full((S, S), float("-inf")).triu(1)
    group = c.num_heads // c.num_kv_heads
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        h = _rms_norm(x, w[p + "input_layernorm.weight"], c.rms_norm_eps)

        def proj(name: str, h: torch.Tensor = h, p: str = p) -> torch.Tensor:
            return F.linear(h, w[f"{p}self_attn.{name}.weight"], w.get(f"{p}self_attn.{name}.bias"))

        q = proj("q_proj").view(S, c.num_heads, c.head_dim).transpose(0, 1)  # [H, S, hd]
        k = proj("k_proj").view(S, c.num_kv_heads, c.head_dim).transpose(0, 1)  # [KV, S, hd]
        v = proj("v_proj").view(S, c.num_kv_heads, c.head_dim).transpose(0, 1)
        q, k = _rope(q, c.rope_theta), _rope(k, c.rope_theta)
        k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)  # [H, S, hd]
        scores = q @ k.transpose(1, 2) / math.sqrt(c.head_dim) + causal.to(q.dtype)
        attn = (scores.float().softmax(-1).to(q.dtype) @ v).transpose(0, 1).reshape(S, c.q_size)
        x = x + F.linear(attn, w[p + "self_attn.o_proj.weight"])
        h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        gate = F.linear(h, w[p + "mlp.gate_proj.weight"])
        up = F.linear(h, w[p + "mlp.up_proj.weight"])
        x = x + F.linear(F.silu(gate) * up, w[p + "mlp.down_proj.weight"])
    x = _rms_norm(x, w["model.norm.weight"], c.rms_norm_eps)
    head = w["model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"]
    return F.linear(x, head).float()


def reference_generate(weights: ModelWeights, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation (argmax, lowest id on ties), recomputing the full sequence each step."""
    ids = list(prompt_ids)
    if not ids:
        raise ValueError("prompt_ids must be non-empty")
    for _ in range(max_new_tokens):
        ids.append(int(reference_logits(weights, ids)[-1].argmax()))
    return ids[len(prompt_ids) :]

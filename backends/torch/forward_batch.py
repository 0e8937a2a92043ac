"""Per-microbatch tensors every layer of a stage shares: positions, RoPE, cache addresses, masks.

Built once per stage per microbatch from a :class:`BatchLayout` and the stage's cache, so layers do
no Python bookkeeping beyond one loop over the multi-token slices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastpp.backends.torch.kv_cache import PagedKVCache
from fastpp.backends.torch.layout import BatchLayout


@dataclass(frozen=True, slots=True)
class ChunkAttn:
    """Attention inputs of one multi-token slice (a prefill chunk)."""

    start: int  # first row in the flat tensor
    end: int  # one past the last row
    context_len: int  # keys attended by the last row: cached + new
    block_ids: torch.Tensor  # [NB] int64 blocks holding positions 0 .. context_len-1
    # [n, context_len] bool, True = may attend; None when there is no cached prefix (plain causal)
    mask: torch.Tensor | None

    @property
    def is_first_chunk(self) -> bool:
        """No cached prefix: keys are exactly the new tokens, so the fresh K/V serve directly."""
        return self.mask is None


@dataclass(frozen=True, slots=True)
class DecodeGroup:
    """All single-token slices of a microbatch, attended in one padded SDPA call.

    One call instead of one per request: per-call overhead dominates small decodes on CPU.
    """

    rows: torch.Tensor  # [B] int64 rows of the flat tensor
    block_ids: torch.Tensor  # [B, NBmax] int64, padded with block 0 (masked out)
    mask: torch.Tensor  # [B, 1, 1, NBmax * block_size] bool, True for the first context_len slots


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    """Everything a stage's layers need about one microbatch besides the activations."""

    layout: BatchLayout
    positions: torch.Tensor  # [T] int64 position of each new token in its request
    cos: torch.Tensor  # [T, head_dim] RoPE cosines at ``positions``, model dtype
    sin: torch.Tensor  # [T, head_dim]
    slot_mapping: torch.Tensor  # [T] int64 cache slot of each new token
    chunks: tuple[ChunkAttn, ...]  # multi-token slices, row order
    decodes: DecodeGroup | None  # single-token slices, None when there are none
    sample_rows: torch.Tensor  # [S] int64 rows that produce logits, row order

    @staticmethod
    def build(
        layout: BatchLayout, cache: PagedKVCache, cos_table: torch.Tensor, sin_table: torch.Tensor
    ) -> ForwardBatch:
        """Derive the tensors; ``ValueError`` if a slice exceeds its KV reservation or the RoPE table."""
        # cos_table, sin_table: [max_context, head_dim]
        max_context = cos_table.shape[0]
        for s in layout.seqs:
            if s.context_len > max_context:
                raise ValueError(
                    f"request {s.req_id} reaches position {s.context_len - 1}, "
                    f"beyond max_context {max_context}"
                )
        index = cache.index(layout)
        positions = (
            torch.cat([torch.arange(s.num_cached_tokens, s.context_len) for s in layout.seqs])
            if layout.seqs
            else torch.empty(0, dtype=torch.int64)
        )
        chunks = []
        dec_rows, dec_blocks, dec_lens = [], [], []
        for s, blocks in zip(layout.seqs, index.block_ids, strict=True):
            if s.num_new_tokens == 1:  # decode (or a 1-token chunk: the same computation)
                dec_rows.append(s.start)
                dec_blocks.append(blocks)
                dec_lens.append(s.context_len)
                continue
            mask = None
            if s.num_cached_tokens:  # prefill after a cached prefix: causal, offset by the prefix
                q_pos = torch.arange(s.num_cached_tokens, s.context_len).unsqueeze(1)
                mask = torch.arange(s.context_len).unsqueeze(0) <= q_pos
            chunks.append(ChunkAttn(s.start, s.end, s.context_len, blocks, mask))
        decodes = None
        if dec_rows:
            bs = cache.block_size
            nb_max = max(len(b) for b in dec_blocks)
            padded = torch.zeros(len(dec_rows), nb_max, dtype=torch.int64)
            for i, b in enumerate(dec_blocks):
                padded[i, : len(b)] = b
            lens = torch.tensor(dec_lens)
            mask = (torch.arange(nb_max * bs).unsqueeze(0) < lens.unsqueeze(1)).view(len(dec_rows), 1, 1, -1)
            decodes = DecodeGroup(torch.tensor(dec_rows), padded, mask)
        return ForwardBatch(
            layout=layout,
            positions=positions,
            cos=cos_table[positions],
            sin=sin_table[positions],
            slot_mapping=index.slot_mapping,
            chunks=tuple(chunks),
            decodes=decodes,
            sample_rows=torch.tensor(layout.sample_rows, dtype=torch.int64),
        )

"""Paged KV cache of one pipeline stage: preallocated K/V blocks, a free list, block tables.

Every stage holds the same requests (each runs all layers), so every stage's cache makes the same
allocations; only the number of layers differs. Tokens are addressed by *slot*
``block * block_size + offset``; a request's position p lives in block ``table[p // block_size]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastpp.backends.torch.layout import BatchLayout

DEFAULT_BLOCK_SIZE = 16


class KVCacheFullError(RuntimeError):
    """An allocation needs more free blocks than the cache has. Nothing was allocated."""


@dataclass(frozen=True, slots=True)
class PagedIndex:
    """Where one microbatch's tokens live in the cache; built once, shared by all layers."""

    slot_mapping: torch.Tensor  # [T] int64: the slot each new token's K/V is written to
    block_ids: tuple[torch.Tensor, ...]  # per slice: [ceil(context_len / block_size)] int64, in order


class PagedKVCache:
    """K and V tensors ``[num_layers, num_blocks, block_size, num_kv_heads, head_dim]`` plus allocation.

    Contract: a block belongs to at most one request; ``allocate`` is all-or-nothing and raises
    :class:`KVCacheFullError` rather than reuse a block; ``free`` returns every block of a request.
    ``num_tokens(req_id)`` is the request's reserved length; a microbatch may write only positions
    below it (``index`` checks), so a request can never write into another's blocks.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        for name, v in (
            ("num_layers", num_layers),
            ("num_blocks", num_blocks),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
            ("block_size", block_size),
        ):
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        # zero_() touches every page now: torch.zeros' lazily mapped pages would otherwise fault
        # during the first forwards and skew their timing (and masked slots must be finite)
        self.k = torch.empty(shape, dtype=dtype).zero_()
        self.v = torch.empty(shape, dtype=dtype).zero_()
        # a stack: the lowest block ids come out first, which keeps small runs easy to read
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._tables: dict[int, list[int]] = {}
        self._num_tokens: dict[int, int] = {}
        # Reused destination of gathers. A fresh multi-MB tensor per layer would come from mmap
        # and page-fault on every fill, which measured 4x slower than the copy itself.
        self._scratch = torch.empty(0, dtype=dtype)

    # ------------------------------------------------------------------ allocation
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def __contains__(self, req_id: int) -> bool:
        return req_id in self._tables

    def num_tokens(self, req_id: int) -> int:
        """Tokens reserved for ``req_id`` (0 for an unknown request)."""
        return self._num_tokens.get(req_id, 0)

    def block_table(self, req_id: int) -> tuple[int, ...]:
        """The request's blocks in position order (empty for an unknown request)."""
        return tuple(self._tables.get(req_id, ()))

    def blocks_needed(self, num_tokens: int, req_id: int | None = None) -> int:
        """New blocks that ``allocate(req_id, num_tokens)`` would take; ``req_id`` None = a new request."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        have = self._num_tokens.get(req_id, 0) if req_id is not None else 0
        held = len(self._tables.get(req_id, ())) if req_id is not None else 0
        return max(0, -(-(have + num_tokens) // self.block_size) - held)

    def can_allocate(self, num_tokens: int, req_id: int | None = None) -> bool:
        """Whether ``num_tokens`` more tokens for ``req_id`` (or a new request) fit right now."""
        return self.blocks_needed(num_tokens, req_id) <= len(self._free)

    def allocate(self, req_id: int, num_tokens: int) -> None:
        """Grow ``req_id``'s reservation by ``num_tokens`` tokens (creating it if new).

        Uses the slack of its last block first. Raises :class:`KVCacheFullError` without
        changing anything when the free blocks do not suffice.
        """
        need = self.blocks_needed(num_tokens, req_id)
        if need > len(self._free):
            raise KVCacheFullError(
                f"request {req_id}: {num_tokens} more tokens need {need} blocks, only {len(self._free)} free "
                f"of {self.num_blocks}"
            )
        table = self._tables.setdefault(req_id, [])
        for _ in range(need):
            table.append(self._free.pop())
        self._num_tokens[req_id] = self._num_tokens.get(req_id, 0) + num_tokens

    def free(self, req_id: int) -> None:
        """Return all of ``req_id``'s blocks. ``KeyError`` if it holds none (double free)."""
        table = self._tables.pop(req_id, None)
        if table is None:
            raise KeyError(f"request {req_id} holds no KV blocks")
        del self._num_tokens[req_id]
        self._free.extend(reversed(table))

    # ------------------------------------------------------------------ addressing
    def index(self, layout: BatchLayout) -> PagedIndex:
        """Slots to write and blocks to read for ``layout``.

        Raises ``ValueError`` when a slice reaches past its request's reservation: writing there
        would need blocks the request does not own.
        """
        bs = self.block_size
        slots: list[torch.Tensor] = []
        block_ids: list[torch.Tensor] = []
        for s in layout.seqs:
            have = self._num_tokens.get(s.req_id, 0)
            if s.context_len > have:
                raise ValueError(
                    f"request {s.req_id} needs KV for {s.context_len} tokens but has {have} "
                    f"reserved; allocate() first"
                )
            table = torch.tensor(self._tables[s.req_id][: -(-s.context_len // bs)], dtype=torch.int64)
            pos = torch.arange(s.num_cached_tokens, s.context_len)
            slots.append(table[pos // bs] * bs + pos % bs)
            block_ids.append(table)
        slot_mapping = torch.cat(slots) if slots else torch.empty(0, dtype=torch.int64)
        return PagedIndex(slot_mapping, tuple(block_ids))

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new keys and values of local layer ``layer`` at ``slot_mapping``."""
        # slot_mapping: [T]; k, v: [T, KV, hd]. A non-finite value (a request whose hidden states
        # went NaN; it fails alone) is stored as 0: masked slots must be finite, and its blocks
        # are reused by other requests once it is freed
        self.k[layer].view(-1, *k.shape[1:])[slot_mapping] = torch.nan_to_num(k, 0.0, 0.0, 0.0)
        self.v[layer].view(-1, *v.shape[1:])[slot_mapping] = torch.nan_to_num(v, 0.0, 0.0, 0.0)

    def _gather_blocks(self, layer: int, flat_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # flat_ids: [N] -> k, v: [N, block_size, KV, hd], views of the scratch buffer
        block_shape = self.k.shape[2:]
        n = flat_ids.shape[0] * self.k[0, 0].numel()
        if self._scratch.numel() < 2 * n:
            self._scratch = torch.empty(2 * n, dtype=self.k.dtype)
        k = self._scratch[:n].view(-1, *block_shape)
        v = self._scratch[n : 2 * n].view(-1, *block_shape)
        # index_select, not k[layer][ids]: advanced indexing measured 4x slower on CPU
        torch.index_select(self.k[layer], 0, flat_ids, out=k)
        torch.index_select(self.v[layer], 0, flat_ids, out=v)
        return k, v

    def gather(self, layer: int, block_ids: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``length`` cached keys and values of one request at local layer ``layer``.

        The result is a view of a scratch buffer: valid until the next gather on this cache.
        """
        # block_ids: [NB] -> k, v: [length, KV, hd]
        k, v = self._gather_blocks(layer, block_ids)
        kv_shape = self.k.shape[3:]
        return k.view(-1, *kv_shape)[:length], v.view(-1, *kv_shape)[:length]

    def gather_padded(self, layer: int, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of whole blocks for several requests, heads first, for one SDPA call.

        Slots past a request's length hold stale or zero values: the caller masks them. The
        result is a view of a scratch buffer: valid until the next gather on this cache.
        """
        # block_ids: [B, NB] -> k, v: [B, KV, NB * block_size, hd]
        B = block_ids.shape[0]
        k, v = self._gather_blocks(layer, block_ids.reshape(-1))
        kv_shape = self.k.shape[3:]
        return k.view(B, -1, *kv_shape).transpose(1, 2), v.view(B, -1, *kv_shape).transpose(1, 2)

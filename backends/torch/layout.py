"""Layout of a ragged microbatch: which slice of the flat token tensor belongs to which request.

Torch-free plain data, so a stage can ship it to the next stage beside the hidden states.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fastpp.plan import MicroBatchPlan


@dataclass(frozen=True, slots=True)
class SeqSlice:
    """One request's part of a microbatch.

    Its new tokens sit at rows ``start .. start + num_new_tokens - 1`` of the flat [T] input and
    have positions ``num_cached_tokens .. num_cached_tokens + num_new_tokens - 1``: each attends to
    the request's ``num_cached_tokens`` cached tokens plus, causally, the new tokens before it.
    A decode is ``num_new_tokens == 1``; a prefill chunk is any count (with a cached prefix when
    it is not the first chunk).
    """

    req_id: int
    start: int  # first row in the flat token tensor
    num_new_tokens: int  # L_pre for a prefill chunk, 1 for a decode; >= 1
    num_cached_tokens: int  # L_past: this request's tokens already in the KV cache
    samples: bool  # the last new token produces logits (decode, or the chunk that ends a prefill)

    @property
    def end(self) -> int:
        """One past the last row of this slice in the flat tensor."""
        return self.start + self.num_new_tokens

    @property
    def context_len(self) -> int:
        """Tokens the last new token attends to, itself included (cached + new)."""
        return self.num_cached_tokens + self.num_new_tokens


@dataclass(frozen=True, slots=True)
class BatchLayout:
    """A microbatch's requests in row order. Invariants (checked): slices tile ``0 .. num_tokens``
    contiguously in order, request ids are distinct, every slice has at least one new token."""

    seqs: tuple[SeqSlice, ...]
    num_tokens: int  # T: rows of the flat input, = sum of num_new_tokens

    def __post_init__(self) -> None:
        row = 0
        seen: set[int] = set()
        for s in self.seqs:
            if s.num_new_tokens < 1 or s.num_cached_tokens < 0:
                raise ValueError(
                    f"request {s.req_id}: need num_new_tokens >= 1 and num_cached_tokens >= 0, "
                    f"got {s.num_new_tokens} and {s.num_cached_tokens}"
                )
            if s.start != row:
                raise ValueError(f"request {s.req_id} starts at row {s.start}, expected {row} (contiguous)")
            if s.req_id in seen:
                raise ValueError(f"request {s.req_id} appears twice in one microbatch")
            seen.add(s.req_id)
            row = s.end
        if row != self.num_tokens:
            raise ValueError(f"slices cover {row} rows but num_tokens is {self.num_tokens}")

    @staticmethod
    def build(entries: Iterable[tuple[int, int, int, bool]]) -> BatchLayout:
        """Lay out ``(req_id, num_new_tokens, num_cached_tokens, samples)`` entries back to back."""
        seqs = []
        row = 0
        for req_id, num_new, num_cached, samples in entries:
            seqs.append(SeqSlice(req_id, row, num_new, num_cached, samples))
            row += num_new
        return BatchLayout(tuple(seqs), row)

    @staticmethod
    def from_plan(plan: MicroBatchPlan) -> BatchLayout:
        """The scheduler's microbatch as rows: decodes first (plan order), then prefill chunks.

        A decode's ``decode_ctx`` counts the token it feeds, whose KV is not cached yet, so it has
        ``ctx - 1`` cached tokens. Logit rows follow the same order (see :attr:`sample_req_ids`).
        """
        decodes = [
            (rid, 1, ctx - 1, True) for rid, ctx in zip(plan.decode_req_ids, plan.decode_ctx, strict=True)
        ]
        chunks = [(c.req_id, c.num_tokens, c.num_computed, c.completes) for c in plan.prefill]
        return BatchLayout.build(decodes + chunks)

    @property
    def sample_req_ids(self) -> tuple[int, ...]:
        """Requests that get a logits row, in row order: row i of the last stage's logits is theirs."""
        return tuple(s.req_id for s in self.seqs if s.samples)

    @property
    def sample_rows(self) -> tuple[int, ...]:
        """Flat-tensor row of each sampling position (the slice's last new token), in row order."""
        return tuple(s.end - 1 for s in self.seqs if s.samples)

"""Per-request sampling parameters and the last stage's token sampler.

Greedy (``temperature == 0``) takes the argmax, lowest id on ties, exactly as the reference
forward does, so greedy outputs can be compared token for token. Otherwise softmax at the
temperature, optionally restricted to the top-p nucleus. A request with a seed draws from a
generator keyed by (seed, step): its output does not depend on what else shares the microbatch.
Any Python int is a valid seed: the generator's 64-bit seed is derived modulo 2**64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

_SEED_STRIDE = 1_000_003  # decorrelates (seed, step) pairs
_SEED_MOD = 1 << 64  # torch.Generator.manual_seed takes at most 64 bits


def generator_seed(seed: int, step: int) -> int:
    """The 64-bit seed of request ``seed``'s generator at output ``step``, in [0, 2**64).

    Reduced modulo 2**64, so a seed of any size works (``seed * stride + step`` overflows 64 bits
    for |seed| above about 1.8e13); for every seed whose product fitted before, this is the same
    value torch derived from it, so those outputs are unchanged."""
    return (seed * _SEED_STRIDE + step) % _SEED_MOD


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What one request asks of generation. Checked on construction (``ValueError`` names the field)."""

    max_tokens: int = 16
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()  # besides the model's EOS (unless ignore_eos)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= 100.0):
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature!r}")
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")

    def row(self, step: int) -> tuple[float, float, int | None, int]:
        """What the sampler needs for this request's ``step``-th output token (a plain tuple)."""
        return (self.temperature, self.top_p, self.seed, step)


SampleRow = tuple[float, float, "int | None", int]  # temperature, top_p, seed, step


def sample_tokens(logits: torch.Tensor, rows: list[SampleRow], generator: torch.Generator) -> list[int]:
    """One token per logits row. ``generator`` serves the rows without a seed."""
    # logits: [S, V] float32
    if logits.shape[0] != len(rows):
        raise ValueError(f"{logits.shape[0]} logits rows for {len(rows)} sampling rows")
    out: list[int] = []
    greedy = None
    for i, (temperature, top_p, seed, step) in enumerate(rows):
        if temperature == 0.0:
            if greedy is None:
                greedy = logits.argmax(dim=-1).tolist()
            out.append(int(greedy[i]))
            continue
        probs = torch.softmax(logits[i] / temperature, dim=-1)
        if top_p < 1.0:
            sorted_p, order = probs.sort(descending=True)
            keep = sorted_p.cumsum(0) - sorted_p < top_p  # always keeps the most likely token
            probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
        gen = generator if seed is None else torch.Generator().manual_seed(generator_seed(seed, step))
        out.append(int(torch.multinomial(probs, 1, generator=gen)))
    return out

"""Per-request sampling parameters and the last stage's token sampler.

Greedy (``temperature`` below ``GREEDY_BELOW``, 0 included) takes the argmax, lowest id on ties,
exactly as the reference forward does, so greedy outputs can be compared token for token.
Otherwise softmax at the temperature, optionally restricted to the top-p nucleus, which always
keeps the most likely token. Every accepted value is numerically safe: the row's maximum is
taken off before dividing by the temperature, so nothing overflows and softmax never gives NaN.
A row that still cannot be sampled (logits with no finite value) fails alone
(:func:`sample_rows`): its request ends with an error, the others in the batch go on.

A request with a seed draws from a generator keyed by (seed, step): its output does not depend
on what else shares the microbatch.
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
    # the caller checks stop strings in the text: a stop string found in the last token's text of
    # a request that ended by length still ends it as ``stop`` (``PipelineEngine.stop``)
    text_stops: bool = False

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

GREEDY_BELOW = 1e-5  # a temperature below this samples greedily (vLLM's _SAMPLING_EPS)
FAILED_TOKEN = -1  # sample_rows' token for a row that could not be sampled


class SamplingError(ValueError):
    """One row could not be sampled (its logits hold no finite value); says why, no traceback."""


def sample_rows(
    logits: torch.Tensor, rows: list[SampleRow], generator: torch.Generator
) -> tuple[list[int], dict[int, str]]:
    """One token per logits row, and the rows that failed: their token is ``FAILED_TOKEN`` and
    ``errors[row]`` says why. A failure is the row's alone; the other rows are sampled as usual.
    ``generator`` serves the rows without a seed."""
    # logits: [S, V], any float dtype; the arithmetic is float32 with the row's maximum taken off
    if logits.shape[0] != len(rows):
        raise ValueError(f"{logits.shape[0]} logits rows for {len(rows)} sampling rows")
    if not rows:
        return [], {}
    clean = _finite_top(logits)
    top = clean.amax(dim=-1)
    greedy = clean.argmax(dim=-1).tolist()  # the lowest id on ties
    out: list[int] = []
    errors: dict[int, str] = {}
    for i, (temperature, top_p, seed, step) in enumerate(rows):
        try:
            if not bool(torch.isfinite(top[i])):
                raise SamplingError("the model's logits hold no finite value")
            if temperature < GREEDY_BELOW:
                out.append(int(greedy[i]))
                continue
            gen = generator if seed is None else torch.Generator().manual_seed(generator_seed(seed, step))
            out.append(_draw(clean[i] - top[i], temperature, top_p, gen))
        except Exception as exc:  # this row's alone: its request fails, the batch goes on
            out.append(FAILED_TOKEN)
            errors[i] = f"sampling failed: {exc}"
    return out, errors


def sample_tokens(logits: torch.Tensor, rows: list[SampleRow], generator: torch.Generator) -> list[int]:
    """One token per logits row; ``SamplingError`` if any row cannot be sampled."""
    tokens, errors = sample_rows(logits, rows, generator)
    if errors:
        row, message = next(iter(errors.items()))
        raise SamplingError(f"row {row}: {message}")
    return tokens


def _finite_top(logits: torch.Tensor) -> torch.Tensor:
    """float32 logits with NaN as -inf and +inf as the largest float (so a row's maximum is
    finite unless every value is NaN or -inf)."""
    big = torch.finfo(torch.float32).max
    return torch.nan_to_num(logits.float(), nan=-math.inf, posinf=big, neginf=-math.inf)


def _draw(shifted: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator) -> int:
    """Sample from softmax(shifted / temperature) within the top-p nucleus. ``shifted``'s
    maximum is 0, so nothing overflows: the most likely token has weight 1 (exp(0)) and the
    others in [0, 1]; the sum is at least 1, never NaN."""
    probs = torch.softmax(shifted / temperature, dim=-1)
    if top_p < 1.0:
        # ranked by logit, not by probability: two logits a float32 probability cannot tell
        # apart keep their order, so the nucleus always starts at the greedy token
        order = shifted.argsort(descending=True, stable=True)
        sorted_p = probs[order]
        keep = sorted_p.cumsum(0) - sorted_p < top_p
        keep[0] = True  # the most likely token stays, however small top_p is (or rounds to in float32)
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=gen))

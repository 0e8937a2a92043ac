"""SGLang 0.5.23's ``--enable-dynamic-chunking``: the baseline today's SGLang users have.

Upstream (``scheduler_components/dynamic_chunk_sizer.py``, ``DynamicChunkSizer`` and
``ChunkSizePredictor``) fits, once at startup, a quadratic ``f(l) = a l^2 + b l + c`` of the
latency of one l-token prefill, and sizes each later chunk of a long prompt so that it costs what
the first chunk did: with prefix L it solves ``f(L + x) - f(L) = T`` where ``T = f(C) - f(0)``.
Attention over a growing prefix makes later chunks slower at a fixed size; shrinking them keeps
the pipeline's stages evenly loaded. Nothing adapts online.

What we reproduce, step for step (times in seconds here, milliseconds upstream; the fit is linear
in the latencies, so the unit changes nothing but rounding):

* Profiling grid: ``int(1.25 C - i * (1.25 C // 128))`` for i = 0..127, stopping at the first
  length <= 0: 128 lengths *descending* from 1.25 C. The first sample is dropped before fitting
  (upstream's warm-up guard); since the grid descends, that is the 1.25 C point. Our profile is
  deterministic and has no warm-up, so dropping it only removes one of 128 points; it is kept
  for fidelity and changes the coefficients only through the tile steps the quadratic smooths.
* Sample latency: upstream times PP rank 0's own forward (its layers only) and broadcasts the
  samples. We take the pipeline's bottleneck, ``max`` over ``profile.stages`` of
  ``stage.time_s(l, 1, 0, l*l, 0)`` (one request, no prefix, one sampled token): the same as
  rank 0 on a balanced split, and on an unbalanced one the stage that sets the pipeline's pace.
* Fit: least squares on ``[l^2, l, 1]``; fewer than 8 points or ``a <= 0`` fails; ``b < 0`` is
  clamped to 0. ``T = f(C) - f(0)`` must be positive. A failed fit means "keep C" for the run.
  One deliberate deviation: a rank-deficient design (C < 103 makes every grid length equal)
  also fails. Upstream's ``len(coeffs) >= 3`` guard cannot catch it and fits a meaningless
  minimum-norm quadratic through one point.
* Per decision with a continuing chunk of prefix L: x = the positive root of
  ``a x^2 + (2aL + b) x - T = 0``, taken in the cancellation-free form
  ``2T / (B + sqrt(B^2 + 4aT))`` (upstream's ``(-B + sqrt(disc)) / 2a`` is the same number up
  to rounding); smoothed ``C + 0.75 (x - C)``, truncated by ``int``; floored at ``C // 4``; aligned
  down to ``max(page_size, 64)`` (raised to one alignment unit if below it); capped at
  ``max_prefill_tokens`` and ``context_len - L - 100``, aligned down again; below one alignment
  unit after the cap means "keep C".

C here is our whole microbatch budget, decodes included. That is what upstream's number is too:
the size becomes ``PrefillAdder.rem_chunk_tokens``, from which ``--enable-mixed-chunk`` subtracts
the running decodes (one token each), exactly as our scheduler gives decodes the first tokens of
C and the chunk the rest. Without mixed chunk upstream's decodes sit out the prefill round; our
scheduler always mixes, so mixed chunk is the matching upstream configuration.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from fastpp.profile import Profile
from fastpp.types import IterationRecord

if TYPE_CHECKING:
    from fastpp.policies import PolicyContext
    from fastpp.view import PolicyView

NUM_PROFILE_SAMPLES = 128  # synthetic prefills upstream times at startup
PROFILE_SPAN = 1.25  # the longest profiled prompt, as a multiple of C
MIN_FIT_POINTS = 8  # fewer samples (after the dropped first) and upstream refuses to fit
MIN_ALIGNMENT_TOKENS = 64  # chunks align to max(page_size, this)
CONTEXT_MARGIN_TOKENS = 100  # a chunk never brings the prompt within this of the context


@dataclass(frozen=True, slots=True)
class UpstreamChunkConfig:
    """Knobs of upstream dynamic chunking; upstream's flag or default in brackets. Tokens."""

    chunk: int = 2048  # C, the static chunk [--chunked-prefill-size 2048]
    page_size: int = 1  # KV page size; chunks align to max(page_size, 64) [--page-size 1]
    max_prefill_tokens: int = 16384  # cap on a dynamic chunk [--max-prefill-tokens 16384]
    max_context: int = 32768  # the model's context length [model_config.context_len]
    smooth_factor: float = 0.75  # share of the move from C to the root [SGLANG_DYNAMIC_..._FACTOR]

    def __post_init__(self) -> None:
        for name in ("chunk", "page_size", "max_prefill_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 token, got {getattr(self, name)}")
        if self.max_context < 2:
            raise ValueError(f"max_context must be >= 2 tokens, got {self.max_context}")
        if not math.isfinite(self.smooth_factor) or self.smooth_factor < 0:
            raise ValueError(f"smooth_factor must be finite and >= 0, got {self.smooth_factor}")

    @property
    def alignment(self) -> int:
        """Tokens a dynamic chunk is a multiple of."""
        return max(self.page_size, MIN_ALIGNMENT_TOKENS)


@dataclass(frozen=True, slots=True)
class QuadraticFit:
    """``f(l) = a l^2 + b l + c``: seconds of a prefill of l tokens with no prefix."""

    a: float
    b: float
    c: float

    def __call__(self, num_tokens: float) -> float:
        return (self.a * num_tokens + self.b) * num_tokens + self.c

    @classmethod
    def fit(cls, lengths: Sequence[int], latencies_s: Sequence[float]) -> QuadraticFit | None:
        """Least squares over the samples after the first (upstream's warm-up guard).

        Returns None where upstream's fit raises (too few points, ``a <= 0``) or the design is
        rank-deficient; clamps a negative ``b`` to 0 as upstream does.
        """
        if len(lengths) != len(latencies_s):
            raise ValueError(f"{len(lengths)} lengths but {len(latencies_s)} latencies")
        ls = np.asarray(lengths[1:], dtype=np.float64)
        ts = np.asarray(latencies_s[1:], dtype=np.float64)
        if len(ls) < MIN_FIT_POINTS or not np.all(np.isfinite(ts)):
            return None
        x = np.column_stack([ls * ls, ls, np.ones_like(ls)])  # x: [n, 3]
        try:
            coeffs, _, rank, _ = np.linalg.lstsq(x, ts, rcond=None)
        except np.linalg.LinAlgError:
            return None
        a, b, c = (float(v) for v in coeffs)
        if rank < 3 or not a > 0:
            return None
        return cls(a, max(b, 0.0), c)


def profile_lengths(chunk: int) -> list[int]:
    """Upstream's profiling grid: up to 128 lengths descending from 1.25 C."""
    top = chunk * PROFILE_SPAN
    step = top // NUM_PROFILE_SAMPLES
    lengths = []
    for i in range(NUM_PROFILE_SAMPLES):
        n = int(top - i * step)
        if n <= 0:
            break
        lengths.append(n)
    return lengths


def prefill_latency_s(profile: Profile, num_tokens: int) -> float:
    """Seconds of one ``num_tokens`` prefill with no prefix: the slowest stage's time."""
    return max(s.time_s(num_tokens, 1, 0, num_tokens * num_tokens, 0) for s in profile.stages)


@dataclass(slots=True)
class UpstreamChunkPolicy:
    """Static C for a new prompt; equal-predicted-latency chunks for a continuing one.

    ``fit`` None (or a non-positive target) keeps C for every decision, as upstream does when
    its predictor is not ready. Build from a profile with :meth:`from_profile`.
    """

    config: UpstreamChunkConfig
    fit: QuadraticFit | None
    last_reason: str = "static"
    target_s: float = field(init=False, default=0.0)  # T = f(C) - f(0)
    observes: ClassVar[bool] = False  # fitted once at start-up, never learns online

    def __post_init__(self) -> None:
        if self.fit is not None:
            self.target_s = self.fit(self.config.chunk) - self.fit(0)
            if not self.target_s > 0:
                self.fit = None

    @classmethod
    def from_latency(
        cls, config: UpstreamChunkConfig, latency_s: Callable[[int], float]
    ) -> UpstreamChunkPolicy:
        """Time upstream's grid with ``latency_s`` and fit once."""
        lengths = profile_lengths(config.chunk)
        return cls(config, QuadraticFit.fit(lengths, [latency_s(n) for n in lengths]))

    @classmethod
    def from_profile(cls, config: UpstreamChunkConfig, profile: Profile) -> UpstreamChunkPolicy:
        """Fit against the deployment's bottleneck-stage prefill latency."""
        return cls.from_latency(config, lambda n: prefill_latency_s(profile, n))

    def root(self, history_len: int) -> float | None:
        """x > 0 with ``f(L + x) - f(L) = T`` before smoothing; None without a fit."""
        fit = self.fit
        if fit is None:
            return None
        b = 2.0 * fit.a * history_len + fit.b
        disc = b * b + 4.0 * fit.a * self.target_s  # > b^2 >= 0: a > 0 and T > 0
        x = 2.0 * self.target_s / (b + math.sqrt(disc))
        return x if x > 0 else None

    def predict(self, history_len: int) -> int | None:
        """Upstream's chunk for a prompt with ``history_len`` tokens done; None = keep C."""
        x = self.root(history_len)
        if x is None:
            return None
        cfg = self.config
        smoothed = cfg.chunk + cfg.smooth_factor * (x - cfg.chunk)
        size = max(int(smoothed), cfg.chunk // 4)
        align = cfg.alignment
        size = max(size // align * align, align)
        cap = min(cfg.max_context - history_len - CONTEXT_MARGIN_TOKENS, cfg.max_prefill_tokens)
        size = min(size, cap) // align * align
        return size if size >= align else None

    def choose(self, view: PolicyView) -> int:
        """C, unless a chunked prompt continues: then ``predict`` at its prefix."""
        chunked = view.chunked
        if chunked is None:  # new prompts: upstream applies dynamic sizes to 2nd+ chunks only
            self.last_reason = "static"
            return self.config.chunk
        prefix = chunked.num_computed
        size = self.predict(prefix)
        if size is None:
            self.last_reason = "static: no prediction" if self.fit else "static: no fit"
            return self.config.chunk
        self.last_reason = f"shrunk for prefix {prefix}" if size < self.config.chunk else "static"
        return size

    def observe(self, rec: IterationRecord) -> None:
        """Upstream fits once at startup and never learns online."""
        return None


def build_upstream(arg: str | None, ctx: PolicyContext) -> UpstreamChunkPolicy:
    """Registry builder for ``upstream[:C]``: C defaults to the scheduler's default chunk."""
    if arg is None:
        chunk = ctx.config.default_chunk
    else:
        try:
            chunk = int(arg)
        except ValueError:
            raise ValueError(f"upstream chunk must be an integer number of tokens, got {arg!r}") from None
    config = UpstreamChunkConfig(
        chunk=chunk, page_size=ctx.config.page_size, max_context=ctx.config.max_context
    )
    return UpstreamChunkPolicy.from_profile(config, ctx.require_profile("upstream"))

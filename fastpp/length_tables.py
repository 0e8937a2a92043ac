"""Request-length samplers: the built-in quantile tables and the distributions workloads draw
from.

Three kinds of length source feed :mod:`fastpp.workloads`:

* real files (read by :mod:`fastpp.length_files`), resampled jointly by
  :class:`EmpiricalLengths`;
* derived quantile tables shipped in ``fastpp/data/length_tables.json`` (written by
  ``scripts/derive_length_tables.py`` from the Azure 2023 trace), sampled by
  :class:`QuantileLengths` without needing the data files;
* :class:`SyntheticLengths`, lognormal marginals calibrated to published means, for workloads
  whose real lengths are not available offline. Their names always say "synthetic".
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Protocol

import numpy as np

from fastpp.length_files import LengthTable, Trace, check_lengths, frozen_int64

BUILTIN_TABLES_FILE = "length_tables.json"


class LengthSampler(Protocol):
    """Draws request lengths. ``sample`` returns (prompt_lens, output_lens): int64 arrays of
    length ``n``, every value >= 1, a pure function of the generator's state."""

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]: ...

    def describe(self) -> str: ...


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")


def _norm_cdf(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF, vectorised (numpy has no erf). Abramowitz & Stegun 7.1.26 for erf,
    absolute error < 1.5e-7: far below what a length sampler can notice."""
    # Capping |z| at 6 (where 1 - erf < 3e-17) keeps exp() out of denormals, which are ~20x slower.
    z = np.minimum(np.abs(x) / math.sqrt(2.0), 6.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-z * z)
    return 0.5 * (1.0 + np.sign(x) * erf)


@dataclass(frozen=True, slots=True, eq=False)
class EmpiricalLengths:
    """Resamples real (prompt, output) PAIRS jointly, with replacement, so the joint shape
    (including the input/output correlation) is exactly the data's."""

    prompt_lens: np.ndarray
    output_lens: np.ndarray
    source: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_lens", frozen_int64(self.prompt_lens))
        object.__setattr__(self, "output_lens", frozen_int64(self.output_lens))
        check_lengths(self.prompt_lens, self.output_lens)
        if self.prompt_lens.size == 0:
            raise ValueError(f"EmpiricalLengths({self.source!r}) needs at least one row")

    @classmethod
    def from_table(cls, table: LengthTable | Trace) -> EmpiricalLengths:
        return cls(table.prompt_lens, table.output_lens, table.source)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        _check_n(n)
        rows = rng.integers(0, self.prompt_lens.size, size=n)
        return self.prompt_lens[rows], self.output_lens[rows]

    def describe(self) -> str:
        num_rows = self.prompt_lens.size
        return f"resampled (input, output) pairs of {num_rows} real rows from {self.source}"


@dataclass(frozen=True, slots=True)
class Marginal:
    """An inverse CDF given as knots: ``values[i]`` is the ``probabilities[i]`` quantile."""

    probabilities: tuple[float, ...]  # strictly increasing, first 0.0, last 1.0
    values: tuple[float, ...]  # non-decreasing, >= 1

    def __post_init__(self) -> None:
        p, q = np.asarray(self.probabilities), np.asarray(self.values)
        if p.shape != q.shape or p.size < 2 or p[0] != 0.0 or p[-1] != 1.0:
            raise ValueError("a marginal needs equally many knots, probabilities from 0 to 1")
        if np.any(np.diff(p) <= 0) or np.any(np.diff(q) < 0) or q[0] < 1:
            raise ValueError("marginal probabilities must increase; values be >= 1, non-decreasing")

    def quantile(self, u: np.ndarray) -> np.ndarray:
        """Piecewise-linear inverse CDF at ``u`` in [0, 1], rounded to int64 token counts."""
        values = np.interp(u, self.probabilities, self.values)
        return np.maximum(np.rint(values), 1).astype(np.int64)


@dataclass(frozen=True, slots=True)
class QuantileLengths:
    """Inverse-CDF sampling from stored marginal quantile tables of input and output lengths.

    The two marginals are joined with a Gaussian copula whose normal correlation is set from
    the stored Spearman rank correlation (r = 2 sin(pi rho_s / 6)), so the joint shape is only
    roughly kept: the marginals are reproduced up to the knots' interpolation, the rank
    correlation approximately, and any other dependence is lost. Use :class:`EmpiricalLengths`
    over the real file when the exact joint distribution matters.
    """

    name: str
    input: Marginal
    output: Marginal
    rank_correlation: float  # Spearman rho between input and output, in [-1, 1]
    source: str

    def __post_init__(self) -> None:
        if not -1.0 <= self.rank_correlation <= 1.0:
            raise ValueError(f"rank_correlation must be in [-1, 1], got {self.rank_correlation!r}")

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        _check_n(n)
        r = 2.0 * math.sin(math.pi * self.rank_correlation / 6.0)
        z = rng.standard_normal((2, n))  # z: [2, n]
        z_out = r * z[0] + math.sqrt(max(0.0, 1.0 - r * r)) * z[1]
        return self.input.quantile(_norm_cdf(z[0])), self.output.quantile(_norm_cdf(z_out))

    def describe(self) -> str:
        return (
            f"quantile table of {self.name} (Gaussian copula, rank correlation "
            f"{self.rank_correlation:.3f}); derived from {self.source}"
        )


def load_builtin_tables() -> dict[str, Any]:
    """The parsed ``fastpp/data/length_tables.json`` (package data; no data directory needed)."""
    text = resources.files("fastpp").joinpath("data", BUILTIN_TABLES_FILE).read_text("utf-8")
    return json.loads(text)


def _marginal(document: dict[str, Any], stats: dict[str, Any]) -> Marginal:
    # The 201-knot grid leaves the top 0.5% to one linear segment up to the max, which inflates
    # heavy-tailed means (azure-code output by ~9%); the table adds finer tail knots for that.
    points = dict(zip(document["probabilities"], stats["quantiles"], strict=True))
    points.update(zip(document["tail_probabilities"], stats["tail_quantiles"], strict=True))
    probabilities = sorted(points)
    return Marginal(tuple(probabilities), tuple(float(points[p]) for p in probabilities))


def builtin_quantile_lengths(name: str) -> QuantileLengths:
    """The :class:`QuantileLengths` for a table in the built-in JSON (``azure-conv``, ...)."""
    document = load_builtin_tables()
    tables = document["tables"]
    if name not in tables:
        raise ValueError(f"no built-in length table {name!r}; known: {', '.join(sorted(tables))}")
    table = tables[name]
    return QuantileLengths(
        name=name,
        input=_marginal(document, table["input"]),
        output=_marginal(document, table["output"]),
        rank_correlation=float(table["rank_correlation"]),
        source=table["source"],
    )


def _lognormal_mu(mean: float, sigma: float, max_len: int) -> float:
    """The mu for which rint(clip(exp(mu + sigma Z), 1, max_len)) has mean ``mean`` exactly.

    E[rint(clip(X))] = sum_k k P(k - 1/2 <= X < k + 1/2), with the end cells taking the
    clipped mass; it increases with mu, so bisection finds the root. Cost is O(max_len).
    """
    edges = np.arange(1, max_len, dtype=np.float64) + 0.5  # cell boundaries 1.5 .. max-0.5
    log_edges = np.log(edges)
    ks = np.arange(1, max_len + 1, dtype=np.float64)

    def clipped_mean(mu: float) -> float:
        cdf = np.concatenate(([0.0], _norm_cdf((log_edges - mu) / sigma), [1.0]))
        return float(ks @ np.diff(cdf))

    low, high = -10.0 * sigma - 10.0, math.log(max_len) + 10.0 * sigma + 10.0
    while high - low > 1e-9:  # ~36 halvings; the mean then matches to ~1e-9 relative
        mid = 0.5 * (low + high)
        if clipped_mean(mid) < mean:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)


@dataclass(frozen=True, slots=True)
class SyntheticLengths:
    """Synthetic lengths: independent lognormal input and output marginals with the given means
    and coefficients of variation, rounded and clipped to [1, max_*].

    The lognormal mu is solved at construction so that the mean AFTER clipping and rounding
    equals the target (the CV drifts a little instead). Input and output are independent.
    The name must contain "synthetic" so results never pass it off as real data.
    """

    name: str
    mean_in: float
    mean_out: float
    cv_in: float
    cv_out: float
    max_in: int
    max_out: int
    mu_in: float = field(init=False)
    mu_out: float = field(init=False)

    def __post_init__(self) -> None:
        if "synthetic" not in self.name:
            raise ValueError(f"a synthetic workload's name must say 'synthetic', got {self.name!r}")
        for side in ("in", "out"):
            mean, cv, cap = (getattr(self, f"{key}_{side}") for key in ("mean", "cv", "max"))
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 2:
                raise ValueError(f"max_{side} must be an integer >= 2, got {cap!r}")
            if not (math.isfinite(mean) and 1.0 < mean < cap):
                raise ValueError(f"mean_{side} must be in (1, max_{side}={cap}), got {mean!r}")
            if not (math.isfinite(cv) and cv > 0):
                raise ValueError(f"cv_{side} must be a positive number, got {cv!r}")
            sigma = math.sqrt(math.log1p(cv * cv))
            object.__setattr__(self, f"mu_{side}", _lognormal_mu(mean, sigma, cap))

    def _draw(self, rng: np.random.Generator, n: int, mu: float, cv: float, cap: int) -> np.ndarray:
        sigma = math.sqrt(math.log1p(cv * cv))
        values = np.exp(mu + sigma * rng.standard_normal(n))
        return np.rint(np.clip(values, 1, cap)).astype(np.int64)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        _check_n(n)
        prompt_lens = self._draw(rng, n, self.mu_in, self.cv_in, self.max_in)
        output_lens = self._draw(rng, n, self.mu_out, self.cv_out, self.max_out)
        return prompt_lens, output_lens

    def describe(self) -> str:
        return (
            f"synthetic lognormal lengths ({self.name}): input mean {self.mean_in:g} "
            f"cv {self.cv_in:g} max {self.max_in}, output mean {self.mean_out:g} "
            f"cv {self.cv_out:g} max {self.max_out}; independent"
        )

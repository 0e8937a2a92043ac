"""Fit a stage's measured times to the profile schema's cost model (numpy only).

Model of one stage iteration (``fastpp.profile.StageCost.time_s`` with the LM head per sampled
token)::

    t = table(N) + a * sum(L_past * L_pre) + b * sum(L_pre^2) + c * sum(L_dec) [+ h * sampled]

The unknowns are the table's value at each of its points and the attention coefficients (and
``h`` when the sampled-token counts are given). ``table(N)`` follows ``LinearTable.at``: flat
up to the first point, linear between points, so a shape whose N lies between two points
depends linearly on the two values and the problem stays linear. It is solved as non-negative
least squares on RELATIVE residuals (rows weighted by 1 / measured time, so 1-token and
1024-token shapes count alike): the coefficients are >= 0 (attention cannot make a batch
faster) and the table is non-decreasing in N.

Used by the CPU engine's profiler (shapes measured on a grid: every N is a point) and by
``fastpp.records_profile`` (iterations recorded while serving: N anywhere, points chosen from
the data by :func:`table_points`).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fastpp.profile import LinearTable

# table_points: a count seen this often is a point; rarer ones at least POINT_RATIO apart
POINT_MIN_COUNT = 3
POINT_RATIO = 1.25
REWEIGHT_ROUNDS = 2  # fit_stage: refits weighted by the fitted time (see there)


@dataclass(frozen=True, slots=True)
class StageFit:
    """A stage's fitted table and attention coefficients, with the fit's own error."""

    table: LinearTable  # seconds vs tokens: everything token-proportional, attention excluded
    attn_past_x_pre_s: float  # s per unit of sum L_past*L_pre
    attn_pre_sq_s: float  # s per unit of sum L_pre^2
    attn_dec_ctx_s: float  # s per unit of sum L_dec
    mape: float  # mean |fit - measured| / measured over the fitted shapes (fraction)
    max_ape: float  # worst shape
    sampled_s: float = 0.0  # s per sampled token (LM head + sampling); 0 when not fitted

    def predict(self, features: np.ndarray, sampled: np.ndarray | None = None) -> np.ndarray:
        """Seconds for rows [N, sum_past_x_pre, sum_pre_sq, sum_dec_ctx] (and their sampled
        tokens, when the fit has a sampled term)."""
        # features: [n, 4]; sampled: [n]
        table = np.array([self.table.at(int(n)) for n in features[:, 0]])
        coef = np.array([self.attn_past_x_pre_s, self.attn_pre_sq_s, self.attn_dec_ctx_s])
        out = table + features[:, 1:] @ coef
        if sampled is not None:
            out = out + self.sampled_s * np.asarray(sampled, dtype=np.float64)
        return out


def nnls(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``argmin |A x - b|`` subject to ``x >= 0`` (Lawson and Hanson's active-set method; a few
    dozen unknowns here, so plain numpy least squares per step is enough)."""
    # A: [m, n], b: [m]
    m, n = A.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * np.abs(A).sum(axis=0).max() * max(m, n)
    for _ in range(3 * n + 10):
        grad = A.T @ (b - A @ x)
        if passive.all() or grad[~passive].max() <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, grad))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if z[passive].min() > 0:
                break
            # step back towards x until the first passive variable hits 0, and free it
            hit = passive & (z <= 0)
            alpha = np.min(x[hit] / (x[hit] - z[hit]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = z
    return x


def table_points(
    token_counts: Iterable[int], ratio: float = POINT_RATIO, min_count: int = POINT_MIN_COUNT
) -> tuple[int, ...]:
    """Table points for shapes with these token counts: every count seen at least ``min_count``
    times (its own value is well measured), the smallest and the largest count, and between
    them rarer counts at least ``ratio`` apart, so every point has data at it and the table
    bends only where data says so."""
    counts = Counter(int(n) for n in token_counts if n >= 1)
    if not counts:
        raise ValueError("no shape with at least one token")
    values = sorted(counts)
    points = [values[0]]
    for v in values[1:-1]:
        if counts[v] >= min_count or (v >= points[-1] * ratio and v >= points[-1] + 1):
            points.append(v)
    if values[-1] != points[-1]:
        points.append(values[-1])
    return tuple(points)


def _table_rows(ns: np.ndarray, points: Sequence[int]) -> np.ndarray:
    """Rows that map the table's increments (value at point j = increments 0..j summed) to
    ``LinearTable.at(N)`` for each N (within the points' range)."""
    rows = np.zeros((len(ns), len(points)))
    for r, n in enumerate(ns):
        j = bisect.bisect_left(points, int(n))  # first point >= n
        if j == 0:
            rows[r, 0] = 1.0
            continue
        lo, hi = points[j - 1], points[j]
        rows[r, :j] = 1.0
        rows[r, j] = (n - lo) / (hi - lo)
    return rows


def fit_stage(
    features: npt.ArrayLike,
    seconds: npt.ArrayLike,
    tokens: Sequence[int],
    sampled: npt.ArrayLike | None = None,
) -> StageFit:
    """Fit ``seconds`` (one per shape) of shapes with ``features`` rows [N, sum_past_x_pre,
    sum_pre_sq, sum_dec_ctx]; ``tokens`` are the table's points and every N must be within 1 ..
    ``tokens[-1]`` (between points the table interpolates). With ``sampled`` (tokens sampled
    per shape), the LM head's cost per sampled token is fitted too (``StageFit.sampled_s``)."""
    X = np.asarray(features, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    # X: [n, 4], y: [n]
    if X.ndim != 2 or X.shape[1] != 4 or X.shape[0] != y.shape[0]:
        raise ValueError(f"features must be [n, 4] with one time each, got {X.shape} and {y.shape}")
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("measured seconds must be finite and > 0")
    points = sorted(tokens)
    outside = sorted({int(n) for n in X[:, 0] if n < 1 or n > points[-1]})
    if outside:
        raise ValueError(
            f"shapes with N = {outside} are not on the table's points {points} "
            f"(N must be within 1 .. {points[-1]})"
        )
    columns = [X[:, 1:]]
    if sampled is not None:
        S = np.asarray(sampled, dtype=np.float64).reshape(-1, 1)
        if S.shape[0] != y.shape[0] or np.any(S < 0):
            raise ValueError(f"sampled must be one count >= 0 per shape, got {S.shape[0]} for {y.shape[0]}")
        columns.append(S)
    extra = np.hstack(columns)
    # increments >= 0: the table never falls with more tokens, which keeps one noisy pair of
    # shapes from trading table for attention
    steps = _table_rows(X[:, 0], points)
    # extra columns scaled to O(1) so the problem is well conditioned
    scale = np.maximum(extra.max(axis=0), 1.0)
    A = np.hstack([steps, extra / scale])
    # Relative residuals, so 40 ms decodes count as much as 400 ms prefills. Weighting by the
    # recorded time (1/y) would pull every estimate below the mean of noisy repeats (small y
    # weigh more); so refit with the fitted time's weight (1/prediction, as a GLM with a
    # constant coefficient of variation): at a table point the estimate is then the mean of
    # its repeats, which is what sums of stage times (latency, throughput) need.
    w = 1.0 / y
    for _ in range(1 + REWEIGHT_ROUNDS):
        sol = nnls(A * w[:, None], y * w)
        w = 1.0 / np.maximum(A @ sol, 0.1 * y)
    coef = sol[len(points) :] / scale
    table = LinearTable(tuple(points), tuple(float(s) for s in np.cumsum(sol[: len(points)])))
    sampled_s = float(coef[3]) if sampled is not None else 0.0
    fit = StageFit(table, float(coef[0]), float(coef[1]), float(coef[2]), 0.0, 0.0, sampled_s)
    ape = np.abs(fit.predict(X, None if sampled is None else np.asarray(sampled)) - y) / y
    return StageFit(
        table,
        fit.attn_past_x_pre_s,
        fit.attn_pre_sq_s,
        fit.attn_dec_ctx_s,
        float(ape.mean()),
        float(ape.max()),
        sampled_s,
    )

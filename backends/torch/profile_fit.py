"""Fit a stage's measured times to the profile schema's cost model (numpy only).

Model of one stage iteration (``fastpp.profile.StageCost.time_s`` without LM head)::

    t = table(N) + a * sum(L_past * L_pre) + b * sum(L_pre^2) + c * sum(L_dec)

The unknowns are the table's value at every grid point of N and the three attention
coefficients; every measured shape has its N on a grid point, so the problem is linear. It is
solved as non-negative least squares on RELATIVE residuals (rows weighted by 1 / measured time,
so 1-token and 1024-token shapes count alike): attention coefficients are >= 0 (attention cannot
make a batch faster) and the table is non-decreasing in N.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fastpp.profile import LinearTable


@dataclass(frozen=True, slots=True)
class StageFit:
    """A stage's fitted table and attention coefficients, with the fit's own error."""

    table: LinearTable  # seconds vs tokens: everything token-proportional, attention excluded
    attn_past_x_pre_s: float  # s per unit of sum L_past*L_pre
    attn_pre_sq_s: float  # s per unit of sum L_pre^2
    attn_dec_ctx_s: float  # s per unit of sum L_dec
    mape: float  # mean |fit - measured| / measured over the fitted shapes (fraction)
    max_ape: float  # worst shape

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Seconds for rows [N, sum_past_x_pre, sum_pre_sq, sum_dec_ctx]."""
        # features: [n, 4]
        table = np.array([self.table.at(int(n)) for n in features[:, 0]])
        coef = np.array([self.attn_past_x_pre_s, self.attn_pre_sq_s, self.attn_dec_ctx_s])
        return table + features[:, 1:] @ coef


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


def fit_stage(features: Sequence[Sequence[int]], seconds: Sequence[float], tokens: Sequence[int]) -> StageFit:
    """Fit ``seconds`` (one per shape) of shapes with ``features`` rows [N, sum_past_x_pre,
    sum_pre_sq, sum_dec_ctx]; every N must be one of ``tokens`` (the table's points)."""
    X = np.asarray(features, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    # X: [n, 4], y: [n]
    if X.ndim != 2 or X.shape[1] != 4 or X.shape[0] != y.shape[0]:
        raise ValueError(f"features must be [n, 4] with one time each, got {X.shape} and {y.shape}")
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("measured seconds must be finite and > 0")
    points = sorted(tokens)
    index = {t: i for i, t in enumerate(points)}
    off_grid = sorted({int(n) for n in X[:, 0]} - set(index))
    if off_grid:
        raise ValueError(f"shapes with N = {off_grid} are not on the table's points {points}")
    # table(points[i]) = sum of increments 0..i, every increment >= 0: the table never falls
    # with more tokens, which keeps one noisy pair of shapes from trading table for attention
    steps = np.array([[1.0 if j <= index[int(n)] else 0.0 for j in range(len(points))] for n in X[:, 0]])
    # attention columns scaled to O(1) so the problem is well conditioned
    scale = np.maximum(X[:, 1:].max(axis=0), 1.0)
    w = 1.0 / y  # relative residuals
    sol = nnls(np.hstack([steps, X[:, 1:] / scale]) * w[:, None], y * w)
    coef = sol[len(points):] / scale
    table = LinearTable(tuple(points), tuple(float(s) for s in np.cumsum(sol[:len(points)])))
    fit = StageFit(table, float(coef[0]), float(coef[1]), float(coef[2]), 0.0, 0.0)
    ape = np.abs(fit.predict(X) - y) / y
    return StageFit(table, fit.attn_past_x_pre_s, fit.attn_pre_sq_s, fit.attn_dec_ctx_s,
                    float(ape.mean()), float(ape.max()))

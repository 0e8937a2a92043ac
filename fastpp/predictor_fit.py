"""Offline side of the latency predictors: batch fitting, the prior a profile gives, input
checks and the predictor file format.

Nothing here runs in the scheduling hot path (STYLE habit 9): :mod:`fastpp.predictor` answers
queries and does the one-sample online update; this module does what happens once, at
construction, after a profiling run or when a predictor is saved or loaded.

Units: seconds; token counts and ALP feature sums are raw (unscaled) numbers unless a name says
``phi`` (the scaled feature matrix of :mod:`fastpp.predictor`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from fastpp.profile import LinearTable, Profile, StageCost

PREDICTOR_SCHEMA_VERSION = 1
DEPLOYMENT_KEYS = ("model", "hardware", "pp", "tp")


class DeploymentKeys(TypedDict):
    """The deployment a predictor is made for (``DEPLOYMENT_KEYS``, the constructor's keywords)."""

    model: str
    hardware: str
    pp: int
    tp: int


# --------------------------------------------------------------------------- input checks


def as_features(X: object, what: str = "X") -> np.ndarray:
    """``X`` as a float64 array of shape (n, 4): [num_tokens, sum_past_x_pre, sum_pre_sq,
    sum_dec_ctx]. Raises ValueError for another shape, a negative or non-finite value, or a
    fractional token count. A single row of 4 values is accepted as (1, 4)."""
    arr = np.asarray(X, dtype=np.float64)
    if arr.ndim == 1 and arr.shape[0] == 4:
        arr = arr.reshape(1, 4)
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise ValueError(
            f"{what} must have shape (n, 4) [num_tokens, sum_past_x_pre, sum_pre_sq, "
            f"sum_dec_ctx], got {arr.shape}"
        )
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{what} must be finite and >= 0")
    if np.any(arr[:, 0] != np.floor(arr[:, 0])):
        raise ValueError(f"{what}[:, 0] (num_tokens) must be whole numbers")
    return arr


def as_targets(y: object, n: int) -> np.ndarray:
    """``y`` (seconds) as a float64 vector of length ``n``, finite and > 0."""
    arr = np.asarray(y, dtype=np.float64).reshape(-1)
    if arr.shape[0] != n:
        raise ValueError(f"y has {arr.shape[0]} values but X has {n} rows")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError("y (measured seconds) must be finite and > 0")
    return arr


# --------------------------------------------------------------------------- batch fit


def pack_upper(matrix: np.ndarray) -> list[float]:
    """Row-major upper triangle of a symmetric k x k matrix (how the RLS covariance is kept:
    the hot path unpacks 10 floats for k = 4)."""
    k = matrix.shape[0]
    return [float(matrix[i, j]) for i in range(k) for j in range(i, k)]


def unpack_upper(upper: list[float], k: int) -> np.ndarray:
    """Inverse of :func:`pack_upper`: the full symmetric k x k matrix."""
    out = np.empty((k, k))
    it = iter(upper)
    for i in range(k):
        for j in range(i, k):
            out[i, j] = out[j, i] = next(it)
    return out


def solve_rls_batch(
    phi: np.ndarray, residual: np.ndarray, prior: np.ndarray, initial_covariance: float
) -> tuple[np.ndarray, np.ndarray]:
    """Ridge least squares of ``residual`` on ``phi`` pulled towards ``prior``.

    Returns ``(theta, cov)`` with ``theta = argmin |phi theta - r|^2 + |theta - prior|^2 / P0``
    and ``cov = (phi^T phi + I / P0)^-1`` where ``P0 = initial_covariance``: exactly the state
    recursive least squares reaches after one pass over the rows without forgetting, starting
    from ``(prior, P0 I)``. So online updates after a batch fit continue from it instead of
    undoing it (a fresh ``P0 I`` would let the first sample move the coefficients ~80%), and a
    feature the batch never excites (e.g. no decodes) keeps its prior coefficient.
    """
    # phi: [n, k], residual: [n], prior: [k]
    k = phi.shape[1]
    precision = phi.T @ phi + np.eye(k) / initial_covariance
    rhs = phi.T @ residual + prior / initial_covariance
    theta = np.linalg.solve(precision, rhs)
    cov = np.linalg.inv(precision)
    return theta, (cov + cov.T) / 2.0


def apply_params(estimator: Any, params: dict[str, Any]) -> None:
    """sklearn-style ``set_params``: reject unknown names, set the rest, and roll every value
    back if the estimator's ``_validate()`` refuses the new combination."""
    old = estimator.get_params()
    unknown = sorted(set(params) - set(old))
    if unknown:
        raise ValueError(f"{type(estimator).__name__}: unknown parameter(s) {unknown}; valid: {sorted(old)}")
    for key, value in params.items():
        setattr(estimator, key, value)
    try:
        estimator._validate()
    except ValueError:
        for key, value in old.items():
            setattr(estimator, key, value)
        raise


# --------------------------------------------------------------------------- profile prior


def _stage_table_s(stage: StageCost, num_tokens: int) -> float:
    """Token-proportional seconds of ``stage`` without attention and LM head."""
    return (
        stage.linear.at(num_tokens)
        + stage.fixed_s
        + stage.embedding_s_per_token * num_tokens
        + stage.allreduce_fixed_s
        + stage.allreduce_s_per_token * num_tokens
    )


def bottleneck_table(profile: Profile) -> LinearTable:
    """The beat's token-proportional cost: at every token count that is a point of some stage's
    linear table, the max over stages of linear + fixed + embedding + all-reduce. Attention and
    the LM head are left out: the predictor's features and bias carry them, so nothing is
    counted twice (the reference's table included the c^2 attention of its profiling chunk).
    Point 1 is added when missing, so below the first point the per-token terms (embedding,
    all-reduce) still scale while the GEMM tile cost stays flat."""
    points = sorted({1} | {n for stage in profile.stages for n in stage.linear.tokens})
    seconds = tuple(max(_stage_table_s(s, n) for s in profile.stages) for n in points)
    return LinearTable(tuple(points), seconds)


def bottleneck_stage(profile: Profile) -> StageCost:
    """The stage with the highest table cost at the largest table point (ties: the earliest).
    Its attention coefficients are the prior: the slowest stage sets the beat."""
    top = max(n for stage in profile.stages for n in stage.linear.tokens)
    costs = [_stage_table_s(s, top) for s in profile.stages]
    return profile.stages[costs.index(max(costs))]


def profile_bias_s(profile: Profile) -> float:
    """Prior bias in seconds: the last stage's LM head on one sampled token."""
    head = profile.stages[-1].lm_head
    return head.at(1) if head is not None else 0.0


def alp_prior(profile: Profile) -> tuple[float, float, float, float]:
    """Unscaled prior coefficients (s per sum_past_x_pre, s per sum_pre_sq, s per sum_dec_ctx,
    bias s) from the bottleneck stage's attention costs and the LM head."""
    stage = bottleneck_stage(profile)
    return (stage.attn_past_x_pre_s, stage.attn_pre_sq_s, stage.attn_dec_ctx_s, profile_bias_s(profile))


def deployment_keys(profile: Profile) -> DeploymentKeys:
    """The (model, hardware, pp, tp) keys a predictor made for ``profile`` carries."""
    return {"model": profile.model.name, "hardware": profile.gpu, "pp": profile.pp, "tp": profile.tp}


# --------------------------------------------------------------------------- files


def write_predictor_file(path: str | Path, doc: dict[str, Any]) -> None:
    """Write a predictor as JSON: ``schema_version`` first, then ``doc``'s keys: ``kind`` (class
    name), ``deployment`` {model, hardware, pp, tp}, ``params`` (constructor parameters but the
    table and deployment), ``table`` {tokens, seconds}, ``coef`` (unscaled, for readers),
    ``theta_scaled``, ``covariance`` (k x k, scaled features), ``n_updates``, ``n_outliers``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"schema_version": PREDICTOR_SCHEMA_VERSION, **doc}, indent=1, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")


def _fmt_deployment(dep: Any) -> str:
    if not isinstance(dep, dict):
        return repr(dep)
    return ", ".join(f"{k}={dep.get(k)!r}" for k in DEPLOYMENT_KEYS)


def read_predictor_file(path: str | Path, kind: str, deployment: DeploymentKeys) -> dict[str, Any]:
    """The JSON document at ``path`` after checking its schema version, its ``kind`` and that
    it was made for ``deployment``. Raises ValueError naming the file (and, for a deployment
    mismatch, both deployments): a file from another model, GPU or split is never reused."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema_version") != PREDICTOR_SCHEMA_VERSION:
        raise ValueError(f"{path}: not a predictor file of schema version {PREDICTOR_SCHEMA_VERSION}")
    if doc.get("kind") != kind:
        raise ValueError(f"{path}: holds a {doc.get('kind')!r}, not a {kind}")
    if doc.get("deployment") != deployment:
        made_for = _fmt_deployment(doc.get("deployment"))
        raise ValueError(
            f"{path}: predictor was made for deployment ({made_for}), "
            f"not for this deployment ({_fmt_deployment(deployment)}); "
            "refit it or use its own file"
        )
    return doc

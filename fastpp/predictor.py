"""ALP latency predictor: how long one pipeline beat takes for a microbatch (PAPER.md 3.2).

    T_iter = table(N_tokens) + b . phi

* ``table`` is a :class:`~fastpp.profile.LinearTable` of the BOTTLENECK stage's token-proportional
  cost without attention and LM head (:func:`fastpp.predictor_fit.bottleneck_table`). It is a
  table, not a line, so hardware steps survive: 129 tokens cost what 256 cost.
* ``phi = [sum L_past*L_pre / 2^21, sum L_pre^2 / 2^20, sum L_dec / 1e5, 1]``: the microbatch's
  attention features and a bias, scaled to be O(1) for a 1-2k token microbatch
  (``DEFAULT_FEATURE_SCALES``). Only scaled values enter the RLS covariance.
* ``b`` is learned by exponentially weighted recursive least squares (RLS) on the residual
  ``measured - table(N)`` after each beat, from a prior (zeros, or a profile's attention costs).

Units: seconds (``_s``); feature sums are raw integers. ``coef_`` is in seconds per UNSCALED
feature unit. ``predict_one`` / ``learn_one`` are the hot path: no numpy (a numpy 4x4 RLS step
measured 10-20 us against ~2.5 us unrolled; see benchmarks/predictor_speed.py), and
``ALPPredictor``'s arithmetic lives in fastpp/alp_rls.py, which the compiled build compiles.

Changes from the reference (reference notes sections 2 and 7): the table holds no attention, so
``b`` does not count it twice; "skip" really skips and "clip" clips; coefficients survive
``reset()`` and files are keyed by (model, hardware, pp, tp); the covariance cannot wind up.
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, Self

import numpy as np

from fastpp.alp_rls import MIN_PREDICTION_S, AlpBeatModel
from fastpp.predictor_fit import (
    DEPLOYMENT_KEYS,
    PREDICTOR_SCHEMA_VERSION,
    DeploymentKeys,
    alp_prior,
    apply_params,
    as_features,
    as_targets,
    bottleneck_table,
    deployment_keys,
    pack_upper,
    profile_bias_s,
    read_predictor_file,
    solve_rls_batch,
    unpack_upper,
    write_predictor_file,
)
from fastpp.predictor_sklearn import SklearnPredictor
from fastpp.profile import LinearTable, Profile

__all__ = [
    "ALPPredictor",
    "BatchPredictor",
    "LatencyPredictor",
    "SklearnPredictor",
    "TokensOnlyPredictor",
    "mape",
    "DEFAULT_FEATURE_SCALES",
    "MIN_PREDICTION_S",
    "PREDICTOR_SCHEMA_VERSION",
]

# MIN_PREDICTION_S (fastpp.alp_rls): predictions are floored there, the controller divides by them
# phi scales: 2^21 = 1024*2048 (a 1k chunk on a 2k prefix), 2^20 = 1024^2, 1e5 = ~100 decodes
# at 1k context; the last entry is the value of the constant bias feature.
DEFAULT_FEATURE_SCALES = (2.0**-21, 2.0**-20, 1e-5, 1.0)
OUTLIER_MODES = ("clip", "skip", "none")
_INF = math.inf


class LatencyPredictor(Protocol):
    """What the predictive chunk policy needs from a beat-duration predictor: one prediction
    and one online learning step per call, both cheap (the policy calls them per decision and
    per microbatch). ALPPredictor, TokensOnlyPredictor and SklearnPredictor implement it; they
    also have scikit-learn's ``fit`` / ``predict`` / ``partial_fit`` for batch use."""

    def predict_one(
        self, num_tokens: int, sum_past_x_pre: int = 0, sum_pre_sq: int = 0, sum_dec_ctx: int = 0
    ) -> float:
        """Seconds one beat takes for a microbatch with these ALP features."""
        ...

    def learn_one(
        self, num_tokens: int, sum_past_x_pre: float, sum_pre_sq: float, sum_dec_ctx: float, duration_s: float
    ) -> float:
        """Learn from one measured beat; returns the prediction error before learning."""
        ...


class BatchPredictor(Protocol):
    """What :func:`mape` scores: scikit-learn's ``predict`` on an (n, 4) feature matrix, giving
    n beat seconds (the batch side every predictor here has beside :class:`LatencyPredictor`)."""

    def predict(self, X: Any) -> np.ndarray:
        """Predicted beat seconds for X (n, 4)."""
        ...


@dataclass(slots=True, eq=False)
class _OnlinePredictor(ABC):
    """Shared part of the RLS predictors: parameters, batch fit, vectorised predict, reset and
    persistence. Subclasses implement the unrolled hot path (``predict_one``, ``learn_one``)."""

    table: LinearTable  # bottleneck stage cost without attention, seconds vs tokens
    _: KW_ONLY
    forgetting_factor: float = 0.9975  # lambda in (0, 1]: a sample's weight halves in ~277 beats
    initial_covariance: float = 1.0  # P0 = this * I; also the per-feature cap on P (anti-windup)
    outlier: str = "clip"  # "clip" | "skip" | "none": what to do when |error| > ratio * prediction
    outlier_ratio: float = 0.4
    max_outlier_run: int = 8  # a longer run of consecutive outliers is a regime change: learn it
    prior_coef: tuple[float, ...] | None = None  # unscaled coefficients to start from; None = 0
    model: str = ""  # deployment keys: a saved predictor only loads for the same four
    hardware: str = ""
    pp: int = 1
    tp: int = 1
    n_updates_: int = field(default=0, init=False)  # RLS steps since coefficients were last set
    n_outliers_: int = field(default=0, init=False)  # samples flagged (never with outlier="none")
    _theta: list[float] = field(default_factory=list, init=False, repr=False)  # scaled coefs
    _P: list[float] = field(default_factory=list, init=False, repr=False)  # upper triangle of P
    _table_at: Callable[[int], float] = field(default=None, init=False, repr=False)  # type: ignore[assignment]
    _dense: np.ndarray | None = field(default=None, init=False, repr=False)  # table for predict()
    _outlier_run: int = field(default=0, init=False, repr=False)

    # ---------------------------------------------------------------- subclass hooks
    @abstractmethod
    def _scales(self) -> tuple[float, ...]:
        """Scale of each feature the subclass learns (the last one is the bias value)."""

    @abstractmethod
    def _phi(self, X: np.ndarray) -> np.ndarray:
        """Scaled feature matrix [n, k] of validated raw features ``X`` [n, 4]."""

    @staticmethod
    @abstractmethod
    def _profile_prior(profile: Profile) -> tuple[float, ...]:
        """Unscaled starting coefficients for ``profile``'s deployment."""

    # ---------------------------------------------------------------- construction
    def __post_init__(self) -> None:
        self._validate()
        self.reset(keep_coefficients=False)

    def _validate(self) -> None:
        name = type(self).__name__
        k = len(self._scales())
        if not isinstance(self.table, LinearTable):
            raise ValueError(f"{name}: table must be a LinearTable, got {type(self.table).__name__}")
        if not 0.0 < self.forgetting_factor <= 1.0:
            raise ValueError(f"{name}: forgetting_factor must be in (0, 1], got {self.forgetting_factor!r}")
        if not 0.0 < self.initial_covariance < _INF:
            raise ValueError(f"{name}: initial_covariance must be > 0, got {self.initial_covariance!r}")
        if self.outlier not in OUTLIER_MODES:
            raise ValueError(f"{name}: outlier must be one of {OUTLIER_MODES}, got {self.outlier!r}")
        if not 0.0 < self.outlier_ratio < _INF:
            raise ValueError(f"{name}: outlier_ratio must be > 0, got {self.outlier_ratio!r}")
        if not isinstance(self.max_outlier_run, int) or self.max_outlier_run < 0:
            raise ValueError(f"{name}: max_outlier_run must be an int >= 0, got {self.max_outlier_run!r}")
        if not all(isinstance(s, int | float) and 0.0 < s < _INF for s in self._scales()):
            raise ValueError(f"{name}: feature scales must be positive and finite, got {self._scales()}")
        if self.prior_coef is not None and (
            len(self.prior_coef) != k or not all(math.isfinite(c) for c in self.prior_coef)
        ):
            raise ValueError(f"{name}: prior_coef must be {k} finite numbers, got {self.prior_coef!r}")
        for key in ("model", "hardware"):
            if not isinstance(getattr(self, key), str):
                raise ValueError(f"{name}: {key} must be a string, got {getattr(self, key)!r}")
        for key in ("pp", "tp"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: {key} must be an int >= 1, got {value!r}")

    def _sync(self) -> None:
        """Recompute what the hot path caches from the parameters and ``_theta``."""
        self._table_at = self.table.at
        self._dense = None

    @classmethod
    def from_profile(cls, profile: Profile, **params: Any) -> Self:
        """A predictor for ``profile``'s deployment: its bottleneck table (no attention, no LM
        head), a prior from its costs, and its (model, hardware, pp, tp) keys. ``params``
        override the other constructor parameters."""
        return cls(
            bottleneck_table(profile),
            prior_coef=cls._profile_prior(profile),
            **deployment_keys(profile),
            **params,
        )

    # ---------------------------------------------------------------- sklearn-style params
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Constructor parameters by name (``deep`` is accepted for sklearn compatibility)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}

    def set_params(self, **params: Any) -> Self:
        """Change constructor parameters; unknown names and invalid values raise ValueError and
        leave the predictor unchanged. Learned coefficients are kept (in unscaled units when
        the feature scales change, which also resets the covariance)."""
        coef, scales = self._coef(), self._scales()
        apply_params(self, params)
        if self._scales() != scales:
            self._theta = [c / s for c, s in zip(coef, self._scales(), strict=True)]
            self.reset()
        self._sync()
        return self

    @property
    def coef_(self) -> np.ndarray:
        """Coefficients in seconds per unscaled feature unit (the last one: bias seconds)."""
        return np.array(self._coef())

    def _coef(self) -> tuple[float, ...]:
        """Unscaled coefficients: each scaled one times its feature's scale."""
        return tuple(t * s for t, s in zip(self._theta, self._scales(), strict=True))

    @property
    def covariance_(self) -> np.ndarray:
        """RLS covariance P (k x k) over the SCALED features."""
        return unpack_upper(self._P, len(self._theta))

    # ---------------------------------------------------------------- fitting
    def reset(self, keep_coefficients: bool = True) -> Self:
        """Covariance back to ``initial_covariance * I`` (fast adaptation again). Coefficients
        are kept unless ``keep_coefficients`` is False, which restores the prior and zeroes
        ``n_updates_`` (the reference lost its learned coefficients on every cache flush)."""
        k = len(self._scales())
        if not keep_coefficients or len(self._theta) != k:
            prior = self.prior_coef if self.prior_coef is not None else (0.0,) * k
            self._theta = [c / s for c, s in zip(prior, self._scales(), strict=True)]
            self.n_updates_ = 0
        self._P = pack_upper(np.eye(k) * self.initial_covariance)
        self._outlier_run = 0
        self._sync()
        return self

    def fit(self, X: Any, y: Any) -> Self:
        """Batch fit on X (n, 4) = [num_tokens, sum_past_x_pre, sum_pre_sq, sum_dec_ctx] and
        y (n,) seconds: ridge least squares of ``y - table(N)`` pulled towards the prior, with
        covariance set to the batch posterior (see ``solve_rls_batch``). Returns self."""
        Xa = as_features(X)
        ya = as_targets(y, Xa.shape[0])
        k = len(self._scales())
        prior = np.asarray(self.prior_coef if self.prior_coef is not None else (0.0,) * k)
        theta, cov = solve_rls_batch(
            self._phi(Xa),
            ya - self._table_values(Xa[:, 0]),
            prior / np.asarray(self._scales()),
            self.initial_covariance,
        )
        self._theta = [float(t) for t in theta]
        self._P = pack_upper(cov)
        self.n_updates_ = self.n_outliers_ = self._outlier_run = 0
        self._sync()
        return self

    def partial_fit(self, x: Any, y: Any) -> Self:
        """Online RLS: one step for one sample (``x`` four numbers, ``y`` seconds), or one step
        per row, in order, for an (n, 4) ``x`` and n ``y``. See ``learn_one``."""
        if isinstance(y, float | int):  # one sample: the per-beat path
            n, a, b, c = x
            self.learn_one(int(n), a, b, c, y)
            return self
        Xa = as_features(x)
        for row, t in zip(Xa.tolist(), as_targets(y, Xa.shape[0]).tolist(), strict=True):
            self.learn_one(int(row[0]), row[1], row[2], row[3], t)
        return self

    @abstractmethod
    def learn_one(
        self, num_tokens: int, sum_past_x_pre: float, sum_pre_sq: float, sum_dec_ctx: float, duration_s: float
    ) -> float:
        """One online step from a measured beat; returns the error before the step."""

    def _screened(self, error: float, pred: float) -> float | None:
        """The error to learn from: itself for an inlier (or with outlier="none"), else what
        :meth:`_on_outlier` says."""
        limit = self.outlier_ratio * (pred if pred > MIN_PREDICTION_S else MIN_PREDICTION_S)
        if -limit <= error <= limit or self.outlier == "none":
            self._outlier_run = 0
            return error
        return self._on_outlier(error, limit)

    def _on_outlier(self, error: float, limit: float) -> float | None:
        """Error to learn from for a sample with ``|error| > limit``: None to skip it, ``limit``
        with the sign of ``error`` to clip it, or ``error`` itself when the run of consecutive
        outliers is longer than ``max_outlier_run``: that is a change of regime, not noise, and
        is learned in full until a sample fits again (else "skip" would lock out a predictor
        whose start is more than ``outlier_ratio`` off). Callers reset the run on an inlier."""
        self.n_outliers_ += 1
        self._outlier_run += 1
        if self._outlier_run > self.max_outlier_run:
            return error
        if self.outlier == "skip":
            return None
        return limit if error > 0 else -limit

    # ---------------------------------------------------------------- querying
    def _table_values(self, num_tokens: np.ndarray) -> np.ndarray:
        """Vectorised ``table.at``; the dense copy is built on first use."""
        top = self.table.tokens[-1]
        if self._dense is None:
            self._dense = np.array([self.table.at(n) for n in range(top + 1)])
        n = num_tokens.astype(np.int64)
        slope = self.table.at(top + 1) - self.table.at(top)
        return np.where(n <= top, self._dense[np.minimum(n, top)], self._dense[top] + slope * (n - top))

    def predict(self, X: Any) -> np.ndarray:
        """Predicted beat seconds for X (n, 4), each floored at ``MIN_PREDICTION_S``."""
        Xa = as_features(X)
        raw = self._table_values(Xa[:, 0]) + self._phi(Xa) @ np.asarray(self._theta)
        return np.maximum(raw, MIN_PREDICTION_S)

    # ---------------------------------------------------------------- persistence
    def save(self, path: str | Path) -> None:
        """Write params, table, coefficients, covariance and deployment keys as JSON
        (format: :func:`fastpp.predictor_fit.write_predictor_file`)."""
        params = self.get_params()
        dep = {k: params.pop(k) for k in DEPLOYMENT_KEYS}
        table = params.pop("table")
        write_predictor_file(
            path,
            {
                "kind": type(self).__name__,
                "deployment": dep,
                "params": {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()},
                "table": table.to_dict(),
                "coef": list(self._coef()),
                "theta_scaled": self._theta,
                "covariance": self.covariance_.tolist(),
                "n_updates": self.n_updates_,
                "n_outliers": self.n_outliers_,
            },
        )

    @classmethod
    def load(cls, path: str | Path, *, model: str, hardware: str, pp: int, tp: int) -> Self:
        """Read a file written by ``save`` for THIS deployment. Raises ValueError, naming both
        deployments, when the file was made for another (model, hardware, pp, tp), and naming
        the file for a malformed one."""
        want: DeploymentKeys = {"model": model, "hardware": hardware, "pp": pp, "tp": tp}
        doc = read_predictor_file(path, cls.__name__, want)
        try:
            params: dict[str, Any] = {
                k: tuple(v) if isinstance(v, list) else v for k, v in doc["params"].items()
            }
            table = LinearTable(tuple(doc["table"]["tokens"]), tuple(doc["table"]["seconds"]))
            obj = cls(table, **params, **want)
            k = len(obj._scales())
            theta = [float(t) for t in doc["theta_scaled"]]
            cov = np.asarray(doc["covariance"], dtype=np.float64)
            if len(theta) != k or cov.shape != (k, k):
                raise ValueError(f"expected {k} coefficients and a {k}x{k} covariance")
            obj._theta, obj._P = theta, pack_upper(cov)
            obj.n_updates_, obj.n_outliers_ = int(doc["n_updates"]), int(doc["n_outliers"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: malformed predictor file: {e!r}") from None
        obj._sync()
        return obj


@dataclass(slots=True, eq=False)
class ALPPredictor(_OnlinePredictor):
    """Table plus attention-aware residual: ``T = table(N) + b . phi`` (module docstring).

    The per-beat arithmetic is an ``AlpBeatModel`` (fastpp/alp_rls.py: unrolled 4x4 RLS,
    compiled with the simulator) on this predictor's own coefficient and covariance lists,
    rebuilt whenever those are replaced.
    """

    feature_scales: tuple[float, float, float, float] = DEFAULT_FEATURE_SCALES
    _model: AlpBeatModel = field(default=None, init=False, repr=False)  # type: ignore[assignment]

    def _sync(self) -> None:
        _OnlinePredictor._sync(self)  # (a slotted dataclass has no zero-argument super())
        table = self.table
        self._model = AlpBeatModel(
            table._dense, table._top, table._slope, self._scales(), self._theta, self._P
        )

    def __copy__(self) -> Self:
        """An independent copy: the beat model updates the coefficient and covariance lists
        in place, so a shallow copy sharing them would learn into the original."""
        return copy.deepcopy(self)

    def _scales(self) -> tuple[float, ...]:
        if len(self.feature_scales) != 4:
            raise ValueError(f"ALPPredictor: feature_scales must have 4 entries, got {self.feature_scales!r}")
        return tuple(self.feature_scales)

    def _phi(self, X: np.ndarray) -> np.ndarray:
        s0, s1, s2, s3 = self.feature_scales
        return np.column_stack([X[:, 1] * s0, X[:, 2] * s1, X[:, 3] * s2, np.full(len(X), float(s3))])

    @staticmethod
    def _profile_prior(profile: Profile) -> tuple[float, ...]:
        return alp_prior(profile)

    def predict_one(
        self, num_tokens: int, sum_past_x_pre: int = 0, sum_pre_sq: int = 0, sum_dec_ctx: int = 0
    ) -> float:
        """Predicted beat seconds for one microbatch (non-negative ints), floored at
        ``MIN_PREDICTION_S``. The controller calls it per candidate chunk and slot."""
        return self._model.predict(num_tokens, sum_past_x_pre, sum_pre_sq, sum_dec_ctx)

    def learn_one(
        self, num_tokens: int, sum_past_x_pre: float, sum_pre_sq: float, sum_dec_ctx: float, duration_s: float
    ) -> float:
        """One exponentially weighted RLS step on the residual ``duration_s - table(N)``.

        Returns the prediction error before the step (seconds, measured - predicted).
        ``P = (P - g q^T) / lambda`` with ``q = P phi``, ``g = q / (lambda + phi . q)``; then
        each diagonal entry of P above ``initial_covariance`` is scaled back to it (P <- D P D,
        which keeps P positive definite): without that, a feature absent for a long while (no
        decodes, no prefix) sees P grow as lambda^-n and the next sample that has it jumps.
        A clipped outlier moves the coefficients by ``g * clipped error`` but leaves P as it is:
        shrinking P on an error we did not believe would make RLS confident in a value it never
        fitted (the reference does that; from a bad start it stalls far from the truth).
        """
        if not 0.0 < duration_s < _INF:
            raise ValueError(f"duration_s must be finite and > 0, got {duration_s!r}")
        model = self._model
        pred = model.fitted(num_tokens, sum_past_x_pre, sum_pre_sq, sum_dec_ctx)
        error = duration_s - pred
        e = self._screened(error, pred)
        if e is None:  # skipped outlier
            return error
        # a clipped sample (e != error) moves the coefficients but is no information: P stays
        model.step(
            sum_past_x_pre,
            sum_pre_sq,
            sum_dec_ctx,
            e,
            self.forgetting_factor,
            self.initial_covariance,
            e == error,
        )
        self.n_updates_ += 1
        return error


@dataclass(slots=True, eq=False)
class TokensOnlyPredictor(_OnlinePredictor):
    """The ablation: ``T = table(N) + bias``, RLS on the bias alone (no attention features).
    Same API as :class:`ALPPredictor`; attention arguments are accepted and ignored."""

    def _scales(self) -> tuple[float, ...]:
        return (1.0,)

    def _phi(self, X: np.ndarray) -> np.ndarray:
        return np.ones((len(X), 1))

    @staticmethod
    def _profile_prior(profile: Profile) -> tuple[float, ...]:
        return (profile_bias_s(profile),)

    def predict_one(
        self, num_tokens: int, sum_past_x_pre: int = 0, sum_pre_sq: int = 0, sum_dec_ctx: int = 0
    ) -> float:
        """Predicted beat seconds, floored at ``MIN_PREDICTION_S``; ignores attention."""
        t = self._table_at(num_tokens) + self._theta[0]
        return t if t > MIN_PREDICTION_S else MIN_PREDICTION_S

    def learn_one(
        self, num_tokens: int, sum_past_x_pre: float, sum_pre_sq: float, sum_dec_ctx: float, duration_s: float
    ) -> float:
        """Scalar RLS step on the bias (see :meth:`ALPPredictor.learn_one`); returns the error."""
        if not 0.0 < duration_s < _INF:
            raise ValueError(f"duration_s must be finite and > 0, got {duration_s!r}")
        pred = self._table_at(num_tokens) + self._theta[0]
        error = duration_s - pred
        e = self._screened(error, pred)
        if e is None:  # skipped outlier
            return error
        lam = self.forgetting_factor
        p = self._P[0]
        g = p / (lam + p)
        self._theta = [self._theta[0] + g * e]
        self.n_updates_ += 1
        if e == error:  # a clipped sample leaves P alone (see ALPPredictor.learn_one)
            self._P = [min((p - g * p) / lam, self.initial_covariance)]
        return error


def mape(predictor: BatchPredictor, X: Any, y: Any) -> float:
    """Mean absolute percentage error of ``predictor.predict(X)`` against ``y`` seconds, as a
    fraction (0.035 means 3.5%). ``y`` must be > 0."""
    Xa = as_features(X)
    ya = as_targets(y, Xa.shape[0])
    return float(np.mean(np.abs(predictor.predict(Xa) - ya) / ya))

"""Scikit-learn beat predictor: the learned-model comparison of PAPER.md 3.2 (the paper's neural
network was more accurate than ALP but gave no end-to-end gain).

Inputs are the ALP features plus the table value, ``[num_tokens, sum_past_x_pre, sum_pre_sq,
sum_dec_ctx, table(num_tokens)]``; the target is the beat in seconds (fitted in milliseconds so
the models see O(1) numbers). ``kind="tree"`` is a GradientBoostingRegressor, ``kind="mlp"`` an
MLPRegressor on standardised inputs and target. scikit-learn is imported only when one is built:
``pip install 'fastpp[sklearn]'``.

Online learning: ``partial_fit`` appends to a bounded buffer (the last ``buffer_size`` samples)
and refits on it every ``refit_every`` new samples. Not for the hot path: one ``predict_one`` is
a model call (tens of microseconds or more); use it offline or to rank predictors.
"""

from __future__ import annotations

from collections import deque
from dataclasses import KW_ONLY, dataclass, field, fields
from typing import Any, Self

import numpy as np

from fastpp.predictor_fit import apply_params, as_features, as_targets
from fastpp.profile import LinearTable

SKLEARN_KINDS = ("tree", "mlp")
_MS = 1e3  # the models are fitted in milliseconds


def _require_sklearn() -> None:
    try:
        import sklearn  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "SklearnPredictor needs scikit-learn, which is not installed; "
            "install the extra: pip install 'fastpp[sklearn]'"
        ) from e


@dataclass(slots=True, eq=False)
class SklearnPredictor:
    """Beat-seconds regressor with the ALP predictors' API (fit / predict / predict_one /
    partial_fit / observe / get_params / set_params). Before any fit it predicts ``table(N)``.
    Deterministic for a given ``random_state`` and sample order."""

    table: LinearTable  # bottleneck stage cost without attention, seconds vs tokens
    _: KW_ONLY
    kind: str = "tree"  # "tree" (gradient boosting) | "mlp" (multi-layer perceptron)
    buffer_size: int = 4096  # partial_fit keeps the most recent this many samples
    refit_every: int = 256  # partial_fit refits on the buffer after this many new samples
    random_state: int = 0
    model: str = ""  # deployment keys, as on ALPPredictor
    hardware: str = ""
    pp: int = 1
    tp: int = 1
    estimator_: Any = field(default=None, init=False, repr=False)  # the fitted sklearn model
    n_updates_: int = field(default=0, init=False)  # samples given to partial_fit
    _buf_x: deque = field(default_factory=deque, init=False, repr=False)
    _buf_y: deque = field(default_factory=deque, init=False, repr=False)
    _since_refit: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        _require_sklearn()
        self._validate()
        self._buf_x = deque(maxlen=self.buffer_size)
        self._buf_y = deque(maxlen=self.buffer_size)

    def _validate(self) -> None:
        if not isinstance(self.table, LinearTable):
            raise ValueError(
                f"SklearnPredictor: table must be a LinearTable, got {type(self.table).__name__}"
            )
        if self.kind not in SKLEARN_KINDS:
            raise ValueError(f"SklearnPredictor: kind must be one of {SKLEARN_KINDS}, got {self.kind!r}")
        for key in ("buffer_size", "refit_every", "pp", "tp"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SklearnPredictor: {key} must be an int >= 1, got {value!r}")

    def _new_estimator(self) -> Any:
        if self.kind == "tree":
            from sklearn.ensemble import GradientBoostingRegressor

            return GradientBoostingRegressor(
                n_estimators=300, max_depth=3, learning_rate=0.05, random_state=self.random_state
            )
        from sklearn.compose import TransformedTargetRegressor
        from sklearn.neural_network import MLPRegressor
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        # lbfgs: small, deterministic full-batch problems (a few thousand beats)
        mlp = MLPRegressor(
            hidden_layer_sizes=(32, 32), solver="lbfgs", max_iter=500, random_state=self.random_state
        )
        return TransformedTargetRegressor(make_pipeline(StandardScaler(), mlp), transformer=StandardScaler())

    def _inputs(self, X: np.ndarray) -> np.ndarray:
        # X: [n, 4] -> [n, 5] with the table value appended
        tab = np.array([self.table.at(int(n)) for n in X[:, 0]])
        return np.column_stack([X, tab])

    # ---------------------------------------------------------------- params
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Constructor parameters by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}

    def set_params(self, **params: Any) -> Self:
        """Change parameters (unknown names raise ValueError). The fitted model is kept until
        the next (re)fit; the buffer keeps its newest samples if ``buffer_size`` shrinks."""
        apply_params(self, params)
        self._buf_x = deque(self._buf_x, maxlen=self.buffer_size)
        self._buf_y = deque(self._buf_y, maxlen=self.buffer_size)
        return self

    # ---------------------------------------------------------------- fitting
    def fit(self, X: Any, y: Any) -> Self:
        """Fit a new model on all of X (n, 4) and y (n,) seconds; the buffer restarts with the
        last ``buffer_size`` rows."""
        Xa = as_features(X)
        ya = as_targets(y, Xa.shape[0])
        self.estimator_ = self._new_estimator().fit(self._inputs(Xa), ya * _MS)
        self._buf_x = deque(Xa.tolist(), maxlen=self.buffer_size)
        self._buf_y = deque(ya.tolist(), maxlen=self.buffer_size)
        self._since_refit = 0
        return self

    def partial_fit(self, x: Any, y: Any) -> Self:
        """Buffer one sample (or the rows of an (n, 4) ``x``); refit on the buffer every
        ``refit_every`` new samples."""
        Xa = as_features(x)
        ya = as_targets(y, Xa.shape[0])
        for row, t in zip(Xa.tolist(), ya.tolist(), strict=True):
            self._buf_x.append(row)
            self._buf_y.append(t)
            self.n_updates_ += 1
            self._since_refit += 1
            if self._since_refit >= self.refit_every:
                bx, by = np.array(self._buf_x), np.array(self._buf_y)
                self.estimator_ = self._new_estimator().fit(self._inputs(bx), by * _MS)
                self._since_refit = 0
        return self

    def learn_one(
        self, num_tokens: int, sum_past_x_pre: float, sum_pre_sq: float, sum_dec_ctx: float, duration_s: float
    ) -> float:
        """One measured beat into the buffer (``partial_fit``); returns the error before it."""
        error = duration_s - self.predict_one(
            num_tokens, int(sum_past_x_pre), int(sum_pre_sq), int(sum_dec_ctx)
        )
        self.partial_fit([num_tokens, sum_past_x_pre, sum_pre_sq, sum_dec_ctx], [duration_s])
        return error

    # ---------------------------------------------------------------- querying
    def predict(self, X: Any) -> np.ndarray:
        """Predicted beat seconds for X (n, 4), floored at 1 us like the ALP predictors."""
        Xa = as_features(X)
        inputs = self._inputs(Xa)
        if self.estimator_ is None:
            return np.maximum(inputs[:, 4], 1e-6)
        return np.maximum(np.asarray(self.estimator_.predict(inputs)) / _MS, 1e-6)

    def predict_one(
        self, num_tokens: int, sum_past_x_pre: int = 0, sum_pre_sq: int = 0, sum_dec_ctx: int = 0
    ) -> float:
        """``predict`` for one microbatch (a model call: slow, see module docstring)."""
        return float(self.predict([[num_tokens, sum_past_x_pre, sum_pre_sq, sum_dec_ctx]])[0])

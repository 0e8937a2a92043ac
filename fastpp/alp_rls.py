"""The ALP predictor's per-beat arithmetic (fastpp/predictor.py, ``ALPPredictor``) in a small
module of its own, so that the compiled build (fastpp/_native.py) compiles it: the predictive
chunk policy asks for a prediction per candidate chunk and slot and learns once per microbatch,
and interpreted these were about a tenth of a predictive goodput search (py-spy).

``AlpBeatModel`` holds what those two calls read: the bottleneck table's dense values, the four
scaled coefficients (the predictor's ``_theta`` list, updated in place) and the covariance's
upper triangle (its ``_P`` list, likewise). The predictor keeps its parameters, screening of
outliers, counters, fitting and files; it builds a new model whenever its coefficients are
replaced (``_sync``). The arithmetic is ``ALPPredictor``'s as it was, operation for operation
in the same order, so the floats are the same.

Units: seconds; feature sums are raw integers (scaled here by the feature scales).
"""

from __future__ import annotations

import copyreg
import math

from fastpp.stage_cost_fn import dense_at

MIN_PREDICTION_S = 1e-6  # fastpp.predictor's floor (the controller divides by predictions)


class AlpBeatModel:
    """``T = table(N) + w . [sum L_past*L_pre, sum L_pre^2, sum L_dec, 1]`` and its RLS step."""

    __slots__ = ("dense", "top", "slope", "s0", "s1", "s2", "x3", "theta", "cov", "w0", "w1", "w2", "w3")

    def __init__(
        self,
        dense: list[float],
        top: int,
        slope: float,
        scales: tuple[float, ...],
        theta: list[float],
        cov: list[float],
    ) -> None:
        """``dense``/``top``/``slope``: the table's (``LinearTable``); ``scales``: the four
        feature scales (the last is the bias feature's value); ``theta`` (4) and ``cov`` (10,
        upper triangle by rows): the predictor's own lists, which the RLS step updates."""
        self.dense = dense
        self.top = top
        self.slope = slope
        self.s0, self.s1, self.s2, self.x3 = scales
        self.theta = theta
        self.cov = cov
        self.w0 = theta[0] * self.s0
        self.w1 = theta[1] * self.s1
        self.w2 = theta[2] * self.s2
        self.w3 = theta[3] * self.x3

    def table_at(self, num_tokens: int) -> float:
        """``LinearTable.at``: the same floats."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return dense_at(self.dense, self.top, self.slope, num_tokens)

    def predict(self, num_tokens: int, sum_past_x_pre: int, sum_pre_sq: int, sum_dec_ctx: int) -> float:
        """``ALPPredictor.predict_one``: seconds, floored at ``MIN_PREDICTION_S``."""
        t = (
            self.table_at(num_tokens)
            + self.w0 * sum_past_x_pre
            + self.w1 * sum_pre_sq
            + self.w2 * sum_dec_ctx
            + self.w3
        )
        return t if t > MIN_PREDICTION_S else MIN_PREDICTION_S

    def fitted(self, num_tokens: int, sum_past_x_pre: float, sum_pre_sq: float, sum_dec_ctx: float) -> float:
        """The prediction ``learn_one`` compares a measured beat with (scaled features times
        the scaled coefficients; not floored)."""
        theta = self.theta
        return (
            self.table_at(num_tokens)
            + theta[0] * (sum_past_x_pre * self.s0)
            + theta[1] * (sum_pre_sq * self.s1)
            + theta[2] * (sum_dec_ctx * self.s2)
            + theta[3] * self.x3
        )

    def step(
        self,
        sum_past_x_pre: float,
        sum_pre_sq: float,
        sum_dec_ctx: float,
        e: float,
        forgetting_factor: float,
        cap: float,
        learn_covariance: bool,
    ) -> None:
        """One exponentially weighted RLS step on the (screened) error ``e``: the coefficients
        move by ``g * e``; with ``learn_covariance`` (not for a clipped outlier) the covariance
        too, each diagonal entry above ``cap`` scaled back to it (``ALPPredictor.learn_one``)."""
        x0 = sum_past_x_pre * self.s0
        x1 = sum_pre_sq * self.s1
        x2 = sum_dec_ctx * self.s2
        x3 = self.x3
        P = self.cov
        p00, p01, p02, p03, p11 = P[0], P[1], P[2], P[3], P[4]
        p12, p13, p22, p23, p33 = P[5], P[6], P[7], P[8], P[9]
        q0 = p00 * x0 + p01 * x1 + p02 * x2 + p03 * x3
        q1 = p01 * x0 + p11 * x1 + p12 * x2 + p13 * x3
        q2 = p02 * x0 + p12 * x1 + p22 * x2 + p23 * x3
        q3 = p03 * x0 + p13 * x1 + p23 * x2 + p33 * x3
        lam = forgetting_factor
        k = 1.0 / (lam + x0 * q0 + x1 * q1 + x2 * q2 + x3 * q3)
        g0, g1, g2, g3 = q0 * k, q1 * k, q2 * k, q3 * k
        theta = self.theta
        t0 = theta[0] + g0 * e
        t1 = theta[1] + g1 * e
        t2 = theta[2] + g2 * e
        t3 = theta[3] + g3 * e
        theta[0], theta[1], theta[2], theta[3] = t0, t1, t2, t3
        self.w0, self.w1, self.w2, self.w3 = t0 * self.s0, t1 * self.s1, t2 * self.s2, t3 * x3
        if not learn_covariance:
            return
        il = 1.0 / lam
        n00 = (p00 - g0 * q0) * il
        n01 = (p01 - g0 * q1) * il
        n02 = (p02 - g0 * q2) * il
        n03 = (p03 - g0 * q3) * il
        n11 = (p11 - g1 * q1) * il
        n12 = (p12 - g1 * q2) * il
        n13 = (p13 - g1 * q3) * il
        n22 = (p22 - g2 * q2) * il
        n23 = (p23 - g2 * q3) * il
        n33 = (p33 - g3 * q3) * il
        if n00 > cap or n11 > cap or n22 > cap or n33 > cap:  # anti-windup: P <- D P D
            d0 = math.sqrt(cap / n00) if n00 > cap else 1.0
            d1 = math.sqrt(cap / n11) if n11 > cap else 1.0
            d2 = math.sqrt(cap / n22) if n22 > cap else 1.0
            d3 = math.sqrt(cap / n33) if n33 > cap else 1.0
            n00, n01, n02, n03 = n00 * d0 * d0, n01 * d0 * d1, n02 * d0 * d2, n03 * d0 * d3
            n11, n12, n13 = n11 * d1 * d1, n12 * d1 * d2, n13 * d1 * d3
            n22, n23, n33 = n22 * d2 * d2, n23 * d2 * d3, n33 * d3 * d3
        P[0], P[1], P[2], P[3], P[4] = n00, n01, n02, n03, n11
        P[5], P[6], P[7], P[8], P[9] = n12, n13, n22, n23, n33


def _constructor_call(model: AlpBeatModel) -> tuple[type, tuple[object, ...]]:
    """``model`` as its constructor call: pickle and copy (a compiled class is otherwise
    restored by calling ``__init__`` without arguments). Pickled with its predictor, the
    coefficient and covariance lists stay the predictor's own (pickle keeps shared objects
    shared)."""
    return AlpBeatModel, (
        model.dense,
        model.top,
        model.slope,
        (model.s0, model.s1, model.s2, model.x3),
        model.theta,
        model.cov,
    )


copyreg.pickle(AlpBeatModel, _constructor_call)

"""ALP latency predictor: RLS convergence and tracking, outliers, batch fit, persistence keyed by
deployment, sklearn-style params, the tokens-only ablation and the profile prior."""

from __future__ import annotations

import functools
import json
import random
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_profile
from fastpp.predictor import (
    MIN_PREDICTION_S,
    ALPPredictor,
    SklearnPredictor,
    TokensOnlyPredictor,
    mape,
)
from fastpp.predictor_fit import bottleneck_table

# true unscaled coefficients: s per sum_past_x_pre, per sum_pre_sq, per sum_dec_ctx, bias s
B_TRUE = np.array([2e-9, 1e-9, 2e-8, 3e-4])
TABLE = bottleneck_table(make_profile(pp=2, step=128))  # 128-token steps up to 8k tokens


def synth(n: int, seed: int, b: np.ndarray = B_TRUE, noise: float = 0.005) -> tuple[np.ndarray, np.ndarray]:
    """Random microbatches (0-64 decodes, 0-3 prefill chunks) timed as table(N) + b . raw
    features, times (1 + N(0, noise)). Returns fresh copies of cached arrays."""
    X, y = _synth(n, seed, tuple(b), noise)
    return X.copy(), y.copy()


@functools.cache
def _synth(n: int, seed: int, b: tuple[float, ...], noise: float) -> tuple[np.ndarray, np.ndarray]:
    rng = random.Random(seed)
    rows, ys = [], []
    for _ in range(n):
        ctx = [rng.randint(100, 4000) for _ in range(rng.randint(0, 64))]
        chunks = [(rng.randint(0, 4096), rng.randint(1, 1024)) for _ in range(rng.randint(0, 3))]
        if not ctx and not chunks:
            ctx = [500]
        num_tokens = len(ctx) + sum(pre for _, pre in chunks)
        row = (num_tokens, sum(p * q for p, q in chunks), sum(q * q for _, q in chunks), sum(ctx))
        t = TABLE.at(num_tokens) + float(np.dot(b, (*row[1:], 1)))
        rows.append(row)
        ys.append(t * (1.0 + rng.gauss(0.0, noise)))
    return np.array(rows, dtype=float), np.array(ys)


def converged(**params) -> ALPPredictor:
    X, y = synth(2000, seed=1, noise=0.0)
    return ALPPredictor(TABLE, **params).partial_fit(X, y)


# --------------------------------------------------------------------------- online RLS


@pytest.mark.parametrize("outlier", ["clip", "skip", "none"])
def test_rls_converges_from_wrong_start(outlier):
    wrong = tuple(-3 * B_TRUE)  # far off: most early samples are "outliers"
    X, y = synth(3000, seed=0)
    pred = ALPPredictor(TABLE, outlier=outlier, prior_coef=wrong).partial_fit(X, y)
    assert pred.n_updates_ > 2500
    np.testing.assert_allclose(pred.coef_, B_TRUE, rtol=0.05)
    assert mape(pred, *synth(500, seed=9)) < 0.01


def test_rls_exact_without_noise():
    np.testing.assert_allclose(converged().coef_, B_TRUE, rtol=1e-3)


def test_forgetting_tracks_a_coefficient_change():
    b_new = B_TRUE * np.array([1.0, 1.0, 2.0, 1.5])  # decode attention doubles (e.g. KV offload)
    X1, y1 = synth(2000, seed=2)
    X2, y2 = synth(2000, seed=3, b=b_new)
    forgetting = ALPPredictor(TABLE).partial_fit(X1, y1).partial_fit(X2, y2)
    no_forget = ALPPredictor(TABLE, forgetting_factor=1.0).partial_fit(X1, y1).partial_fit(X2, y2)
    np.testing.assert_allclose(forgetting.coef_, b_new, rtol=0.05)
    assert abs(no_forget.coef_[2] / b_new[2] - 1) > 0.15  # averages the two regimes


def test_covariance_does_not_wind_up_on_an_absent_feature():
    X, y = synth(5000, seed=4)
    X[:, 3] = 0.0  # no decodes for 5000 beats: lambda^-5000 ~ 3e5 without the cap
    y = np.array([TABLE.at(int(r[0])) + B_TRUE[:3] @ r[1:4] + B_TRUE[3] for r in X])
    pred = ALPPredictor(TABLE).partial_fit(X, y)
    cov = pred.covariance_
    assert np.all(np.diag(cov) <= pred.initial_covariance * (1 + 1e-12))
    assert np.all(np.linalg.eigvalsh(cov) > 0)


def test_outlier_skip_ignores_a_spike_and_clip_bounds_it():
    x = (512, 1_000_000, 200_000, 40_000)
    results = {}
    for mode in ("skip", "clip", "none"):
        pred = converged(outlier=mode)
        before, n, n_out = pred.coef_.copy(), pred.n_updates_, pred.n_outliers_
        truth = pred.predict_one(*x)
        err = pred.learn_one(*x, 5 * truth)  # a 5x spike (GC pause, preemption)
        assert err == pytest.approx(4 * truth, rel=1e-3)
        results[mode] = np.abs(pred.coef_ - before).sum()
        assert pred.n_outliers_ == n_out + (0 if mode == "none" else 1)
        assert pred.n_updates_ == n + (0 if mode == "skip" else 1)
    assert results["skip"] == 0.0
    assert 0 < results["clip"] < results["none"] * 0.2  # clipped at 0.4 x prediction, not 4x


def test_a_long_run_of_outliers_is_learned_as_a_regime_change():
    pred = converged(outlier="skip", max_outlier_run=3)
    x = (512, 1_000_000, 200_000, 40_000)
    slow = 3 * pred.predict_one(*x)
    n = pred.n_updates_
    for _ in range(3):
        pred.learn_one(*x, slow)
    assert pred.n_updates_ == n  # all three skipped
    pred.learn_one(*x, slow)  # the fourth in a row is learned
    assert pred.n_updates_ == n + 1


def test_partial_fit_of_one_sample_is_learn_one():
    a, b = ALPPredictor(TABLE), ALPPredictor(TABLE)
    a.learn_one(300, 256 * 1024, 256**2, 44_000, 0.004)
    b.partial_fit([300, 256 * 1024, 256**2, 44_000], 0.004)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    assert a.n_updates_ == 1


def test_invalid_measurements_and_params_are_rejected():
    pred = ALPPredictor(TABLE)
    with pytest.raises(ValueError, match="duration_s"):
        pred.learn_one(10, 0, 0, 0, float("nan"))
    with pytest.raises(ValueError, match="forgetting_factor"):
        ALPPredictor(TABLE, forgetting_factor=1.5)
    with pytest.raises(ValueError, match="outlier must be one of"):
        ALPPredictor(TABLE, outlier="drop")
    with pytest.raises(ValueError, match="shape"):
        pred.predict([[1, 2, 3]])


# --------------------------------------------------------------------------- batch fit, predict


def test_fit_recovers_coefficients_and_keeps_unexcited_prior():
    X, y = synth(1500, seed=5)
    np.testing.assert_allclose(ALPPredictor(TABLE).fit(X, y).coef_, B_TRUE, rtol=0.05)
    y = y - B_TRUE[2] * X[:, 3]  # the same beats without decodes: that column is all zero,
    X[:, 3] = 0.0  # so its coefficient stays at the prior instead of collapsing to 0
    fitted = ALPPredictor(TABLE, prior_coef=(0.0, 0.0, 7e-8, 0.0)).fit(X, y)
    assert fitted.coef_[2] == pytest.approx(7e-8)
    np.testing.assert_allclose(fitted.coef_[[0, 1, 3]], B_TRUE[[0, 1, 3]], rtol=0.05)
    assert fitted.n_updates_ == 0


def test_online_updates_after_fit_do_not_undo_it():
    X, y = synth(1500, seed=6)
    pred = ALPPredictor(TABLE).fit(X, y)
    pred.partial_fit(*synth(20, seed=7))
    np.testing.assert_allclose(pred.coef_, B_TRUE, rtol=0.05)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 20_000), st.integers(0, 10**9), st.integers(0, 10**8), st.integers(0, 10**7))
def test_predict_one_matches_predict(num_tokens, past_x_pre, pre_sq, dec_ctx):
    for pred in (_TRAINED_ALP, _TRAINED_TOK):
        one = pred.predict_one(num_tokens, past_x_pre, pre_sq, dec_ctx)
        many = pred.predict([[num_tokens, past_x_pre, pre_sq, dec_ctx]])
        assert one == pytest.approx(float(many[0]), rel=1e-9, abs=1e-15)
        assert one >= MIN_PREDICTION_S


_TRAINED_ALP = ALPPredictor(TABLE).fit(*synth(300, seed=8))
_TRAINED_TOK = TokensOnlyPredictor(TABLE).fit(*synth(300, seed=8))


def test_predictions_are_floored():
    pred = ALPPredictor(TABLE, prior_coef=(0.0, 0.0, 0.0, -1.0))
    assert pred.predict_one(100) == MIN_PREDICTION_S
    assert pred.predict([[100, 0, 0, 0]])[0] == MIN_PREDICTION_S


def test_tokens_only_is_worse_than_alp_on_attention_heavy_data():
    X, y = synth(1500, seed=10)
    Xt, yt = synth(500, seed=11)
    alp = ALPPredictor(TABLE).fit(X, y)
    tok = TokensOnlyPredictor(TABLE).fit(X, y)
    assert mape(alp, Xt, yt) < 0.02
    assert mape(tok, Xt, yt) > 5 * mape(alp, Xt, yt)
    online = TokensOnlyPredictor(TABLE).partial_fit(X, y)
    assert online.coef_.shape == (1,) and online.n_updates_ > 0


# --------------------------------------------------------------------------- params, reset, files


def test_get_params_set_params_round_trip():
    pred = ALPPredictor(TABLE, forgetting_factor=0.99, outlier="skip", model="m", pp=2)
    clone = ALPPredictor(**pred.get_params())
    assert clone.get_params() == pred.get_params()
    assert clone.set_params(outlier_ratio=0.3, tp=2) is clone
    assert clone.outlier_ratio == 0.3 and clone.tp == 2
    with pytest.raises(ValueError, match="unknown parameter"):
        clone.set_params(lambda_=0.9)
    with pytest.raises(ValueError, match="forgetting_factor"):
        clone.set_params(forgetting_factor=0.0, outlier="none")
    assert clone.forgetting_factor == 0.99 and clone.outlier == "skip"  # unchanged on error


def test_changing_feature_scales_keeps_unscaled_coefficients():
    pred = converged()
    coef = pred.coef_.copy()
    pred.set_params(feature_scales=(1e-6, 1e-6, 1e-4, 0.5))
    np.testing.assert_allclose(pred.coef_, coef, rtol=1e-12)
    assert pred.predict_one(512, 10**6, 10**5, 10**4) == pytest.approx(
        TABLE.at(512) + coef @ (10**6, 10**5, 10**4, 1), rel=1e-12
    )


def test_coefficients_survive_reset():
    pred = converged(prior_coef=(1e-9, 1e-9, 1e-8, 1e-4))
    coef = pred.coef_.copy()
    pred.reset()
    np.testing.assert_array_equal(pred.coef_, coef)
    np.testing.assert_array_equal(pred.covariance_, np.eye(4) * pred.initial_covariance)
    pred.reset(keep_coefficients=False)
    np.testing.assert_array_equal(pred.coef_, (1e-9, 1e-9, 1e-8, 1e-4))
    assert pred.n_updates_ == 0


@pytest.mark.parametrize("cls", [ALPPredictor, TokensOnlyPredictor])
def test_save_load_round_trip(tmp_path, cls):
    keys = dict(model="Qwen2.5-32B", hardware="A100-40GB-PCIe", pp=4, tp=1)
    pred = cls(TABLE, forgetting_factor=0.995, outlier="skip", **keys)
    pred.partial_fit(*synth(500, seed=12))
    path = tmp_path / "sub" / "alp.json"
    pred.save(path)
    back = cls.load(path, **keys)
    assert back.get_params() == pred.get_params()
    np.testing.assert_array_equal(back.coef_, pred.coef_)
    np.testing.assert_array_equal(back.covariance_, pred.covariance_)
    assert (back.n_updates_, back.n_outliers_) == (pred.n_updates_, pred.n_outliers_)
    more = synth(50, seed=13)  # and both continue identically (exact float round trip)
    np.testing.assert_array_equal(back.partial_fit(*more).coef_, pred.partial_fit(*more).coef_)
    assert json.loads(path.read_text())["deployment"] == keys


def test_load_refuses_another_deployment(tmp_path):
    path = tmp_path / "alp.json"
    ALPPredictor(TABLE, model="Qwen2.5-32B", hardware="A100-40GB-PCIe", pp=4, tp=1).save(path)
    with pytest.raises(ValueError) as info:
        ALPPredictor.load(path, model="Qwen2.5-32B", hardware="H100-80GB", pp=4, tp=1)
    msg = str(info.value)
    assert "A100-40GB-PCIe" in msg and "H100-80GB" in msg and "alp.json" in msg
    with pytest.raises(ValueError, match="pp=2"):
        ALPPredictor.load(path, model="Qwen2.5-32B", hardware="A100-40GB-PCIe", pp=2, tp=1)
    with pytest.raises(ValueError, match="not a TokensOnlyPredictor"):
        TokensOnlyPredictor.load(path, model="Qwen2.5-32B", hardware="A100-40GB-PCIe", pp=4, tp=1)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        ALPPredictor.load(path, model="Qwen2.5-32B", hardware="A100-40GB-PCIe", pp=4, tp=1)


# --------------------------------------------------------------------------- profile prior


def test_from_profile_uses_bottleneck_table_and_attention_prior():
    prof = make_profile(pp=2, num_layers=4, step=16)
    pred = ALPPredictor.from_profile(prof)
    stage0, last = prof.stages[0], prof.stages[-1]  # stage 0 is the bottleneck (embedding)
    assert (pred.model, pred.hardware, pred.pp, pred.tp) == ("toy", "toy", 2, 1)
    np.testing.assert_allclose(
        pred.coef_,
        (stage0.attn_past_x_pre_s, stage0.attn_pre_sq_s, stage0.attn_dec_ctx_s, last.lm_head.at(1)),
    )
    assert pred.table.tokens == (1, *stage0.linear.tokens)
    for n, a, s, d in [(1, 0, 0, 0), (17, 0, 289, 0), (200, 10**5, 10**4, 3000), (1000, 0, 0, 10**5)]:
        expected = stage0.time_s(n, 0, a, s, d) + last.lm_head.at(1)  # beat = slowest stage
        assert pred.predict_one(n, a, s, d) == pytest.approx(expected, rel=1e-12)
    tok = TokensOnlyPredictor.from_profile(prof, forgetting_factor=0.99)
    assert tok.coef_.tolist() == [last.lm_head.at(1)] and tok.forgetting_factor == 0.99


def test_uneven_split_takes_the_stage_with_more_layers():
    prof = make_profile(pp=3, num_layers=4, step=16)  # layers 2, 1, 1
    pred = ALPPredictor.from_profile(prof)
    assert pred.coef_[0] == prof.stages[0].attn_past_x_pre_s == 2e-9


def test_table_step_is_kept():
    pred = ALPPredictor.from_profile(make_profile(pp=2, step=128))
    assert pred.predict_one(129) == pytest.approx(pred.predict_one(256), rel=0.05)
    # the whole 128 -> 256 rise happens at 129 (the step), none of it is spread over the range
    rise = pred.predict_one(256) - pred.predict_one(128)
    assert pred.predict_one(129) - pred.predict_one(128) > 0.9 * rise


# --------------------------------------------------------------------------- sklearn ablation


def test_sklearn_predictor_names_the_extra_when_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    with pytest.raises(ImportError, match=r"fastpp\[sklearn\]"):
        SklearnPredictor(TABLE)


@pytest.mark.parametrize("kind", ["tree", "mlp"])
def test_sklearn_predictor_fits_and_predicts(kind):
    pytest.importorskip("sklearn")
    X, y = synth(400, seed=14)
    Xt, yt = synth(200, seed=15)
    pred = SklearnPredictor(TABLE, kind=kind)
    assert pred.predict_one(129) == pytest.approx(TABLE.at(129))  # before fit: the table
    pred.fit(X, y)
    assert mape(pred, Xt, yt) < 0.15
    assert pred.predict_one(*Xt[0].astype(int)) == pytest.approx(pred.predict(Xt[:1])[0])


def test_sklearn_partial_fit_refits_every_k():
    pytest.importorskip("sklearn")
    X, y = synth(60, seed=16)
    pred = SklearnPredictor(TABLE, refit_every=25, buffer_size=40)
    pred.partial_fit(X[:24], y[:24])
    assert pred.estimator_ is None
    pred.partial_fit(X[24], y[24])
    first = pred.estimator_
    assert first is not None
    pred.partial_fit(X[25:], y[25:])
    assert pred.estimator_ is not first and pred.n_updates_ == 60 and len(pred._buf_x) == 40
    with pytest.raises(ValueError, match="kind"):
        pred.set_params(kind="forest")


# --------------------------------------------------------------------------- the beat model


def _textbook_step(theta, P, phi, e, lam):
    """Exponentially weighted RLS in matrix form: the reference for the unrolled step."""
    q = P @ phi
    g = q / (lam + phi @ q)
    return theta + g * e, (P - np.outer(g, q)) / lam


@pytest.mark.parametrize("cap", [1e6, 1.0])  # 1.0: the anti-windup scales P back on most steps
def test_the_unrolled_rls_step_is_the_textbook_update(cap):
    X, y = synth(300, seed=5)
    pred = ALPPredictor(TABLE, initial_covariance=cap, outlier="none")
    scales = np.array(pred.feature_scales)
    for row, t in zip(X, y, strict=True):
        theta, P = np.array(pred._theta), pred.covariance_
        phi = np.array([row[1], row[2], row[3], 1.0]) * scales
        e = t - (TABLE.at(int(row[0])) + phi @ theta)
        error = pred.learn_one(int(row[0]), row[1], row[2], row[3], t)
        assert error == pytest.approx(e, rel=1e-12, abs=1e-15)
        want_theta, want_P = _textbook_step(theta, P, phi, e, pred.forgetting_factor)
        d = np.sqrt(np.minimum(1.0, cap / np.diag(want_P)))  # anti-windup: P <- D P D
        np.testing.assert_allclose(pred._theta, want_theta, rtol=1e-9, atol=1e-18)
        np.testing.assert_allclose(pred.covariance_, want_P * np.outer(d, d), rtol=1e-9, atol=1e-18)
        assert pred.coef_.tolist() == [a * b for a, b in zip(pred._theta, scales, strict=True)]


def test_the_beat_model_works_on_the_predictors_own_lists():
    X, y = synth(50, seed=6)
    pred = ALPPredictor(TABLE)
    for change in (
        lambda: pred.fit(X, y),
        lambda: pred.reset(),
        lambda: pred.set_params(feature_scales=(1e-6, 1e-6, 1e-5, 1.0)),
        lambda: pred.partial_fit(X, y),
    ):
        change()
        assert pred._model.theta is pred._theta and pred._model.cov is pred._P
        x = X[7]
        assert pred.predict_one(int(x[0]), int(x[1]), int(x[2]), int(x[3])) == pytest.approx(
            float(pred.predict(X[7:8])[0]), rel=1e-12
        )


def test_a_pickled_predictor_learns_on_as_the_original():
    import pickle

    X, y = synth(400, seed=7)
    pred = ALPPredictor(TABLE).partial_fit(X[:200], y[:200])
    copy = pickle.loads(pickle.dumps(pred))
    assert copy._model.theta is copy._theta and copy._model.cov is copy._P
    for p in (pred, copy):
        p.partial_fit(X[200:], y[200:])
    assert copy._theta == pred._theta and copy._P == pred._P
    assert copy.predict_one(512, 10**6, 10**5, 4000) == pred.predict_one(512, 10**6, 10**5, 4000)


def test_a_copied_predictor_learns_apart_from_the_original():
    import copy

    X, y = synth(100, seed=8)
    pred = ALPPredictor(TABLE).partial_fit(X[:50], y[:50])
    theta, cov = list(pred._theta), list(pred._P)
    other = copy.copy(pred).partial_fit(X[50:], y[50:])
    assert (pred._theta, pred._P) == (theta, cov) and other._theta != theta

"""The paper's experiments (PAPER.md section 5) that are not a plain goodput grid: predictor
ablation, stage-iteration time per policy, delay scheduling on a decode-heavy load, trace replay,
SLO scaling. Each returns plain rows (dicts) that docs/RESULTS.md tabulates and plots; every
function is deterministic for its seeds. ``scripts/make_results.py`` calls them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from fastpp.metrics import summarize
from fastpp.predictor import ALPPredictor, TokensOnlyPredictor
from fastpp.predictor_fit import bottleneck_table
from fastpp.sim.run import DeploymentConfig, SimulationRun, WorkloadConfig, run_simulation
from fastpp.types import IterationRecord


def beats(iterations: list[IterationRecord]) -> tuple[np.ndarray, np.ndarray]:
    """Per microbatch: features [tokens, sum L_past*L_pre, sum L_pre^2, sum L_dec] and the
    duration of its slowest stage (the beat the predictor is asked for), in launch order."""
    slowest: dict[int, IterationRecord] = {}
    for it in iterations:
        best = slowest.get(it.mb_id)
        if best is None or it.duration_s > best.duration_s:
            slowest[it.mb_id] = it
    rows = [slowest[k] for k in sorted(slowest)]
    X = np.array([[r.num_tokens, r.sum_past_x_pre, r.sum_pre_sq, r.sum_dec_ctx] for r in rows], dtype=float)
    y = np.array([r.duration_s for r in rows])
    return X, y


def predictor_ablation(
    workload: WorkloadConfig, deployment: DeploymentConfig, noise_cv: float = 0.0
) -> list[dict]:
    """MAPE of beat predictions on one simulated run (second half of the microbatches).

    Online predictors start from the bottleneck table with NO attention prior and learn by RLS
    as the run goes (predict, then learn, per microbatch); the scikit-learn tree is fitted on
    the first half. ``noise_cv`` jitters every stage time (a real GPU is not a formula).
    Caveat stated in RESULTS.md: the simulator's stage cost has the ALP form by construction,
    so ALP's edge here measures the cost model, not a real GPU.
    """
    run = run_simulation(workload, deployment, noise_cv=noise_cv)
    profile = run.profile
    X, y = beats(run.result.iterations)
    half = len(y) // 2
    table = bottleneck_table(profile)
    rows = []
    for name, predictor in (
        ("tokens-only (table + bias, RLS)", TokensOnlyPredictor(table)),
        ("ALP (table + attention features, RLS)", ALPPredictor(table)),
    ):
        errors = []
        for i in range(len(y)):
            pred = predictor.predict_one(*(int(v) for v in X[i]))
            if i >= half:
                errors.append(abs(pred - y[i]) / y[i])
            predictor.learn_one(*(int(v) for v in X[i]), float(y[i]))
        rows.append({"predictor": name, "mape": float(np.mean(errors)), "n_test": len(errors)})
    try:
        from fastpp.predictor_sklearn import SklearnPredictor

        tree = SklearnPredictor(table, kind="tree").fit(X[:half], y[:half])
        errors = np.abs(tree.predict(X[half:]) - y[half:]) / y[half:]
        rows.append(
            {
                "predictor": "scikit-learn gradient boosting (fit on first half)",
                "mape": float(np.mean(errors)),
                "n_test": len(errors),
            }
        )
    except ImportError as exc:
        rows.append({"predictor": f"scikit-learn: not installed ({exc})", "mape": float("nan"), "n_test": 0})
    return rows


def iteration_time(run: SimulationRun) -> dict:
    """P50/P90/P99 of the beat (slowest stage per microbatch) in ms, and the mean idle share."""
    _, y = beats(run.result.iterations)
    p50, p90, p99 = np.percentile(y * 1e3, [50, 90, 99]) if len(y) else (np.nan,) * 3
    return {
        "policy": run.deployment.policy,
        "deployment": run.deployment.label,
        "p50_beat_ms": float(p50),
        "p90_beat_ms": float(p90),
        "p99_beat_ms": float(p99),
        "mean_bubble_fraction": run.summary["mean_bubble_fraction"],
    }


def latency_row(run: SimulationRun) -> dict:
    s = run.summary
    keys = (
        "p90_ttft_ms",
        "p90_tpot_ms",
        "p99_tpot_ms",
        "mean_e2e_latency_ms",
        "p99_e2e_latency_ms",
        "slo_attainment",
        "slo_met",
        "num_parked",
        "num_retractions",
        "completed",
        "num_requests",
    )
    return {
        "deployment": run.deployment.label,
        "policy": run.deployment.policy,
        **{k: s.get(k) for k in keys},
    }


def run_rows(
    workload: WorkloadConfig, deployments: list[DeploymentConfig], record_iterations: bool = False
) -> list[SimulationRun]:
    """One run per deployment on the same requests."""
    requests = workload.requests()
    return [
        run_simulation(workload, d, requests=requests, record_iterations=record_iterations)
        for d in deployments
    ]


def pooled_summary(workload: WorkloadConfig, deployment: DeploymentConfig, seeds: tuple[int, ...]) -> dict:
    """Summary over the pooled requests of several seeds."""
    records = []
    for seed in seeds:
        records += run_simulation(
            replace(workload, seed=seed), deployment, record_iterations=False
        ).result.records
    return summarize(records, slo=deployment.slo)

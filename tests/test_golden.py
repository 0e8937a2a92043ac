"""Golden runs: a seeded simulation's summary and its per-request records must not drift
silently. The cases pin the static chunk on PP and TP and every adaptive policy of the paper
(greedy, predictive, predictive + delay scheduling) plus upstream dynamic chunking, our slack
policy, greedy with the tile floor and the late-last queue order on a burst over capacity. After a
deliberate change to the model or a policy, regenerate with
``FASTPP_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py`` and say in the commit which
goldens moved and why."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pytest

from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation

GOLDEN = Path(__file__).parent / "golden"
KEYS = (
    "completed",
    "mean_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p90_tpot_ms",
    "p99_itl_ms",
    "mean_e2e_latency_ms",
    "num_microbatches",
    "num_retractions",
    "slo_attainment",
    "bubble_fraction",
    "sim_end_s",
)

AZURE = WorkloadConfig(rate=3.0, num_requests=150, seed=7)
# Decode-heavy and dense enough that more than a tier of 4 x 128 decodes runs at once, so delay
# scheduling parks and restores (thousands of times) and the pin covers it.
CNN_REVERSED_BURST = WorkloadConfig(name="cnn-reversed-synthetic", rate=40.0, num_requests=600, seed=3)

# All at once into the KV pool: memory runs out, the greedy controller's KV-pressure rule fires and
# the scheduler retracts (and recomputes) requests, so the pin covers retraction too.
CNN_REVERSED_ALL_AT_ONCE = WorkloadConfig(name="cnn-reversed-synthetic", rate=None, num_requests=700, seed=5)

# Three times what PP=4 sustains, for 300 requests: many wait past the TTFT SLO, so the
# late-last queue order moves them behind the others and brings them back after 10 x the SLO.
AZURE_BURST = WorkloadConfig(rate=12.0, num_requests=300, seed=1)

CASES = {
    "pp4_azure_conv": (AZURE, DeploymentConfig(pp=4, tp=1, policy="static:512")),
    "tp4_azure_conv": (AZURE, DeploymentConfig(pp=1, tp=4, policy="static:2048")),
    "pp4_azure_conv_greedy": (AZURE, DeploymentConfig(pp=4, tp=1, policy="greedy")),
    "pp4_azure_conv_greedy_p90": (AZURE, DeploymentConfig(pp=4, tp=1, policy="greedy:p90")),
    "pp4_azure_conv_predictive": (AZURE, DeploymentConfig(pp=4, tp=1, policy="predictive")),
    "pp4_azure_conv_upstream": (AZURE, DeploymentConfig(pp=4, tp=1, policy="upstream:2048")),
    "pp4_azure_conv_slack": (AZURE, DeploymentConfig(pp=4, tp=1, policy="slack")),
    "pp4_azure_burst_late_last": (
        AZURE_BURST,
        DeploymentConfig(pp=4, tp=1, policy="static:384", queue_order="late_last"),
    ),
    # the burst keeps prompts waiting, so greedy:tile lifts a sub-tile C to the tile
    "pp4_azure_burst_greedy_tile": (AZURE_BURST, DeploymentConfig(pp=4, tp=1, policy="greedy:tile")),
    "pp4_cnnr_all_at_once_greedy": (CNN_REVERSED_ALL_AT_ONCE, DeploymentConfig(pp=4, tp=1, policy="greedy")),
    # the same under admission "all" (the default before "slot"): its digest is that case's old one
    "pp4_cnnr_all_at_once_greedy_admission_all": (
        CNN_REVERSED_ALL_AT_ONCE,
        DeploymentConfig(pp=4, tp=1, policy="greedy", admission_reserve="all"),
    ),
    "pp4_14b_cnnr_predictive_ds": (
        CNN_REVERSED_BURST,
        DeploymentConfig(model="Qwen2.5-14B", pp=4, tp=1, policy="predictive+ds"),
    ),
}


def _close(a, b) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


def _rounded(value):
    """Floats to 9 significant digits: a digest that survives summation-order noise, not drift."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def records_digest(records) -> str:
    """SHA-256 of every request's record (times, token gaps, retractions, parks, finish)."""
    rows = [{k: _rounded(v) for k, v in r.to_dict().items()} for r in records]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(CASES))
def test_seeded_run_matches_golden(name):
    workload, deployment = CASES[name]
    run = run_simulation(workload, deployment, record_iterations=False)
    got = {k: run.summary[k] for k in KEYS}
    got["num_parked"] = sum(r.num_parked for r in run.result.records)
    got["records_sha256"] = records_digest(run.result.records)
    path = GOLDEN / f"{name}.json"
    if os.environ.get("FASTPP_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=2) + "\n")
    assert path.exists(), f"missing {path}; create it with FASTPP_UPDATE_GOLDEN=1"
    want = json.loads(path.read_text())
    drift = {k: (want.get(k), got[k]) for k in got if not _close(want.get(k), got[k])}
    assert not drift, f"run drifted from {path.name}: {drift}"


def test_delay_scheduling_golden_exercises_parking():
    """The DS pin is only worth its run time if DS actually acts in it."""
    want = json.loads((GOLDEN / "pp4_14b_cnnr_predictive_ds.json").read_text())
    assert want["num_parked"] > 1000


def test_retraction_golden_exercises_retraction():
    want = json.loads((GOLDEN / "pp4_cnnr_all_at_once_greedy.json").read_text())
    assert want["num_retractions"] > 10


def test_tile_floor_golden_exercises_the_lift():
    """The greedy:tile pin is only worth its run time if the floor lifts C in it."""
    workload, deployment = CASES["pp4_azure_burst_greedy_tile"]
    run = run_simulation(workload, deployment, record_iterations=True)
    assert any(it.reason == "tile-floor" for it in run.result.iterations)


def test_same_seed_gives_identical_records():
    workload, deployment = CASES["pp4_azure_conv"]
    a = run_simulation(workload, deployment, record_iterations=False)
    b = run_simulation(workload, deployment, record_iterations=False)
    assert [r.to_dict() for r in a.result.records] == [r.to_dict() for r in b.result.records]

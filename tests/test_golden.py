"""Golden run: a seeded simulation's summary must not drift silently. After a deliberate change
to the model, regenerate with ``FASTPP_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py``
and say why in the commit."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation

GOLDEN = Path(__file__).parent / "golden"
KEYS = ("completed", "mean_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p90_tpot_ms",
        "p99_itl_ms", "mean_e2e_latency_ms", "num_microbatches", "num_retractions",
        "slo_attainment", "bubble_fraction", "sim_end_s")

CASES = {
    "pp4_azure_conv": (WorkloadConfig(rate=3.0, num_requests=150, seed=7),
                       DeploymentConfig(pp=4, tp=1, policy="static:512")),
    "tp4_azure_conv": (WorkloadConfig(rate=3.0, num_requests=150, seed=7),
                       DeploymentConfig(pp=1, tp=4, policy="static:2048")),
}


def _close(a, b) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


@pytest.mark.parametrize("name", sorted(CASES))
def test_seeded_run_matches_golden(name):
    workload, deployment = CASES[name]
    summary = run_simulation(workload, deployment, record_iterations=False).summary
    got = {k: summary[k] for k in KEYS}
    path = GOLDEN / f"{name}.json"
    if os.environ.get("FASTPP_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=2) + "\n")
    assert path.exists(), f"missing {path}; create it with FASTPP_UPDATE_GOLDEN=1"
    want = json.loads(path.read_text())
    drift = {k: (want[k], got[k]) for k in KEYS if not _close(want[k], got[k])}
    assert not drift, f"summary drifted from {path.name}: {drift}"


def test_same_seed_gives_identical_records():
    workload, deployment = CASES["pp4_azure_conv"]
    a = run_simulation(workload, deployment, record_iterations=False)
    b = run_simulation(workload, deployment, record_iterations=False)
    assert [r.to_dict() for r in a.result.records] == [r.to_dict() for r in b.result.records]

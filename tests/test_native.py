"""The compiled build (fastpp/_native.py, scripts/build_native.py) gives exactly the results of
the Python source: seeded simulations byte for byte (records and every stage record, as JSON)
and a goodput search's whole report; and its value types (plans, requests, records) survive
pickle, as the sweep's worker processes need."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Run in a child process, with the build on or off: prints the build status, then one JSON line
# per result (golden cases of tests/test_golden.py: PP and TP, static, greedy, predictive+DS).
SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import fastpp._native as native
from test_golden import CASES
from fastpp.sim.goodput import slo_goodput
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation

print(native.status())
for name in ("pp4_azure_conv", "tp4_azure_conv", "pp4_cnnr_all_at_once_greedy",
             "pp4_14b_cnnr_predictive_ds"):
    workload, deployment = CASES[name]
    result = run_simulation(workload, deployment).result
    print(json.dumps({"case": name, "records": [r.to_dict() for r in result.records],
                      "stages": [it.to_dict() for it in result.iterations],
                      "end_at": result.end_at}, sort_keys=True))
found = slo_goodput(WorkloadConfig(name="azure-conv"), DeploymentConfig(pp=4, policy="predictive"),
                    precision=1.0)
print(json.dumps(found.to_dict(), sort_keys=True))
# the value types cross processes (sweep workers, engine plugins): each survives pickle
import pickle
from fastpp.plan import (BalancePlan, MicroBatchPlan, PrefillChunk, RequestEnd, SchedulerStats,
                         StepOutput)
from fastpp.types import SLO, FinishReason, IterationRecord, Request, RequestRecord
from fastpp.live_request import LiveRequest
from fastpp.policies.predictive import Decision
record = RequestRecord(3, 0.5, 10, 4, num_generated=2, first_token_at=0.75, token_times=[0.75])
values = [SLO(0.5, 0.05), Request(3, 0.5, 10, 4), record, PrefillChunk(3, 0, 8, True),
          IterationRecord(7, 2, 1, 0.5, 0.75, 9, 8, 1, 128, 64, 9, 64, "why", 3),
          LiveRequest(record, 4, 10, ctx_len=11, slot=2), Decision(64, "r", 1.0, 2.0, 0.5),
          MicroBatchPlan(7, 1, 0.5, 64, (1, 2), (9, 10), (PrefillChunk(3, 0, 8, True),), 10, 8,
                         3, 0, 64, 19, "why", (4,), ((3, 16),), (4,)),
          RequestEnd(3, FinishReason.LENGTH, "", record), StepOutput((), frozenset({5})),
          SchedulerStats(1, 2, 0, 1, 64, 1024, 3, 1, 7, 0, 0), BalancePlan((1,), (2,), "even")]
print(json.dumps([repr(pickle.loads(pickle.dumps(v))) == repr(v) for v in values]))
"""


def _run(env: dict[str, str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO / "tests")], env=env,
                          capture_output=True, text=True, cwd=REPO, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def _status(env: dict[str, str]) -> str:
    code = "import fastpp, fastpp._native as n; print(n.status())"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_without_a_build_for_these_sources_fastpp_is_pure_python(tmp_path):
    from fastpp import _native

    env = {k: v for k, v in os.environ.items() if k != "FASTPP_NATIVE"}
    env["FASTPP_NATIVE_DIR"] = str(tmp_path)
    assert _status(env).startswith("off: not built for these sources")
    folder = tmp_path / _native.source_key()  # a folder for these sources, but broken
    folder.mkdir()
    (folder / _native.MANIFEST).write_text('{"files": {"fastpp.scheduler": "missing.so"}}')
    assert _status(env) == f"off: incomplete build in {folder}"
    assert _status({**env, "FASTPP_NATIVE": "0"}) == "off: FASTPP_NATIVE=0"


@pytest.mark.slow
def test_the_compiled_build_gives_the_python_sources_results(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FASTPP_NATIVE"}
    env["FASTPP_NATIVE_DIR"] = str(tmp_path / "native")
    built = subprocess.run([sys.executable, "scripts/build_native.py"], env=env, cwd=REPO,
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    assert "on:" in built.stdout
    compiled = _run(env)
    python = _run({**env, "FASTPP_NATIVE": "0"})
    assert compiled[0].startswith("on: ") and python[0] == "off: FASTPP_NATIVE=0"
    assert len(compiled) == len(python) == 7
    for got, want in zip(compiled[1:], python[1:], strict=True):
        assert got == want, got[:200]
    assert "false" not in compiled[-1]  # every value type pickles in the compiled build

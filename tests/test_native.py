"""The compiled build (fastpp/_native.py, fastpp/native_build.py): off unless ``FASTPP_NATIVE=1``
asks for it; a damaged build falls back to pure Python with one warning line; with it on, the
public classes stay subclassable and their overrides are called; and it gives exactly the
results of the Python source: seeded simulations byte for byte (records and every stage record,
as JSON) and a goodput search's whole report, its value types surviving pickle as the sweep's
worker processes need."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from fastpp import _native, native_build
from fastpp.data_dir import DATA_DIR_ENV, checkout_data_dir

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

# A custom scheduler as a user writes one, run by the simulator (compiled with the build on):
# subclasses of Scheduler, PredictiveChunkPolicy and Request, whose overrides the compiled
# callers must call. Prints the build status, then the calls counted and the records, as JSON.
SUBCLASSES = r"""
import json
from dataclasses import dataclass
import fastpp._native as native
from fastpp import (IterationLog, MicroBatchPlan, PredictiveChunkPolicy, Request, RequestRecord,
                    Scheduler, SLO, make_policies)
from fastpp.sim.engine import PipelineSimulation
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, build_scheduler

calls = {"schedule": 0, "choose": 0, "observe": 0}

class CountingScheduler(Scheduler):
    def schedule(self, slot):
        calls["schedule"] += 1
        return super().schedule(slot)

class CountingPolicy(PredictiveChunkPolicy):
    def choose(self, view):
        calls["choose"] += 1
        return super().choose(view)

    def observe(self, rec):
        calls["observe"] += 1
        super().observe(rec)

@dataclass(frozen=True)
class TaggedRequest(Request):
    tenant: str = "a"

class MyRecord(RequestRecord):
    pass

class MyPlan(MicroBatchPlan):
    pass

class MyLog(IterationLog):
    pass

class MySLO(SLO):
    pass

deployment = DeploymentConfig(pp=4, policy="predictive")
profile = deployment.load_profile()
base = build_scheduler(profile, deployment)
reqs = WorkloadConfig(num_requests=40, rate=8.0).requests()
out = {}
for name, sched_cls, policy_cls, req_cls in (
        ("plain", Scheduler, PredictiveChunkPolicy, Request),
        ("custom", CountingScheduler, CountingPolicy, TaggedRequest)):
    _, balancer = make_policies("static:512", base.config, profile)
    sched = sched_cls(base.config, lambda: 0.0, policy_cls.from_profile(profile), balancer)
    mine = [req_cls(r.req_id, r.arrived_at, r.prompt_len, r.output_len) for r in reqs]
    result = PipelineSimulation(profile, sched, mine).run()
    out[name] = [r.to_dict() for r in result.records]
print(native.status())
print(json.dumps(calls))
print(json.dumps(out["plain"] == out["custom"]))
import fastpp.scheduler
print(json.dumps([fastpp.scheduler.__doc__.startswith("Engine-neutral pipeline-parallel"),
                  Scheduler.__doc__.startswith("Owns every request")]))
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != _native.SWITCH}
    env.update(extra)
    return env


def _python(code: str, env: dict[str, str], *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, cwd=cwd, timeout=1800
    )


STATUS = "import fastpp, fastpp._native as n; print(n.status())"


def _fake_build(root: Path) -> Path:
    """A build folder for these sources whose manifest records every file's size and hash
    (its files are not extension modules: only loaded if a test got the opt-in wrong)."""
    folder = root / _native.source_key()
    files = {}
    for module in _native.MODULES:
        rel = module.replace(".", "/") + ".so"
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(b"\x7fELF not really" * 100)
        files[module] = _native.file_entry(folder, rel)
    (folder / _native.MANIFEST).write_text(json.dumps({"files": files}))
    return folder


def _installed_copy(into: Path) -> Path:
    """fastpp laid out as a wheel installs it: each folder of the source tree at its package's
    place (sim/ as fastpp/sim, cli/ as fastpp/cli, ...), no scripts/, no pyproject.toml."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "fastpp", into / "fastpp", ignore=ignore)
    for folder in ("sim", "backends", "cli", "profiles"):
        shutil.copytree(REPO / folder, into / "fastpp" / folder, ignore=ignore)
    return into


def test_the_build_is_off_unless_asked_for_even_with_one_in_the_cache(tmp_path):
    _fake_build(tmp_path)
    for env in (
        _env(FASTPP_NATIVE_DIR=str(tmp_path)),
        _env(FASTPP_NATIVE_DIR=str(tmp_path), FASTPP_NATIVE="0"),
    ):
        done = _python(STATUS, env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().startswith(
            "off: not requested (FASTPP_NATIVE=1 uses a build made by python -m fastpp.native_build)"
        )
        assert done.stderr == ""


def test_asked_for_without_a_build_warns_once_and_runs_python(tmp_path):
    done = _python(STATUS, _env(FASTPP_NATIVE_DIR=str(tmp_path), FASTPP_NATIVE="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith("off: no build for these sources")
    assert done.stderr.splitlines() == [
        f"fastpp: FASTPP_NATIVE=1 but no build for these sources in {tmp_path} (run python -m "
        "fastpp.native_build); running pure Python"
    ]
    bad = _python(STATUS, _env(FASTPP_NATIVE_DIR=str(tmp_path), FASTPP_NATIVE="yes"))
    assert bad.returncode == 0 and bad.stdout.strip() == "off: FASTPP_NATIVE='yes' is neither 0 nor 1"
    assert len(bad.stderr.splitlines()) == 1


@pytest.mark.parametrize("damage", ["truncate", "overwrite", "delete", "manifest"])
def test_a_damaged_build_falls_back_to_python_with_one_warning(tmp_path, damage):
    folder = _fake_build(tmp_path)
    victim = folder / "fastpp" / "scheduler.so"
    if damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:100])
    elif damage == "overwrite":  # same size, other bytes
        victim.write_bytes(victim.read_bytes()[::-1])
    elif damage == "delete":
        victim.unlink()
    else:
        (folder / _native.MANIFEST).write_text('{"files": {"fastpp.scheduler": "scheduler.so"}}')
    code = STATUS + "; import fastpp.sim.run, fastpp.scheduler as s; print(s.__file__)"
    done = _python(code, _env(FASTPP_NATIVE_DIR=str(tmp_path), FASTPP_NATIVE="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    status, module_file = done.stdout.splitlines()
    assert status.startswith(f"off: the build in {folder} is damaged")
    assert module_file.endswith("scheduler.py")  # the Python source runs
    [line] = done.stderr.splitlines()
    assert line.startswith("fastpp: FASTPP_NATIVE=1 but the build in") and "damaged" in line
    assert line.endswith("running pure Python")


def test_a_build_of_another_checkout_is_not_this_ones(tmp_path):
    """The build folder's name hashes the package's location too: a copy of fastpp elsewhere
    (another checkout, another installation) never finds this checkout's build."""
    copy = _installed_copy(tmp_path / "elsewhere")
    code = "import fastpp._native as n; print(n.source_key())"
    theirs = _python(code, _env(PYTHONPATH=str(copy)), cwd=tmp_path)
    assert theirs.returncode == 0, theirs.stderr[-2000:]
    ours = _python(code, _env(), cwd=tmp_path)
    assert theirs.returncode == ours.returncode == 0, theirs.stderr[-2000:] + ours.stderr[-2000:]
    assert theirs.stdout.strip() != ours.stdout.strip() == _native.source_key()


def test_the_builder_is_part_of_the_package():
    done = subprocess.run(
        [sys.executable, "-m", "fastpp.native_build", "--help"],
        env=_env(),
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "python -m fastpp.native_build" in done.stdout and "FASTPP_NATIVE=1" in done.stdout


@dataclass(frozen=True)
class InstalledBuild:
    """A copy of fastpp laid out as a wheel installs it, and the one real build of the suite,
    made by that copy's own builder (mypyc: about 25 s on two idle cores, several minutes on
    slow or busy ones, so it is made once; the checkout's layout is staged by
    test_the_checkout_stages_every_compiled_module)."""

    site: Path  # on PYTHONPATH, the copy is the fastpp that runs (from any folder but the checkout)
    native: Path  # FASTPP_NATIVE_DIR of the build

    def env(self, **extra: str) -> dict[str, str]:
        # an installed package has no checkout beside it: the data directory is named
        return _env(PYTHONPATH=str(self.site), FASTPP_NATIVE_DIR=str(self.native), **DATA, **extra)


DATA = {DATA_DIR_ENV: str(checkout_data_dir())}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> InstalledBuild:
    root = tmp_path_factory.mktemp("native")
    build = InstalledBuild(_installed_copy(root / "site"), root / "cache")
    done = subprocess.run(
        [sys.executable, "-m", "fastpp.native_build"],
        env=build.env(),
        cwd=root,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "on:" in done.stdout
    return build


@pytest.mark.slow
def test_the_compiled_build_gives_the_python_sources_results(built):
    def run(env: dict[str, str]) -> list[str]:
        done = _python(SCRIPT, env, str(REPO / "tests"), cwd=built.site)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.splitlines()

    compiled = run(built.env(FASTPP_NATIVE="1"))
    python = run(built.env())
    assert compiled[0].startswith("on: ") and python[0].startswith("off: not requested")
    assert len(compiled) == len(python) == 7
    for got, want in zip(compiled[1:], python[1:], strict=True):
        assert got == want, got[:200]
    assert "false" not in compiled[-1]  # every value type pickles in the compiled build


@pytest.mark.slow
def test_public_classes_stay_subclassable_with_the_build_on(built):
    done = _python(SUBCLASSES, built.env(FASTPP_NATIVE="1"), cwd=built.site)
    assert done.returncode == 0, done.stderr[-3000:]
    status, calls, same, docs = done.stdout.splitlines()
    assert status.startswith("on: ")
    counted = json.loads(calls)
    assert all(n > 0 for n in counted.values()), counted  # compiled callers call the overrides
    assert json.loads(same) is True  # and the subclasses change nothing else
    assert json.loads(docs) == [True, True]  # module and class docstrings restored


@pytest.mark.slow
def test_an_installed_package_builds_its_own(built, tmp_path):
    code = STATUS + "; import fastpp.scheduler as s; print(s.__file__)"
    used = _python(code, built.env(FASTPP_NATIVE="1"), cwd=tmp_path)
    assert used.returncode == 0, used.stderr[-2000:]
    status, module_file = used.stdout.splitlines()
    assert status.startswith("on: ") and module_file.startswith(str(built.native))
    mine = _python(STATUS, _env(FASTPP_NATIVE_DIR=str(built.native), FASTPP_NATIVE="1"))
    assert mine.stdout.startswith("off: no build")  # the checkout never uses the copy's build


def test_the_checkout_stages_every_compiled_module(tmp_path):
    """What the builder compiles from a checkout, where fastpp.sim lives in sim/: every module
    of the build, byte for byte its source, under the key a build of the checkout is found by."""
    staged = native_build.stage(tmp_path)
    names = [f.relative_to(tmp_path).with_suffix("").as_posix().replace("/", ".") for f in staged]
    assert names == list(_native.MODULES)
    for module, file in zip(_native.MODULES, staged, strict=True):
        assert file.read_bytes() == _native.source_path(module).read_bytes(), module
    assert _native.source_key(tmp_path) == _native.source_key()


@pytest.mark.slow
def test_a_truncated_compiled_module_falls_back_instead_of_crashing(built, tmp_path):
    damaged = tmp_path / "native"
    shutil.copytree(built.native, damaged)
    [so] = damaged.glob("*/fastpp/scheduler.*")
    so.write_bytes(so.read_bytes()[: so.stat().st_size // 3])
    done = subprocess.run(
        [sys.executable, "-m", "fastpp", "simulate", "-n", "5", "-d", "pp4", "-o", str(tmp_path / "run")],
        env={**built.env(FASTPP_NATIVE="1"), "FASTPP_NATIVE_DIR": str(damaged)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]  # not SIGBUS (-7, exit 135)
    warnings = [line for line in done.stderr.splitlines() if "FASTPP_NATIVE" in line]
    assert len(warnings) == 1 and "damaged" in warnings[0], done.stderr[-2000:]

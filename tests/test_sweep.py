"""Sweeps: grid expansion and point ids, validation before any work, identical tables from the
serial, process-pool and Ray executors, resume after an interruption, best-static, and the CLI.

Points are tiny (Qwen2.5-14B on pp2/tp2, CNN/DailyMail lengths, 40 requests per run, coarse
goodput precision) so the whole file runs in well under a minute on two cores.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fastpp.cli.app import app
from fastpp.sim import sweep as sweep_mod
from fastpp.sim.sweep import (
    DEFAULT_STATIC_CHUNKS,
    ProcessExecutor,
    RayExecutor,
    SerialExecutor,
    SweepGrid,
    SweepPoint,
    execute_plans,
    make_executor,
    plan_sweep,
    run_sweep,
)
from fastpp.sim.sweep_grid import grid_from_mapping
from fastpp.sim.sweep_table import RESULTS_CSV, RESULTS_JSONL

TINY = dict(workloads=("cnn-dailymail-synthetic",), models=("Qwen2.5-14B",), num_requests=40)
SIM_GRID = SweepGrid(
    **TINY, deployments=("pp2", "tp2"), chunks=(512, 2048), rates=(1.0, 4.0), seeds=(0, 1)
)  # 16 simulate points
BEST_GRID = SweepGrid(
    **TINY,
    deployments=("pp2",),
    metric="best-static",
    chunks=(128, 512, 2048),
    slo_scales=(0.2,),
    seeds=(0,),
    precision=1.0,
    steady=False,  # the SLO test alone: what picks the best is the same, and 100x faster
)  # tight SLO: small chunks win


class CountingExecutor:
    """Serial, but records the points it was given and can stop (``KeyboardInterrupt``) after
    ``stop_after`` rows, as an interrupted sweep would."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.stop_after = stop_after
        self.seen: list[str] = []

    def run(self, points: Sequence[SweepPoint]) -> Iterator[dict]:
        self.seen += [p.point_id for p in points]
        for i, row in enumerate(SerialExecutor().run(points)):
            if self.stop_after is not None and i == self.stop_after:
                raise KeyboardInterrupt
            yield row


def files(out: Path) -> tuple[bytes, bytes]:
    return (out / RESULTS_JSONL).read_bytes(), (out / RESULTS_CSV).read_bytes()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The simulate grid run serially: the table every other executor must reproduce."""
    out = tmp_path_factory.mktemp("serial")
    run_sweep(SIM_GRID, out, SerialExecutor())
    return out


# grid expansion and point ids


def test_expansion_order_defaults_and_stable_unique_ids():
    points, targets = SIM_GRID.expand()
    assert len(points) == 16 and not targets
    assert [(p.deploy, p.policy, p.rate, p.seeds) for p in points[:5]] == [
        ("pp2", "static:512", 1.0, (0,)),
        ("pp2", "static:512", 1.0, (1,)),
        ("pp2", "static:512", 4.0, (0,)),
        ("pp2", "static:512", 4.0, (1,)),
        ("pp2", "static:2048", 1.0, (0,)),
    ]
    ids = [p.point_id for p in points]
    assert len(set(ids)) == 16 and all(len(i) == 16 for i in ids)
    assert ids == [
        p.point_id
        for p in SweepGrid(
            **TINY, deployments=("pp2", "tp2"), chunks=(512, 2048), rates=(1, 4), seeds=(0, 1)
        ).expand()[0]
    ]  # 1 == 1.0
    assert ids[0] == "420f21b72f7a4c5c"  # golden: a changed hash would orphan every saved table
    row = points[0].axes()
    assert row["chunk"] == 512 and row["slo_ttft_ms"] == 2000.0 and row["seeds"] == "0"
    # a setting that changes the result changes the id
    other = SweepGrid(**{**TINY, "num_requests": 41}, deployments=("pp2",), chunks=(512,), rates=(1.0,))
    assert other.expand()[0][0].point_id not in ids


def test_defaults_pinned_deployment_policy_and_goodput_points():
    (point,), _ = SweepGrid().expand()  # every axis from the library defaults
    assert (point.workload, point.model, point.deploy, point.policy, point.rate, point.seeds) == (
        "azure-conv",
        "Qwen2.5-32B",
        "pp4",
        "static:2048",
        4.0,
        (0,),
    )
    points, _ = SweepGrid(deployments=("pp4@predictive", "tp4"), policies=("static:256",)).expand()
    assert [(p.deploy, p.policy) for p in points] == [("pp4", "predictive"), ("tp4", "static:256")]
    points, _ = SweepGrid(metric="goodput", deployments=("pp4",), chunks=(512,)).expand()
    assert points[0].rate is None and points[0].seeds == (0, 1) and points[0].precision == 0.1
    # the paper's fixed-run protocol is another point: its own id, steady=False in its row
    (lax,), _ = SweepGrid(metric="goodput", deployments=("pp4",), chunks=(512,), steady=False).expand()
    assert not lax.steady and lax.axes()["steady"] is False and points[0].axes()["steady"] is True
    assert lax.point_id != points[0].point_id
    assert grid_from_mapping({"metric": "goodput", "steady": False}).steady is False
    points, targets = SweepGrid(metric="best-static").expand()
    assert [p.policy for p in points] == [f"static:{c}" for c in DEFAULT_STATIC_CHUNKS]
    assert len(DEFAULT_STATIC_CHUNKS) == 16 and targets[0].candidates == tuple(points)


# validation: named, and before any work


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"workloads": ("nope-conv",)}, "'nope-conv'"),
        ({"models": ("GPT-5",)}, "'GPT-5'"),
        ({"gpus": ("B200",)}, "'B200'"),
        ({"policies": ("fastest:1",)}, "'fastest'"),
        ({"policies": ("static:512+magic",)}, "'magic'"),
        ({"deployments": ("pq4",)}, "'pq4'"),
        ({"rates": ()}, "'rates'"),
        ({"chunks": (512, 512)}, "512"),
        ({"metric": "latency"}, "'latency'"),
        ({"metric": "goodput", "rates": (1.0,)}, "rates"),
        ({"metric": "best-static", "policies": ("static:512",)}, "policies"),
        ({"steady": False}, "steady applies to metrics 'goodput' and 'best-static' only"),
        ({"metric": "goodput", "steady": "no"}, "steady must be true or false, got 'no'"),
    ],
)
def test_grid_rejects_bad_values_naming_them(kwargs, named):
    with pytest.raises(ValueError, match=named.replace("+", r"\+")):
        SweepGrid(**kwargs)


@pytest.mark.parametrize(
    ("policy", "deploy", "model", "named"),
    [
        ("static:abc", "pp2", "Qwen2.5-14B", "'abc'"),  # bad argument: needs the policy built
        ("static:512", "tp3", "Qwen2.5-14B", "tp must divide"),  # impossible split
        ("static:512", "pp1", "Qwen2.5-72B", "does not fit"),  # no room for the KV cache
    ],
)
def test_plan_validates_every_point_before_running_any(tmp_path, policy, deploy, model, named):
    def axis(*values: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(values))  # the good value first, then the bad one

    grid = SweepGrid(
        workloads=("cnn-dailymail-synthetic",),
        models=axis("Qwen2.5-14B", model),
        deployments=axis("pp2", deploy),
        policies=axis("static:512", policy),
        rates=(1.0,),
    )
    spy = CountingExecutor()
    with pytest.raises(ValueError, match=named):
        run_sweep(grid, tmp_path / "out", spy)
    assert spy.seen == [] and not (tmp_path / "out").exists()


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r"fastpp\[ray\]"):
        make_executor("ray")
    with pytest.raises(ValueError, match="'threads'"):
        make_executor("threads")


# determinism and resume


def test_process_pool_gives_identical_files(reference, tmp_path):
    result = run_sweep(SIM_GRID, tmp_path, ProcessExecutor(workers=2))
    assert result.num_run == 16 and files(tmp_path) == files(reference)
    rows = [json.loads(line) for line in (tmp_path / RESULTS_JSONL).read_text().splitlines()]
    assert [r["point_id"] for r in rows] == [p.point_id for p in SIM_GRID.expand()[0]]
    assert all(r["completed"] == 40 and "sim_wall_s" not in r for r in rows)


def test_resume_after_interruption_skips_finished_points(reference, tmp_path):
    with pytest.raises(KeyboardInterrupt):
        run_sweep(SIM_GRID, tmp_path, CountingExecutor(stop_after=5))
    finished = [json.loads(line)["point_id"] for line in (tmp_path / RESULTS_JSONL).open()]
    assert len(finished) == 5 and not (tmp_path / RESULTS_CSV).exists()
    with (tmp_path / RESULTS_JSONL).open("a") as fh:  # the row being written when it stopped
        fh.write('{"point_id": "0123456789abcdef", "metric": "simu')

    plan = plan_sweep(SIM_GRID, tmp_path)
    assert plan.num_skipped == 5 and any("ignored the last line" in n for n in plan.notes)
    resumed = CountingExecutor()
    result = run_sweep(SIM_GRID, tmp_path, resumed)
    assert len(resumed.seen) == 11 and not set(resumed.seen) & set(finished)
    assert (result.num_run, result.num_skipped) == (11, 5)
    assert files(tmp_path) == files(reference)
    again = CountingExecutor()  # a finished sweep resumes to nothing and rewrites the same files
    assert run_sweep(SIM_GRID, tmp_path, again).num_run == 0 and again.seen == []
    assert files(tmp_path) == files(reference)


def test_rows_of_other_grids_are_kept_after_this_grids(tmp_path):
    small = SweepGrid(**TINY, deployments=("pp2",), rates=(1.0,))
    first = run_sweep(small, tmp_path, SerialExecutor()).rows
    result = run_sweep(SweepGrid(**TINY, deployments=("tp2",), rates=(1.0,)), tmp_path, SerialExecutor())
    lines = [json.loads(line) for line in (tmp_path / RESULTS_JSONL).read_text().splitlines()]
    assert [r["deploy"] for r in lines] == ["tp2", "pp2"] and lines[1] == first[0]
    assert any("other grids" in n for n in result.notes)


def test_several_grids_in_one_executor_run_share_points_and_write_what_each_would(tmp_path, reference):
    """execute_plans hands every plan's points to one executor run; a point two grids share
    runs once; each folder ends up byte-identical to its own run_sweep."""
    part = SweepGrid(**TINY, deployments=("pp2",), chunks=(512, 2048), rates=(1.0, 4.0), seeds=(0, 1))
    alone = tmp_path / "alone"
    run_sweep(part, alone, SerialExecutor())
    counting = CountingExecutor()
    plans = [plan_sweep(SIM_GRID, tmp_path / "whole"), plan_sweep(part, tmp_path / "part")]
    whole, sub = execute_plans(plans, counting)
    assert sorted(counting.seen) == sorted(p.point_id for p in SIM_GRID.expand()[0])  # 16, not 24
    assert (whole.num_run, sub.num_run) == (16, 8)
    assert files(tmp_path / "whole") == files(reference)
    assert files(tmp_path / "part") == files(alone)
    assert [r["point_id"] for r in sub.rows] == [p.point_id for p in part.expand()[0]]


# best static chunk


def test_best_static_names_the_highest_goodput_chunk(tmp_path):
    result = run_sweep(BEST_GRID, tmp_path, SerialExecutor())
    *cands, best = result.rows
    assert [r["metric"] for r in cands] == ["goodput"] * 3 and best["metric"] == "best-static"
    top = max(cands, key=lambda r: r["goodput"])
    assert sorted(r["goodput"] for r in cands)[-2] < top["goodput"]  # a strict winner
    assert (best["chunk"], best["policy"], best["goodput"]) == (top["chunk"], top["policy"], top["goodput"])
    assert best["num_candidates"] == 3 and result.best_static == [best]
    header = (tmp_path / RESULTS_CSV).read_text().splitlines()[0].split(",")
    assert header[:3] == ["point_id", "metric", "workload"] and "goodput" in header
    # the candidates are plain goodput points: a goodput sweep of the same chunks reuses them
    goodput = SweepGrid(
        **{**TINY},
        deployments=("pp2",),
        metric="goodput",
        chunks=(128, 512, 2048),
        slo_scales=(0.2,),
        seeds=(0,),
        precision=1.0,
        steady=False,
    )
    assert plan_sweep(goodput, tmp_path).todo == []


# Ray


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install 'fastpp[ray]')"
)
def test_ray_executor_gives_identical_files(reference, tmp_path):
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result = run_sweep(SIM_GRID, tmp_path, RayExecutor())
        assert ray.is_initialized()  # a session the caller started is left running
    finally:
        ray.shutdown()
    assert result.num_run == 16 and files(tmp_path) == files(reference)


# CLI


runner = CliRunner()
CLI_TINY = ["-w", "cnn-dailymail-synthetic", "-m", "Qwen2.5-14B", "-n", "40", "--executor", "serial"]


def test_cli_sweep_json_and_resume(tmp_path):
    args = [
        "sweep",
        *CLI_TINY,
        "-d",
        "pp2",
        "-r",
        "1,2",
        "--chunk",
        "512",
        "-p",
        "static:2048",
        "-o",
        str(tmp_path),
        "--json",
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert (out["num_points"], out["num_run"], out["num_skipped"]) == (4, 4, 0)
    assert [(r["policy"], r["rate"]) for r in out["rows"]] == [
        ("static:2048", 1.0),
        ("static:2048", 2.0),
        ("static:512", 1.0),
        ("static:512", 2.0),
    ]
    assert len((tmp_path / RESULTS_CSV).read_text().splitlines()) == 5
    res = runner.invoke(app, args)
    again = json.loads(res.stdout)
    assert (again["num_run"], again["num_skipped"]) == (0, 4) and again["rows"] == out["rows"]
    assert "resuming: 4 of 4 points" in res.stderr


def test_cli_grid_file_best_static_table(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'workload = "cnn-dailymail-synthetic"\nmodel = ["Qwen2.5-14B"]\n'
        'deploy = ["pp2"]\nchunk = [128, 2048]\nslo-scale = 0.2\nseeds = 1\n'
        "num_requests = 40\nprecision = 1.0\nsteady = false\nbest_static = true\n"
    )
    res = runner.invoke(
        app,
        [
            "sweep",
            "--grid",
            str(grid),
            "--chunk",
            "128,512,2048",
            "--executor",
            "serial",
            "-o",
            str(tmp_path / "out"),
        ],
    )
    assert res.exit_code == 0, res.stderr
    assert "best static chunk for cnn-dailymail-synthetic Qwen2.5-14B" in res.stdout
    rows = [json.loads(line) for line in (tmp_path / "out" / RESULTS_JSONL).read_text().splitlines()]
    assert [r["chunk"] for r in rows[:3]] == [128, 512, 2048]  # --chunk replaced the file's list
    assert rows[-1]["metric"] == "best-static"
    assert grid_from_mapping({"best_static": True, "chunk": 256}).chunks == (256,)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--gpu", "B200"], "'B200'"),
        (["--rate", ""], "'rates' is empty"),
        (["--rate", "fast"], "'fast'"),
        (["-w", "azure-conv,nope"], "'nope'"),
        (["--metric", "goodput", "-r", "2"], "rates"),
        (["--best-static", "--metric", "simulate"], "best_static"),
        (["--no-steady"], "steady applies"),
    ],
)
def test_cli_errors_name_the_bad_value_and_run_nothing(tmp_path, args, named):
    res = runner.invoke(app, ["sweep", *args, "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and named in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()


def test_cli_unknown_grid_key(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text("rates = [1, 2]\n")
    res = runner.invoke(app, ["sweep", "--grid", str(grid), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and "unknown grid key(s) rates" in res.stderr


def test_module_exports():
    assert {"SweepGrid", "run_sweep", "plan_sweep", "execute_plan"} <= set(sweep_mod.__all__)


def test_cli_sweeps_get_their_own_folder_and_an_out_of_another_grid_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = ["sweep", *CLI_TINY, "-d", "pp2", "-p", "static:512", "--json"]
    for rate in ("1", "2"):  # without -o: a new folder each
        assert runner.invoke(app, [*base, "-r", rate]).exit_code == 0
    folders = sorted((tmp_path / "runs" / "sweep").iterdir())
    assert len(folders) == 2 and all((f / RESULTS_CSV).is_file() for f in folders)
    out = tmp_path / "out"
    assert runner.invoke(app, [*base, "-r", "1", "-o", str(out)]).exit_code == 0
    res = runner.invoke(app, [*base, "-r", "1,2", "-o", str(out)])  # a superset resumes
    assert res.exit_code == 0 and json.loads(res.stdout)["num_skipped"] == 1
    res = runner.invoke(app, [*base, "-r", "4", "-o", str(out)])  # another grid: refused, kept
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and f"--out {out} holds 2 rows of another sweep grid" in text
    assert "--overwrite" in text and len((out / RESULTS_CSV).read_text().splitlines()) == 3
    res = runner.invoke(app, [*base, "-r", "4", "-o", str(out), "--overwrite"])
    assert res.exit_code == 0, res.output
    assert [r["rate"] for r in json.loads(res.stdout)["rows"]] == [4.0]
    assert len((out / RESULTS_CSV).read_text().splitlines()) == 2


PROFILE = "a100-40gb-pcie_qwen2.5-32b_pp4"  # a shipped profile: Qwen2.5-32B, pp4
PROFILE_SWEEP = ["sweep", "--profile", PROFILE, "-n", "20", "-r", "1", "--executor", "serial"]


def test_cli_sweep_profile_with_a_conflicting_model_is_an_error_naming_both(tmp_path):
    profile, args = PROFILE, PROFILE_SWEEP
    res = runner.invoke(app, [*args, "-m", "Qwen2.5-72B", "-o", str(tmp_path / "a")])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and f"--profile {profile} is Qwen2.5-32B on A100-40GB-PCIe" in text
    assert "-m/--model Qwen2.5-72B (the profile's is Qwen2.5-32B)" in text
    res = runner.invoke(app, [*args, "-m", "Qwen2.5-32B", "-o", str(tmp_path / "b"), "--json"])
    assert res.exit_code == 0, res.output  # the profile's own model is no conflict
    assert {r["model"] for r in json.loads(res.stdout)["rows"]} == {"Qwen2.5-32B"}


def test_cli_sweep_profile_refuses_a_deployment_of_another_shape(tmp_path):
    profile, args = PROFILE, PROFILE_SWEEP
    res = runner.invoke(app, [*args, "-d", "tp4", "-o", str(tmp_path / "a")])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and f"deployment 'tp4': the profile {profile} is for pp4tp1" in text
    assert not (tmp_path / "a").exists()  # refused before any folder is made
    res = runner.invoke(app, [*args, "-d", "pp4@greedy", "-o", str(tmp_path / "b"), "--json"])
    assert res.exit_code == 0, res.output  # the profile's own shape, with a policy, is no conflict
    assert [(r["deploy"], r["policy"]) for r in json.loads(res.stdout)["rows"]] == [("pp4", "greedy")]


def test_cli_sweep_takes_the_uniform_random_workload_and_names_a_bad_one(tmp_path):
    args = ["sweep", "-n", "20", "-r", "1", "--executor", "serial", "--json"]
    res = runner.invoke(app, [*args, "-w", "random:64:8", "-o", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert [r["workload"] for r in json.loads(res.stdout)["rows"]] == ["random:64:8"]
    res = runner.invoke(app, [*args, "-w", "random:64", "-o", str(tmp_path / "b")])
    assert res.exit_code == 2 and "expected random:IN:OUT" in " ".join(res.output.split())
    res = runner.invoke(app, [*args, "-w", "nope", "-o", str(tmp_path / "c")])
    assert res.exit_code == 2 and "or random:IN:OUT[:RATIO]" in " ".join(res.output.split())

"""DeploymentConfig.async_batch_depth (--pp-async-batch-depth, SGLang's flag of that name):
pp + depth microbatch slots, so a slot's next microbatch can wait at stage 0 while its tokens
come back."""

from __future__ import annotations

import pytest

from fastpp.sim.run import DeploymentConfig, WorkloadConfig, build_scheduler, run_simulation
from fastpp.sim.sweep_grid import SweepGrid, grid_from_mapping

WORKLOAD = WorkloadConfig(name="azure-conv", rate=6.0, num_requests=120, seed=2)


def test_a_deeper_pipeline_runs_pp_plus_depth_slots_and_ends_every_request():
    deep = DeploymentConfig(model="Qwen2.5-14B", pp=4, policy="predictive", async_batch_depth=1)
    assert build_scheduler(deep.load_profile(), deep).config.num_slots == 5
    run = run_simulation(WORKLOAD, deep)
    assert run.summary["completed"] == WORKLOAD.num_requests
    assert run.summary["async_batch_depth"] == 1
    iterations = run.result.iterations
    assert {it.slot for it in iterations} == set(range(5))
    # five microbatches in flight at once: one more than the stages
    stage0 = sorted((it for it in iterations if it.stage == 0), key=lambda it: it.started_at)
    last = {it.mb_id: it.finished_at for it in iterations if it.stage == 3}
    in_flight = max(sum(1 for o in stage0 if o.started_at <= it.started_at < last[o.mb_id]) for it in stage0)
    assert in_flight == 5


def test_depth_zero_is_the_pipeline_as_before():
    plain = DeploymentConfig(model="Qwen2.5-14B", pp=4, policy="static:512")
    zero = DeploymentConfig(model="Qwen2.5-14B", pp=4, policy="static:512", async_batch_depth=0)
    a, b = run_simulation(WORKLOAD, plain), run_simulation(WORKLOAD, zero)
    assert a.summary["p90_ttft_ms"] == b.summary["p90_ttft_ms"]
    assert build_scheduler(plain.load_profile(), plain).config.num_slots == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"async_batch_depth": -1}, r"--pp-async-batch-depth\) must be an integer in \[0, 8\]"),
        ({"async_batch_depth": 9}, r"must be an integer in \[0, 8\], got 9"),
        ({"async_batch_depth": 1, "host_loop": "batch-queue"}, "one batch per stage"),
    ],
)
def test_bad_depths_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DeploymentConfig(**kwargs)


def test_a_single_stage_refuses_a_depth():
    tp = DeploymentConfig(pp=1, tp=4, async_batch_depth=1)
    with pytest.raises(ValueError, match="needs pp > 1"):
        build_scheduler(tp.load_profile(), tp)


def test_a_sweep_point_carries_the_depth_and_keeps_old_ids_at_zero():
    plain = SweepGrid(metric="simulate", rates=(1.0,)).expand()[0][0]
    zero = SweepGrid(metric="simulate", rates=(1.0,), async_batch_depth=0).expand()[0][0]
    deep = grid_from_mapping({"pp_async_batch_depth": 1, "rate": [1.0]}).expand()[0][0]
    assert plain.point_id == zero.point_id != deep.point_id
    assert deep.deployment_config().async_batch_depth == 1
    assert deep.axes()["async_batch_depth"] == 1 and "async_batch_depth" not in plain.axes()
    with pytest.raises(ValueError, match="--pp-async-batch-depth"):
        SweepGrid(metric="simulate", async_batch_depth=-2)


def test_the_cli_runs_a_depth_and_names_a_bad_one(tmp_path):
    import json

    from typer.testing import CliRunner

    from fastpp.cli.app import app

    bad = CliRunner().invoke(app, ["simulate", "-n", "5", "-d", "tp4", "--pp-async-batch-depth", "1"])
    assert bad.exit_code != 0 and "needs pp > 1" in bad.output
    args = ["simulate", "-n", "20", "-d", "pp4@static:512", "--pp-async-batch-depth", "1"]
    ok = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "run")])
    assert ok.exit_code == 0, ok.output
    summary = json.loads((tmp_path / "run" / "pp4-static-512" / "summary.json").read_text())
    assert summary["async_batch_depth"] == 1

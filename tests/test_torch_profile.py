"""`fastpp profile --backend torch`: the CPU engine measured into a profile the simulator runs on."""

from __future__ import annotations

import json
import multiprocessing

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from fastpp.backends.torch.profile_config import ProfileGrid, TorchProfileConfig  # noqa: E402
from fastpp.backends.torch.profile_link import fit_link  # noqa: E402
from fastpp.backends.torch.profile_measure import Shape, grid_shapes, measure_host_overhead  # noqa: E402
from fastpp.backends.torch.profiler import profile_torch, write_torch_profile  # noqa: E402
from fastpp.cli.app import app  # noqa: E402
from fastpp.predictor import ALPPredictor  # noqa: E402
from fastpp.profile import load_profile  # noqa: E402
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation  # noqa: E402
from fastpp.stage_fit import fit_stage, nnls  # noqa: E402
from fastpp.types import Request  # noqa: E402

# A grid for the 2-layer "tiny" config: every kind of shape, few points, short timing loops.
TINY_GRID = ProfileGrid(
    tokens=(1, 16, 64, 128),
    split_tokens=(128,),
    past=(128,),
    chunks=(16, 64),
    decode_batches=(1, 16),
    decode_ctx=(32, 128),
    sampled=(1, 16),
    link_tokens=(1, 64),
    num_holdout=3,
    repeats=2,
    min_time_s=0.005,
)
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def tiny_result():
    """One measured profile of tiny on 2 stages, link included (two gloo subprocesses)."""
    config = TorchProfileConfig(model="tiny", pp=2, grid=TINY_GRID)
    return profile_torch(config, created_at="2025-01-01T00:00:00+00:00")


# ---------------------------------------------------------------------------- end to end
def test_tiny_profile_loads_and_matches_the_engine_split(tiny_result, tmp_path):
    path = write_torch_profile(tiny_result, tmp_path / "cpu_tiny_pp2.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu_tiny_pp2.json"]  # one artifact
    prof = load_profile(path)
    assert prof.to_dict() == tiny_result.profile.to_dict()
    assert (prof.kind, prof.gpu, prof.pp, prof.tp, prof.model.name) == ("measured", "CPU", 2, 1, "tiny")
    assert [s.num_layers for s in prof.stages] == [1, 1]
    assert prof.stages[0].lm_head is None and prof.stages[1].lm_head is not None
    assert prof.stages[1].lm_head.tokens == (1, 16)  # sampled points, decode batch sizes included
    assert prof.activation_bytes_per_token == 64 * 4 and prof.page_size == 16
    for stage in prof.stages:
        assert stage.linear.tokens == TINY_GRID.tokens
        assert all(s > 0 for s in stage.linear.seconds)
        assert list(stage.linear.seconds) == sorted(stage.linear.seconds)  # fitted non-decreasing
        assert min(stage.attn_past_x_pre_s, stage.attn_pre_sq_s, stage.attn_dec_ctx_s) >= 0
    # the link was measured: one point per message size, and a positive latency and bandwidth
    assert len(json.loads(prof.provenance["link_one_way_points_bytes_s"])) == len(TINY_GRID.link_tokens)
    assert prof.link.latency_s >= 0 and prof.link.bandwidth_bytes_per_s > 0
    assert 0 < prof.host_overhead_s < 0.05
    assert prof.provenance["created_at"] == "2025-01-01T00:00:00+00:00"
    assert prof.provenance["concurrent_load"].startswith("none")  # stages timed alone by default


def test_tiny_predictor_is_fitted_and_its_error_reported(tiny_result, tmp_path):
    path = write_torch_profile(tiny_result, tmp_path / "p.json")
    from_profile = ALPPredictor.from_profile(load_profile(path))  # what the predictive policy uses
    X = np.array([[1, 0, 0, 32], [64, 128 * 64, 64 * 64, 0], [80, 0, 64 * 64, 16 * 128]])
    assert np.all(from_profile.predict(X) > 0) and np.all(tiny_result.predictor.predict(X) > 0)
    # the errors are measured numbers, written into the profile and the summary
    r = tiny_result
    assert np.isfinite(r.predictor_mape) and r.predictor_mape >= 0
    assert r.holdout_profile_mape is not None and np.isfinite(r.holdout_profile_mape)
    assert float(r.profile.provenance["predictor_fit_mape"]) == pytest.approx(r.predictor_mape, abs=1e-4)
    assert all(np.isfinite(f.mape) for f in r.stage_fits)
    text = "\n".join(r.summary_lines())
    assert "ALPPredictor MAPE" in text and "held-out beats" in text


def test_simulator_runs_on_the_measured_profile(tiny_result, tmp_path):
    path = write_torch_profile(tiny_result, tmp_path / "p.json")
    requests = [Request(i, 0.05 * i, 40 + 7 * i, 8) for i in range(24)]
    run = run_simulation(
        WorkloadConfig(rate=20.0, num_requests=24),
        DeploymentConfig(profile_path=str(path), policy="static:64"),
        requests=requests,
    )
    assert run.summary["completed"] == 24 and run.profile.pp == 2
    # stage 0's simulated iterations cost exactly what the measured profile says
    first = [rec for rec in run.result.iterations if rec.stage == 0]
    assert len(first) == len(run.result.iterations) // 2 > 0
    stage0 = run.profile.stages[0]
    for rec in first:
        want = stage0.time_s(rec.num_tokens, 0, rec.sum_past_x_pre, rec.sum_pre_sq, rec.sum_dec_ctx)
        assert rec.duration_s == pytest.approx(want, rel=1e-9)


# ---------------------------------------------------------------------------- CLI
def test_cli_profiles_tiny_and_simulate_reads_it(tmp_path):
    path = tmp_path / "tiny.json"
    res = invoke(
        "profile",
        "--backend",
        "torch",
        "-m",
        "tiny",
        "--pp",
        "2",
        "--quick",
        "--max-tokens",
        "64",
        "--repeats",
        "1",
        "--no-link",
        "-o",
        str(path),
    )
    assert res.exit_code == 0, res.output
    assert "ALPPredictor MAPE" in res.output and "stage 1 (1 layers)" in res.output
    assert not (tmp_path / "tiny.predictor.json").exists()
    prof = load_profile(path)
    assert prof.pp == 2 and "assumed" in prof.provenance["link_one_way_points_bytes_s"]
    res = invoke(
        "simulate",
        "--profile",
        str(path),
        "-w",
        "sharegpt-synthetic",
        "-n",
        "12",
        "-r",
        "2",
        "--policy",
        "static:64",
        "--json",
        "-o",
        str(tmp_path / "sim"),
    )
    assert res.exit_code == 0, res.output
    (summary,) = json.loads(res.output)
    assert summary["pp"] == 2 and summary["model"] == "tiny" and summary["gpu"] == "CPU"
    assert summary["deployment"] == "pp2"  # named after the profile's split, not the default pp4
    assert summary["completed"] + summary.get("rejected", 0) >= 1


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("-m", "llama-9000"), "llama-9000"),  # unknown model: the error lists the known ones
        (("-m", "tiny", "--pp", "3"), "pp must be in 1..2"),
        (("-m", "tiny", "-d", "pp2tp2"), "pp2tp2"),
        (("-m", "tiny", "--gpu", "H100-SXM"), "--gpu"),
        (("-m", "tiny", "--max-tokens", "0"), "max_tokens"),
    ],
)
def test_cli_bad_torch_input_is_named(args, named):
    res = invoke("profile", "--backend", "torch", *args)
    assert res.exit_code == 2
    assert named in res.output
    if "llama-9000" in args:
        assert "smollm2-135m" in res.output and "tiny" in res.output


def test_cli_backend_and_torch_only_options_checked():
    res = invoke("profile", "--backend", "tpu")
    assert res.exit_code == 2 and "--backend" in res.output
    res = invoke("profile", "--weights", "random")
    assert res.exit_code == 2 and "--weights" in res.output and "torch only" in res.output
    res = invoke("profile", "--concurrent-load")
    assert res.exit_code == 2 and "--concurrent-load" in res.output and "torch only" in res.output


def test_cli_concurrent_load_profile_is_written_and_says_so(tmp_path):
    """--concurrent-load: the other stage loops in a spawned process while one is timed (no timing
    asserted: the run completes, stops its load process and writes a loadable profile)."""
    path = tmp_path / "tiny_loaded.json"
    res = invoke(
        "profile",
        "--backend",
        "torch",
        "-m",
        "tiny",
        "--pp",
        "2",
        "--quick",
        "--max-tokens",
        "16",
        "--repeats",
        "1",
        "--no-link",
        "--concurrent-load",
        "-o",
        str(path),
    )
    assert res.exit_code == 0, res.output
    prof = load_profile(path)
    assert prof.pp == 2 and all(s > 0 for st in prof.stages for s in st.linear.seconds)
    assert "other 1 stage(s) looped forward passes" in prof.provenance["concurrent_load"]
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("fastpp-profile-load")]


# ---------------------------------------------------------------------------- parts
def test_config_rejects_what_cannot_be_profiled():
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        TorchProfileConfig(model="nope")
    with pytest.raises(ValueError, match=r"pp must be in 1..30 \(the layer count of smollm2-135m\), got 31"):
        TorchProfileConfig(pp=31)
    with pytest.raises(ValueError, match="model must be smollm2-135m"):
        TorchProfileConfig(model="tiny", weights="smollm2")
    with pytest.raises(ValueError, match=r"grid.chunks values \[100\]"):
        ProfileGrid(chunks=(100,))
    with pytest.raises(ValueError, match="grid.split_tokens"):
        ProfileGrid(tokens=(1, 4), split_tokens=(4,), chunks=(), decode_batches=(1,))


def test_grid_fits_the_model_context():
    grid = ProfileGrid().for_context(512)
    assert max(grid.tokens) == 512 and 1024 not in grid.split_tokens
    shapes = grid_shapes(grid, 512)
    assert all(n + p <= 512 for s in shapes for n, p in s.chunks)
    assert all(ctx <= 512 for s in shapes for ctx in s.decode_ctx)
    assert any(s.kind == "prefix" for s in shapes)  # prefixes clipped, not all dropped
    assert ProfileGrid().with_max_tokens(2048).tokens[-3:] == (1024, 1536, 2048)


def test_shape_features_follow_the_plan_definitions():
    s = Shape("holdout", chunks=((100, 300), (20, 0)), decode_ctx=(50, 70), num_completing=1, samples=True)
    assert s.features == (122, 100 * 300, 100 * 100 + 20 * 20, 120)
    assert s.num_sampled == 3  # two decodes and the completing chunk
    assert s.entries() == [(0, 1, 49, True), (1, 1, 69, True), (2, 100, 300, True), (3, 20, 0, False)]


def test_fit_recovers_a_known_stage_cost():
    grid = ProfileGrid()
    shapes = grid_shapes(grid, 8192)
    table = {n: 1e-3 + 2e-5 * n for n in grid.tokens}
    a, b, c = 3e-9, 2e-9, 4e-8
    X = np.array([s.features for s in shapes], dtype=float)
    y = [table[int(n)] + a * pxp + b * psq + c * dec for n, pxp, psq, dec in X]
    fit = fit_stage(X, y, grid.tokens)
    assert fit.attn_past_x_pre_s == pytest.approx(a, rel=1e-6)
    assert fit.attn_pre_sq_s == pytest.approx(b, rel=1e-6)
    assert fit.attn_dec_ctx_s == pytest.approx(c, rel=1e-6)
    assert fit.table.seconds == pytest.approx([table[n] for n in grid.tokens], rel=1e-6)
    assert fit.mape < 1e-9
    with pytest.raises(ValueError, match="not on the table's points"):
        fit_stage([[3, 0, 9, 0]], [1e-3], (1, 2))


def test_nnls_keeps_coefficients_non_negative_and_optimal():
    A = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    x = nnls(A, np.array([2.0, -1.0, 1.0]))  # unconstrained optimum has x1 < 0
    assert x == pytest.approx([1.5, 0.0])


def test_link_fit_recovers_alpha_beta():
    alpha, bw, row_bytes = 50e-6, 2e9, 576 * 4
    rtt = {0: 2 * alpha}
    rtt |= {n: alpha + n * row_bytes / bw + alpha for n in (1, 64, 512, 2048)}
    m = fit_link(rtt, row_bytes)
    assert m.latency_s == pytest.approx(alpha, rel=1e-6)
    assert m.bandwidth_bytes_per_s == pytest.approx(bw, rel=1e-6)


def test_host_overhead_times_real_scheduler_steps():
    seconds, tokens = measure_host_overhead(
        num_slots=2, kv_capacity_tokens=16384, page_size=16, max_context=2048, num_samples=50
    )
    assert 0 < seconds < 0.05
    assert 1 <= tokens <= 512  # static 512-token chunks


def test_quick_grid_measures_fewer_shapes_than_the_default():
    assert len(grid_shapes(ProfileGrid.quick(), 8192)) < len(grid_shapes(ProfileGrid(), 8192))

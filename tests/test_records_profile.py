"""`fastpp profile --from-records`: a recorded run folder (any executor) back into a profile.

The records here come from the simulator with a known profile, so the fit has a right answer:
the stage costs on the shapes the run had, the link, the token return and the host overhead.
"""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fastpp.cli.app import app
from fastpp.profile import LinearTable, ModelShape, load_profile
from fastpp.records_profile import (
    RecordsProfileError,
    iteration_errors,
    profile_from_records,
    sampled_rows,
)
from fastpp.run_files import ITERATIONS, SUMMARY, read_iterations_csv, write_run
from fastpp.run_setup import RunSetup, SetupError
from fastpp.scheduler_config import SchedulerConfig
from fastpp.sim.models import resolve_model
from fastpp.sim.output import write_simulation
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation
from fastpp.stage_fit import fit_stage, table_points
from fastpp.types import SLO, IterationRecord

runner = CliRunner()
CPU_CANDIDATES = tuple(range(32, 1025, 32))


def simulated_run(
    tmp_path: Path,
    profile: str = "cpu_smollm2-135m_pp2",
    policy: str = "static:256",
    n: int = 40,
    rate: float = 0.5,
    workload: str = "random:256:64",
    noise_cv: float = 0.0,
):
    run = run_simulation(
        WorkloadConfig(name=workload, rate=rate, num_requests=n, seed=3),
        DeploymentConfig(
            profile_path=profile, policy=policy, slo=SLO(5.0, 0.5), chunk_candidates=CPU_CANDIDATES
        ),
        noise_cv=noise_cv,
    )
    paths = write_simulation(run, tmp_path)
    return run, paths["summary"].parent


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    return simulated_run(tmp_path_factory.mktemp("cpu_run"))


def test_fit_recovers_the_profile_that_made_the_records(cpu_run):
    run, run_dir = cpu_run
    truth = run.profile
    got = profile_from_records(run_dir)
    p = got.profile
    assert (p.pp, p.tp, p.kv_capacity_tokens, p.page_size) == (
        truth.pp,
        truth.tp,
        truth.kv_capacity_tokens,
        truth.page_size,
    )
    assert p.model == truth.model and [s.num_layers for s in p.stages] == [15, 15]
    assert p.provenance["source"] == "records" and p.provenance["engine"] == "fastpp-sim"
    assert p.kind == "measured"
    # hand-offs: exact up to the clocks' rounding in the files
    assert p.host_overhead_s == pytest.approx(truth.host_overhead_s, rel=0.02, abs=2e-6)
    assert p.token_return_s == pytest.approx(truth.token_return_s, rel=0.02, abs=2e-6)
    assert p.stage_turnaround_s == pytest.approx(truth.stage_turnaround_s, abs=2e-6)  # zeros
    for tokens in (1, 16, 256):  # the link as the simulator uses it: activations of N tokens
        assert p.link.time_s(tokens * p.activation_bytes_per_token) == pytest.approx(
            truth.link.time_s(tokens * truth.activation_bytes_per_token), rel=0.02
        )
    # stage costs: every recorded iteration predicted as the true profile costs it
    for row in iteration_errors(p, run.result.iterations):
        assert row["n"] > 100 and row["median_ape"] < 0.005 and row["p90_ape"] < 0.02, row
    # ... and the decode-only microbatches, which decide TPOT, at every batch size the run had
    last = len(truth.stages) - 1
    for it in run.result.iterations:
        if it.num_prefill_tokens == 0:
            want = truth.stages[it.stage].time_s(it.num_tokens, it.num_sampled, 0, 0, it.sum_dec_ctx)
            have = p.stages[it.stage].time_s(it.num_tokens, it.num_sampled, 0, 0, it.sum_dec_ctx)
            assert have == pytest.approx(want, rel=0.01), (it.stage, it.num_tokens, it.stage == last)
    assert got.num_outliers == (0, 0) and [n for n in got.notes if "extrapolated" not in n] == []


def test_fitted_profile_replays_the_run(cpu_run, tmp_path):
    run, run_dir = cpu_run
    fitted = profile_from_records(run_dir).profile
    from fastpp.profile import save_profile

    save_profile(fitted, tmp_path / "p.json")
    again = run_simulation(
        WorkloadConfig(name="random:256:64", rate=0.5, num_requests=40, seed=3),
        DeploymentConfig(
            profile_path=str(tmp_path / "p.json"),
            policy="static:256",
            slo=SLO(5.0, 0.5),
            chunk_candidates=CPU_CANDIDATES,
        ),
    )
    for key in ("median_ttft_ms", "p90_ttft_ms", "median_tpot_ms", "p90_tpot_ms"):
        assert again.summary[key] == pytest.approx(run.summary[key], rel=0.05), key


def test_stage_turnaround_is_fitted_and_simulated(tmp_path):
    """A last stage that is busy 3 ms after each compute (the CPU engine's sampling and sending):
    the simulator starts none of its microbatches sooner, and the fit finds the 3 ms in the gaps
    where the next input was already waiting."""
    from fastpp.profile import save_profile
    from fastpp.profile_names import resolve_profile

    base = load_profile(resolve_profile("cpu_smollm2-135m_pp2"))
    save_profile(replace(base, stage_turnaround_s=(0.0, 0.003)), tmp_path / "turn.json")
    run, run_dir = simulated_run(tmp_path / "run", profile=str(tmp_path / "turn.json"), n=40, rate=2.0)
    last = sorted((it for it in run.result.iterations if it.stage == 1), key=lambda it: it.started_at)
    gaps = [b.started_at - a.finished_at for a, b in zip(last, last[1:], strict=False)]
    assert min(gaps) >= 0.003 - 1e-9 and sum(g < 0.0031 for g in gaps) > 50  # back to back often
    got = profile_from_records(run_dir)
    assert got.profile.stage_turnaround_s == pytest.approx((0.0, 0.003), abs=2e-6)
    assert got.turnaround[1].samples > 50
    lines = got.summary_lines()
    assert any("stage turnaround 0.000 ms (in host overhead), 3.000 ms" in line for line in lines)
    # and without it, the same load's decode steps come faster
    plain = simulated_run(tmp_path / "plain", n=40, rate=2.0)[0]
    assert plain.summary["median_tpot_ms"] < run.summary["median_tpot_ms"]


def test_turnaround_needs_enough_back_to_back_iterations(tmp_path):
    """A run whose last stage was never handed a microbatch while busy (a few requests far apart,
    as vLLM at low load) has no turnaround to measure: 0, and a note says why."""
    from fastpp.records_profile import MIN_TURNAROUND_GAPS

    _, run_dir = simulated_run(tmp_path, n=3, rate=0.02)
    got = profile_from_records(run_dir)
    assert got.turnaround[1].samples < MIN_TURNAROUND_GAPS
    assert got.profile.stage_turnaround_s == (0.0, 0.0)
    assert any("stage 1:" in n and "turnaround 0 (not measurable here)" in n for n in got.notes)


def test_pp4_gpu_profile_with_noise(tmp_path):
    """Four stages of the analytic A100 profile, stage times jittered by 5%: the fit sees noise."""
    run, run_dir = simulated_run(
        tmp_path,
        profile="a100-40gb-pcie_qwen2.5-32b_pp4",
        policy="static:512",
        n=60,
        rate=2.0,
        workload="azure-conv",
        noise_cv=0.05,
    )
    truth = run.profile
    got = profile_from_records(run_dir).profile
    assert got.pp == 4 and got.stages[-1].lm_head is not None and got.stages[0].lm_head is None
    assert got.host_overhead_s == pytest.approx(truth.host_overhead_s, rel=0.02)
    assert got.token_return_s == pytest.approx(truth.token_return_s, rel=0.02)
    for row in iteration_errors(got, run.result.iterations):
        assert row["median_ape"] < 0.05 and abs(row["median_bias"]) < 0.01, row
    for s, (a, b) in enumerate(zip(truth.stages, got.stages, strict=True)):
        decode = [it for it in run.result.iterations if it.stage == s and it.num_prefill_tokens == 0]
        want = np.median([a.time_s(it.num_tokens, it.num_sampled, 0, 0, it.sum_dec_ctx) for it in decode])
        have = np.median([b.time_s(it.num_tokens, it.num_sampled, 0, 0, it.sum_dec_ctx) for it in decode])
        assert have == pytest.approx(want, rel=0.03), s


def test_stage_fit_interpolates_between_points():
    """Shapes between table points: the table at the points and the ALP terms come back exactly."""
    points = (1, 8, 64, 512)
    table = LinearTable(points, (0.01, 0.012, 0.03, 0.2))
    a, b, c, h = 2e-8, 3e-8, 4e-6, 1e-4
    rng = np.random.default_rng(0)
    rows, y, sampled = [], [], []
    for _ in range(300):
        n = int(rng.integers(1, 513))
        pxp, psq, dec = (int(v) for v in rng.integers(0, 5000, 3))
        s = int(rng.integers(0, 9))
        rows.append([n, pxp, psq, dec])
        sampled.append(s)
        y.append(table.at(n) + a * pxp + b * psq + c * dec + h * s)
    for n in points:  # every point has data
        rows.append([n, 0, 0, 0])
        sampled.append(0)
        y.append(table.at(n))
    fit = fit_stage(rows, y, points, sampled)
    assert fit.table.seconds == pytest.approx(table.seconds, rel=1e-6)
    assert (fit.attn_past_x_pre_s, fit.attn_pre_sq_s, fit.attn_dec_ctx_s, fit.sampled_s) == pytest.approx(
        (a, b, c, h), rel=1e-5
    )
    assert fit.mape < 1e-8
    with pytest.raises(ValueError, match="within 1 .. 512"):
        fit_stage([[513, 0, 0, 0]], [1.0], points)


def test_table_points_follow_the_data():
    assert table_points([5, 1, 2, 2, 3, 100, 40, 41]) == (1, 2, 3, 5, 40, 100)
    assert table_points([5, 1, 2, 2, 3, 100, 40, 41, 41, 41]) == (1, 2, 3, 5, 40, 41, 100)
    with pytest.raises(ValueError, match="no shape"):
        table_points([0])


# ------------------------------------------------------------------------------ run folder format


def test_setup_round_trip_and_errors_name_the_field():
    config = SchedulerConfig(
        num_slots=2,
        kv_capacity_tokens=4096,
        page_size=16,
        chunk_candidates=(64, 128),
        default_chunk=128,
        token_step=1,
        slo=SLO(3.0, 0.3),
        max_running_requests=8,
    )
    shape = resolve_model("SmolLM2-135M")
    setup = RunSetup(
        engine="vllm 0.32.0",
        device="CPU",
        pp=2,
        tp=1,
        policy="greedy+ds",
        scheduler=config,
        model=shape,
        layers_per_stage=(15, 15),
        dtype="float32",
    )
    summary = json.loads(json.dumps({"completed": 3, "setup": setup.to_dict()}))
    assert RunSetup.from_summary(summary) == setup
    with pytest.raises(SetupError, match=r"run/summary.json: setup: missing field"):
        RunSetup.from_summary({"completed": 3}, "run/summary.json")
    broken = json.loads(json.dumps(summary))
    del broken["setup"]["scheduler"]["kv_capacity_tokens"]
    with pytest.raises(SetupError, match=r"setup\.scheduler\.kv_capacity_tokens: missing field"):
        RunSetup.from_summary(broken)
    broken = json.loads(json.dumps(summary))
    del broken["setup"]["model"]["hidden_size"]
    with pytest.raises(SetupError, match=r"setup\.model\.hidden_size: missing field"):
        RunSetup.from_summary(broken)
    broken = json.loads(json.dumps(summary))
    del broken["setup"]["pp"]
    with pytest.raises(SetupError, match=r"setup\.pp: missing field"):
        RunSetup.from_summary(broken)


def test_model_shape_from_a_hf_directory(tmp_path):
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "dtype": "float32",
        "head_dim": 64,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "max_position_embeddings": 8192,
        "model_type": "llama",
        "num_attention_heads": 9,
        "num_hidden_layers": 30,
        "num_key_value_heads": 3,
        "tie_word_embeddings": False,
        "vocab_size": 49152,
    }
    d = tmp_path / "smollm2-135m-instruct"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    shape = resolve_model(str(d))
    assert shape == replace(
        resolve_model("SmolLM2-135M"), name="smollm2-135m-instruct", dtype_bytes=4, tie_word_embeddings=False
    )
    with pytest.raises(ValueError, match="unknown model"):
        resolve_model(str(tmp_path / "nothing-here"))


def test_iterations_without_num_sampled_still_read(cpu_run, tmp_path):
    """Files written before ``num_sampled`` existed: read as unknown (-1), fitted on decodes."""
    _, run_dir = cpu_run
    for name in ("summary.json", "requests.jsonl"):
        (tmp_path / name).write_bytes((run_dir / name).read_bytes())
    with (run_dir / ITERATIONS).open() as f, (tmp_path / ITERATIONS).open("w", newline="") as g:
        rows = list(csv.DictReader(f))
        out = csv.DictWriter(g, fieldnames=[k for k in rows[0] if k != "num_sampled"])
        out.writeheader()
        out.writerows({k: v for k, v in r.items() if k != "num_sampled"} for r in rows)
    its = read_iterations_csv(tmp_path / ITERATIONS)
    assert {it.num_sampled for it in its} == {-1}
    assert sampled_rows(its[0]) == its[0].num_decode_reqs
    got = profile_from_records(tmp_path)
    assert any("sampled rows not recorded" in n for n in got.notes)
    assert max(got.stage_median_ape) < 0.02


def test_errors_name_the_missing_file_or_field(cpu_run, tmp_path):
    run, run_dir = cpu_run
    with pytest.raises(FileNotFoundError, match="no summary.json"):
        profile_from_records(tmp_path)
    summary = json.loads((run_dir / SUMMARY).read_text())
    # no model shape recorded: the caller must give it
    summary["setup"]["model"] = None
    write_run(tmp_path / "nomodel", run.result.records, run.result.iterations, summary)
    with pytest.raises(RecordsProfileError, match=r"setup.model is null.*--model"):
        profile_from_records(tmp_path / "nomodel")
    shape = resolve_model("SmolLM2-135M")
    assert profile_from_records(tmp_path / "nomodel", model=shape).profile.model == shape
    # too few iterations of a stage
    few = [it for it in run.result.iterations if it.stage == 0 or it.mb_id < 3]
    write_run(tmp_path / "few", run.result.records, few, json.loads((run_dir / SUMMARY).read_text()))
    with pytest.raises(RecordsProfileError, match=r"iterations.csv: \d+ iterations of stage 1"):
        profile_from_records(tmp_path / "few")
    # a stage the setup does not have
    extra = [*run.result.iterations, IterationRecord(10**6, 2, 0, 1.0, 2.0, 1, 0, 1, 0, 0, 5, 1)]
    write_run(tmp_path / "extra", run.result.records, extra, json.loads((run_dir / SUMMARY).read_text()))
    with pytest.raises(RecordsProfileError, match=r"stage 2 in a run with pp=2"):
        profile_from_records(tmp_path / "extra")


# ------------------------------------------------------------------------------ the command


def test_cli_writes_a_profile_the_simulator_runs(cpu_run, tmp_path):
    _, run_dir = cpu_run
    out = tmp_path / "fitted.json"
    res = runner.invoke(app, ["profile", "--from-records", str(run_dir), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "stage 1 (15 layers)" in res.output and "host overhead" in res.output
    assert load_profile(out).provenance["source"] == "records"
    res = runner.invoke(
        app, ["simulate", "--profile", str(out), "-w", "random:256:64", "-n", "10", "-r", "0.5"]
    )
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pp", "2"], "--pp cannot be combined with --from-records"),
        (["--backend", "torch"], "--backend cannot be combined with --from-records"),
        (["--model", "no-such-model"], "--model: unknown model 'no-such-model'"),
        (["--model", "Qwen2.5-14B"], "(30 layers, hidden 576, 9 heads); the model given is Qwen2.5-14B"),
    ],
)
def test_cli_refuses_bad_flags(cpu_run, args, message):
    _, run_dir = cpu_run
    res = runner.invoke(app, ["profile", "--from-records", str(run_dir), *args])
    assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output


def test_cli_names_what_is_missing(cpu_run, tmp_path):
    _, run_dir = cpu_run
    res = runner.invoke(app, ["profile", "--from-records", str(run_dir.parent)])  # simulate's -o folder
    text = "".join(res.output.split())
    assert res.exit_code == 2 and "holds1runfolder(s)" in text and f"--from-records{run_dir}" in text
    res = runner.invoke(app, ["profile", "--from-records", str(tmp_path / "none")])
    assert res.exit_code == 2 and "not a folder" in " ".join(res.output.split())
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / SUMMARY).write_text("{}")
    (tmp_path / "partial" / "requests.jsonl").write_text("")
    res = runner.invoke(app, ["profile", "--from-records", str(tmp_path / "partial")])
    assert res.exit_code == 2 and "no iterations.csv" in " ".join(res.output.split()), res.output
    (tmp_path / "partial" / ITERATIONS).write_text((run_dir / ITERATIONS).read_text())
    res = runner.invoke(app, ["profile", "--from-records", str(tmp_path / "partial")])
    assert res.exit_code == 2 and "setup: missing field" in " ".join(res.output.split()), res.output


def test_model_shape_round_trip():
    shape = ModelShape("m", 2, 64, 4, 2, 16, 128, 256, 512)
    assert ModelShape.from_dict(shape.to_dict()) == shape


# ------------------------------------------------------------------------------ sim vs real script


def test_sim_vs_real_replays_a_recorded_run(cpu_run, tmp_path):
    """benchmarks/sim_vs_real.py on a run folder the simulator wrote: fitting its records and
    replaying its requests gives back its latencies (the script's whole path, no engine)."""
    import runpy

    _, run_dir = cpu_run
    script = runpy.run_path(str(Path(__file__).resolve().parents[1] / "benchmarks" / "sim_vs_real.py"))
    out = tmp_path / "cmp.json"
    assert script["main"]([str(run_dir), "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["engine"] == "fastpp-sim" and got["host_loop"] == "free-slots"
    for key in ("median_ttft_ms", "p90_ttft_ms", "median_tpot_ms", "p90_tpot_ms"):
        assert got["sim"][key] == pytest.approx(got["real"][key], rel=0.05), key
    assert got["microbatches"]["sim"] == pytest.approx(got["microbatches"]["real"], rel=0.05)
    assert all(row["median_ape"] < 0.01 for row in got["iteration_errors"])
    # a vLLM run is replayed with vLLM's batch-queue host loop
    setup = RunSetup.from_summary(json.loads((run_dir / SUMMARY).read_text()))
    assert script["host_loop_of"](replace(setup, engine="vllm 0.32.0")) == "batch-queue"
    # SGLang on CPU computes stage 0 in its scheduler loop; on a GPU it launches asynchronously
    assert script["host_loop_of"](replace(setup, engine="sglang 0.5.23", device="CPU")) == "blocking-launch"
    assert script["host_loop_of"](replace(setup, engine="sglang 0.5.23", device="H100")) == "free-slots"


def test_vllm_host_side_reads_a_record_dir(tmp_path):
    """benchmarks/vllm_host_side.py on a hand-made vLLM record dir with known instants."""
    import runpy

    def line(**kw) -> str:
        return json.dumps(kw) + "\n"

    # mb 0 (slot 0) and mb 2 (slot 0) compute; mb 1 (slot 1) is an empty call between them
    (tmp_path / "decisions.jsonl").write_text(
        line(mb_id=0, slot=0, schedule_started_at=1.0000, at=1.0004, total_scheduled=4)
        + line(mb_id=1, slot=1, schedule_started_at=1.0005, at=1.0006, total_scheduled=0)
        + line(mb_id=2, slot=0, schedule_started_at=1.1030, at=1.1033, total_scheduled=1)
    )
    (tmp_path / "returns.jsonl").write_text(
        line(mb_id=0, update_started_at=1.1010, returned_at=1.1012, done_at=1.1015)
        + line(mb_id=1, update_started_at=1.1016, returned_at=1.1016, done_at=1.1016)
        + line(mb_id=2, update_started_at=1.2050, returned_at=1.2052, done_at=1.2055)
    )
    its = [
        IterationRecord(0, 0, 0, 1.0010, 1.0500, 4, 4, 0, 0, 16, 0, 256, "static", 1),
        IterationRecord(0, 1, 0, 1.0500, 1.1000, 4, 4, 0, 0, 16, 0, 256, "static", 1),
        IterationRecord(2, 0, 0, 1.1040, 1.1500, 1, 0, 1, 0, 0, 5, 256, "static", 1),
        IterationRecord(2, 1, 0, 1.1500, 1.2000, 1, 0, 1, 0, 0, 5, 256, "static", 1),
    ]
    write_run(tmp_path, [], its, {})
    script = runpy.run_path(str(Path(__file__).resolve().parents[1] / "benchmarks" / "vllm_host_side.py"))
    got = script["host_side"](tmp_path)
    assert (got["pp"], got["schedule_calls"], got["empty_calls"]) == (2, 3, 1)
    assert got["schedule_s"]["median_ms"] == pytest.approx(0.35)  # 0.4 and 0.3 ms
    assert got["launch_s"]["median_ms"] == pytest.approx(0.65)  # 0.6 and 0.7 ms
    assert got["last_stage_end_to_token_s"]["median_ms"] == pytest.approx(3.2)  # 1.2 and 5.2 ms
    assert got["slot_cycle_gap_s"] == {
        "n": 1,
        "median_ms": pytest.approx(4.0),
        "p10_ms": pytest.approx(4.0),
        "p90_ms": pytest.approx(4.0),
    }
    assert got["scheduled_while_computing"] == 0.0
    assert got["stage0_busy_while_later_stage_busy"] == 0.0  # one microbatch in the pipe at a time
    assert script["overlap_share"]([(0.0, 2.0), (4.0, 5.0)], [(1.0, 3.0), (4.5, 6.0)]) == pytest.approx(0.5)


def test_sglang_host_side_reads_the_loop_timings(tmp_path, monkeypatch):
    """benchmarks/sglang_host_side.py on hand-made host_rank*.jsonl files with known instants:
    pp 2, two slots; rank 1 computes slot 0 from 102 to 195 ms while rank 0 computes slot 1."""
    import runpy

    def write(rank: int, *steps: dict) -> None:
        (tmp_path / f"host_rank{rank}.jsonl").write_text(
            "".join(json.dumps({"rank": rank, **s}) + "\n" for s in steps)
        )

    ms = 1e-3
    write(
        0,
        dict(
            step=0,
            slot=0,
            ingest=[0, 1 * ms],
            schedule=[1 * ms, 3 * ms],
            launch=[3 * ms, 100 * ms],
            exchange_outputs=[100 * ms, 101 * ms],
            send_activations=[101 * ms, 102 * ms],
        ),
        dict(
            step=1,
            slot=1,
            ingest=[102 * ms, 103 * ms],
            schedule=[103 * ms, 104 * ms],
            launch=[104 * ms, 200 * ms],
            exchange_outputs=[200 * ms, 201 * ms],
            process_result=[201 * ms, 203 * ms],
            send_activations=[203 * ms, 204 * ms],
        ),
        dict(
            step=2,
            slot=0,
            ingest=[204 * ms, 205 * ms],
            schedule=[205 * ms, 207 * ms],
            launch=[207 * ms, 300 * ms],
        ),
    )
    write(
        1,
        dict(
            step=0,
            slot=0,
            ingest=[0, 100 * ms],
            recv_activations=[100.5 * ms, 102 * ms],
            launch=[102 * ms, 195 * ms],
            exchange_outputs=[195 * ms, 196 * ms],
        ),
        dict(step=1, slot=1, recv_activations=[204 * ms, 205 * ms], launch=[205 * ms, 290 * ms]),
    )
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    script = runpy.run_path(str(Path(__file__).resolve().parents[1] / "benchmarks" / "sglang_host_side.py"))
    got = script["host_side"](tmp_path)
    assert (got["pp"], got["slots"]) == (2, 2)
    assert got["phases"]["0"]["schedule"]["median_ms"] == pytest.approx(2.0)  # 2, 1, 2 ms
    assert got["phases"]["1"]["launch"]["n"] == 2
    assert got["rank0_before_launch_s"]["median_ms"] == pytest.approx(3.0)  # 3, 2, 3 ms
    # slot 0's tokens: last stage done at 195 ms, at rank 0 at 201 (rank 0 computed until 200),
    # processed at 203, slot 0 launched again at 207
    assert got["last_stage_end_to_tokens_at_rank0_s"]["median_ms"] == pytest.approx(6.0)
    assert got["of_which_rank0_computing_s"]["median_ms"] == pytest.approx(5.0)
    assert got["last_stage_end_to_tokens_processed_s"]["median_ms"] == pytest.approx(8.0)
    assert got["slot_cycle_gap_s"]["median_ms"] == pytest.approx(12.0)
    assert got["rank0_scheduled_while_later_stage_computed"] == pytest.approx(2 / 3)

"""``fastpp plan`` end to end, kept to seconds: fixed 200-request probes (--no-steady), one
seed, a coarse bracket, two candidates. Also the resumed plan and the bad inputs."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fastpp.cli.app import app

runner = CliRunner()
SMALL = [
    "-m",
    "Qwen2.5-14B",
    "--gpus",
    "2",
    "--layouts",
    "pp2,tp2",
    "--policies",
    "static:512,no-ds",
    "--seeds",
    "1",
    "-n",
    "200",
    "--no-steady",
    "--precision",
    "2",
    "--executor",
    "serial",
]


def _plan(args: list[str]) -> tuple[int, str]:
    result = runner.invoke(app, ["plan", *args])
    return result.exit_code, result.output


def test_a_small_plan_ranks_prunes_and_recommends(tmp_path):
    code, out = _plan([*SMALL, "-o", str(tmp_path), "--json"])
    assert code == 0, out
    plan = json.loads(out)
    by_label = {r["label"]: r for r in plan["results"]}
    pp2, tp2 = by_label["pp2 static:512"], by_label["tp2 static:512"]
    assert plan["best"] == "pp2 static:512" and pp2["status"] == "searched"
    assert pp2["goodput"] > 0 and pp2["goodput_per_gpu"] == pytest.approx(pp2["goodput"] / 2)
    assert pp2["binding"] and pp2["operating_point"]["p90_ttft_ms"] > 0
    assert pp2["operating_point"]["replica_rate"] == pytest.approx(0.8 * pp2["goodput"])
    # tp2's bound is below pp2's goodput: it cannot win, and costs no probe
    assert tp2["status"] == "pruned" and tp2["num_probes"] == 0 and tp2["bound"] < pp2["goodput"]
    assert plan["counts"] == {"searched": 1, "beaten": 0, "pruned": 1}
    assert "--tp-size 1" in plan["commands"]["sglang"]
    assert "--chunked-prefill-size 512" in plan["commands"]["sglang"]
    assert "--max-num-batched-tokens 512" in plan["commands"]["vllm"]
    assert "rate / dp" in plan["routing"]
    assert (tmp_path / "plan.json").exists() and (tmp_path / "plan.jsonl").exists()

    code, again = _plan([*SMALL, "-o", str(tmp_path), "--json"])  # resumed from plan.jsonl
    assert code == 0, again
    resumed = json.loads(again)
    assert resumed["probes_run"] == 0
    assert [r["goodput"] for r in resumed["results"]] == [r["goodput"] for r in plan["results"]]


def test_the_printed_plan_has_the_table_and_the_commands(tmp_path):
    code, out = _plan([*SMALL, "-o", str(tmp_path)])
    assert code == 0, out
    assert "recommended: pp2 static:512" in out and "fastpp serve --backend sglang" in out
    assert "pruned" in out and "random routing" in out


def test_async_depths_add_pipelined_candidates_and_the_sglang_flag(tmp_path):
    code, out = _plan(
        [*SMALL, "--pp-async-batch-depth", "0,1", "--exhaustive", "-o", str(tmp_path), "--json"]
    )
    assert code == 0, out
    plan = json.loads(out)
    depths = {r["label"]: r["async_batch_depth"] for r in plan["results"]}
    # one stage has no other microbatch to keep in flight: tp2 only at depth 0
    assert depths == {"pp2 static:512": 0, "pp2 static:512 async1": 1, "tp2 static:512": 0}
    assert all(r["status"] == "searched" and r["goodput"] > 0 for r in plan["results"])

    code, out = _plan(
        [*SMALL, "--layouts", "pp2", "--pp-async-batch-depth", "1", "-o", str(tmp_path), "--json"]
    )
    assert code == 0, out
    plan = json.loads(out)
    assert plan["best"] == "pp2 static:512 async1"
    assert plan["commands"]["sglang"].endswith("--pp-async-batch-depth 1")
    assert plan["commands"]["vllm"].startswith("none: vLLM keeps one batch per stage")


def test_queue_orders_add_candidates_with_their_own_rows_and_the_vllm_flag(tmp_path):
    """A plan folder holds fcfs rows from an earlier plan: --queue-orders fcfs,late_last reuses
    them (their labels and cache keys are unchanged) and searches the late_last candidates,
    whose serve commands carry --queue-order."""
    pp2 = [*SMALL, "--layouts", "pp2", "-o", str(tmp_path), "--json"]
    code, out = _plan(pp2)
    assert code == 0, out
    code, out = _plan([*pp2, "--queue-orders", "fcfs,late_last", "--exhaustive"])
    assert code == 0, out
    plan = json.loads(out)
    rows = {r["label"]: (r["queue_order"], r["cached"]) for r in plan["results"]}
    assert rows == {"pp2 static:512": ("fcfs", True), "pp2 static:512 late_last": ("late_last", False)}
    assert all(r["goodput"] > 0 for r in plan["results"])

    code, out = _plan([*pp2, "--queue-orders", "late_last"])
    assert code == 0, out
    plan = json.loads(out)
    assert plan["best"] == "pp2 static:512 late_last"
    assert "--queue-order late_last" in plan["commands"]["vllm"]
    assert "--queue-order late_last" in plan["commands"]["sglang"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-m", "Qwen9-1T"], "unknown model 'Qwen9-1T'"),
        (["--queue-orders", "fcfs,lifo"], "--queue-orders: 'lifo' is not one of fcfs, late_last"),
        (["--pp-async-batch-depth", "0,x"], "--pp-async-batch-depth takes a comma list of integers"),
        (["--pp-async-batch-depth", "9"], "must be an integer in [0, 8], got 9"),
        (
            ["--pp-async-batch-depth", "1", "--host-loop", "batch-queue"],
            "--pp-async-batch-depth) is SGLang's",
        ),
        (["--gpu", "B300"], "unknown GPU 'B300'"),
        (["--gpus", "3"], "power of two"),
        (["--layouts", "pp8"], "--layouts: pp8 is not a layout of 4 GPUs"),
        (["--policies", "fast"], "unknown entry 'fast'"),
        (["--host-loop", "sideways"], "--host-loop must be one of"),
        (["--gpu", "X:bf16_tflops=1"], "missing hbm_gbps, memory_gib"),
        (["-m", "tests/data"], "a directory without config.json"),
    ],
)
def test_bad_input_is_a_clear_error(args, message):
    code, out = _plan([*args, "-o", ""])
    assert code == 2, out
    assert message in " ".join(out.split()) and "Traceback" not in out


def test_a_model_that_fits_no_layout_says_why(tmp_path):
    code, out = _plan(["-m", "Qwen2.5-72B", "--gpus", "1", "-o", str(tmp_path)])
    assert code == 1, out
    text = " ".join(out.split())
    assert "no feasible deployment" in text and "weights do not fit" in text


def test_an_slo_nothing_meets_names_the_binding_limit(tmp_path):
    code, out = _plan([*SMALL, "--layouts", "pp2", "--slo-tpot-ms", "5", "-o", str(tmp_path), "--json"])
    assert code == 1, out
    plan = json.loads(out)
    assert plan["best"] is None
    assert all(r["goodput"] == 0 for r in plan["results"] if r["status"] == "searched")
    assert "TPOT" in plan["results"][0]["binding"]


def test_gpu_list_shows_calibrated_parts():
    code, out = _plan(["--gpu", "list"])
    assert code == 0 and "A100-40GB-PCIe" in out and "calibrated" in out
    assert "uncalibrated" in out  # how to give another GPU


# ---- the simulate options `fastpp goodput` and `fastpp sweep` gained ----------------------------


def test_goodput_takes_a_profile_host_loop_and_chunk_candidates():
    result = runner.invoke(
        app,
        [
            "goodput",
            "--profile",
            "cpu_smollm2-135m_pp2",
            "-w",
            "sharegpt-synthetic",
            "-p",
            "predictive",
            "--no-steady",
            "-n",
            "40",
            "--seeds",
            "1",
            "--precision",
            "1",
            "--low",
            "0.25",
            "--high",
            "1",
            "--host-loop",
            "blocking-launch",
            "--chunk-candidates",
            "64:512:64",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output[result.output.index("[") :])
    assert rows[0]["deployment"] == "pp2" and rows[0]["policy"] == "predictive"
    bad = runner.invoke(app, ["goodput", "--host-loop", "sideways", "-n", "10"])
    assert bad.exit_code == 2 and "host loop must be one of" in bad.output


def test_sweep_grids_take_the_simulate_options_without_changing_default_ids():
    from fastpp.sim.sweep_grid import SweepGrid, grid_from_mapping

    plain = SweepGrid(metric="simulate", rates=(1.0,)).expand()[0][0]
    same = SweepGrid(metric="simulate", rates=(1.0,), host_loop="free-slots").expand()[0][0]
    other = SweepGrid(metric="simulate", rates=(1.0,), host_loop="batch-queue").expand()[0][0]
    assert plain.point_id == same.point_id != other.point_id
    grid = grid_from_mapping(
        {"profile": "cpu_smollm2-135m_pp2", "chunk_candidates": "64:256:64", "rate": [0.5]}
    )
    point = grid.expand()[0][0]
    assert (point.pp, point.gpu, point.chunk_candidates) == (2, "CPU", (64, 128, 192, 256))
    assert point.deployment_config().profile_path == "cpu_smollm2-135m_pp2"
    with pytest.raises(ValueError, match="profile fixes the model and GPU"):
        grid_from_mapping({"profile": "cpu_smollm2-135m_pp2", "model": "Qwen2.5-14B"})


@pytest.mark.parametrize("given", ["folder", "config.json"])
def test_a_config_json_model_on_a_datasheet_gpu_plans_and_says_uncalibrated(tmp_path, given):
    from pathlib import Path

    model = Path(__file__).parent / "data" / "qwen2.5-14b-instruct"
    code, out = _plan(
        [
            "-m",
            str(model if given == "folder" else model / "config.json"),
            "--gpu",
            "L40S:bf16_tflops=362,hbm_gbps=864,memory_gib=48",
            "--gpus",
            "2",
            "--layouts",
            "pp2",
            "--policies",
            "predictive,no-ds",
            "--seeds",
            "1",
            "-n",
            "150",
            "--no-steady",
            "--precision",
            "2",
            "--executor",
            "serial",
            "-o",
            str(tmp_path),
            "--json",
        ]
    )
    assert code == 0, out
    plan = json.loads(out)
    assert plan["gpu"] == "L40S" and plan["gpu_note"].startswith("uncalibrated")
    assert plan["model"] == "qwen2.5-14b-instruct" and plan["results"][0]["goodput"] > 0
    # the model directory serves, also when the plan was given its config.json
    assert f" -m {model} " in plan["commands"]["sglang"] and f" -m {model} " in plan["commands"]["vllm"]
    assert "--profile" in plan["commands"]["vllm"]  # predictive reads the plan's profile

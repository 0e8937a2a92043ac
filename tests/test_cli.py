"""The CLI as a user sees it: outputs written, and bad input named in a clear error."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fastpp.cli.app import app
from fastpp.run_files import read_run

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_simulate_writes_summary_records_iterations_and_timeline(tmp_path):
    res = invoke("simulate", "-n", "60", "-r", "3", "-d", "pp4", "-d", "tp4", "-o", str(tmp_path))
    assert res.exit_code == 0, res.output
    assert "pp4" in res.output and "tp4" in res.output and "static:2048" in res.output
    summaries = json.loads((tmp_path / "summary.json").read_text())
    assert [s["deployment"] for s in summaries] == ["pp4", "tp4"]
    assert all(s["completed"] == 60 for s in summaries)
    assert "p90_ttft_ms" in summaries[0] and "slo_met" in summaries[0]
    lines = (tmp_path / "pp4-static-2048" / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 60 and json.loads(lines[0])["finish_reason"] == "length"
    trace = json.loads((tmp_path / "pp4-static-2048" / "timeline.json").read_text())
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert len(tracks) == 4
    # each deployment is a run folder, the format a recorded real run has too
    back = read_run(tmp_path / "tp4-static-2048")
    assert back.summary == summaries[1] and len(back.records) == 60 and back.iterations


def test_simulate_json_output_and_per_deployment_policy(tmp_path):
    res = invoke("simulate", "-n", "30", "-d", "pp2@static:256", "--json", "-o", str(tmp_path))
    assert res.exit_code == 0, res.output
    (summary,) = json.loads(res.output)
    assert summary["policy"] == "static:256" and summary["pp"] == 2


def test_trace_replay_window_and_speed(tmp_path, shared_data):
    res = invoke(
        "simulate",
        "--replay",
        "azure-conv",
        "--replay-window",
        "60",
        "--replay-speed",
        "0.5",
        "-d",
        "pp4",
        "--data-dir",
        str(shared_data),
        "--json",
        "--no-timeline",
        "-o",
        str(tmp_path),
    )
    assert res.exit_code == 0, res.output
    (summary,) = json.loads(res.output)
    assert summary["num_requests"] > 100 and "replay of azure-conv" in summary["workload"]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--gpu", "B300-NOPE"], "B300-NOPE"),
        (["--model", "GPT-17"], "GPT-17"),
        (["--slo-ttft-ms", "0"], "--slo-ttft-ms must be > 0, got 0"),
        (["--slo-tpot-ms", "-5"], "--slo-tpot-ms must be > 0, got -5"),
        (["--max-time", "-5"], "--max-time must be > 0, got -5"),
        (["--workload", "nope"], "nope"),
        (["-d", "pp4x"], "pp4x"),
        (["--policy", "fancy:1"], "fancy"),
        (["--rate", "-1"], "rate"),
    ],
)
def test_bad_options_are_named(args, needle, tmp_path):
    res = invoke("simulate", "-n", "5", "-o", str(tmp_path), *args)
    assert res.exit_code == 2
    assert needle in res.output
    assert not (tmp_path / "summary.json").exists()


def test_an_unwritable_out_folder_fails_before_simulating(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    res = invoke("simulate", "-n", "5", "-o", str(blocker / "sub"))
    assert res.exit_code == 2 and "--out" in res.output and "Traceback" not in res.output


def test_help_shows_defaults_and_brackets_as_written():
    from fastpp.sim.run import DeploymentConfig, WorkloadConfig

    text = " ".join(invoke("simulate", "--help").output.split())
    workload, deployment = WorkloadConfig(), DeploymentConfig()  # the defaults' one source
    assert f"Arrival rate, requests/s. [default: {workload.rate}]" in text
    assert f"Requests to send. [default: {workload.num_requests}]" in text
    assert f"Model name. [default: {deployment.model}]" in text
    assert "random:IN:OUT[:RATIO]" in text
    assert "Commands:" in invoke("-h").output and invoke("--version").output.startswith("fastpp ")


def test_python_dash_m_lists_every_command():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "fastpp", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in (
        "simulate",
        "goodput",
        "sweep",
        "plot",
        "workloads",
        "policies",
        "profile",
        "serve",
        "bench",
    ):
        assert command in out


def test_malformed_trace_line_is_named(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:47.0000000,-3,10\n"
    )
    res = invoke("simulate", "--replay", str(trace), "-o", str(tmp_path))
    assert res.exit_code == 2
    assert "trace.csv line 3" in res.output and "ContextTokens" in res.output


def test_profile_round_trip_and_a_profile_missing_a_field(tmp_path):
    path = tmp_path / "p.json"
    res = invoke("profile", "-m", "Qwen2.5-14B", "--gpu", "A100-40GB-PCIe", "-d", "pp2", "-o", str(path))
    assert res.exit_code == 0, res.output
    res = invoke("simulate", "--profile", str(path), "-n", "20", "--json", "-o", str(tmp_path))
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)[0]["model"] == "Qwen2.5-14B"
    # -d names policies on the file's shape; another shape is refused
    res = invoke(
        "simulate",
        "--profile",
        str(path),
        "-n",
        "20",
        "--json",
        "-o",
        str(tmp_path),
        "-d",
        "pp2@static:256",
        "-d",
        "pp2@predictive",
        "--overwrite",
    )
    assert res.exit_code == 0, res.output
    assert [r["policy"] for r in json.loads(res.output)] == ["static:256", "predictive"]
    res = invoke("simulate", "--profile", str(path), "-n", "20", "-d", "pp4", "-o", str(tmp_path))
    assert res.exit_code == 2 and "is for pp2tp1" in " ".join(res.output.split())
    doc = json.loads(path.read_text())
    del doc["stages"][1]["attn_pre_sq_s"]
    path.write_text(json.dumps(doc))
    res = invoke("simulate", "--profile", str(path), "-n", "20", "-o", str(tmp_path))
    assert res.exit_code == 2
    assert "stages[1].attn_pre_sq_s" in res.output


def test_each_simulate_without_out_gets_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        res = invoke("simulate", "-n", "10", "-d", "pp2", "--no-timeline")
        assert res.exit_code == 0, res.output
    runs = sorted((tmp_path / "runs" / "simulate").iterdir())
    assert len(runs) == 2 and runs[0].name != runs[1].name
    assert all((r / "summary.json").is_file() and (r / "pp2-static-2048").is_dir() for r in runs)
    assert f"outputs in runs/simulate/{runs[1].name}/" in " ".join(res.output.split())


def test_an_out_folder_holding_another_run_is_refused_or_cleared(tmp_path):
    out = tmp_path / "run"
    assert invoke("simulate", "-n", "10", "-d", "tp2", "-o", str(out)).exit_code == 0
    (out / "notes.txt").write_text("mine")
    res = invoke("simulate", "-n", "10", "-d", "pp2", "-o", str(out))
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and f"--out {out} already holds a run" in text
    assert "tp2-static-2048" in text and "--overwrite" in text
    res = invoke("simulate", "-n", "10", "-d", "pp2", "-o", str(out), "--overwrite")
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "pp2-static-2048", "summary.json"]
    # a folder of whole earlier runs is never cleared
    parent = tmp_path / "many"
    assert invoke("simulate", "-n", "5", "-d", "pp2", "-o", str(parent / "a")).exit_code == 0
    res = invoke("simulate", "-n", "5", "-d", "pp2", "-o", str(parent), "--overwrite")
    assert res.exit_code == 2 and "holds 1 earlier runs in subfolders (a)" in " ".join(res.output.split())
    assert (parent / "a" / "summary.json").is_file()


def test_simulate_and_sweep_refuse_each_others_output_folder_even_with_overwrite(tmp_path):
    sim, swept = tmp_path / "sim", tmp_path / "swept"
    assert invoke("simulate", "-n", "10", "-d", "pp2", "--no-timeline", "-o", str(sim)).exit_code == 0
    sweep = ("sweep", "--executor", "serial", "-n", "10", "-d", "pp2", "--overwrite")
    res = invoke(*sweep, "-o", str(sim))
    text = "".join(res.output.split())  # rich may wrap inside a path
    assert res.exit_code == 2 and f"--out{sim}holdstheoutputoffastppsimulate(summary.json)" in text
    assert not (sim / "results.jsonl").exists()
    assert invoke(*sweep, "-o", str(swept)).exit_code == 0
    res = invoke("simulate", "-n", "10", "-d", "pp2", "-o", str(swept), "--overwrite")
    text = "".join(res.output.split())  # rich may wrap inside a path
    assert res.exit_code == 2 and f"--out{swept}holdstheoutputoffastppsweep(results.jsonl)" in text
    assert sorted(p.name for p in swept.iterdir()) == ["results.csv", "results.jsonl"]


def test_sweep_out_that_cannot_be_a_folder_is_an_error_naming_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for out in (blocker, blocker / "sub"):
        res = invoke("sweep", "--executor", "serial", "-n", "10", "-d", "pp2", "-o", str(out))
        text = "".join(res.output.split())  # rich may wrap inside a path
        assert res.exit_code == 2 and f"--out{out}:cannotcreatethefolder" in text, res.output


def test_a_profile_with_a_conflicting_model_or_gpu_is_an_error_naming_both(tmp_path):
    path = tmp_path / "p.json"
    assert (
        invoke(
            "profile", "-m", "Qwen2.5-14B", "--gpu", "A100-40GB-PCIe", "-d", "pp2", "-o", str(path)
        ).exit_code
        == 0
    )
    res = invoke(
        "simulate",
        "--profile",
        str(path),
        "-m",
        "Qwen2.5-72B",
        "--gpu",
        "H100",
        "-n",
        "5",
        "-o",
        str(tmp_path / "a"),
    )
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and f"--profile {path} is Qwen2.5-14B on A100-40GB-PCIe" in text
    assert "-m/--model Qwen2.5-72B" in text and "--gpu H100" in text
    assert not (tmp_path / "a").exists()
    res = invoke(
        "simulate",
        "--profile",
        str(path),
        "-m",
        "Qwen2.5-14B",
        "-n",
        "5",
        "--json",
        "-o",
        str(tmp_path / "b"),
    )
    assert res.exit_code == 0, res.output  # the same model is no conflict
    res = invoke("goodput", "--profile", str(path), "--gpu", "H100", "-n", "20")
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "--gpu H100 (the profile's is A100-40GB-PCIe)" in text
    assert "searching" not in text


def test_workloads_and_policies_listings():
    res = invoke("workloads")
    assert res.exit_code == 0 and "azure-conv" in res.output and "cnn-reversed-synthetic" in res.output
    assert "statistics of 20,000 samples" in res.output
    res = invoke("workloads", "--samples", "7")
    assert res.exit_code == 0 and "statistics of 7 samples" in res.output
    res = invoke("policies")
    assert res.exit_code == 0 and "static" in res.output


def test_goodput_command_reports_a_rate_and_its_probes():
    res = invoke(
        "goodput",
        "-w",
        "cnn-dailymail-synthetic",
        "-m",
        "Qwen2.5-14B",
        "-d",
        "pp2@static:512",
        "--seeds",
        "1",
        "--precision",
        "2",
        "-n",
        "120",
        "--json",
    )
    assert res.exit_code == 0, res.output
    (result,) = json.loads(res.stdout)
    assert result["goodput"] > 0 and result["probes"]
    assert result["policy"] == "static:512"


def test_goodput_table_says_when_the_answer_is_only_a_lower_bound():
    args = ("goodput", "-m", "SmolLM2-135M", "-d", "pp2", "-w", "random:16:4", "--seeds", "1")
    res = invoke(*args, "--precision", "4", "--low", "0.25", "--high", "0.5", "-n", "100")
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "goodput 8 req/s (+inf)" in text
    assert "note: feasible at the cap 8 req/s: goodput is at least this" in text


def test_prompts_longer_than_the_context_are_named_as_rejected(tmp_path):
    res = invoke("simulate", "-n", "50", "-d", "pp4", "-w", "random:100000:10", "-o", str(tmp_path))
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "pp4: 36 of 50 requests rejected on arrival (the first: prompt of" in text
    assert "exceeds the context limit 32768)" in text
    res = invoke("goodput", "-w", "random:100000:10:1", "-d", "pp4", "--seeds", "1", "-n", "100")
    text = " ".join(res.stdout.split())
    assert res.exit_code == 0 and "goodput 0: even" in text, res.output
    assert "of them rejected (prompt of 100000 tokens exceeds the context limit 32768)" in text


def test_goodput_no_steady_judges_the_slo_alone():
    # 300 decode-heavy requests end long before the KV cache fills: the P90s pass at rates whose
    # queue is still growing, which only the steady-queue rule catches
    args = (
        "goodput",
        "-w",
        "cnn-reversed-synthetic",
        "-m",
        "Qwen2.5-14B",
        "-d",
        "pp2@static:256",
        "--seeds",
        "1",
        "--precision",
        "4",
        "-n",
        "300",
        "--low",
        "16",
        "--high",
        "32",
        "--json",
    )
    strict, lax = (json.loads(invoke(*args, *extra).stdout)[0] for extra in ((), ("--no-steady",)))
    assert "steady queue" in strict["criterion"] and "steady queue" not in lax["criterion"]
    assert lax["goodput"] > strict["goodput"] > 0


def test_goodput_first_seed_picks_the_seeds_pooled():
    res = invoke(
        "goodput",
        "-w",
        "cnn-dailymail-synthetic",
        "-m",
        "Qwen2.5-14B",
        "-d",
        "pp2@static:512",
        "--seeds",
        "2",
        "--first-seed",
        "6",
        "--precision",
        "4",
        "-n",
        "60",
        "--json",
    )
    assert res.exit_code == 0, res.output
    assert "seeds (6, 7) pooled" in json.loads(res.stdout)[0]["criterion"]
    res = invoke("goodput", "--first-seed", "-1")
    assert res.exit_code != 0 and "--first-seed must be >= 0, got -1" in res.output


def test_goodput_searches_bursty_gamma_arrivals():
    args = ("goodput", "-w", "cnn-dailymail-synthetic", "-m", "Qwen2.5-14B", "-d", "pp2@static:512")
    args += ("--seeds", "1", "--precision", "1", "-n", "300", "--json")
    poisson, bursty = (
        json.loads(invoke(*args, *extra).stdout)[0] for extra in ((), ("--arrival", "gamma", "--cv", "4"))
    )
    assert (poisson["arrival"], poisson["cv"]) == ("poisson", None)
    assert (bursty["arrival"], bursty["cv"]) == ("gamma", 4.0)
    assert 0 < bursty["goodput"] < poisson["goodput"]  # bursts queue up: less sustained rate
    for bad, message in (
        (("--arrival", "uniform"), "arrival must be one of poisson, gamma, got 'uniform'"),
        (("--cv", "2"), "cv=2.0 needs arrival='gamma'"),
        (("--arrival", "gamma", "--cv", "0"), "cv must be a positive finite number, got 0.0"),
        (("--arrival", "gamma", "--cv", "2", "--protocol", "azure"), "sends Poisson arrivals"),
    ):
        res = invoke("goodput", *bad)
        assert res.exit_code != 0 and message in " ".join(res.output.split()), res.output
        assert "searching" not in res.output


def test_goodput_names_a_bad_deployment_before_searching():
    res = invoke("goodput", "-d", "pp4@static:512", "-d", "pp4@nosuch", "-n", "50")
    assert res.exit_code != 0 and "unknown chunk policy 'nosuch'" in res.output
    assert "searching" not in res.output  # no search ran before the bad one was found


def test_goodput_with_an_impossible_slo_reports_zero_and_why():
    res = invoke(
        "goodput",
        "-w",
        "cnn-dailymail-synthetic",
        "-m",
        "Qwen2.5-14B",
        "-d",
        "pp2",
        "--seeds",
        "1",
        "-n",
        "60",
        "--slo-tpot-ms",
        "1",
        "--low",
        "1",
        "--json",
    )
    assert res.exit_code == 0, res.output
    (result,) = json.loads(res.stdout)
    assert result["goodput"] == 0 and "TPOT" in result["reason"]


def test_goodput_and_sweep_can_plot_directly(tmp_path):
    res = invoke(
        "goodput",
        "-w",
        "cnn-dailymail-synthetic",
        "-m",
        "Qwen2.5-14B",
        "-d",
        "pp2@static:512",
        "--seeds",
        "1",
        "--precision",
        "4",
        "-n",
        "60",
        "--plot",
        str(tmp_path / "g"),
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / "g" / "goodput.json").exists() and (tmp_path / "g" / "goodput_probes.png").exists()
    (result,) = json.loads((tmp_path / "g" / "goodput.json").read_text())
    assert {k: result[k] for k in ("model", "gpu", "workload", "slo_ttft_ms", "slo_tpot_ms", "policy")} == {
        "model": "Qwen2.5-14B",
        "gpu": "A100-40GB-PCIe",
        "workload": "cnn-dailymail-synthetic",
        "slo_ttft_ms": 2000.0,
        "slo_tpot_ms": 200.0,
        "policy": "static:512",
    }
    title = " ".join(res.stderr.split())  # the figures' titles say the same
    svg = (tmp_path / "g" / "goodput.svg").read_text()
    assert "Qwen2.5-14B on A100-40GB-PCIe" in title and "Qwen2.5-14B" in svg and "static:512" in svg
    res = invoke(
        "sweep",
        "-w",
        "cnn-dailymail-synthetic",
        "-m",
        "Qwen2.5-14B",
        "-d",
        "pp2",
        "--chunk",
        "256,512",
        "-r",
        "2,4",
        "-n",
        "30",
        "--executor",
        "serial",
        "-o",
        str(tmp_path / "s"),
        "--plot",
    )
    assert res.exit_code == 0, res.output
    assert list((tmp_path / "s" / "plots").glob("latency_vs_rate*.png"))


def test_chunk_candidates_option(tmp_path):
    from fastpp.scheduler_config import parse_chunk_candidates

    assert parse_chunk_candidates("32:128:32") == (32, 64, 96, 128)
    assert parse_chunk_candidates("64,256") == (64, 256)
    for bad in ("5:1", "256,64", "0,64", "a:b:c", "64:32:32"):
        with pytest.raises(ValueError, match="chunk candidates"):
            parse_chunk_candidates(bad)
    res = invoke(
        "simulate",
        "-n",
        "20",
        "-d",
        "pp4@predictive",
        "--chunk-candidates",
        "64:512:64",
        "--json",
        "-o",
        str(tmp_path),
    )
    assert res.exit_code == 0, res.output
    res = invoke("simulate", "-n", "20", "--chunk-candidates", "512,64", "-o", str(tmp_path))
    assert res.exit_code == 2 and "strictly ascending" in " ".join(res.output.split())


def test_goodput_plot_folder_holding_another_run_is_refused_or_replaced(tmp_path):
    args = ["goodput", "-w", "cnn-dailymail-synthetic", "-m", "Qwen2.5-14B", "-d", "pp2@static:512"]
    args += ["--seeds", "1", "--precision", "4", "-n", "40", "--no-steady", "--plot", str(tmp_path)]
    assert invoke(*args).exit_code == 0  # (--no-steady: the folder rule is under test, not the search)
    (tmp_path / "notes.txt").write_text("mine")
    first = (tmp_path / "goodput.json").read_text()
    res = invoke(*args)
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and f"--plot {tmp_path} already holds a run (goodput.json)" in text
    assert (tmp_path / "goodput.json").read_text() == first and "searching" not in text
    res = invoke(*args, "--overwrite")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "goodput.png").is_file()


def test_plot_of_a_folder_of_sweeps_draws_the_newest_alone(tmp_path):
    import os

    rows = [{"metric": "simulate", "workload": "w", "policy": "static:512", "rate": r} for r in (1.0, 2.0)]
    for name, p90 in (("old", 100.0), ("new", 300.0)):
        folder = tmp_path / name
        folder.mkdir()
        lines = [json.dumps({**row, "p90_ttft_ms": p90 * row["rate"], "p90_tpot_ms": 50.0}) for row in rows]
        (folder / "results.jsonl").write_text("\n".join(lines) + "\n")
    os.utime(tmp_path / "old" / "results.jsonl", (1, 1))
    from fastpp.sim.plot_inputs import detect

    assert detect(tmp_path) == ("sweep", tmp_path / "new")


def test_a_gpu_given_by_its_datasheet_runs_in_simulate_profile_and_sweep(tmp_path):
    """`fastpp plan` takes an uncalibrated GPU by its numbers; simulate, profile and sweep take
    the same text (the sweep keeps its commas as the GPU's, not as a list of GPUs)."""
    gpu = "L40S:bf16_tflops=362,hbm_gbps=864,memory_gib=48"
    res = invoke(
        "simulate",
        "--gpu",
        gpu,
        "-m",
        "Qwen2.5-14B",
        "-d",
        "pp2",
        "-n",
        "20",
        "--json",
        "-o",
        str(tmp_path / "s"),
    )
    assert res.exit_code == 0, res.output
    (summary,) = json.loads(res.output)
    assert summary["completed"] == 20
    res = invoke("profile", "--gpu", gpu, "-m", "Qwen2.5-14B", "-d", "pp2", "-o", str(tmp_path / "p.json"))
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "p.json").read_text())["gpu"] == "L40S"
    out = tmp_path / "sweep"
    res = invoke(
        "sweep",
        "--gpu",
        gpu,
        "--gpu",
        "H100",
        "-m",
        "Qwen2.5-14B",
        "-d",
        "pp2",
        "-r",
        "2",
        "-n",
        "20",
        "-o",
        str(out),
    )
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["gpu"] for r in rows] == [gpu, "H100-SXM"] and all(r["completed"] == 20 for r in rows)
    res = invoke("simulate", "--gpu", "L40S", "-n", "20", "-o", str(tmp_path / "bad"))
    assert res.exit_code == 2 and "give it by its datasheet: L40S:bf16_tflops=" in " ".join(
        res.output.split()
    )

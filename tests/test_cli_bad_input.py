"""Bad input met by a hostile user of the CLI: each gets a one-paragraph error naming the
option, the file and the line or field, and exit 2; never a traceback, a silent default or a
silently ignored option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fastpp.backends.bench.config import BenchConfig
from fastpp.cli.app import app
from fastpp.length_files import WorkloadError, read_azure_trace
from fastpp.profile import ProfileError, load_profile
from fastpp.profile_names import resolve_profile
from fastpp.sim.hardware import parse_gpu_datasheet

runner = CliRunner()
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = "2023-11-16 18:15:46.6805900,374,44\n"


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def refused(*args: str, needle: str) -> str:
    res = invoke(*args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert "".join(needle.split()) in "".join(res.output.split()), res.output  # rich wraps long paths
    return res.output


# ------------------------------------------------------------------ options


@pytest.mark.parametrize("command", ["simulate", "goodput", "plan"])
def test_an_infinite_slo_is_refused_naming_the_flag(command, tmp_path):
    out = ["--plot" if command == "goodput" else "-o", str(tmp_path)]
    refused(command, "--slo-ttft-ms", "inf", *out, needle="--slo-ttft-ms must be a finite number, got inf")


@pytest.mark.parametrize("command", ["simulate", "goodput", "plan", "bench"])
def test_gamma_arrivals_without_a_cv_are_refused_not_run_as_poisson(command, tmp_path):
    out = ["-r", "2"] if command == "bench" else ["--plot" if command == "goodput" else "-o", str(tmp_path)]
    refused(command, "--arrival", "gamma", *out, needle="--arrival gamma needs --cv")


@pytest.mark.parametrize(
    "args",
    [
        ("simulate", "-d", "pp4", "-d", "pp4@static:2048", "-n", "10"),
        ("goodput", "-d", "pp4@predictive", "-d", "pp4@predictive"),
    ],
)
def test_a_deployment_given_twice_is_refused(args, tmp_path):
    """Two -d naming one deployment would write one run folder twice and show two rows."""
    out = ("-o", str(tmp_path / "o")) if args[0] == "simulate" else ()
    refused(*args, *out, needle=f"-d {args[4]} names the same deployment as -d {args[2]}")


@pytest.mark.parametrize("option", ["--policies", "--layouts", "--queue-orders"])
def test_an_empty_plan_list_is_refused_not_taken_as_the_default(option, tmp_path):
    refused("plan", option, " ", "-o", str(tmp_path), needle=f"{option} is empty")


def test_a_random_workload_spec_prints_as_typed(tmp_path):
    # rich used to turn ":a:" into an emoji, so the message did not show what was typed
    refused("simulate", "-n", "5", "-w", "random:a:b", "-o", str(tmp_path), needle="'random:a:b'")


def test_a_negative_seed_names_the_option(tmp_path):
    refused("simulate", "-n", "5", "--seed", "-1", "-o", str(tmp_path), needle="seed (--seed) must be >= 0")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--replay", "azure-conv", "-n", "50"], "--num-requests does not apply to --replay azure-conv"),
        (["--replay", "azure-conv", "-r", "3", "--seed", "2"], "--rate, --seed do not apply to --replay"),
        (["-n", "5", "--replay-start", "5"], "--replay-start applies to --replay only"),
        (["-n", "5", "--replay-speed", "2", "--replay-window", "9"], "--replay-window, --replay-speed apply"),
    ],
)
def test_simulate_refuses_options_a_replay_would_ignore(args, needle, tmp_path):
    refused("simulate", *args, "-o", str(tmp_path), needle=needle)
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--precision", "0"], "--precision must be > 0, got 0"),  # was silently 0.1
        (["--high", "inf"], "--high must be a finite number, got inf"),  # failed after a probe
        (["--low", "5", "--high", "2"], "--low must be below --high, got --low 5 and --high 2"),
        (["--low", "10"], "got --low 10 and --high 8"),
        (["-n", "0", "--protocol", "fixed"], "--num-requests (-n) must be >= 2 per seed, got 0"),  # was 1000
        (["--protocol", "fixed", "--low", "3"], "--low: --protocol fixed probes a fixed grid"),
        (["--protocol", "azure", "--attainment", "0.5"], "--attainment: --protocol azure"),
    ],
)
def test_goodput_refuses_bad_or_ignored_search_options_before_searching(args, needle):
    output = refused("goodput", "--seeds", "1", *args, needle=needle)
    assert "searching" not in output


def test_profile_refuses_a_bad_out_path_and_pp_before_writing(tmp_path):
    refused("profile", "-o", str(tmp_path), needle="is a folder; give the JSON file's path")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    refused("profile", "-o", str(blocker / "p.json"), needle=f"--out {blocker / 'p.json'}: cannot create")
    refused("profile", "--pp", "0", "-o", str(tmp_path / "p.json"), needle="--pp must be >= 1, got 0")
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("samples", ["0", "-5"])
def test_workloads_refuses_a_sample_count_below_one(samples):
    refused("workloads", "--samples", samples, needle=f"--samples must be in [1, 10,000,000], got {samples}")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--port", "70000"], "--port must be in 1..65535, got 70000"),
        (["--port", "0"], "--port must be in 1..65535, got 0"),  # was the default 8000
        (["--base-url", "http://127.0.0.1:99999"], "base_url 'http://127.0.0.1:99999': Port out of range"),
        (["--base-url", "http://[::1"], "Invalid IPv6 URL"),
        (["--replay-start", "5"], "apply to a replay (--replay) only"),
    ],
)
def test_bench_refuses_a_bad_address_or_an_ignored_option_before_connecting(args, needle):
    refused("bench", "-n", "2", *args, needle=needle)


def test_bench_checks_its_output_file_before_the_run(tmp_path):
    refused("bench", "--port", "9", "-n", "2", "-o", str(tmp_path), needle="is a folder")


def test_a_bench_config_without_a_host_is_refused():
    with pytest.raises(ValueError, match="names no host"):
        BenchConfig(base_url="http://")


def test_plan_names_a_layout_as_typed(tmp_path):
    refused("plan", "--gpus", "2", "--layouts", "xx", "-o", str(tmp_path), needle="--layouts: xx is not")


@pytest.mark.parametrize("value", ["inf", "nan", "1e308", "0"])
def test_a_gpu_datasheet_number_must_be_finite_and_positive(value):
    with pytest.raises(ValueError, match=f"GPU X: memory_gib must be a number in .*got {value}"):
        parse_gpu_datasheet(f"X:bf16_tflops=100,hbm_gbps=1000,memory_gib={value}")


# ------------------------------------------------------------------ trace and profile files


def test_a_trace_with_bytes_that_are_not_utf8_names_the_line_and_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes((HEADER + ROW).encode() + b"2023-11-16 18:15:47.0,\xff\xfe,44\n")
    with pytest.raises(WorkloadError, match=r"t.csv line 3: ContextTokens: not UTF-8 text \(byte 0xff\)"):
        read_azure_trace(path)


def test_a_field_over_the_csv_limit_names_the_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(HEADER + ROW + f'2023-11-16 18:15:47.0,374,"{"9" * 200_000}"\n')
    with pytest.raises(WorkloadError, match=r"t.csv line 3: row: not readable as CSV: field larger"):
        read_azure_trace(path)


def test_a_folder_given_as_a_trace_is_named_a_folder(tmp_path):
    refused("simulate", "--replay", str(tmp_path), "-o", str(tmp_path / "o"), needle="is a folder")


@pytest.fixture
def profile_dict() -> dict:
    return json.loads(resolve_profile("cpu_smollm2-135m_pp2").read_text())


def test_a_profile_that_is_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "p.json"
    path.write_bytes(b'{"name": "\xff"}')
    with pytest.raises(ProfileError, match=r"p.json: not UTF-8 text \(byte 0xff at offset 10\)"):
        load_profile(path)


def test_a_profile_max_context_below_two_names_the_field(tmp_path, profile_dict):
    profile_dict["model"]["max_context"] = 1
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile_dict))
    with pytest.raises(ProfileError, match=r"p.json: model.max_context: must be >= 2, got 1"):
        load_profile(path)


def test_a_profile_page_larger_than_its_kv_pool_names_the_field(tmp_path, profile_dict):
    profile_dict["page_size"] = profile_dict["kv_capacity_tokens"] + 1
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile_dict))
    with pytest.raises(ProfileError, match=r"p.json: page_size: .* is more than kv_capacity_tokens"):
        load_profile(path)


def test_a_folder_given_as_a_profile_is_named_a_folder(tmp_path):
    out = str(tmp_path / "o")
    refused("simulate", "-n", "5", "--profile", str(tmp_path), "-o", out, needle="is a folder")


# ------------------------------------------------------------------ sweep grid files


@pytest.mark.parametrize(
    "toml,needle",
    [
        ('num_requests = "ten"', "grid key 'num_requests': expected an integer, got str 'ten'"),
        ("seeds = 2.5", "grid key 'seeds': expected an integer or a list of them, got float 2.5"),
        ("profile = 5", "grid key 'profile': expected a string, got int 5"),
        ('deploy = ["pp4", 4]', "grid key 'deploy': expected a string or a list of them"),
        ("policy = 5", "grid key 'policy': expected a string"),
        ('slo_ttft_ms = "fast"', "grid key 'slo_ttft_ms': expected a number, got str 'fast'"),
        ('precision = "x"', "grid key 'precision': expected a number"),
        ("chunk_candidates = 5", "grid key 'chunk_candidates': expected a string such as"),
        ("rate = true", "grid key 'rate': expected a number or a list of them, got bool True"),
    ],
)
def test_a_grid_value_of_the_wrong_type_names_the_key(toml, needle, tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(toml + "\n")
    refused("sweep", "--executor", "serial", "--grid", str(grid), "-o", str(tmp_path / "o"), needle=needle)


def test_every_grid_key_has_a_type_to_check():
    """A key added to the grid files without a type here would fail the check with no message."""
    from fastpp.sim import sweep_grid as g

    typed = {*g._STRING_KEYS, *g._NUMBER_KEYS, *g._INTEGER_KEYS, *g._BOOL_KEYS, "chunk_candidates"}
    assert typed == set(g.GRID_KEYS)
    assert set(g._LIST_KEYS) <= typed


def test_a_grid_file_that_is_not_utf8_or_missing_is_named(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_bytes(b"rate = \xff\n")
    refused("sweep", "--grid", str(grid), needle=f"grid file {grid}: not UTF-8 text")
    refused("sweep", "--grid", str(tmp_path / "none.toml"), needle="none.toml: no such file")


@pytest.mark.parametrize(
    ("option", "text"),
    [
        ("-r", "1,,2"),
        ("--chunk", "256,"),
        ("-p", ",static:512"),
        ("-m", "Qwen2.5-32B,,"),
        ("--gpu", "A100,,H100"),
    ],
)
def test_a_sweep_axis_with_an_empty_item_is_refused_not_shortened(option, text):
    refused("sweep", option, text, needle=f"{text!r} has an empty item between its commas")


# ------------------------------------------------------------------ plot inputs


@pytest.fixture
def run_dir(tmp_path) -> Path:
    out = tmp_path / "sim"
    res = invoke("simulate", "-n", "20", "-d", "pp4", "--no-timeline", "-o", str(out))
    assert res.exit_code == 0, res.output
    return out


def test_plot_names_a_summary_that_is_not_utf8(run_dir):
    (run_dir / "summary.json").write_bytes(b"\xff\xfe")
    refused("plot", str(run_dir), needle="summary.json: not UTF-8 text (byte 0xff at offset 0)")


def test_plot_names_a_run_summary_that_is_not_json(run_dir):
    (run_dir / "pp4-static-2048" / "summary.json").write_text("{")
    refused("plot", str(run_dir), needle="pp4-static-2048/summary.json: not JSON")


def test_plot_names_the_short_row_of_an_iterations_table(run_dir):
    table = run_dir / "pp4-static-2048" / "iterations.csv"
    lines = table.read_text().count("\n")
    with table.open("a") as f:
        f.write("1,2,x\n")
    refused("plot", str(run_dir), needle=f"iterations.csv:{lines + 1}: row has 3 fields")


def test_plot_draws_a_run_in_which_no_request_finished(tmp_path):
    out = tmp_path / "sim"
    res = invoke("simulate", "-n", "20", "-d", "pp4", "--max-time", "0.01", "-o", str(out))
    assert res.exit_code == 0, res.output
    res = invoke("plot", str(out))
    assert res.exit_code == 0, res.output
    assert (out / "plots" / "cdf_ttft.png").is_file()


@pytest.mark.parametrize("value,needle", [("-1", "must be > 0, got -1"), ("inf", "must be a finite number")])
def test_plot_refuses_a_bad_slo_line(run_dir, value, needle):
    refused("plot", str(run_dir), "--slo-ttft-ms", value, needle=f"--slo-ttft-ms {needle}")

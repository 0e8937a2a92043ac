"""Inputs too large for memory, or too deep to parse, are refused up front with an error naming
the option, the field or the line: never a MemoryError or a RecursionError traceback (issue 27).
Each check sits where the value is consumed (fastpp.sim.limits, fastpp.workloads,
fastpp.length_files, fastpp.profile, fastpp.scheduler_config, fastpp.sim.goodput), so the
library and the CLI both get it."""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from fastpp.cli.app import app
from fastpp.cli.common import run_app
from fastpp.length_files import MAX_LENGTH_TOKENS, WorkloadError, read_azure_trace, read_length_csv
from fastpp.profile import ProfileError, load_profile
from fastpp.scheduler_config import MAX_CHUNK_CANDIDATES, parse_chunk_candidates
from fastpp.sim import limits
from fastpp.sim.goodput import MAX_FIRST_LOOK, first_look_length, probe_span_s, slo_goodput
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation
from fastpp.types import SLO, Request
from fastpp.workloads import MAX_REQUESTS, make_requests, poisson_arrivals

runner = CliRunner()


def _refused(match: str, call, *args, **kwargs) -> str:
    """``call`` raises a ValueError matching ``match`` within a second (no allocation first)."""
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=match) as info:
        call(*args, **kwargs)
    assert time.perf_counter() - t0 < 1.0
    return str(info.value)


# ------------------------------------------------------------------ the simulator's workload


def test_too_many_requests_are_refused_naming_the_option():
    message = _refused(r"10,000,000 requests \(-n, num_requests\)", WorkloadConfig, num_requests=10_000_000)
    assert f"at most {limits.MAX_REQUESTS:,}" in message and "200 GB" in message
    WorkloadConfig(num_requests=limits.MAX_REQUESTS)  # the cap itself is allowed


def test_a_duration_too_long_or_too_full_is_refused():
    _refused(r"--duration", WorkloadConfig, num_requests=None, duration_s=1e12)
    message = _refused(
        r"about 100,000,000 requests", WorkloadConfig, num_requests=None, duration_s=1e6, rate=100.0
    )
    assert "--duration" in message and "--rate" in message


def test_a_rate_that_spreads_few_requests_over_centuries_is_refused():
    message = _refused(
        r"20 requests \(-n\) at 1e-09 req/s \(--rate\)", WorkloadConfig, rate=1e-9, num_requests=20
    )
    assert "30 days" in message


def test_the_simulation_checks_the_requests_it_is_given():
    """A list a caller built (or a trace slowed by --replay-speed) is checked by the
    simulation itself, before anything runs."""
    spread = [Request(0, 0.0, 16, 4), Request(1, limits.MAX_SPAN_S * 2, 16, 4)]
    _refused(
        r"arrivals .* span 5\.18e\+06 s",
        run_simulation,
        WorkloadConfig(num_requests=2),
        DeploymentConfig(pp=2),
        requests=spread,
    )


def test_the_workload_generator_refuses_before_drawing():
    import numpy as np

    _refused(r"num_requests=20,000,000", make_requests, "azure-conv", seed=0, num_requests=2 * MAX_REQUESTS)
    _refused(
        r"duration_s=1e\+12 at rate=4 req/s", poisson_arrivals, 4.0, np.random.default_rng(0), duration_s=1e12
    )
    _refused(r"duration_s", make_requests, "azure-conv", seed=0, rate=4.0, duration_s=1e12)


# ------------------------------------------------------------------ chunk candidates


def test_a_huge_chunk_candidate_range_is_refused_before_it_is_built():
    _refused(rf"more than {MAX_CHUNK_CANDIDATES:,} values", parse_chunk_candidates, "1:1000000000:1")
    _refused(r"more than", parse_chunk_candidates, f"1:{10**30}:1")
    _refused(
        r"chunk_candidates \(--chunk-candidates\)",
        DeploymentConfig,
        chunk_candidates=tuple(range(1, MAX_CHUNK_CANDIDATES + 2)),
    )
    assert len(parse_chunk_candidates(f"1:{MAX_CHUNK_CANDIDATES}:1")) == MAX_CHUNK_CANDIDATES


# ------------------------------------------------------------------ goodput probes


def test_a_lax_tpot_slo_does_not_grow_the_probes_without_bound():
    span = probe_span_s(WorkloadConfig(), SLO(2.0, 1e6))  # --slo-tpot-ms 1e9
    assert span > 1e8  # the length rule alone would ask for hundreds of millions of requests
    assert first_look_length(span, 2.0) == MAX_FIRST_LOOK
    assert first_look_length(float("inf"), 2.0) == MAX_FIRST_LOOK
    assert first_look_length(120.0, 2.0) == 300  # the usual rule is unchanged
    _refused(
        r"num_requests \(-n\) must be in \[2, 100,000\]",
        slo_goodput,
        WorkloadConfig(),
        DeploymentConfig(),
        num_requests=10**7,
    )


# ------------------------------------------------------------------ trace files


def _trace(tmp_path, *rows: str):
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("length", ["1" + "0" * 30, "9" * 5000, str(MAX_LENGTH_TOKENS + 1)])
def test_an_absurd_length_names_the_line_and_column(tmp_path, length):
    path = _trace(tmp_path, "2023-11-16 18:15:46.6805900,100,10", f"2023-11-16 18:15:47.6805900,{length},10")
    with pytest.raises(WorkloadError, match=r"trace\.csv line 3: ContextTokens: .* tokens is more") as e:
        read_azure_trace(path)
    assert (e.value.line, e.value.column) == (3, "ContextTokens")
    lengths = tmp_path / "lengths.csv"
    lengths.write_text(f"num_prefill_tokens,num_decode_tokens\n10,{length}\n")
    with pytest.raises(WorkloadError, match=r"line 2: num_decode_tokens"):
        read_length_csv(lengths)
    assert len(read_length_csv(_lengths(tmp_path, MAX_LENGTH_TOKENS))) == 1  # the cap itself


def _lengths(tmp_path, n: int):
    path = tmp_path / "ok.csv"
    path.write_text(f"num_prefill_tokens,num_decode_tokens\n{n},0000000000007\n")
    return path


def test_a_trace_spanning_centuries_names_the_line(tmp_path):
    path = _trace(
        tmp_path,
        "1700-01-01 00:00:00.0000000,100,10",
        "1700-01-01 00:00:01.0000000,100,10",
        "2023-11-16 18:15:47.6805900,100,10",
    )
    with pytest.raises(
        WorkloadError,
        match=r"line 4: TIMESTAMP: .* 324 years after the first "
        r"row's; a trace spans at most 292 years",
    ):
        read_azure_trace(path)


# ------------------------------------------------------------------ profile files


@pytest.mark.parametrize(
    ("nested", "where"),
    [
        ("[" * 100_000 + "]" * 100_000, "line 1, column 65"),
        ('{"a":' * 100_000 + "1" + "}" * 100_000, "line 1, column 321"),
        # brackets inside strings do not count; the line is where the 65th level opens
        ('{"x": "[[[[[[[[",\n"y": ' + '{"a":' * 3000 + "1" + "}" * 3001, "line 2, column 321"),
    ],
)
def test_a_deeply_nested_profile_names_the_file_and_line(tmp_path, nested, where):
    path = tmp_path / "deep.json"
    path.write_text(nested)
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    assert str(e.value) == f"deep.json: nested more than 64 levels deep at {where}"


# ------------------------------------------------------------------ the command line


def test_the_cli_prints_the_refusal_without_a_traceback(tmp_path):
    for args in (
        ["simulate", "-n", "10000000", "-d", "pp4"],
        ["simulate", "-r", "1e-9", "-n", "20", "-d", "pp4"],
        ["simulate", "--duration", "1e12", "-d", "pp4"],
        ["simulate", "--chunk-candidates", "1:1000000000:1", "-d", "pp4@predictive"],
    ):
        done = runner.invoke(app, [*args, "-o", str(tmp_path / "run")])
        assert done.exit_code == 2, (args, done.output)
        assert "error:" in done.output and "Traceback" not in done.output
        assert done.exception is None or isinstance(done.exception, SystemExit)


def test_a_memory_error_no_check_caught_is_one_line(capsys):
    def app_that_runs_out() -> None:
        raise MemoryError

    def app_too_deep() -> None:
        raise RecursionError("maximum recursion depth exceeded")

    for broken, words in ((app_that_runs_out, "out of memory"), (app_too_deep, "nested too deeply")):
        with pytest.raises(SystemExit) as stop:
            run_app(broken)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2

"""Goodput under the paper's protocol (fastpp.sim.goodput_fixed): presets, the grid walk, the
refinement, and the CLI's --protocol option."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fastpp.cli.app import app
from fastpp.sim.goodput import judge_records
from fastpp.sim.goodput_fixed import PRESETS, FixedProtocol, fixed_goodput, parse_protocol
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation

WL = WorkloadConfig(name="cnn-dailymail-synthetic")
DEP = DeploymentConfig(model="Qwen2.5-14B", pp=2, policy="static:512")


def test_presets_are_the_papers_settings():
    assert PRESETS["azure"].num_requests == 400 and PRESETS["cnn-reversed"].num_requests == 1000
    assert PRESETS["azure"].rates == tuple(float(r) for r in range(1, 12))
    assert parse_protocol("steady", None) is None
    assert parse_protocol("fixed", 250) == FixedProtocol(250)
    assert parse_protocol("azure", 100).num_requests == 100  # -n overrides the preset's N
    with pytest.raises(ValueError, match="known: steady, fixed, azure, cnn-reversed"):
        parse_protocol("paper", None)
    with pytest.raises(ValueError, match="ascending"):
        FixedProtocol(10, (2.0, 1.0))


def test_goodput_is_the_last_grid_rate_before_the_first_failure():
    protocol = FixedProtocol(120, (2.0, 4.0, 8.0, 16.0, 32.0, 64.0))
    res = fixed_goodput(WL, DEP, protocol, seeds=(0,))
    rates = [p.rate for p in res.probes]
    assert rates == list(protocol.rates[: len(rates)])  # ascending, stopped at the first failure
    assert all(p.ok for p in res.probes[:-1]) and not res.probes[-1].ok
    assert res.rate == rates[-2] and res.margin == rates[-1] - rates[-2]
    # every probe is one fixed run of N requests judged on the P90s alone
    run = run_simulation(
        WorkloadConfig(name=WL.name, rate=rates[-1], num_requests=120, seed=0), DEP, record_iterations=False
    )
    again = judge_records([run.result.records], DEP.slo, rate=rates[-1], require_steady=False)
    assert again.ok == res.probes[-1].ok
    assert again.metrics["p90_ttft_ms"] == pytest.approx(res.probes[-1].metrics["p90_ttft_ms"])


def test_precision_bisects_inside_the_grid_bracket():
    protocol = FixedProtocol(120, (2.0, 4.0, 8.0, 16.0, 32.0, 64.0))
    coarse = fixed_goodput(WL, DEP, protocol, seeds=(0,))
    fine = fixed_goodput(WL, DEP, protocol, seeds=(0,), precision=0.5)
    assert coarse.rate <= fine.rate < coarse.rate + coarse.margin
    assert fine.margin < 0.5
    ok = [p.rate for p in fine.probes if p.ok]
    assert fine.rate == max(ok) and all(r < min(p.rate for p in fine.probes if not p.ok) for r in ok)


def test_the_cli_protocol_option():
    runner = CliRunner()
    res = runner.invoke(
        app,
        [
            "goodput",
            "-w",
            WL.name,
            "-m",
            "Qwen2.5-14B",
            "-d",
            "pp2@static:512",
            "--protocol",
            "fixed",
            "-n",
            "120",
            "--seeds",
            "1",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    (result,) = json.loads(res.stdout)
    assert "fixed runs of 120 requests" in result["criterion"]
    assert result["goodput"] == fixed_goodput(WL, DEP, FixedProtocol(120), seeds=(0,)).rate
    bad = runner.invoke(app, ["goodput", "--protocol", "nope"])
    assert bad.exit_code != 0 and "unknown goodput protocol" in bad.output

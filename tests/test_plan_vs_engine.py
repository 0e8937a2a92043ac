"""benchmarks/plan_vs_engine.py's pure helpers: the real goodput search fed fake measurements,
ranks, pair agreement, errors and the table (no engine, no bench)."""

from __future__ import annotations

import pytest

from conftest import REPO_ROOT, script_module
from fastpp.sim.goodput import ProbeResult
from fastpp.sim.plan_candidates import Layout, PolicyGrid


@pytest.fixture(scope="module")
def pve():
    with script_module(REPO_ROOT / "benchmarks" / "plan_vs_engine.py") as module:
        yield module


def threshold_probe(goodput: float, seen: list[float]):
    """A deployment that meets the SLO up to ``goodput`` req/s (a fake bench + verdict)."""

    def probe(rate: float) -> ProbeResult:
        seen.append(rate)
        return ProbeResult(rate, rate <= goodput, reason="" if rate <= goodput else "P90 TTFT")

    return probe


@pytest.mark.parametrize("predicted", [3.5, 2.0, 6.0, 12.0, None, 0.0])
def test_search_finds_the_measured_goodput_from_any_prediction(pve, predicted):
    seen: list[float] = []
    res = pve.search_measured(
        threshold_probe(3.3, seen), predicted, spread=0.2, precision=0.2, max_probes=16, fallback=(0.5, 1.0)
    )
    assert res.rate <= 3.3 < res.rate + res.margin
    assert res.margin < 0.2
    assert len(seen) == len(res.probes) <= 16


def test_search_starts_around_the_prediction(pve):
    seen: list[float] = []
    pve.search_measured(threshold_probe(4.1, seen), 4.0, spread=0.25, precision=0.1, max_probes=8)
    assert seen[:2] == pytest.approx([3.0, 5.0])  # low passes, high fails: bisection between
    assert all(3.0 <= r <= 5.0 for r in seen)


def test_search_stops_at_the_probe_budget(pve):
    seen: list[float] = []
    res = pve.search_measured(threshold_probe(3.3, seen), 4.0, spread=0.2, precision=0.01, max_probes=3)
    assert len(seen) == 3
    assert res.rate <= 3.3 < res.rate + res.margin
    assert any("probe budget" in n for n in res.notes)


def test_search_reports_zero_when_nothing_passes(pve):
    res = pve.search_measured(threshold_probe(0.0, []), 2.0, spread=0.2, precision=0.1, max_probes=16)
    assert res.rate == 0.0 and res.reason


def test_bracket(pve):
    assert pve.search_bracket(4.0, 0.25, (0.5, 1.0)) == pytest.approx((3.0, 5.0))
    assert pve.search_bracket(None, 0.25, (0.5, 1.0)) == (0.5, 1.0)
    assert pve.search_bracket(0.0, 0.25, (0.5, 1.0)) == (0.5, 1.0)
    with pytest.raises(ValueError, match="spread"):
        pve.search_bracket(4.0, 1.0, (0.5, 1.0))


def test_ranks_share_ties_and_skip_missing(pve):
    assert pve.ranks([4.0, 2.0, 4.0, None, 1.0]) == [1, 3, 1, None, 4]


def test_pair_agreement(pve):
    assert pve.pair_agreement([3.0, 2.0, 1.0], [30.0, 20.0, 10.0]) == (3, 3)
    assert pve.pair_agreement([1.0, 2.0, 3.0], [30.0, 20.0, 10.0]) == (0, 3)
    # equal measurements order nothing; a predicted tie where they differ does not agree
    assert pve.pair_agreement([2.0, 2.0, 1.0], [3.0, 3.0, 1.0]) == (2, 2)
    assert pve.pair_agreement([2.0, 2.0], [3.0, 1.0]) == (0, 1)
    assert pve.pair_agreement([2.0, None], [3.0, 1.0]) == (0, 0)


def test_relative_error(pve):
    assert pve.relative_error(5.0, 4.0) == pytest.approx(0.25)
    assert pve.relative_error(3.0, 4.0) == pytest.approx(-0.25)
    assert pve.relative_error(3.0, 0.0) is None
    assert pve.relative_error(None, 4.0) is None


def test_table(pve):
    rows = [
        {
            "deployment": "pp1/t2",
            "policy": "static:256",
            "predicted": 5.0,
            "measured": 4.0,
            "predicted_margin": 0.1,
            "measured_margin": 0.15,
        },
        {
            "deployment": "pp2/t1",
            "policy": "predictive",
            "predicted": 6.0,
            "measured": 3.0,
            "predicted_margin": 0.1,
            "measured_margin": float("inf"),
        },
        {
            "deployment": "pp2/t1",
            "policy": "static:256",
            "predicted": 1.0,
            "measured": 0.0,
            "predicted_margin": 0.1,
            "measured_margin": 0.5,
        },
    ]
    lines = pve.table_rows(rows)
    assert lines[2] == "| pp1/t2 | static:256 | 5.00 (+0.10) | 4.00 (+0.15) | +25% | 2 | 1 |"
    assert lines[3] == "| pp2/t1 | predictive | 6.00 (+0.10) | 3.00 | +100% | 1 | 2 |"
    assert lines[4] == "| pp2/t1 | static:256 | 1.00 (+0.10) | 0.00 (+0.50) | n/a | 3 | 3 |"


def test_deployments(pve):
    assert pve.parse_deployments("pp1/t2, pp2") == [pve.CpuDeployment(1, 2), pve.CpuDeployment(2, 1)]
    assert pve.CpuDeployment(2, 1).label == "pp2/t1"
    for bad in ("tp2", "pp2/tx", "pp0", ""):
        with pytest.raises(ValueError):
            pve.parse_deployments(bad)
    with pytest.raises(ValueError, match="one per pp"):
        pve.parse_deployments("pp2/t1,pp2/t2")


def test_planner_gets_exactly_the_policies_given(pve):
    grid = PolicyGrid.parse(pve.planner_policies(["static:256", "predictive", "greedy+ds"]))
    assert grid.for_layout(Layout(1, 1, 2)) == ["static:256", "predictive", "greedy+ds"]
    assert grid.for_layout(Layout(1, 1, 1)) == ["static:256", "predictive"]  # no +ds on one stage


def test_finite_makes_strict_json(pve):
    assert pve.finite({"a": [1.0, float("inf")], "b": (float("nan"),), "c": "x"}) == {
        "a": [1.0, None],
        "b": [None],
        "c": "x",
    }


def test_simulated_twin_is_the_planners_probe(pve):
    """The twin of a real probe judges what the plan judged: at the plan's goodput it passes, at
    the lowest rate the plan saw fail (goodput + margin) it fails."""
    import argparse

    config = {"workload": "random:64:16:0.5", "slo_ttft_ms": 1000.0, "slo_tpot_ms": 200.0}
    config |= {"num_requests": 40, "seeds": [0]}
    args = argparse.Namespace(policies=["static:256"], precision=0.5, **config)
    predicted = pve.predict(pve.CpuDeployment(2, 1), "cpu_smollm2-135m_pp2", args)["static:256"]
    assert predicted["goodput"] > 0
    at = pve.simulate_probe("cpu_smollm2-135m_pp2", "static:256", predicted["goodput"], config)
    above = pve.simulate_probe(
        "cpu_smollm2-135m_pp2", "static:256", predicted["goodput"] + predicted["margin"], config
    )
    assert at["ok"] and not above["ok"]


def test_report_renders_rows_and_probes(pve):
    probe = {"rate": 2.0, "ok": False, "p90_ttft_ms": None, "p90_tpot_ms": 150.0, "load_average_after": 1.5}
    probe["simulated"] = {"ok": True, "p90_ttft_ms": 400.0, "p90_tpot_ms": 120.0}
    out = {
        "config": {"workload": "random:64:16:0.5", "slo_ttft_ms": 1000.0, "slo_tpot_ms": 200.0},
        "rows": [
            {
                "deployment": "pp2/t1",
                "policy": "static:256",
                "predicted": 2.5,
                "measured": 1.0,
                "predicted_margin": 0.1,
                "measured_margin": 0.2,
                "real": {"probes": [probe]},
            },
        ],
        "ranks": {"pairs": 0, "pairs_agreeing": 0},
        "load_average_before": [1.0, 1.1, 1.2],
        "load_average_after": [1.5, 1.4, 1.3],
        "wall_s": 12.0,
    }
    out["config"] |= {"num_requests": 40, "seeds": [0]}
    text = pve.report(out)
    assert "| pp2/t1 | static:256 | 2.50 (+0.10) | 1.00 (+0.20) | +150% | 1 | 1 |" in text
    assert "| pp2/t1 | static:256 | 2.00 | inf / 400 | 150 / 120 | fail / pass | 1.50 |" in text
    assert "before 1.00 / 1.10" in text and "after 1.50 / 1.40" in text

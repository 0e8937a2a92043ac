"""scripts/make_results.py's plumbing (the experiments themselves take an hour): every grid goes
through one background pool and comes back as its own sweep would; report parts come out in
section order whatever order they were added in."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from fastpp.sim.sweep import SerialExecutor, SweepGrid, run_sweep

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_results.py"
TINY = dict(
    workloads=("cnn-dailymail-synthetic",),
    models=("Qwen2.5-14B",),
    num_requests=40,
    metric="goodput",
    precision=4.0,
    seeds=(0,),
    steady=False,  # the plumbing is under test, not the search: 0.2 s a point instead of 5 s
)


@pytest.fixture
def script(monkeypatch):
    """The script as the module ``make_results``, importable by the pool's spawned workers
    (they take this process's sys.path), as it is when run as a script."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("make_results", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "make_results", module)
    spec.loader.exec_module(module)
    return module


def test_background_sweeps_give_each_grid_its_own_rows(tmp_path, monkeypatch, script):
    grids = {
        "a": SweepGrid(**TINY, deployments=("pp2@static:512",)),
        "b": SweepGrid(**TINY, deployments=("pp2@static:512", "tp2@static:2048")),
    }
    monkeypatch.setattr(script, "sweep_grids", lambda: grids)
    sweeps = script.SweepsInBackground(tmp_path / "cache", workers=1)
    sweeps.start()
    for name, grid in grids.items():
        alone = run_sweep(grid, tmp_path / "alone" / name, SerialExecutor()).rows
        assert sweeps.rows(name) == alone


def test_a_failed_sweep_is_raised_where_its_rows_are_asked_for(tmp_path, monkeypatch, script):
    grids = {"a": SweepGrid(**TINY, deployments=("pp2@static:512",))}
    monkeypatch.setattr(script, "sweep_grids", lambda: grids)

    def broken(*args, **kwargs):
        raise ValueError("a point failed")

    monkeypatch.setattr(script, "execute_plans", broken)
    sweeps = script.SweepsInBackground(tmp_path, workers=1)
    sweeps.start()
    with pytest.raises(RuntimeError, match="a point failed"):
        sweeps.rows("a")


def test_report_parts_come_out_in_section_order(tmp_path, script):
    rep = script.Report(tmp_path)
    rep.add(5, "## 5. five")
    rep.add(1, "## 1. one")
    rep.add(2, "## 2. two")
    rep.add(1, "one, continued")
    assert rep.text() == "## 1. one\n\none, continued\n\n## 2. two\n\n## 5. five\n"


def test_each_point_s_cpu_time_is_kept_and_rerun_drops_only_the_named_policy(tmp_path, monkeypatch, script):
    grids = {"a": SweepGrid(**TINY, deployments=("pp2@static:512", "pp2@greedy", "pp2@greedy+ds"))}
    monkeypatch.setattr(script, "sweep_grids", lambda: grids)
    sweeps = script.SweepsInBackground(tmp_path, workers=1)
    sweeps.start()
    sweeps.rows("a")
    cpu = json.loads((tmp_path / "point_cpu.json").read_text())
    assert set(cpu) == sweeps.point_ids and all(v > 0 for v in cpu.values())
    assert sweeps.cpu_of_all_points() == (pytest.approx(sum(cpu.values())), 0)
    assert script.drop_cached(tmp_path, ["greedy"]) == 2
    again = script.SweepsInBackground(tmp_path, workers=1)
    assert [p.policy for p in again.plans["a"].todo] == ["greedy", "greedy+ds"]
    assert again.num_todo == 2 and len(again.point_ids) == 3


def test_bursty_section_names_the_best_static_chunk_and_who_falls_behind(tmp_path, script):
    chunks, cvs = script.BURSTY_CHUNKS, script.BURSTY_CVS
    found = {
        ("Qwen2.5-32B", "azure-conv"): {
            "static": {c: 6.0 + (c == 384) for c in chunks},
            "pp4@predictive": 7.0,
            "pp4@slack": 7.5,  # 7% ahead of the best static chunk (384: 7.0)
        }
    }
    bursty = {}
    for cv in cvs:  # the best chunk grows with cv (the last one: 1024); slack falls behind
        best = chunks[-1] if cv == cvs[-1] else 512
        bursty.update({(cv, f"static:{c}"): 4.0 + (c == best) for c in chunks})
        bursty[(cv, "predictive")] = 5.0
        bursty[(cv, "slack")] = 4.5 if cv == cvs[-1] else 5.0
    rep = script.Report(tmp_path)
    script.bursty_section(rep, bursty, found)
    text = " ".join(rep.text().split())
    assert "| 1 (Poisson, section 1) | 7.00 (C=384) | 7.00 (+0.0%) | 7.50 (+7.1%) |" in text
    assert f"(C = 384, 512, {chunks[-1]} at cv 1, 2, 4)" in text
    assert f"below the best static chunk: slack at cv {cvs[-1]:g} (4.50 vs 5.00)" in text
    assert "At least 5% ahead: slack at cv 1 (+7.1%)." in text


def test_overload_words_name_the_worst_gap_and_what_five_percent_would_take(script):
    from fastpp.sim.overload import OverloadThroughput

    def t(rate: float) -> OverloadThroughput:
        return OverloadThroughput(rate, (10.0, 20.0), 0.0, 100)

    found = {
        ("M", "a"): {"best_goodput": 9.0, "pp4@slack": 9.0},
        ("M", "b"): {"best_goodput": 4.0, "pp4@slack": 4.0},
    }
    out = {
        ("M", "a"): {
            "best": 384,
            "cells": {"static:384": (t(10), t(10)), "predictive": (t(9), t(10)), "slack": (t(10), t(10.5))},
        },
        ("M", "b"): {
            "best": 128,
            "cells": {"static:128": (t(5), t(5)), "predictive": (t(5), t(5)), "slack": (t(4.5), t(4.2))},
        },
    }
    text = script.overload_words(out, found)
    assert "predictive -10.0% (M a, backlog); slack -16.0% (M b, overload)" in text
    assert "goodput is 80%..90% of its throughput under overload" in text
    # 1.05 x 9 / 10.5 = 90% (M a) and 1.05 x 4 / 4.2 = 100% (M b)
    assert "at least 90% of slack's overload throughput (M a), and 100% where it is most" in text

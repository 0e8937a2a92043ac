"""Sweep points under the paper's fixed-run protocol (``protocol``): the same answer as
``fixed_goodput`` called directly, ids of their own, steady-state ids and rows unchanged, and
bad settings named before any work."""

from __future__ import annotations

import pytest

from fastpp.sim.goodput_fixed import PRESETS, FixedProtocol, fixed_goodput
from fastpp.sim.sweep import SerialExecutor, SweepGrid, run_sweep

TINY = dict(
    workloads=("cnn-dailymail-synthetic",),
    models=("Qwen2.5-14B",),
    deployments=("pp2@static:512",),
    metric="goodput",
    precision=2.0,
    seeds=(0,),
)


def test_a_fixed_protocol_point_answers_as_fixed_goodput(tmp_path):
    grid = SweepGrid(
        **{**TINY, "workloads": ("azure-conv",)}, num_requests=30, slo_scales=(0.25,), protocol="azure"
    )
    (row,) = run_sweep(grid, tmp_path, SerialExecutor()).rows
    (point,), _ = grid.expand()
    direct = fixed_goodput(
        point.workload_config(),
        point.deployment_config(),
        FixedProtocol(num_requests=30, rates=PRESETS["azure"].rates),
        seeds=(0,),
        precision=2.0,
    )
    assert 0 < row["goodput"] == direct.rate < 11 and row["margin"] == direct.margin < 2.0
    assert row["num_probes"] == len(direct.probes) and row["protocol"] == "azure"


def test_protocol_gives_its_own_id_and_leaves_steady_points_as_they_were():
    (steady,), _ = SweepGrid(**TINY).expand()
    (azure,), _ = SweepGrid(**TINY, protocol="azure").expand()
    (cnnr,), _ = SweepGrid(**TINY, protocol="cnn-reversed").expand()
    assert len({steady.point_id, azure.point_id, cnnr.point_id}) == 3
    assert "protocol" not in steady.axes() and azure.axes()["protocol"] == "azure"
    # steady-state ids as they were before the protocol field (existing caches stay valid)
    assert steady.point_id == "77af9e51d768560e"
    best = dict(TINY, metric="best-static", deployments=("pp2",), chunks=(256, 512))
    assert SweepGrid(**best).expand()[1][0].point_id == "60c5b629402ded96"


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"protocol": "paper"}, "unknown goodput protocol 'paper'"),
        ({"protocol": "steady"}, "leave it unset"),
        ({"protocol": "azure", "steady": False}, "no steady-queue rule"),
        ({"protocol": "azure", "metric": "simulate", "precision": None}, "protocol applies to metrics"),
    ],
)
def test_bad_protocol_settings_are_named(kwargs, named):
    with pytest.raises(ValueError, match=named):
        SweepGrid(**{**TINY, **kwargs})

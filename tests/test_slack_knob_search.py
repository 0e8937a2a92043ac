"""benchmarks/slack_knob_search.py's draws and how it sets them on a policy (no replay run)."""

from __future__ import annotations

import random

import pytest

from conftest import REPO_ROOT, script_module
from fastpp.policies.slack import SlackPolicy
from fastpp.sim.run import DeploymentConfig


@pytest.fixture(scope="module")
def search():
    with script_module(REPO_ROOT / "benchmarks" / "slack_knob_search.py") as module:
        yield module


def test_every_draw_is_a_valid_configuration_set_on_both_configs(search):
    profile = DeploymentConfig(model="Qwen2.5-32B", policy="slack").load_profile()
    rng = random.Random(0)
    for _ in range(200):
        knobs = search.draw(rng)
        assert set(knobs) == set(search.SPACE)
        assert all(search.SPACE[k][0] <= v <= search.SPACE[k][1] for k, v in knobs.items())
        policy = SlackPolicy.from_profile(profile)
        overhead = policy.config.round_overhead_s
        search.configure(policy, knobs)  # SlackConfig and PredictiveConfig check their values
        assert policy.slack.deadline_ratio == knobs["deadline_ratio"]
        assert policy.config.kv_bound_tpot_coeff == knobs["kv_bound_tpot_coeff"]
        assert policy.config.round_overhead_s == overhead  # the profile's, kept


def test_the_draws_are_the_seeds(search):
    first = [search.draw(random.Random(7)) for _ in range(2)]
    assert first[0] == first[1]
    assert search.draw(random.Random(8)) != first[0]


def test_a_steady_point_names_model_workload_and_rate(search):
    assert search.parse_steady("Qwen2.5-14B:azure-conv:13.5") == ("Qwen2.5-14B", "azure-conv", 13.5)
    with pytest.raises(ValueError):
        search.parse_steady("Qwen2.5-14B:azure-conv")

"""SchedulerConfig.admission_reserve and .retraction: whose remaining output the admission
reserve counts, and which request a KV shortage retracts and where it waits again."""

from __future__ import annotations

import pytest

from conftest import FakeClock, make_scheduler
from fastpp.scheduler_config import SchedulerConfig
from fastpp.types import Request


def run_round(sched, clock):
    plan = None
    for slot in range(sched.config.num_slots):
        if sched.is_slot_free(slot):
            p = sched.schedule(slot)
            if p is not None:
                clock.t += 0.01
                sched.update(p)
                plan = plan or p
    return plan


@pytest.mark.parametrize(("mode", "admitted"), [("all", False), ("slot", True)])
def test_the_slot_reserve_ignores_the_other_slots_remaining_output(mode, admitted):
    clock = FakeClock()
    sched = make_scheduler(
        clock,
        num_slots=2,
        kv_capacity_tokens=1000,
        default_chunk=1024,
        max_context=4096,
        new_token_ratio=0.5,
        admission_reserve=mode,
    )
    sched.add_request(Request(0, 0.0, 100, 800))  # decodes in slot 0, 800 tokens to go
    sched.update(sched.schedule(0))
    assert sched.view.num_running(0) == 1
    sched.add_request(Request(1, 0.0, 600, 10))
    plan = sched.schedule(1)  # slot 1 has no decodes of its own
    # "all": reserve 0.5 x 799 = 399 tokens, free ~899: 600 does not fit; "slot": reserve 0
    assert bool(plan is not None and any(c.req_id == 1 for c in plan.prefill)) is admitted


def _retract_once(mode):
    clock = FakeClock()
    sched = make_scheduler(
        clock, num_slots=1, kv_capacity_tokens=96, default_chunk=256, new_token_ratio=0.0, retraction=mode
    )
    sched.add_request(Request(0, 0.0, 30, 40))
    run_round(sched, clock)
    for _ in range(5):  # request 0 is 5 tokens ahead when request 1 joins
        run_round(sched, clock)
    sched.add_request(Request(1, clock.t, 20, 40))
    run_round(sched, clock)
    sched.add_request(Request(2, clock.t, 80, 5))  # waits: it does not fit beside 0 and 1
    while not sched.stats().num_retractions:
        run_round(sched, clock)
    return sched


def test_newest_front_retracts_the_newest_admitted_to_the_front():
    sched = _retract_once("newest_front")
    waiting = [r.req_id for r in sched.view.iter_waiting()]
    assert waiting[0] == 1 and 2 in waiting  # 1 (newest admitted) ahead of 2


def test_fewest_output_back_retracts_the_shortest_output_to_the_back():
    sched = _retract_once("fewest_output_back")
    waiting = [r.req_id for r in sched.view.iter_waiting()]
    assert waiting[-1] == 1 and waiting.index(2) < waiting.index(1)


def test_victim_order_prefers_fewest_generated_then_longest_prompt():
    clock = FakeClock()
    sched = make_scheduler(clock, retraction="fewest_output_back")

    class Live:  # the fields the key reads
        def __init__(self, generated, prompt, seq):
            self.rec = type("Rec", (), {"num_generated": generated})()
            self.prompt_len, self.admit_seq = prompt, seq

    lives = [Live(5, 10, 0), Live(2, 10, 1), Live(2, 30, 2), Live(9, 99, 3)]
    assert max(lives, key=sched._victim_order) is lives[2]
    newest = make_scheduler(clock)
    assert max(lives, key=newest._victim_order) is lives[3]


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="admission_reserve"):
        SchedulerConfig(num_slots=1, kv_capacity_tokens=10, admission_reserve="some")
    with pytest.raises(ValueError, match="retraction"):
        SchedulerConfig(num_slots=1, kv_capacity_tokens=10, retraction="oldest")


def test_a_deployment_carries_both_options_to_its_scheduler_summary_and_sweep_point():
    from dataclasses import replace

    from fastpp.sim.run import DeploymentConfig, WorkloadConfig, build_scheduler, run_simulation
    from fastpp.sim.sweep_grid import SweepGrid, grid_from_mapping

    base = DeploymentConfig(model="Qwen2.5-14B", pp=2, policy="predictive+ds")
    chosen = replace(base, admission_reserve="all", retraction="fewest_output_back")
    config = build_scheduler(chosen.load_profile(), chosen).config
    assert (config.admission_reserve, config.retraction) == ("all", "fewest_output_back")
    run = run_simulation(WorkloadConfig(name="cnn-reversed-synthetic", rate=4.0, num_requests=20), chosen)
    assert (run.summary["admission_reserve"], run.summary["retraction"]) == ("all", "fewest_output_back")
    assert run.summary["completed"] == 20
    # a sweep point: the default (slot) stays out of the id; all is another point
    plain = SweepGrid(metric="simulate", rates=(1.0,)).expand()[0][0]
    same = SweepGrid(metric="simulate", rates=(1.0,), admission_reserve="slot").expand()[0][0]
    other = grid_from_mapping({"admission": "all", "rate": [1.0]}).expand()[0][0]
    assert plain.point_id == same.point_id != other.point_id
    assert plain.deployment_config().admission_reserve == "slot"
    assert other.deployment_config().admission_reserve == "all"
    assert other.axes()["admission_reserve"] == "all" and "admission_reserve" not in plain.axes()
    with pytest.raises(ValueError, match="--admission"):
        DeploymentConfig(admission_reserve="lazy")
    with pytest.raises(ValueError, match="retraction must be one of"):
        SweepGrid(metric="simulate", retraction="oldest")


def test_the_cli_names_a_bad_admission_or_retraction():
    from typer.testing import CliRunner

    from fastpp.cli.app import app

    for flag, value in (("--admission", "lazy"), ("--retraction", "oldest")):
        bad = CliRunner().invoke(app, ["simulate", "-n", "5", flag, value])
        assert bad.exit_code != 0 and value in bad.output and flag.lstrip("-") in bad.output

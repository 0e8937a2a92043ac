"""The deployment planner's parts: layouts and memory fit (with the reasons a layout is left
out), the policy grid, the capacity bound (an upper bound on what any simulated run serves),
the config.json model loader and GPUs given by datasheet numbers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastpp.sim.analytic import analytic_profile
from fastpp.sim.hardware import calibration_note, get_gpu, is_calibrated, resolve_gpu
from fastpp.sim.models import get_model, resolve_model
from fastpp.sim.plan_bound import RequestLengths, capacity_bound
from fastpp.sim.plan_candidates import (
    DeploymentCandidate,
    Layout,
    PolicyGrid,
    enumerate_layouts,
    shape_problem,
)
from fastpp.sim.plan_job import binding_from_reason
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation

DATA = Path(__file__).parent / "data"
A100 = get_gpu("A100-40GB-PCIe")


def test_layouts_of_32b_on_four_a100_40gb_fit_but_one_gpu_replicas():
    fits, excluded = enumerate_layouts(get_model("Qwen2.5-32B"), A100, 4, min_kv_tokens=4609)
    assert {f.layout.key for f in fits} == {"pp4", "tp4", "pp2tp2", "dp2pp2", "dp2tp2"}
    assert [e.layout.key for e in excluded] == ["dp4"]
    assert excluded[0].reason.startswith("weights do not fit: stage 0 (64 layers over tp 1)")
    assert all(f.layout.num_gpus == 4 for f in fits)
    pp4 = next(f for f in fits if f.layout.key == "pp4")
    assert pp4.kv_capacity_tokens == analytic_profile("Qwen2.5-32B", A100, 4, 1).kv_capacity_tokens


def test_a_kv_pool_smaller_than_the_p99_request_excludes_the_layout():
    fits, excluded = enumerate_layouts(get_model("Qwen2.5-32B"), A100, 4, min_kv_tokens=100_000)
    reasons = {e.layout.key: e.reason for e in excluded}
    assert set(reasons) == {"dp4", "dp2pp2", "dp2tp2"}  # one-pipeline-of-two pools: ~37k tokens
    assert "smaller than the workload's P99 request (100,000 tokens)" in reasons["dp2pp2"]
    assert {f.layout.key for f in fits} == {"pp4", "tp4", "pp2tp2"}


def test_shape_rules_name_the_split_that_fails():
    llama8b = get_model("Llama-3.1-8B")
    assert shape_problem(llama8b, tp=16, pp=1) == "tp 16 does not divide the 8 KV heads"
    assert shape_problem(llama8b, tp=1, pp=64) == "pp 64 > 32 layers"
    assert shape_problem(get_model("SmolLM2-135M"), tp=2, pp=1) == "tp 2 does not divide the 3 KV heads"
    _, excluded = enumerate_layouts(llama8b, get_gpu("H100"), 64, min_kv_tokens=1)
    assert any(e.reason == "pp 64 > 32 layers" for e in excluded)


@pytest.mark.parametrize("gpus", [0, 3, 6, 12])
def test_a_gpu_count_not_a_power_of_two_is_refused(gpus):
    with pytest.raises(ValueError, match="power of two"):
        enumerate_layouts(get_model("Qwen2.5-14B"), A100, gpus, 1)


def test_the_policy_grid_and_its_narrowing():
    pipe, single = Layout(1, 1, 4), Layout(4, 1, 1)
    full = PolicyGrid().for_layout(pipe)
    assert len(full) == 26 and "slack+ds" in full and "static:384+ds" in full
    # the default static grid holds the chunks between the powers of two (the best static chunk
    # of Qwen2.5-32B on azure-conv is 384), and our own policy beside the paper's two
    assert PolicyGrid().for_layout(single) == [
        *(f"static:{c}" for c in (128, 256, 384, 512, 640, 768, 896, 1024, 1536, 2048)),
        "greedy",
        "predictive",
        "slack",
    ]
    assert PolicyGrid.parse("static:512,predictive,no-ds").for_layout(pipe) == ["static:512", "predictive"]
    assert PolicyGrid.parse("predictive,ds").for_layout(pipe) == ["predictive+ds"]
    # any registered chunk policy is a dynamic entry, with its +ds variant unless no-ds
    assert PolicyGrid.parse("slack,greedy:tile").for_layout(pipe) == [
        "slack",
        "greedy:tile",
        "slack+ds",
        "greedy:tile+ds",
    ]
    assert PolicyGrid.parse("slack,no-ds").for_layout(single) == ["slack"]
    assert PolicyGrid.parse("static").statics == PolicyGrid().statics
    assert PolicyGrid.parse("static,static:100").statics[-1] == 100
    assert PolicyGrid.parse("greedy+ds").for_layout(single) == []  # +ds needs pp > 1
    with pytest.raises(ValueError, match="unknown entry 'fast'"):
        PolicyGrid.parse("static:512,fast")
    assert DeploymentCandidate(pipe, "static:512+ds").max_tokens() == 512
    assert DeploymentCandidate(pipe, "predictive").max_tokens((128, 256)) == 256


def test_binding_limits_read_from_probe_reasons():
    assert binding_from_reason("P90 TTFT: 2400.00 ms > 2000 ms") == "TTFT"
    assert binding_from_reason("P90 TPOT: 250.00 ms > 200 ms") == "TPOT"
    assert (
        binding_from_reason("P90 TTFT/TPOT: 24 of 600 requests ... (probe stopped early)") == "TTFT and TPOT"
    )
    assert binding_from_reason("queue not stationary: median TTFT ...") == "queue growth"


# ---- the bound: no run serves more than it ----------------------------------------------------

_LAYOUTS = [
    ("Qwen2.5-14B", "A100-40GB-PCIe", 2, 1),
    ("Qwen2.5-14B", "A100-40GB-PCIe", 1, 2),
    ("Qwen2.5-14B", "H100-SXM", 4, 1),
    ("Llama-3.1-8B", "A100-40GB-PCIe", 1, 1),
]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=st.sampled_from(_LAYOUTS),
    prompt=st.integers(16, 1500),
    output=st.integers(1, 24),
    chunk=st.sampled_from([128, 256, 512, 2048]),
    ds=st.booleans(),
    rate=st.sampled_from([None, 20.0, 200.0]),
)
def test_no_simulated_run_serves_more_than_the_capacity_bound(layout, prompt, output, chunk, ds, rate):
    model, gpu, pp, tp = layout
    workload = WorkloadConfig(name=f"random:{prompt}:{output}", rate=rate, num_requests=30)
    policy = f"static:{chunk}" + ("+ds" if ds and pp > 1 else "")
    run = run_simulation(
        workload, DeploymentConfig(model=model, gpu=gpu, pp=pp, tp=tp, policy=policy), record_iterations=False
    )
    records = run.result.records
    lengths = RequestLengths.of([(r.prompt_len, r.output_len) for r in records])
    bound = capacity_bound(run.profile, lengths, chunk)
    served = [r for r in records if r.finished_at is not None]
    assert len(served) == len(records)
    window = max(r.finished_at for r in served) - min(r.arrived_at for r in records)
    assert len(served) / window <= bound.rate * (1 + 1e-9)
    for s, busy in enumerate(run.result.stage_busy_s):  # each stage's work, resource by resource
        name = f"stage {s}" if pp > 1 else ("TP group" if tp > 1 else "GPU")
        assert len(served) / busy <= bound.replica_rates[name] * (1 + 1e-9)


def test_the_bound_scales_with_replicas_and_names_its_bottleneck():
    profile = analytic_profile("Qwen2.5-32B", A100, 4, 1)
    lengths = RequestLengths.of([(1000, 200)] * 10)
    one, two = capacity_bound(profile, lengths, 512), capacity_bound(profile, lengths, 512, dp=2)
    assert two.rate == pytest.approx(2 * one.rate) and two.replica_rate == pytest.approx(one.rate)
    assert one.bottleneck == "stage 3"  # the last stage adds the LM head and sampling
    assert set(one.replica_rates) == {"stage 0", "stage 1", "stage 2", "stage 3", "host loop", "KV pool"}
    assert capacity_bound(profile, lengths, 2048).rate > capacity_bound(profile, lengths, 256).rate


# ---- models from config.json, GPUs from datasheets --------------------------------------------


@pytest.mark.parametrize(
    ("path", "known"),
    [
        ("qwen2.5-14b-instruct", "Qwen2.5-14B"),
        ("qwen2.5-14b-instruct/config.json", "Qwen2.5-14B"),
        ("smollm2-135m-instruct", "SmolLM2-135M"),
        ("smollm2-135m-instruct/config.json", "SmolLM2-135M"),
    ],
)
def test_a_hugging_face_config_gives_the_built_in_shape(path, known):
    shape = resolve_model(str(DATA / path))
    assert shape.name == path.split("/")[0]
    assert dataclasses.replace(shape, name=known) == get_model(known)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not one"),
        ({"num_local_experts": 8}, "mixture-of-experts"),
        ({"num_hidden_layers": None}, "config.json: num_hidden_layers: missing key"),
        ({"num_attention_heads": 0}, "config.json: num_attention_heads: must be >= 1, got 0"),
        ({"num_attention_heads": "40"}, "num_attention_heads: expected an integer, got str"),
    ],
)
def test_a_config_the_cost_model_cannot_describe_is_refused(tmp_path, change, message):
    cfg = json.loads((DATA / "qwen2.5-14b-instruct" / "config.json").read_text())
    cfg.update(change)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=message):
        resolve_model(str(tmp_path))


def test_a_gpu_by_its_datasheet_is_uncalibrated():
    gpu = resolve_gpu("L40S:bf16_tflops=362,hbm_gbps=864,memory_gib=48")
    assert (gpu.name, gpu.family, gpu.interconnect) == ("L40S", "A100", "pcie4")
    assert gpu.peak_bf16_flops == 362e12 and gpu.memory_bytes == 48 * 1024**3
    assert not is_calibrated(gpu) and calibration_note(gpu).startswith("uncalibrated")
    assert is_calibrated(resolve_gpu("h100")) and calibration_note(get_gpu("H100")).startswith("calibrated")
    with pytest.raises(ValueError, match="missing memory_gib"):
        resolve_gpu("X:bf16_tflops=1,hbm_gbps=2")
    with pytest.raises(ValueError, match="unknown datasheet entry 'speed=3'"):
        resolve_gpu("X:bf16_tflops=1,hbm_gbps=2,memory_gib=3,speed=3")
    with pytest.raises(ValueError, match="unknown GPU 'B300'.*give it by its datasheet: B300:bf16_tflops="):
        resolve_gpu("B300")


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["static:512", "predictive"])
def test_goodput_under_the_steady_protocol_never_exceeds_the_bound(policy):
    """The search `fastpp goodput` runs (steady queue, confirmation on the longest look), one
    seed, on a pipeline whose goodput comes close to its bound."""
    from fastpp.sim.goodput import slo_goodput
    from fastpp.sim.planner import sample_lengths

    workload = WorkloadConfig(name="azure-conv")
    deployment = DeploymentConfig(model="Qwen2.5-14B", gpu="A100-40GB-PCIe", pp=2, tp=1, policy=policy)
    bound = capacity_bound(
        deployment.load_profile(),
        RequestLengths.of(sample_lengths(workload)),
        DeploymentCandidate(Layout(1, 1, 2), policy).max_tokens(),
    )
    result = slo_goodput(workload, deployment, seeds=(0,), precision=0.5, low=bound.rate / 2, high=bound.rate)
    assert 0 < result.rate <= bound.rate


def _twin_plan(workload: str, out_dir=None, **changes):
    from fastpp.sim.plan_job import SearchSettings
    from fastpp.sim.planner import PlanConfig, plan_deployment

    config = PlanConfig(
        model="Qwen2.5-14B",
        num_gpus=2,
        workload=workload,
        layouts=("pp2",),
        policies="static:512",  # static:512 and static:512+ds
        settings=SearchSettings(seeds=(1,), num_requests=400, require_steady=False, precision=2.0),
        prune=False,  # every candidate from the same bracket: the twins' searches comparable
        **changes,
    )
    plan = plan_deployment(config, executor="serial", out_dir=out_dir)
    return {r.label: r for r in plan.results}, plan


def test_a_twin_whose_delay_scheduling_never_acts_reports_the_full_search():
    """azure-conv on pp2 never holds a tile of decodes per slot, so delay scheduling never
    parks: static:512 takes static:512+ds's search, and it is what its own search finds."""
    shared, plan = _twin_plan("azure-conv")
    full, _ = _twin_plan("azure-conv", share_twins=False)
    base, twin = shared["pp2 static:512"], shared["pp2 static:512+ds"]
    assert base.shared_with == "pp2 static:512+ds" and base.num_probes == 0 and plan.num_shared == 1
    assert twin.num_probes > 0 and not twin.shared_with
    alone = full["pp2 static:512"]
    assert not alone.shared_with and alone.num_probes == twin.num_probes
    for field in ("status", "goodput", "margin", "attainment", "binding", "binding_rate", "operating_point"):
        assert getattr(base, field) == getattr(alone, field), field
    assert plan.probes_run == twin.num_probes


def test_a_twin_whose_delay_scheduling_parks_is_searched_on_its_own():
    """Short prompts at a high rate put more decodes in a slot than a tile: delay scheduling
    parks some, the twins' runs differ, and static:512 gets a search of its own."""
    results, plan = _twin_plan("random:16:100")
    base = results["pp2 static:512"]
    assert not base.shared_with and base.num_probes > 0 and plan.num_shared == 0


def test_search_order_puts_dynamic_policies_first_and_each_ds_twin_before_its_base():
    from fastpp.sim.plan_bound import CapacityBound
    from fastpp.sim.plan_job import CandidateJob, SearchSettings
    from fastpp.sim.planner import search_order

    def job(layout: Layout, policy: str, rate: float) -> CandidateJob:
        bound = CapacityBound(rate, layout.dp, "stage 0", {"stage 0": rate / layout.dp})
        return CandidateJob(
            policy,
            DeploymentCandidate(layout, policy),
            WorkloadConfig(),
            DeploymentConfig(),
            bound,
            SearchSettings(),
        )

    pp4, dp2 = Layout(1, 1, 4), Layout(2, 1, 2)
    jobs = [
        job(pp4, "static:256", 7.7),
        job(pp4, "static:2048", 8.0),
        job(pp4, "predictive", 8.0),
        job(pp4, "static:2048+ds", 8.0),
        job(pp4, "predictive+ds", 8.0),
        job(dp2, "predictive", 9.0),
        job(dp2, "static:256", 6.0),
    ]
    order = [(j.candidate.layout, j.candidate.policy) for j in search_order(jobs)]
    assert order == [
        (dp2, "predictive"),
        (dp2, "static:256"),
        (pp4, "predictive+ds"),
        (pp4, "predictive"),
        (pp4, "static:2048+ds"),
        (pp4, "static:2048"),
        (pp4, "static:256"),
    ]


def _search_order(candidates: dict[str, DeploymentCandidate]) -> list[str]:
    """The ids of ``candidates`` (id -> candidate, all with the same bound) in search order."""
    from fastpp.sim.plan_bound import CapacityBound
    from fastpp.sim.plan_job import CandidateJob, SearchSettings
    from fastpp.sim.planner import search_order

    bound = CapacityBound(8.0, 1, "stage 0", {"stage 0": 8.0})
    jobs = [
        CandidateJob(job_id, cand, WorkloadConfig(), DeploymentConfig(), bound, SearchSettings())
        for job_id, cand in candidates.items()
    ]
    return [j.job_id for j in search_order(jobs)]


def test_other_async_depths_follow_a_layouts_depth_0_candidates_with_their_own_twins():
    pp4 = Layout(1, 1, 4)
    order = _search_order(
        {
            f"{p}/{d}": DeploymentCandidate(pp4, p, d)
            for d in (1, 0)
            for p in ("static:512", "predictive+ds", "predictive")
        }
    )
    assert order == [
        "predictive+ds/0",
        "predictive/0",
        "static:512/0",
        "predictive+ds/1",
        "predictive/1",
        "static:512/1",
    ]
    assert DeploymentCandidate(pp4, "predictive", 1).label == "pp4 predictive async1"
    assert DeploymentCandidate(pp4, "predictive").label == "pp4 predictive"


def test_another_queue_order_follows_fcfs_at_each_depth_with_its_own_twins():
    pp4 = Layout(1, 1, 4)
    order = _search_order(
        {
            f"{p}/{d}/{q}": DeploymentCandidate(pp4, p, d, q)
            for q in ("late_last", "fcfs")
            for d in (1, 0)
            for p in ("static:512", "predictive")
        }
    )
    assert order == [
        "predictive/0/fcfs",
        "static:512/0/fcfs",
        "predictive/0/late_last",
        "static:512/0/late_last",
        "predictive/1/fcfs",
        "static:512/1/fcfs",
        "predictive/1/late_last",
        "static:512/1/late_last",
    ]
    assert DeploymentCandidate(pp4, "predictive", 1, "late_last").label == "pp4 predictive async1 late_last"


def test_a_search_stops_once_it_fails_at_or_below_a_goodput_found_elsewhere():
    """The live best (what the process pool publishes to running jobs): a search that has
    failed at a rate no higher than it cannot win and stops there; a best below every failure
    changes nothing."""
    from fastpp.sim import plan_job

    full, _ = _twin_plan("azure-conv")
    ref = full["pp2 static:512+ds"]
    assert ref.status == "searched" and ref.num_probes >= 3
    try:
        plan_job.set_live_best(lambda: ref.goodput / 2)
        same, _ = _twin_plan("azure-conv")
        plan_job.set_live_best(lambda: 1e6)
        stopped, _ = _twin_plan("azure-conv")
    finally:
        plan_job.set_live_best(None)
    assert same["pp2 static:512+ds"] == ref
    cut = stopped["pp2 static:512+ds"]
    assert cut.status == "beaten" and cut.goodput is None and cut.binding
    assert ref.goodput < cut.below and 1 <= cut.num_probes < ref.num_probes


def test_among_layouts_with_close_bounds_fewer_replicas_are_searched_first():
    from fastpp.sim.plan_bound import CapacityBound
    from fastpp.sim.plan_job import CandidateJob, SearchSettings
    from fastpp.sim.planner import POOLING_TOLERANCE, search_order

    def job(layout: Layout, rate: float) -> CandidateJob:
        bound = CapacityBound(rate, layout.dp, "stage 0", {"stage 0": rate / layout.dp})
        cand = DeploymentCandidate(layout, "predictive")
        return CandidateJob(cand.label, cand, WorkloadConfig(), DeploymentConfig(), bound, SearchSettings())

    pp8, dp2, dp8, tp8 = Layout(1, 1, 8), Layout(2, 1, 4), Layout(8, 1, 1), Layout(1, 8, 1)
    close = 1 - POOLING_TOLERANCE / 2
    jobs = [job(dp8, 44.0), job(dp2, 44.0 * close), job(pp8, 44.0 * close**2), job(tp8, 30.0)]
    assert [j.candidate.layout for j in search_order(jobs)] == [pp8, dp2, dp8, tp8]
    apart = [job(dp8, 44.0), job(pp8, 44.0 * (1 - 2 * POOLING_TOLERANCE))]
    assert [j.candidate.layout for j in search_order(apart)] == [dp8, pp8]


@pytest.mark.parametrize("prune", [True, False])
def test_the_best_goodput_is_published_to_running_searches_only_when_pruning(monkeypatch, prune):
    """An exhaustive plan (--exhaustive) must search every candidate fully: no live best."""
    import fastpp.sim.planner as planner
    from fastpp.sim.plan_exec import SerialRunner

    published: list[float] = []

    class Recording(SerialRunner):
        def publish(self, best: float) -> None:
            published.append(best)

    from fastpp.sim.plan_job import SearchSettings

    monkeypatch.setattr(planner, "make_runner", lambda *a, **k: Recording())
    config = planner.PlanConfig(
        model="Qwen2.5-14B",
        num_gpus=2,
        layouts=("pp2",),
        policies="static:512,no-ds",
        settings=SearchSettings(seeds=(1,), num_requests=400, require_steady=False, precision=2.0),
        prune=prune,
    )
    plan = planner.plan_deployment(config, executor="serial")
    assert plan.best is not None
    assert published == ([plan.best.goodput] if prune else [])


def test_a_plan_under_bursty_arrivals_searches_them_and_says_so(tmp_path):
    """Gamma arrivals with cv 4 queue up in bursts: the same candidates sustain less than under
    Poisson arrivals, the plan names its arrivals, and a plan folder does not hand a Poisson
    plan's rows to a bursty one (nor the other way round)."""
    poisson, plan = _twin_plan("azure-conv", out_dir=tmp_path)
    bursty, bursty_plan = _twin_plan("azure-conv", out_dir=tmp_path, arrival="gamma", cv=4.0)
    again, _ = _twin_plan("azure-conv", out_dir=tmp_path)
    assert plan.workload == "azure-conv"
    assert bursty_plan.workload == "azure-conv (gamma arrivals, cv 4)"
    for label, result in bursty.items():
        assert not result.cached and not poisson[label].cached and again[label].cached, label
        if result.num_probes:  # searched, not a twin's
            assert 0 < result.goodput < poisson[label].goodput, label
    from fastpp.sim.planner import PlanConfig

    with pytest.raises(ValueError, match="cv=2.0 needs arrival='gamma'"):
        PlanConfig(cv=2.0)


def _result(layout, policy, goodput, status="searched", shared_with=""):
    from fastpp.sim.plan_bound import CapacityBound
    from fastpp.sim.plan_result import CandidateResult

    bound = CapacityBound(8.0 * layout.dp, layout.dp, "stage 0", {"stage 0": 8.0})
    return CandidateResult(
        DeploymentCandidate(layout, policy), bound, status, goodput, shared_with=shared_with
    )


def test_candidates_within_one_search_step_of_the_pick_are_named():
    from fastpp.sim.plan_report import verdict
    from fastpp.sim.plan_result import DeploymentPlan

    pipe, pairs = Layout(1, 1, 4), Layout(2, 1, 2)
    results = (
        _result(pipe, "slack", 6.44),
        _result(pipe, "slack+ds", 6.42),
        _result(pipe, "predictive", 6.22, shared_with="pp4 predictive+ds"),
        _result(pipe, "predictive+ds", 6.22),  # the same search as predictive: named once
        _result(pairs, "greedy", 6.0),  # 2 replicas: within 2 x 0.25 of 6.44
        _result(pipe, "greedy", 6.18),  # just outside 6.44 - 0.25
        _result(pipe, "static:384", None, status="beaten"),
    )
    plan = DeploymentPlan(
        "Qwen2.5-32B", "A100-40GB-PCIe", "calibrated", "pcie4", 4, "azure-conv", 2000.0, 200.0,
        results, (), 0.8, 0.25, (0, 1), 1.0,
    )  # fmt: skip
    assert plan.best is results[0]
    assert [r.label for r in plan.near_best] == ["pp4 slack+ds", "pp4 predictive", "dp2 x pp2 greedy"]
    assert plan.to_dict()["near_best"] == ["pp4 slack+ds", "pp4 predictive", "dp2 x pp2 greedy"]
    line = verdict(plan)[-1]
    assert line.startswith("as good within one search step (0.25 req/s per replica): pp4 slack+ds 6.42")
    alone = dataclasses.replace(plan, results=results[:1] + results[5:])
    assert alone.near_best == [] and not verdict(alone)[-1].startswith("as good")

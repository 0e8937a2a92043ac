"""The simulator's host loops: fastpp.pipeline.BatchQueueDriver (vLLM's batch queue) and the
blocking launch (SGLang on CPU), against the free-slots loop."""

from __future__ import annotations

from fastpp.pipeline import BatchQueueDriver
from fastpp.policies import make_policies
from fastpp.profile import load_profile
from fastpp.profile_names import resolve_profile
from fastpp.scheduler import Scheduler
from fastpp.scheduler_config import SchedulerConfig
from fastpp.sim.engine import PipelineSimulation
from fastpp.types import SLO, Request


def run(requests, batch_queue: bool):
    profile = load_profile(resolve_profile("cpu_smollm2-135m_pp2"))
    config = SchedulerConfig(
        num_slots=2,
        kv_capacity_tokens=65536,
        page_size=16,
        chunk_candidates=(256,),
        default_chunk=4096,
        slo=SLO(5.0, 0.5),
    )
    chunk, balancer = make_policies("static", config, profile)
    sched = Scheduler(config, lambda: 0.0, chunk, balancer)
    loop = "batch-queue" if batch_queue else "free-slots"
    sim = PipelineSimulation(profile, sched, requests, host_loop=loop)
    assert isinstance(sim.driver, BatchQueueDriver) == batch_queue
    return sim, sim.run()


def first_start(result, req_launch_mb: int) -> float:
    return min(it.started_at for it in result.iterations if it.mb_id == req_launch_mb and it.stage == 0)


def test_an_arrival_waits_for_the_oldest_output_after_an_empty_call():
    """One request in flight, slot 1's turn comes up empty: vLLM blocks on the in-flight
    output, so a request arriving meanwhile starts only after that output returns."""
    reqs = [Request(0, 0.0, 512, 4), Request(1, 0.01, 512, 4)]
    _, free = run(reqs, batch_queue=False)
    sim, queued = run(reqs, batch_queue=True)
    # free slots: the second request launches in slot 1 as soon as it arrives, before the first returns
    assert first_start(free, 1) < max(it.finished_at for it in free.iterations if it.mb_id == 0)
    first_back = max(it.finished_at for it in queued.iterations if it.mb_id == 0)
    later = [it for it in queued.iterations if it.stage == 0 and it.mb_id > 0 and it.num_prefill_tokens]
    assert later and min(it.started_at for it in later) >= first_back
    assert sim.driver.empty_calls >= 1
    ttft = {r.req_id: r.first_token_at - r.arrived_at for r in queued.records}
    assert ttft[1] > ttft[0]
    assert all(r.num_generated == 4 for r in queued.records)


def test_slots_take_turns_and_every_request_finishes(monkeypatch):
    """The k-th schedule() call is slot k % 2 (an empty call uses its turn), at most two outputs
    are in flight, and they return in launch order (the driver raises otherwise)."""
    reqs = [Request(i, 0.05 * i, 64 + 16 * i, 8) for i in range(12)]
    calls: list[int] = []
    original = Scheduler.schedule

    def logged(self, slot):
        calls.append(slot)
        return original(self, slot)

    monkeypatch.setattr(Scheduler, "schedule", logged)
    sim, result = run(reqs, batch_queue=True)
    assert all(r.num_generated == 8 for r in result.records)
    assert calls == [k % 2 for k in range(len(calls))]
    assert len(calls) == result.num_microbatches + sim.driver.empty_calls


def test_a_deployment_chooses_its_host_loop():
    from dataclasses import replace

    import pytest

    from fastpp.sim.run import DeploymentConfig, WorkloadConfig, check_deployment, run_simulation

    wl = WorkloadConfig(name="random:256:64", rate=0.5, num_requests=30)
    base = DeploymentConfig(profile_path="cpu_smollm2-135m_pp2", policy="static:256")
    runs = {loop: run_simulation(wl, replace(base, host_loop=loop)) for loop in ("free-slots", "batch-queue")}
    for loop, run in runs.items():
        assert run.summary["host_loop"] == loop and run.summary["completed"] == 30
    # vLLM's loop leaves slots idle while it waits on the oldest output: fewer, fuller microbatches
    assert runs["batch-queue"].result.num_microbatches < runs["free-slots"].result.num_microbatches
    with pytest.raises(ValueError, match="free-slots, batch-queue, blocking-launch, got 'fifo'"):
        check_deployment(DeploymentConfig(host_loop="fifo"))


def test_a_blocking_launch_host_neither_launches_nor_folds_in_tokens_while_stage_0_computes():
    from dataclasses import replace

    profile = replace(load_profile(resolve_profile("cpu_smollm2-135m_pp2")), host_overhead_s=0.004)
    reqs = [Request(i, 0.003 * i, 200, 6) for i in range(8)]
    runs = {}
    for loop in ("free-slots", "blocking-launch"):
        config = SchedulerConfig(
            num_slots=2,
            kv_capacity_tokens=65536,
            page_size=16,
            chunk_candidates=(256,),
            default_chunk=256,
            slo=SLO(5.0, 0.5),
        )
        chunk, balancer = make_policies("static", config, profile)
        result = PipelineSimulation(
            profile, Scheduler(config, lambda: 0.0, chunk, balancer), reqs, host_loop=loop
        ).run()
        assert all(r.num_generated == 6 for r in result.records)
        stage0 = sorted((it.started_at, it.finished_at) for it in result.iterations if it.stage == 0)
        gaps = [b[0] - a[1] for a, b in zip(stage0, stage0[1:], strict=False)]
        tokens = [t for r in result.records for t in r.token_times]
        inside = sum(any(a < t < b for a, b in stage0) for t in tokens)
        runs[loop] = (min(gaps), inside)
    # free slots: the host forms the next microbatch while stage 0 computes (back-to-back
    # launches) and folds tokens in whenever they return
    assert runs["free-slots"][0] == 0.0 and runs["free-slots"][1] > 0
    # blocking launch: the host pays its overhead after stage 0's compute, and tokens wait for it
    assert runs["blocking-launch"][0] >= 0.004 - 1e-12 and runs["blocking-launch"][1] == 0

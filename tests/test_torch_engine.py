"""The PP engine across real stage processes: greedy outputs equal a plain single-process forward
of the same weights whatever the chunk policy, chunk sizes, P, parking and retraction; aborts and
shutdown leave no KV block held on any stage."""

from __future__ import annotations

import os
import random
import threading

import pytest

torch = pytest.importorskip("torch")

from test_scheduler_invariants import RandomBalancer, RandomChunks  # noqa: E402

from conftest import make_profile  # noqa: E402
from fastpp.backends.torch import random_weights, reference_generate  # noqa: E402
from fastpp.backends.torch.engine import EngineConfig, PipelineEngine  # noqa: E402
from fastpp.backends.torch.engine_state import EngineEvent  # noqa: E402
from fastpp.backends.torch.sampling import SamplingParams  # noqa: E402
from fastpp.backends.torch.weights_source import WeightsSource  # noqa: E402
from fastpp.types import SLO  # noqa: E402

SOURCE = WeightsSource.parse("random:tiny")
WEIGHTS = random_weights("tiny")


class Collector:
    """Gathers every request's events; ``wait`` returns once ``n`` requests have ended."""

    def __init__(self) -> None:
        self.tokens: dict[int, list[int]] = {}
        self.ends: dict[int, EngineEvent] = {}
        self.cond = threading.Condition()

    def __call__(self, ev: EngineEvent) -> None:
        with self.cond:
            assert ev.req_id not in self.ends, f"event for request {ev.req_id} after its end"
            self.tokens.setdefault(ev.req_id, []).extend(ev.token_ids)
            if ev.finish_reason is not None:
                self.ends[ev.req_id] = ev
                self.cond.notify_all()

    def wait(self, n: int, timeout_s: float = 120.0) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.ends) >= n, timeout_s), (
                f"{len(self.ends)} of {n} requests ended"
            )


def workload(seed: int, n: int, max_prompt: int, max_output: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(256) for _ in range(rng.randrange(1, max_prompt + 1))],
            rng.randrange(1, max_output + 1),
        )
        for _ in range(n)
    ]


def run_and_check(
    engine: PipelineEngine, seed: int, n: int = 12, max_prompt: int = 160, max_output: int = 13
) -> Collector:
    """Submit in three waves (some arrive while others run); every output equals the reference."""
    got = Collector()
    reqs = workload(seed, n, max_prompt, max_output)
    ids = {}
    for k, (prompt, out) in enumerate(reqs):
        ids[engine.submit(prompt, SamplingParams(max_tokens=out), got)] = (prompt, out)
        if k in (n // 3, 2 * n // 3):
            got.wait(1)
    got.wait(n)
    for rid, (prompt, out) in ids.items():
        assert got.ends[rid].finish_reason == "length", got.ends[rid]
        assert got.tokens[rid] == reference_generate(WEIGHTS, prompt, out), rid
    return got


def check_no_leak(engine: PipelineEngine) -> None:
    assert engine.snapshot.stats.kv_used_tokens == 0
    assert engine.final_free_blocks == [engine.config.kv_blocks] * engine.config.num_stages


CASES = {
    "static-32": dict(policy="static:32"),
    "greedy": dict(policy="greedy"),
    "predictive+ds": dict(policy="predictive+ds", profile=make_profile(pp=2)),
    # a TTFT SLO of 10 ms: the later waves find requests already late, which wait behind them
    "static-32-late-last": dict(policy="static:32", queue_order="late_last", slo=SLO(0.01, 0.2)),
    # the admission reserve other than the default ("slot") reaches the engine's scheduler
    "greedy-admission-all": dict(policy="greedy", admission_reserve="all"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_two_stage_outputs_equal_the_reference_for_named_policies(case):
    cfg = EngineConfig(
        num_stages=2, kv_blocks=128, block_size=4, chunk_candidates=(8, 16, 32, 64), **CASES[case]
    )
    engine = PipelineEngine(SOURCE, cfg).start()
    assert engine.scheduler_config.admission_reserve == cfg.admission_reserve
    try:
        run_and_check(engine, seed=len(case))
    finally:
        engine.shutdown()
    check_no_leak(engine)


def test_random_chunks_parking_and_retraction_do_not_change_outputs():
    # 40 blocks of 4 tokens: each request (up to 140 tokens) fits alone, not all together; admitted
    # without a reserve for their growth, running requests must be retracted and recomputed. The
    # balancer parks and restores at random; C changes every microbatch.
    cfg = EngineConfig(num_stages=2, kv_blocks=40, block_size=4, new_token_ratio=0.0, record=True)
    engine = PipelineEngine(
        SOURCE, cfg, chunk_policy=RandomChunks(1, [1, 3, 8, 17, 64]), balancer=RandomBalancer(2)
    ).start()
    try:
        got = run_and_check(engine, seed=5, n=14, max_prompt=100, max_output=40)
        assert engine.snapshot.stats.num_retractions > 0, "the workload was meant to force retractions"
        assert sum(r.num_parked for r in engine.recorded_requests) > 0
        assert sorted(r.req_id for r in engine.recorded_requests) == sorted(got.ends)
        assert not engine.scheduler._records  # ended requests are forgotten
        assert {it.stage for it in engine.recorded_iterations} == {0, 1}
    finally:
        engine.shutdown()
    check_no_leak(engine)


@pytest.mark.slow
def test_three_stages_with_a_middle_stage_match_the_reference():
    source = WeightsSource.parse("random:tiny4")
    weights = random_weights("tiny4")
    engine = PipelineEngine(
        source, EngineConfig(num_stages=3, kv_blocks=128, block_size=4, policy="static:32")
    ).start()
    got = Collector()
    try:
        reqs = workload(11, 8, 120, 10)
        ids = {engine.submit(p, SamplingParams(max_tokens=n), got): (p, n) for p, n in reqs}
        got.wait(len(ids))
    finally:
        engine.shutdown()
    for rid, (prompt, n) in ids.items():
        assert got.tokens[rid] == reference_generate(weights, prompt, n), rid
    check_no_leak(engine)


def test_single_stage_engine_runs_in_process():
    engine = PipelineEngine(
        SOURCE, EngineConfig(num_stages=1, kv_blocks=128, block_size=16, policy="static:48")
    ).start()
    try:
        run_and_check(engine, seed=9, n=6)
    finally:
        engine.shutdown()
    check_no_leak(engine)


def test_abort_frees_kv_on_every_stage_and_bad_prompts_are_refused():
    engine = PipelineEngine(SOURCE, EngineConfig(num_stages=2, kv_blocks=64, block_size=4)).start()
    try:
        with pytest.raises(ValueError, match="outside the vocabulary"):
            engine.submit([1, 999], SamplingParams(), lambda ev: None)
        with pytest.raises(ValueError, match="context of 512"):
            engine.submit([1] * 600, SamplingParams(), lambda ev: None)
        with pytest.raises(ValueError, match="empty"):
            engine.submit([], SamplingParams(), lambda ev: None)
        got = Collector()
        long = engine.submit([5] * 40, SamplingParams(max_tokens=400, ignore_eos=True), got)
        short = engine.submit([7] * 10, SamplingParams(max_tokens=3), got)
        got.wait(1)
        engine.abort(long)
        got.wait(2)
        assert got.ends[long].finish_reason == "aborted"
        assert got.ends[short].finish_reason == "length"
        assert 0 < len(got.tokens[long]) < 400
        # a request after the abort still runs (and carries the pending frees down the pipeline)
        after = engine.submit([9] * 12, SamplingParams(max_tokens=2), got)
        got.wait(3)
        assert got.tokens[after] == reference_generate(WEIGHTS, [9] * 12, 2)
    finally:
        engine.shutdown()
    check_no_leak(engine)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin two stages")
def test_pinned_stages_run_on_a_core_each_and_still_match_the_reference():
    cores = sorted(os.sched_getaffinity(0))[:2]
    engine = PipelineEngine(
        SOURCE, EngineConfig(num_stages=2, kv_blocks=128, block_size=16, policy="static:48", pin_cores=True)
    ).start()
    try:
        assert engine.spec.cores == tuple(cores)
        assert os.sched_getaffinity(engine._procs.procs[0].pid) == {cores[1]}
        assert os.sched_getaffinity(engine._thread.native_id) == {cores[0]}
        run_and_check(engine, seed=5, n=6)
    finally:
        engine.shutdown()
    check_no_leak(engine)


def test_pinning_more_stages_than_cores_is_refused(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    with pytest.raises(ValueError, match="2 stages, 1 core"):
        PipelineEngine(SOURCE, EngineConfig(num_stages=2, pin_cores=True))

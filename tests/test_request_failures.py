"""A request that cannot be sampled or computed fails alone (issue 27): its caller gets an
``error`` end without a traceback, the other requests of its microbatch and every later one run
on, the stages stay up and its KV is freed. Every way a request ends reaches the recording with
its reason: a stop string as ``stop``, its own failure and a dead stage as ``aborted`` with an
``error: ...`` detail."""

from __future__ import annotations

import math
import os
import signal
import time

import pytest

torch = pytest.importorskip("torch")

from test_torch_engine import Collector, check_no_leak  # noqa: E402

from fastpp.backends.torch import random_weights, reference_generate  # noqa: E402
from fastpp.backends.torch.engine import EngineConfig, PipelineEngine  # noqa: E402
from fastpp.backends.torch.layout import BatchLayout  # noqa: E402
from fastpp.backends.torch.sampling import FAILED_TOKEN, SamplingParams  # noqa: E402
from fastpp.backends.torch.stage_runtime import (  # noqa: E402
    StageRunner,
    StageSpec,
    last_stage_result,
    make_meta,
    run_or_fail,
)
from fastpp.backends.torch.weights import ModelWeights  # noqa: E402
from fastpp.backends.torch.weights_source import WeightsSource  # noqa: E402
from fastpp.types import FinishReason  # noqa: E402

SOURCE = WeightsSource.parse("random:tiny")
WEIGHTS = random_weights("tiny")
POISON = 200  # its embedding is NaN: a request whose prompt holds it gets NaN logits


def poisoned_weights() -> ModelWeights:
    tensors = dict(WEIGHTS.tensors)
    emb = tensors["model.embed_tokens.weight"].clone()
    emb[POISON] = math.nan
    tensors["model.embed_tokens.weight"] = emb
    return ModelWeights(WEIGHTS.config, tensors)


def wait_for_tokens(got: Collector, rid: int, n: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(got.tokens.get(rid, [])) < n:
        assert rid not in got.ends and time.monotonic() < deadline, f"request {rid}: {got.ends.get(rid)}"
        time.sleep(0.001)


def recorded(engine: PipelineEngine) -> dict[int, tuple[FinishReason | None, str]]:
    return {r.req_id: (r.finish_reason, r.detail) for r in engine.recorded_requests}


@pytest.mark.parametrize("pp", [1, 2])
def test_a_request_that_cannot_be_sampled_fails_alone_and_the_engine_goes_on(pp):
    config = EngineConfig(num_stages=pp, kv_blocks=64, block_size=4, policy="static:64", record=True)
    engine = PipelineEngine(SOURCE, config, weights=poisoned_weights()).start()
    good_prompt = [5, 6, 7, 8]
    want = reference_generate(WEIGHTS, good_prompt, 6)
    assert POISON not in want  # so NaN logits for POISON (tied embeddings, pp 1) change nothing
    try:
        got = Collector()
        # submitted together: both in the same first microbatch
        bad = engine.submit([1, POISON, 3], SamplingParams(max_tokens=6, temperature=0.7, seed=1), got)
        good = engine.submit(good_prompt, SamplingParams(max_tokens=6, ignore_eos=True), got)
        got.wait(2)
        assert got.ends[bad].finish_reason == "error"
        assert "sampling failed" in got.ends[bad].detail and "Traceback" not in got.ends[bad].detail
        assert got.tokens[bad] == []
        assert got.ends[good].finish_reason == "length" and got.tokens[good] == want
        assert engine.is_alive and engine.error is None
        later = engine.submit(good_prompt, SamplingParams(max_tokens=6), got)
        got.wait(3)
        assert got.tokens[later] == want
        assert engine.snapshot.counters.ended == {"error": 1, "length": 2}
        reason, detail = recorded(engine)[bad]
        assert reason == FinishReason.ABORTED and detail.startswith("error: sampling failed")
    finally:
        engine.shutdown()
    check_no_leak(engine)


def test_a_stop_string_end_is_counted_and_recorded_as_stop():
    engine = PipelineEngine(
        SOURCE, EngineConfig(num_stages=1, kv_blocks=128, block_size=4, record=True)
    ).start()
    try:
        got = Collector()
        rid = engine.submit([9] * 8, SamplingParams(max_tokens=500, ignore_eos=True), got)
        wait_for_tokens(got, rid, 2)
        engine.stop(rid)  # what the server does when the text holds a stop string
        got.wait(1)
        assert got.ends[rid].finish_reason == "stop"
        assert engine.snapshot.counters.ended == {"stop": 1}
        assert recorded(engine)[rid] == (FinishReason.STOP, "stop string")
        engine.stop(rid)  # already ended: nothing happens
        engine.abort(rid)
    finally:
        engine.shutdown()
    check_no_leak(engine)
    assert engine.snapshot.counters.ended == {"stop": 1}


def test_a_stop_string_in_the_last_token_relabels_a_length_end_as_stop():
    """The server finds the stop string only after the engine ended the request by length (the
    match is in its last token): the response says ``stop``, so must the counters and record."""
    engine = PipelineEngine(
        SOURCE, EngineConfig(num_stages=1, kv_blocks=128, block_size=4, record=True)
    ).start()
    try:
        got = Collector()
        with_stops = SamplingParams(max_tokens=3, ignore_eos=True, text_stops=True)
        rid = engine.submit([9] * 8, with_stops, got)
        plain = engine.submit([9] * 8, SamplingParams(max_tokens=3, ignore_eos=True), got)
        got.wait(2)
        assert got.ends[rid].finish_reason == "length"
        engine.stop(rid)
        engine.stop(plain)  # no text stops: a length end stays a length end
        deadline = time.monotonic() + 10
        while engine.snapshot.counters.ended.get("stop", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        engine.stop(rid)  # relabelled once only
    finally:
        engine.shutdown()
    check_no_leak(engine)
    assert engine.snapshot.counters.ended == {"stop": 1, "length": 1}
    assert recorded(engine)[rid] == (FinishReason.STOP, "stop string")
    assert recorded(engine)[plain] == (FinishReason.LENGTH, "")


def test_requests_failed_by_a_dead_stage_are_in_the_recording():
    engine = PipelineEngine(
        SOURCE, EngineConfig(num_stages=2, kv_blocks=64, block_size=4, record=True)
    ).start()
    try:
        got = Collector()
        done = engine.submit([3] * 5, SamplingParams(max_tokens=2), got)
        got.wait(1)
        running = engine.submit([4] * 5, SamplingParams(max_tokens=200, ignore_eos=True), got)
        wait_for_tokens(got, running, 1)
        os.kill(engine._procs.procs[0].pid, signal.SIGKILL)
        got.wait(2)
        assert got.ends[running].finish_reason == "error"
    finally:
        engine.shutdown()
    rec = recorded(engine)
    assert rec[done] == (FinishReason.LENGTH, "")
    assert rec[running][0] == FinishReason.ABORTED and rec[running][1].startswith("error: ")


def test_a_request_still_in_the_inbox_when_the_engine_fails_is_ended_and_recorded():
    """Submitted (counted as received) but not yet taken in by the engine thread when the
    engine fails: its caller gets the error end and the recording its record, so the records
    match the requests received (the stopped-stage chaos test counts both)."""
    engine = PipelineEngine(SOURCE, EngineConfig(num_stages=1, kv_blocks=16, block_size=4, record=True))
    got = Collector()
    rid = engine.submit([3] * 5, SamplingParams(max_tokens=4), got)  # no engine thread: it waits
    engine._fail("stage 1 stopped responding: no heartbeat for 3.0 s")
    assert got.ends[rid].finish_reason == "error"
    assert engine.num_received == 1
    assert recorded(engine) == {
        rid: (FinishReason.ABORTED, "error: stage 1 stopped responding: no heartbeat for 3.0 s")
    }


def test_a_microbatch_a_stage_cannot_compute_fails_alone():
    spec = StageSpec(SOURCE, num_stages=1, kv_blocks=4, block_size=4)
    runner = StageRunner(spec, 0, WEIGHTS)
    layout = BatchLayout.build([(0, 3, 0, True)])
    inputs = torch.tensor([1, 2, 3])
    # a reservation the cache cannot hold: the forward raises, the stage goes on
    meta = make_meta(0, layout, [], [(0, 1000)], [(0.0, 1.0, None, 0)], [])
    assert run_or_fail(runner, meta, inputs) is inputs
    assert meta["failed"].startswith("stage 0 failed on this request's batch: KVCacheFullError")
    result = last_stage_result(meta, inputs, torch.Generator())
    assert result["tokens"] == [FAILED_TOKEN] and result["failed"] == meta["failed"]
    # the same stage computes the next microbatch
    ok = make_meta(1, layout, [], [(0, 4)], [(0.0, 1.0, None, 0)], [])
    logits = run_or_fail(runner, ok, inputs)
    assert "failed" not in ok and last_stage_result(ok, logits, torch.Generator())[
        "tokens"
    ] == reference_generate(WEIGHTS, [1, 2, 3], 1)


def test_output_room_is_what_the_context_and_the_kv_pool_leave():
    engine = PipelineEngine(SOURCE, EngineConfig(num_stages=1, kv_blocks=16, block_size=4))
    assert engine.output_room(10) == 16 * 4 - 10 + 1  # the KV pool binds
    big = PipelineEngine(SOURCE, EngineConfig(num_stages=1, kv_blocks=1024, block_size=4))
    assert big.output_room(10) == 512 - 10  # the context binds

"""The policy host's own rules (fastpp/policy_host.py): balance-plan validation, the one liveness
rule, one failure count, the ALP sums, the record rules, SGLang's finish-reason map, and the one
source of the static chunk every executor runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fastpp.backends.sglang.engine_facts import finish_reason_of
from fastpp.backends.sglang.launcher import LaunchSpec, _default_ceiling
from fastpp.backends.vllm.settings import VllmSchedulerSettings
from fastpp.decode_slots import DecodeSlots
from fastpp.live_request import LiveRequest
from fastpp.plan import BalancePlan
from fastpp.policies import make_policies
from fastpp.policies.base import NoBalancer, StaticChunkPolicy
from fastpp.policy_host import BALANCER_FALLBACK, BatchFeatures, PolicyHost, check_balance
from fastpp.policy_host_records import RequestLog
from fastpp.scheduler_config import DEFAULT_STATIC_CHUNK, SchedulerConfig, static_chunk
from fastpp.signals import Signals
from fastpp.types import FinishReason, RequestRecord
from fastpp.view import SchedulerView
from fastpp.waiting_queue import WaitingQueue

CONFIG = SchedulerConfig(num_slots=2, kv_capacity_tokens=4096, default_chunk=64)


def live(req_id: int, ctx: int = 10) -> LiveRequest:
    r = LiveRequest(RequestRecord(req_id, 0.0, ctx - 1, 8), target_len=8, fill_len=ctx - 1)
    r.num_computed = r.fill_len
    r.ctx_len = ctx
    return r


def make_host(balancer=None, chunk=None, in_flight=False):
    slots = DecodeSlots(2, lambda: in_flight)
    host = PolicyHost(CONFIG, chunk or StaticChunkPolicy(64), balancer or NoBalancer(), slots)
    from fastpp.kv_pool import KVPool

    host.view = SchedulerView(CONFIG, WaitingQueue(), slots, KVPool(4096, 1), host.signals, [None, None])
    for i in range(4):
        r = live(i)
        host.records.by_id[i] = r.rec
        slots.join(r, 0)
    return host, slots


class Plans:
    def __init__(self, *plans) -> None:
        self.plans = list(plans)

    def plan(self, view, slot):
        return self.plans.pop(0) if self.plans else BalancePlan()

    def observe(self, rec):
        return None


@pytest.mark.parametrize(
    "plan, message",
    [
        (BalancePlan(park_ids=(9,)), "not a decode of slot 0"),
        (BalancePlan(restore_ids=(1,)), "not parked"),
        (BalancePlan(park_ids=(1, 1)), "repeats"),
    ],
)
def test_a_plan_the_slot_state_cannot_apply_is_refused(plan, message):
    _, slots = make_host()
    with pytest.raises(ValueError, match=message):
        check_balance(plan, 0, slots)


def test_an_invalid_plan_falls_back_once_counted_and_nothing_moves():
    host, slots = make_host(Plans(BalancePlan(park_ids=(9,))))
    d = host.begin_step(0, 1.0)
    assert d.balance == BALANCER_FALLBACK and d.fallback == "balancer" and d.park_ids == ()
    assert host.policies.num_failures == 1 and len(slots.running[0]) == 4


def test_parks_are_counted_in_the_records_and_the_decodes_that_ride_are_the_rest():
    host, slots = make_host(Plans(BalancePlan(park_ids=(0, 1), reason="even")), in_flight=True)
    d = host.begin_step(0, 1.0)
    assert d.park_ids == (0, 1) and d.balance == "even"
    assert [r.req_id for r in d.decodes] == [2, 3]
    assert [host.records.by_id[i].num_parked for i in range(4)] == [1, 1, 0, 0]
    assert host.counters.parks == 2 and d.num_liveness == 0


def test_liveness_restores_every_parked_request_when_nothing_runs_and_nothing_is_in_flight():
    park_all = BalancePlan(park_ids=(0, 1, 2, 3))
    host, slots = make_host(Plans(park_all), in_flight=False)
    d = host.begin_step(0, 1.0)
    assert d.park_ids == (0, 1, 2, 3) and d.restore_ids == (0, 1, 2, 3) and d.num_liveness == 4
    assert len(d.decodes) == 4 and not slots.parked and host.counters.liveness_restores == 4
    # with a microbatch in flight the pipeline is not idle: the parked stay parked
    host, slots = make_host(Plans(park_all), in_flight=True)
    d = host.begin_step(0, 1.0)
    assert d.num_liveness == 0 and not d.decodes and len(slots.parked) == 4


def test_a_small_budget_rotates_the_decodes_and_counts_the_sitouts():
    class Two:
        last_reason = "two"

        def choose(self, view):
            return 2

        def observe(self, rec):
            return None

    host, _ = make_host(chunk=Two())
    first, second = host.begin_step(0, 1.0), host.begin_step(0, 2.0)
    assert [r.req_id for r in first.decodes] == [0, 1] and [r.req_id for r in second.decodes] == [2, 3]
    assert host.counters.decode_sitouts == 4 and first.reason == "two"


def test_batch_features_are_the_alp_sums():
    f = BatchFeatures.of([10, 20], [(0, 64, False), (100, 30, True)])
    assert (f.num_tokens, f.num_prefill_tokens, f.num_decode_reqs) == (96, 94, 2)
    assert (f.sum_past_x_pre, f.sum_pre_sq, f.sum_dec_ctx, f.num_sampled) == (3000, 64 * 64 + 900, 30, 3)
    head = f.head(7, 1, 128, "why")
    host, _ = make_host()
    (rec,) = host.stage_records(head, [(0, 1.0, 2.0)])
    assert (rec.mb_id, rec.slot, rec.chunk_budget, rec.reason, rec.sum_pre_sq) == (7, 1, 128, "why", 4996)


def test_request_log_folds_in_tokens_once_with_one_first_token_sample():
    log = RequestLog(Signals())
    rec = log.arrive(3, 1.0, 5, 4)
    with pytest.raises(ValueError, match="duplicate"):
        log.arrive(3, 1.0, 5, 4)
    assert log.took(rec, 2, 1.5) == 2 and log.took(rec, 2, 1.6) == 0 and log.took(rec, 3, 1.7) == 1
    assert rec.token_times == [1.5, 1.5, 1.7] and rec.first_token_at == 1.5
    assert list(log.signals.ttft) == [(1.5, 0.5)] and list(log.signals.arrivals) == [(1.0, 5)]
    RequestLog.end(rec, 2.0, FinishReason.STOP, "stop string")
    assert (rec.finish_reason, rec.finished_at, rec.detail) == (FinishReason.STOP, 2.0, "stop string")


@pytest.mark.parametrize(
    "name, reason",
    [
        ("FINISH_LENGTH", FinishReason.LENGTH),
        ("FINISH_MATCHED_TOKEN", FinishReason.STOP),
        ("FINISH_MATCHED_STR", FinishReason.STOP),
        ("FINISHED_MATCHED_REGEX", FinishReason.STOP),
        ("FINISH_ABORT", FinishReason.ABORTED),
        ("FINISH_SOMETHING_NEW", FinishReason.ABORTED),
    ],
)
def test_sglang_finish_reasons_map_explicitly(name, reason):
    obj = type(name, (), {"message": "client went away"})()
    got, detail = finish_reason_of(obj)
    assert got is reason
    if name == "FINISH_SOMETHING_NEW":
        assert "FINISH_SOMETHING_NEW" in detail  # an unknown reason is named, not guessed
    assert finish_reason_of(None)[0] is FinishReason.ABORTED


def test_static_means_the_same_chunk_in_every_executor():
    from fastpp.backends.torch.engine import PipelineEngine
    from fastpp.backends.torch.engine_config import EngineConfig
    from fastpp.backends.torch.weights_source import WeightsSource
    from fastpp.sim.run import DeploymentConfig, build_scheduler

    assert static_chunk() == DEFAULT_STATIC_CHUNK == SchedulerConfig(1, 1).default_chunk
    deployment = DeploymentConfig(pp=2, tp=1, policy="static")
    sim = build_scheduler(deployment.load_profile(), deployment)
    engine = PipelineEngine(WeightsSource.parse("random:tiny"), EngineConfig(policy="static"))
    vllm = VllmSchedulerSettings().scheduler_config(
        num_slots=2, max_budget=8192, kv_total_tokens=1 << 16, page_size=16, max_context=4096
    )
    sglang_ceiling = _default_ceiling(LaunchSpec(model="/m", pp=2, policy="static"))
    for config in (sim.config, engine.scheduler_config, vllm):
        assert config.default_chunk == DEFAULT_STATIC_CHUNK
        chunk, _ = make_policies("static", config)
        assert chunk.choose(SimpleNamespace()) == DEFAULT_STATIC_CHUNK
    assert sglang_ceiling == DEFAULT_STATIC_CHUNK  # SGLang's --chunked-prefill-size, so C fits
    # an engine's own limit caps it; the user's chunk wins below it
    assert static_chunk(limit=512) == 512 and static_chunk(300, limit=512) == 300
    user = VllmSchedulerSettings(default_chunk=300).scheduler_config(
        num_slots=2, max_budget=8192, kv_total_tokens=1 << 16, page_size=16, max_context=4096
    )
    assert user.default_chunk == 300

"""SlackPolicy: deadlines that can still be met set the chunk, banked TPOT slack pays for
catch-up only while the KV pool has room, and decode-only slots just above a tile boundary
park their richest decodes."""

from __future__ import annotations

import math

import pytest

from conftest import FakeClock, make_profile, make_scheduler
from fastpp.policies import make_policies
from fastpp.policies.predictive import PredictiveChunkPolicy, PredictiveConfig
from fastpp.policies.slack import SlackConfig, SlackPolicy
from fastpp.scheduler_config import SchedulerConfig
from fastpp.types import SLO, Request

CANDS = (16, 32, 64, 128, 256, 512)


def slack_for(pp=2, **cfg) -> SlackPolicy:
    return SlackPolicy.from_profile(make_profile(pp=pp), SlackConfig(**cfg), CANDS)


DEFAULT_SLO = SLO(2.0, 0.2)


def queued(policy, arrivals, prompt=200, slo=DEFAULT_SLO, kv=100_000, **cfg):
    clock = FakeClock()
    sched = make_scheduler(
        clock,
        policy,
        num_slots=2,
        kv_capacity_tokens=kv,
        chunk_candidates=CANDS,
        slo=slo,
        token_step=16,
        **cfg,
    )
    for i, t in enumerate(arrivals):
        sched.add_request(Request(i, t, prompt, 50))
    return sched, clock


def balancing(policy, **cfg):
    """A two-slot scheduler with ``policy`` as chunk policy and balancer, KV to spare."""
    clock = FakeClock()
    sched = make_scheduler(
        clock,
        policy,
        policy,
        num_slots=2,
        kv_capacity_tokens=100_000,
        chunk_candidates=CANDS,
        token_step=16,
        default_chunk=512,
        max_context=4096,
        **cfg,
    )
    return sched, clock


def test_the_registry_builds_one_object_for_both_roles():
    profile = make_profile(pp=2)
    cfg = SchedulerConfig(num_slots=2, kv_capacity_tokens=8192, token_step=16)
    chunk, balancer = make_policies("slack", cfg, profile)
    assert isinstance(chunk, SlackPolicy) and balancer is chunk
    chunk, balancer = make_policies("slack+ds", cfg, profile)
    assert balancer is not chunk


def test_a_request_past_its_deadline_does_not_drive_the_chunk_up():
    # one request 2.5 s old (its TTFT is lost whatever C is) ahead of fresh ones
    arrivals = [0.0] + [2.4] * 3
    slack = slack_for()
    sched, clock = queued(slack, arrivals)
    clock.t = sched.view.now = 2.5
    got = slack.choose(sched.view)
    predictive = PredictiveChunkPolicy.from_profile(make_profile(pp=2), PredictiveConfig(), CANDS)
    sched2, clock2 = queued(predictive, arrivals)
    clock2.t = sched2.view.now = 2.5
    assert predictive.choose(sched2.view) == CANDS[-1]  # its backlog is late: as fast as TPOT allows
    assert got < CANDS[-1] and slack.last.reason == "optimal"
    # and with the request still in time, the same queue needs the deadline's capacity
    sched3, clock3 = queued(slack_for(), [1.9] + [2.4] * 3)
    clock3.t = sched3.view.now = 2.5
    assert sched3.chunk_policy.choose(sched3.view) >= got


def test_a_queue_every_request_of_which_is_past_its_deadline_drains_at_the_tpot_bound():
    """No chunk saves a request already past its deadline, so with nobody else waiting the
    smallest chunk would meet the (absent) deadlines, and a backlog served so would drain at
    the tile floor's pace (14B sharegpt-synthetic, 12,000 requests at once: 43 req/s against
    static:768's 50). Overflowing, the queue drains as fast as the TPOT bound allows."""
    slack = slack_for()
    sched, clock = queued(slack, [0.0] * 4)
    clock.t = sched.view.now = 2.5
    assert slack.choose(sched.view) == CANDS[-1]
    assert slack.last.reason == "best-effort: overflowing queue"
    # one request still in time behind them: its deadline sets the chunk again
    sched2, clock2 = queued(slack_for(), [0.0] * 4 + [2.4])
    clock2.t = sched2.view.now = 2.5
    assert sched2.chunk_policy.choose(sched2.view) < CANDS[-1]
    assert sched2.chunk_policy.last.reason == "optimal"


def test_deadlines_are_cumulative_fcfs_prompt_tokens_and_slack():
    slack = slack_for(deadline_ratio=1.0)
    sched, clock = queued(slack, [0.0, 0.5, 1.0], prompt=100)
    clock.t = sched.view.now = 1.5
    assert [(a, s) for a, _, s in slack._deadlines(sched.view)] == [(100, 0.5), (200, 1.0), (300, 1.5)]


def test_while_the_kv_pool_has_room_a_request_also_counts_against_the_early_deadline():
    """Early slack = arrival + early_ratio x SLO TTFT - now while less than early_kv_share of
    the pool is used (here it is empty); -inf (never used) once that share is reached."""
    slack = slack_for()
    sched, clock = queued(slack, [0.0, 0.5, 1.0], prompt=100)
    clock.t = sched.view.now = 1.5
    assert [round(e, 9) for _, e, _ in slack._deadlines(sched.view)] == [-0.1, 0.4, 0.9]
    full = slack_for(early_kv_share=0.0)
    sched, clock = queued(full, [0.0, 0.5, 1.0], prompt=100)
    clock.t = sched.view.now = 1.5
    assert [e for _, e, _ in full._deadlines(sched.view)] == [-math.inf] * 3


def _chunk_after_filling(
    kv: int, pause: float = 10.0, optimal: bool = True, head_waited: float | None = None, **cfg
) -> tuple[int, float, float]:
    """(chunk, used KV share, required rate) for 40 prompts that arrived over the last second,
    their deadlines far off (SLO TTFT 20 s), behind 16 requests already decoding in a pool of
    ``kv`` tokens, ``pause`` seconds after those filled it; the inflow, scaled up by
    throughput_coeff, only the largest chunk covers. With ``optimal`` the decision must meet
    every deadline. ``head_waited``: one more prompt ahead of the 40, waiting that long."""
    slack = slack_for(predictive=PredictiveConfig(throughput_coeff=10.0), **cfg)
    sched, clock = queued(slack, [], slo=SLO(20.0, 0.2), kv=kv)
    for i in range(16):
        sched.add_request(Request(i, 0.0, 1000, 1000))
    while sched.view.num_waiting or sched.view.chunked is not None:
        for slot in range(2):
            plan = sched.schedule(slot)
            if plan is not None:
                clock.t += 0.001
                sched.update(plan)
    view = sched.view
    used = 1 - view.kv_free_tokens / view.kv_total_tokens
    t0 = clock.t
    if head_waited is not None:
        sched.add_request(Request(99, t0 + pause + 1.0 - head_waited, 100, 50))
    for i in range(40):
        sched.add_request(Request(100 + i, t0 + pause + i / 40, 1500, 50))
    clock.t = view.now = t0 + pause + 1.0
    chunk = slack.choose(view)
    assert slack.last.reason.startswith("optimal") or not optimal
    return chunk, used, slack.last.required_tok_s


def test_with_half_the_kv_pool_used_and_tpot_room_the_deadlines_alone_set_the_chunk():
    """With the pool nearly empty the chunk covers the inflow; with more than half of it used
    (the same requests in a smaller pool) and token gaps far under the SLO TPOT, the inflow no
    longer counts and the smallest chunk the tile floor allows meets every deadline."""
    roomy, used, required = _chunk_after_filling(400_000)
    assert used < 0.5 and required == pytest.approx(60_000) and roomy == CANDS[-1]
    tight, used, required = _chunk_after_filling(24_000)
    assert used >= 0.5 and required == 0.0 and tight == 128


def test_while_the_pool_fills_fast_the_chunk_covers_the_inflow():
    # the same half-used pool one second after it filled (from empty, in under 0.1 s): a queue
    # that grows with the pool is not a buffer (the inflow now counts the 16 first prompts too)
    chunk, used, required = _chunk_after_filling(24_000, pause=0.0, optimal=False)
    assert used >= 0.5 and required > 60_000 and chunk == CANDS[-1]
    # the same instant with the slope limit above that fill rate: the deadlines alone again
    chunk, used, required = _chunk_after_filling(24_000, pause=0.0, inflow_kv_slope=10.0)
    assert required == 0.0 and chunk == 128


def test_once_the_head_of_the_queue_is_past_its_deadline_the_chunk_covers_the_inflow():
    """A queue whose head has waited past deadline_ratio x SLO TTFT overflows, it buffers
    nothing: under sustained overload the pool would otherwise hover at inflow_kv_share while
    the queue grows without end (14B sharegpt-synthetic at 70 req/s: 41 req/s completed against
    static:768's 50)."""
    # the head waited 17.9 s of its 18 s deadline (0.9 x 20 s): the queue still buffers
    chunk, used, required = _chunk_after_filling(24_000, pause=20.0, optimal=False, head_waited=17.9)
    assert used >= 0.5 and required == 0.0
    # 18.1 s: past it, the inflow counts again and only the largest chunk covers it
    chunk, used, required = _chunk_after_filling(24_000, pause=20.0, optimal=False, head_waited=18.1)
    assert used >= 0.5 and required == pytest.approx(60_000) and chunk == CANDS[-1]


def test_without_tpot_room_the_chunk_covers_the_inflow_however_full_the_pool():
    # the same half-used pool; token gaps counted as near the SLO (inflow_tpot_ratio tiny)
    chunk, used, required = _chunk_after_filling(24_000, inflow_tpot_ratio=1e-9)
    assert used >= 0.5 and required == pytest.approx(60_000) and chunk == CANDS[-1]
    # and inflow_kv_share 1 keeps the inflow at any share below a full pool
    chunk, used, required = _chunk_after_filling(24_000, inflow_kv_share=1.0)
    assert required == pytest.approx(60_000) and chunk == CANDS[-1]


def test_the_default_deadline_keeps_a_tenth_of_the_ttft_slo_in_hand():
    slack = slack_for()
    sched, clock = queued(slack, [0.0, 0.5, 1.0], prompt=100)
    clock.t = sched.view.now = 1.5
    got = [(a, round(s, 9)) for a, _, s in slack._deadlines(sched.view)]
    assert got == [(100, 0.3), (200, 0.8), (300, 1.3)]


def test_deadlines_follow_the_admission_order_a_late_request_last():
    slack = slack_for(deadline_ratio=1.0)
    sched, clock = queued(slack, [0.0, 2.0, 2.2], prompt=100, queue_order="late_last")
    clock.t = sched.view.now = 2.5
    sched._queue.defer_late(2.5)  # as the scheduler does before it admits
    assert [round(s, 9) for _, _, s in slack._deadlines(sched.view)] == [1.5, 1.7, -0.5]


def test_a_decode_only_slot_just_over_a_tile_parks_its_richest_decodes_and_restores_them():
    policy = slack_for()
    sched, clock = balancing(policy)
    for i in range(36):  # 8-token prompts, 16 per 128-token microbatch: slots of 20 and 16
        sched.add_request(Request(i, 0.0, 8, 400))
    sizes = []
    for _ in range(60):
        for slot in range(2):
            plan = sched.schedule(slot)
            if plan is not None:
                if not plan.prefill:
                    sizes.append(len(plan.decode_req_ids))
                clock.t += 0.01
                sched.update(plan)
        for r in sched.view.iter_parked():  # nobody parked longer than the bound and a round
            assert clock.t - r.parked_at <= policy.slack.max_park_slo_ratio * 0.2 + 0.05
    assert policy.num_parks > 0 and policy.num_restores > 0
    # decode-only microbatches of 20 became 16 (a tile) most of the time, none was emptied
    assert sizes.count(16) > sizes.count(20) and min(sizes) > 0


def test_catch_up_spends_banked_slack_only_when_it_saves_deadlines_and_the_pool_has_room():
    """Every running request far ahead of its pace, a backlog arrived at t = 0 and no TPOT-safe
    chunk (256 here) clears it in time. With 26 prompts a stretched round (512) does: catch-up
    takes it while the KV pool has room, not once the pool is filling (the backlog is old
    enough for the lift of the KV bound, which restores the TPOT budget but never stretches
    it). With 40 prompts no chunk saves them: no stretch, the largest TPOT-safe chunk."""

    def backlog(n, filling=False):
        policy = slack_for(catchup_tpot_ratio=3.0, bank_quantile=0.0)
        sched, clock = queued(policy, [0.0] * n, prompt=2000, slo=SLO(2.0, 0.012))
        policy._slot_bank = {0: 1.0, 1: 1.0}  # 1 s banked: far more than any round
        pool = sched._kv.pool
        for t, share in ((0.5, 0.5), (1.0, 0.7 if filling else 0.5)):
            pool.used = int(share * pool.capacity)
            clock.t = sched.view.now = t
            chunk = policy.choose(sched.view)
        return chunk, policy.last.reason

    def tpot_safe(n):
        policy = PredictiveChunkPolicy.from_profile(make_profile(pp=2), PredictiveConfig(), CANDS)
        sched, clock = queued(policy, [0.0] * n, prompt=2000, slo=SLO(2.0, 0.012))
        clock.t = sched.view.now = 1.0
        return policy.choose(sched.view)

    safe = tpot_safe(26)
    assert backlog(26) == (512, "optimal: catch-up on banked slack") and safe < 512
    bound, why = backlog(26, filling=True)
    assert bound <= safe and "catch-up" not in why
    assert backlog(40) == (tpot_safe(40), "best-effort")


def test_observe_learns_once_though_the_record_comes_twice():
    from fastpp.types import IterationRecord

    policy = slack_for(pp=1)
    rec = IterationRecord(0, 0, 0, 0.0, 0.03, 100, 100, 0, 0, 10_000, 0, 128)
    before = policy.predictor.n_updates_
    policy.observe(rec)
    policy.observe(rec)  # the same record, as the balancer
    assert policy.predictor.n_updates_ == before + 1


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="bank_quantile"):
        SlackConfig(bank_quantile=1.0)
    with pytest.raises(ValueError, match="catchup_tpot_ratio"):
        SlackConfig(catchup_tpot_ratio=0.5)
    with pytest.raises(ValueError, match="deadline_ratio"):
        SlackConfig(deadline_ratio=1.5)
    with pytest.raises(ValueError, match="early_ratio"):
        SlackConfig(early_ratio=0.95)
    with pytest.raises(ValueError, match="early_kv_share"):
        SlackConfig(early_kv_share=1.5)
    with pytest.raises(ValueError, match="inflow_kv_share"):
        SlackConfig(inflow_kv_share=-0.1)
    with pytest.raises(ValueError, match="inflow_tpot_ratio"):
        SlackConfig(inflow_tpot_ratio=0.0)
    with pytest.raises(ValueError, match="inflow_kv_slope"):
        SlackConfig(inflow_kv_slope=-0.01)


def test_restores_for_room_never_lift_a_slot_above_an_even_share_of_all_decodes():
    """With an SLO TPOT no round comes near, no parked request is ever due: every restore is
    for room, and room stops at an even share of running and parked decodes over the slots
    (without that cap the first slot to launch below its boundary took a tile of parked
    requests, and that slot's decodes came to set every beat)."""

    class Recording(SlackPolicy):
        def plan(self, view, slot):
            before, even = view.num_running(slot), self._even_share(view)
            got = super().plan(view, slot)
            if got.restore_ids:
                self.restores.append((before, len(got.restore_ids), even))
            return got

    policy = Recording.from_profile(make_profile(pp=2), SlackConfig(), CANDS)
    policy.restores = []
    sched, clock = balancing(policy, slo=SLO(2.0, 50.0))
    for i in range(60):  # outputs of 40..334 tokens: the slots shrink unevenly as they finish
        sched.add_request(Request(i, 0.0, 8, 40 + (i * 37) % 295))
    for _ in range(400):
        for slot in range(2):
            plan = sched.schedule(slot)
            if plan is not None:
                clock.t += 0.01
                sched.update(plan)
    assert policy.num_parks > 0 and len(policy.restores) > 0
    assert all(before + n <= even for before, n, even in policy.restores), policy.restores

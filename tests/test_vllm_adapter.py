"""The vLLM backend's parts that need no vLLM: adapter, view, settings, stage-time files and the
launcher's command line. The adapter runs against tests/vllm_fake.py, a small copy of the vLLM
behaviour it relies on (the real engine: tests/test_vllm_backend.py)."""

from __future__ import annotations

import json
from collections import deque

import pytest

from conftest import FakeClock, make_profile
from fastpp.backends.vllm.adapter import Adapter
from fastpp.backends.vllm.launcher import SCHEDULER_CLS, VllmLaunch, cpu_bind, launch_from_options
from fastpp.backends.vllm.settings import ENV_VAR, STAGE_TIMES_ENV_VAR, VllmSchedulerSettings
from fastpp.backends.vllm.stage_times import StageTimesReader, StageTimesWriter
from fastpp.plan import BalancePlan
from fastpp.policies import make_policies
from fastpp.types import FinishReason
from fastpp.view import PolicyView, RequestView
from vllm_fake import FakeEngineLoop, FakeRequest, FakeVllm


class Recorded:
    """A Recorder that keeps everything in lists."""

    def __init__(self) -> None:
        self.decisions: list[dict] = []
        self.returns: list[dict] = []
        self.iterations = []
        self.ends = []

    def on_decision(self, entry: dict) -> None:
        self.decisions.append(entry)

    def on_return(self, entry: dict) -> None:
        self.returns.append(entry)

    def on_iteration(self, rec) -> None:
        self.iterations.append(rec)

    def on_request_end(self, rec) -> None:
        self.ends.append(rec)


def make_adapter(
    policy: str = "static",
    pp: int = 2,
    token_step: int = 1,
    max_budget: int = 256,
    kv_blocks: int = 64,
    stage_times=None,
    profile=None,
    **settings_fields,
):
    engine = FakeVllm(kv_blocks=kv_blocks)
    settings = VllmSchedulerSettings(policy=policy, token_step=token_step, **settings_fields)
    config = settings.scheduler_config(
        num_slots=pp,
        max_budget=max_budget,
        page_size=16,
        max_context=2048,
        kv_total_tokens=engine.kv_total_tokens(),
    )
    chunk, balancer = make_policies(policy, config, profile)
    clock = FakeClock()
    rec = Recorded()
    adapter = Adapter(
        config, chunk, balancer, engine, clock, max_budget=max_budget, recorder=rec, stage_times=stage_times
    )
    return adapter, engine, clock, rec


def burst(loop: FakeEngineLoop, n: int, prompt: int = 20, out: int = 6, t: float = 0.0) -> None:
    for i in range(n):
        loop.add(FakeRequest(f"r{i}", prompt, out, arrival_time=t))


# ---------------------------------------------------------------------------------- adapter
def test_view_and_requests_satisfy_the_policy_protocols():
    adapter, engine, _, _ = make_adapter()
    loop = FakeEngineLoop(engine, adapter, pp=2)
    burst(loop, 2)
    assert isinstance(adapter.view, PolicyView)
    assert all(isinstance(t, RequestView) for t in adapter.tracked.values())
    assert adapter.view.num_waiting == 2
    assert adapter.view.waiting_prefill_tokens == 40
    assert adapter.view.num_arrivals == 2


def test_static_budget_reproduces_the_frozen_split_and_every_request_finishes():
    """Without a balancer a burst prefilled in one step decodes in that step's slot only, as
    stock vLLM does; the decodes the adapter chose are exactly those scheduled."""
    adapter, engine, _, rec = make_adapter("static")
    loop = FakeEngineLoop(engine, adapter, pp=2)
    burst(loop, 8)
    loop.run()
    assert len(rec.ends) == 8 and all(r.finish_reason is FinishReason.LENGTH for r in rec.ends)
    assert all(r.num_generated == 6 and len(r.token_times) == 6 for r in rec.ends)
    decode_steps = [d for d in rec.decisions if d["scheduled_decodes"]]
    assert {d["slot"] for d in decode_steps} == {0}
    assert all(d["chosen_decodes"] == d["scheduled_decodes"] for d in rec.decisions)
    assert adapter.counters.unexpected_decodes == 0
    assert not adapter.tracked and not adapter.in_flight
    # host timing: every launched step returned once, in order, each instant after the last
    assert [r["mb_id"] for r in rec.returns] == [d["mb_id"] for d in rec.decisions]
    assert all(d["schedule_started_at"] <= d["at"] for d in rec.decisions)
    assert all(r["update_started_at"] is None and r["returned_at"] <= r["done_at"] for r in rec.returns)


def test_delay_balancer_with_unit_step_evens_the_slots():
    """static+ds with token_step 1: the 8 decodes stuck in slot 0 are split 4/4 and stay so."""
    adapter, engine, _, rec = make_adapter("static+ds", token_step=1)
    loop = FakeEngineLoop(engine, adapter, pp=2)
    burst(loop, 8, out=12)
    loop.run()
    assert len(rec.ends) == 8
    counts = [len(d["scheduled_decodes"]) for d in rec.decisions if d["scheduled_decodes"]]
    assert counts[0] == 4 and max(counts) == 4, counts
    assert {d["slot"] for d in rec.decisions if d["scheduled_decodes"]} == {0, 1}
    assert adapter.host.counters.parks >= 4 and adapter.host.counters.restores >= 4
    assert all(d["chosen_decodes"] == d["scheduled_decodes"] for d in rec.decisions)
    assert all(r.num_generated == 12 for r in rec.ends)


class Shrinking:
    """C = 4 for the first two decisions (the prefills), 2 afterwards."""

    last_reason = "shrinking"

    def __init__(self) -> None:
        self.calls = 0

    def choose(self, view):
        self.calls += 1
        return 4 if self.calls <= 2 else 2

    def observe(self, rec):
        return None


def test_budget_below_the_decode_count_rotates_the_slot():
    """Four decodes in slot 0 and C = 2: two ride each round, the others first next round,
    and none moves to slot 1 (the balancer's job, not the budget's)."""
    adapter, engine, _, rec = make_adapter("static")
    adapter.policies.chunk_policy = Shrinking()
    loop = FakeEngineLoop(engine, adapter, pp=2)
    for i in range(4):
        loop.add(FakeRequest(f"r{i}", 1, 5))
    loop.run()
    assert len(rec.ends) == 4 and all(r.num_generated == 5 for r in rec.ends)
    decoding = [d for d in rec.decisions if d["scheduled_decodes"]]
    assert {d["slot"] for d in decoding} == {0}
    assert [d["scheduled_decodes"] for d in decoding[:2]] == [["r0", "r1"], ["r2", "r3"]]
    assert all(d["total_scheduled"] <= d["budget"] for d in rec.decisions)
    assert adapter.host.counters.decode_sitouts > 0


def test_budget_is_capped_at_max_num_batched_tokens():
    adapter, engine, _, rec = make_adapter("static:4096", max_budget=100)
    loop = FakeEngineLoop(engine, adapter, pp=2)
    burst(loop, 3, prompt=80)
    loop.run()
    assert {d["budget"] for d in rec.decisions} == {100}
    assert max(d["total_scheduled"] for d in rec.decisions) == 100


class Raising:
    last_reason = ""

    def choose(self, view):
        raise RuntimeError("boom")

    def plan(self, view, slot):
        raise RuntimeError("boom")

    def observe(self, rec):
        raise RuntimeError("boom")


def test_raising_policies_fall_back_and_serving_goes_on(caplog):
    adapter, engine, _, rec = make_adapter("static", max_budget=64)
    adapter.policies.chunk_policy = Raising()
    adapter.policies.balancer = Raising()
    loop = FakeEngineLoop(engine, adapter, pp=2)
    burst(loop, 4)
    loop.run()
    assert len(rec.ends) == 4 and all(r.num_generated == 6 for r in rec.ends)
    assert {d["reason"] for d in rec.decisions} == {"fallback: policy error"}
    assert {d["budget"] for d in rec.decisions} == {64}  # default_chunk = max_num_batched_tokens
    assert adapter.policies.num_failures > 0
    assert sum("raised" in r.message for r in caplog.records) == 2  # once per kind


def test_a_balancer_plan_that_breaks_the_rules_is_ignored():
    class Bad:
        def plan(self, view, slot):
            return BalancePlan(park_ids=(999,))

        def observe(self, rec):
            return None

    adapter, engine, _, rec = make_adapter("static")
    adapter.policies.balancer = Bad()
    loop = FakeEngineLoop(engine, adapter, pp=2)
    burst(loop, 3)
    loop.run()
    assert len(rec.ends) == 3 and adapter.host.counters.parks == 0 and adapter.policies.num_failures > 0


def _first_scheduled(queue_order: str) -> tuple[list[str], Recorded]:
    """Eight 64-token prompts at t = 0 under a 32-token budget (about two steps each), a ninth
    at t = 1 s; SLO TTFT 0.5 s; 0.1 s per step. Request ids in the order their prefill began."""
    adapter, engine, clock, rec = make_adapter(
        "static:32", kv_blocks=256, queue_order=queue_order, slo_ttft_s=0.5
    )
    loop = FakeEngineLoop(engine, adapter, pp=2)
    for i in range(8):
        loop.add(FakeRequest(f"r{i}", 64, 4, arrival_time=0.0))
    began: dict[str, float] = {}
    while loop.has_requests() or loop.queue:
        if clock.t >= 1.0 and "new" not in loop.requests:
            loop.add(FakeRequest("new", 64, 4, arrival_time=clock.t))
        loop.step()
        for rid, r in loop.requests.items():
            if r.num_computed_tokens > 0:
                began.setdefault(rid, clock.t)
        clock.t += 0.1
    return sorted(began, key=lambda rid: (began[rid], rid)), rec


def test_queue_order_late_last_admits_the_on_time_request_before_the_late_ones():
    """At 1 s the prompts of t = 0 not yet begun have waited past the SLO TTFT: under late_last
    the one that arrives then goes first; under fcfs it waits behind them all. Every request
    completes either way."""
    fcfs, fcfs_rec = _first_scheduled("fcfs")
    late_last, late_rec = _first_scheduled("late_last")
    assert fcfs[-1] == "new"
    waiting_at_1s = fcfs[fcfs.index("new") - 1 :]  # at least one was still waiting at 1 s
    assert len(waiting_at_1s) >= 2
    pos = late_last.index("new")
    assert pos < len(late_last) - 1, late_last  # some late request began after it
    assert set(late_last[pos + 1 :]) <= {f"r{i}" for i in range(8)}
    for rec in (fcfs_rec, late_rec):
        assert len(rec.ends) == 9 and all(r.finish_reason is FinishReason.LENGTH for r in rec.ends)


def test_fcfs_leaves_vllms_queue_as_it_is():
    adapter, engine, clock, _ = make_adapter("static:32")
    queue = deque(FakeRequest(f"r{i}", 64, 4, arrival_time=0.0) for i in range(3))
    for r in queue:
        adapter.arrive(r)
    clock.t = 100.0
    before = list(queue)
    assert not adapter.order_waiting(queue) and list(queue) == before


def test_signals_ttft_and_token_gaps():
    adapter, engine, clock, _ = make_adapter("static")
    loop = FakeEngineLoop(engine, adapter, pp=2)
    burst(loop, 2, out=4)
    while loop.has_requests() or loop.queue:
        clock.t += 0.01
        loop.step()
    assert len(adapter.signals.ttft) == 2 and all(v > 0 for _, v in adapter.signals.ttft)
    assert adapter.signals.token_gap and all(v > 0 for _, v in adapter.signals.token_gap)


def test_preemption_leaves_the_slot_and_the_request_rejoins_after_recompute():
    adapter, engine, _, rec = make_adapter("static")
    loop = FakeEngineLoop(engine, adapter, pp=2)
    burst(loop, 2, out=8)
    for _ in range(6):
        loop.step()
    victim = next(
        t
        for t in adapter.tracked.values()
        if t.slot >= 0 and t.engine.num_computed_tokens < t.engine.num_tokens
    )  # decoding, not in flight
    engine.preempt(victim.engine)
    adapter.preempted(victim.engine_id)
    assert victim.slot == -1 and victim.rec.num_retractions == 1
    assert victim.remaining_prefill == victim.engine.num_tokens
    loop.run()
    assert len(rec.ends) == 2 and all(r.num_generated == 8 for r in rec.ends)


def test_abort_ends_the_record():
    adapter, engine, _, rec = make_adapter("static")
    loop = FakeEngineLoop(engine, adapter, pp=2)
    burst(loop, 2)
    loop.step()
    adapter.ended("r1", FinishReason.ABORTED, "aborted by client")
    assert [r.finish_reason for r in rec.ends] == [FinishReason.ABORTED]


def test_a_return_out_of_order_is_refused():
    adapter, engine, _, _ = make_adapter("static")
    loop = FakeEngineLoop(engine, adapter, pp=2)
    burst(loop, 1)
    loop.step()
    with pytest.raises(RuntimeError, match="not the oldest in flight"):
        adapter.returned(object())


def test_stage_times_become_iteration_records(tmp_path):
    reader = StageTimesReader(tmp_path, 2)
    writers = [StageTimesWriter(tmp_path, s) for s in range(2)]
    adapter, engine, clock, rec = make_adapter("static", stage_times=reader)
    loop = FakeEngineLoop(engine, adapter, pp=2)
    burst(loop, 1, out=2)
    decision = adapter.begin_step()
    out = engine.schedule(decision.budget, decision.held_ids)
    adapter.launched(decision, out, out.num_scheduled_tokens)
    writers[0].write(decision.seq, 1.0, 1.5)
    writers[1].write(decision.seq, 1.1, 2.0)  # started waiting before stage 0 ended
    engine.update(out, loop.requests)
    adapter.returned(out)
    (s0, s1) = rec.iterations
    assert (s0.stage, s0.started_at, s0.finished_at) == (0, 1.0, 1.5)
    assert (s1.stage, s1.started_at, s1.finished_at) == (1, 1.5, 2.0)
    assert s0.num_prefill_tokens == 20 and s0.sum_pre_sq == 400 and s0.mb_id == decision.seq


def test_stage_times_reader_waits_for_every_stage_and_whole_lines(tmp_path):
    reader = StageTimesReader(tmp_path, 2)
    (tmp_path / "stage0.csv").write_text("3,1.0,2.0\n4,2.0,3.0\n5,3.0")
    assert reader(3) is None  # stage 1 has not written
    (tmp_path / "stage1.csv").write_text("3,1.5,2.5\n")
    assert reader(3) == {0: (1.0, 2.0), 1: (1.5, 2.5)}
    with (tmp_path / "stage0.csv").open("a") as f:
        f.write(",3.5\nnot a line\n")
    with (tmp_path / "stage1.csv").open("a") as f:
        f.write("5,3.6,4.0\n")
    assert reader(5) == {0: (3.0, 3.5), 1: (3.6, 4.0)}  # 4 never completed: dropped


# ---------------------------------------------------------------------------------- settings
def test_settings_round_trip_through_the_environment():
    s = VllmSchedulerSettings(
        policy="greedy+ds", slo_tpot_s=0.1, chunk_candidates="64:512:64", token_step=1, record_dir="/tmp/x"
    )
    assert VllmSchedulerSettings.from_env(s.to_env()) == s
    assert VllmSchedulerSettings.from_env({}) == VllmSchedulerSettings()


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[1]", "JSON object"),
        ("{", "not JSON"),
        ('{"polcy": "static"}', "unknown field"),
        ('{"chunk_candidates": "9:1:1"}', "ascending"),
        ('{"slo_tpot_s": 0}', "tpot_s"),
        ('{"queue_order": "lifo"}', "queue_order must be one of fcfs, late_last"),
    ],
)
def test_bad_settings_are_named(text, match):
    with pytest.raises(ValueError, match=match):
        VllmSchedulerSettings.from_env({ENV_VAR: text})


def test_scheduler_config_never_exceeds_vllms_budget():
    cfg = VllmSchedulerSettings().scheduler_config(
        num_slots=2, max_budget=512, kv_total_tokens=4096, page_size=16, max_context=2048
    )
    assert max(cfg.chunk_candidates) == 512 and cfg.default_chunk == 512
    with pytest.raises(ValueError, match="none is <="):
        VllmSchedulerSettings(chunk_candidates="1024,2048").scheduler_config(
            num_slots=2, max_budget=512, kv_total_tokens=4096, page_size=16, max_context=2048
        )


# ---------------------------------------------------------------------------------- launcher
def test_cpu_bind_splits_the_cores_per_stage():
    assert cpu_bind(2, [0, 1]) == "0|1"
    assert cpu_bind(2, list(range(16))) == "0-7|8-15"
    assert cpu_bind(3, [0, 1, 2, 3, 6, 7, 8]) == "0-2|3,6|7-8"
    with pytest.raises(ValueError, match="at least 4 CPU cores"):
        cpu_bind(4, [0, 1])


def test_launch_command_and_environment(tmp_path):
    settings = VllmSchedulerSettings(policy="greedy", record_dir=str(tmp_path))
    launch = VllmLaunch(
        "/m",
        pp=2,
        port=9000,
        settings=settings,
        engine_python="/py",
        cpu=True,
        vllm_args=["--max-model-len", "2048"],
    )
    cmd = launch.command()
    assert cmd[:5] == ["/py", "-m", "vllm.entrypoints.cli.main", "serve", "/m"]
    for part in (
        ["--scheduler-cls", SCHEDULER_CLS],
        ["--distributed-executor-backend", "mp"],
        ["--shutdown-timeout", "30"],
        ["--enforce-eager"],
        ["--max-model-len", "2048"],
    ):
        assert any(cmd[i : i + len(part)] == part for i in range(len(cmd))), part
    env = launch.environment("/stages", base={"VLLM_CPU_OMP_THREADS_BIND": "0|1"})
    assert json.loads(env[ENV_VAR])["policy"] == "greedy"
    assert env[STAGE_TIMES_ENV_VAR] == "/stages" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"  # the user's binding is kept

    stock = VllmLaunch(
        "/m",
        pp=2,
        stock=True,
        engine_python="/py",
        cpu=False,
        vllm_args=["--distributed-executor-backend", "ray"],
    )
    cmd = stock.command()
    assert "--scheduler-cls" not in cmd and "--enforce-eager" not in cmd
    assert cmd.count("--distributed-executor-backend") == 1
    env = VllmLaunch("/m", stock=True, cpu=False).environment(None, base={})
    assert ENV_VAR not in env and "VLLM_CPU_OMP_THREADS_BIND" not in env


def test_launch_options_are_checked_before_vllm_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTPP_ENGINES_DIR", str(tmp_path))
    common = dict(
        pp=2,
        host="127.0.0.1",
        port=8000,
        profile=None,
        slo_ttft_ms=None,
        slo_tpot_ms=None,
        chunk_candidates=None,
        token_step=None,
        record_dir=None,
        engine_python=None,
        vllm_args=[],
    )
    with pytest.raises(ValueError, match="unknown chunk policy"):
        launch_from_options(model="/m", policy="nope", **common)
    with pytest.raises(FileNotFoundError, match="is not prepared"):
        launch_from_options(model="smollm2", policy="greedy", **common)
    launch = launch_from_options(model="/m", policy="stock", **common)
    assert launch.stock
    with pytest.raises(FileNotFoundError, match="no vLLM environment"):
        launch.check()
    late = launch_from_options(model="/m", policy="static", queue_order="late_last", **common)
    assert late.settings.queue_order == "late_last"
    assert json.loads(late.environment(None, base={})[ENV_VAR])["queue_order"] == "late_last"
    with pytest.raises(ValueError, match="--queue-order need ours"):
        launch_from_options(model="/m", policy="stock", queue_order="late_last", **common)
    priority = {**common, "vllm_args": ["--scheduling-policy", "priority"]}
    with pytest.raises(ValueError, match="needs --scheduling-policy fcfs, got priority"):
        launch_from_options(model="/m", policy="static", queue_order="late_last", **priority)
    assert launch_from_options(model="/m", policy="static", **priority).settings.queue_order == "fcfs"


def test_parked_requests_come_back_when_nothing_else_can_run():
    """Liveness: a balancer that parks everything must not idle the pipeline."""

    class ParkAll:
        def plan(self, view, slot):
            return BalancePlan(park_ids=tuple(t.req_id for t in view.iter_running(slot)))

        def observe(self, rec):
            return None

    adapter, engine, _, rec = make_adapter("static")
    adapter.policies.balancer = ParkAll()
    loop = FakeEngineLoop(engine, adapter, pp=2)
    burst(loop, 3, out=4)
    loop.run()
    assert len(rec.ends) == 3 and all(r.num_generated == 4 for r in rec.ends)
    assert adapter.host.counters.liveness_restores > 0 and adapter.host.counters.parks > 0


def test_every_registered_policy_runs_over_the_adapter(tmp_path):
    """The simulator's policies, unchanged, decide a vLLM run: each serves a burst to the end
    without a policy error, and the ones that learn get stage records."""
    for spec in ("greedy", "greedy:p90+ds", "predictive", "predictive:tokens+ds:tpot_first", "upstream"):
        reader = StageTimesReader(tmp_path / spec.replace(":", "_"), 2)
        writers = [StageTimesWriter(reader.folder, s) for s in range(2)]
        adapter, engine, clock, rec = make_adapter(spec, stage_times=reader, profile=make_profile())
        loop = FakeEngineLoop(engine, adapter, pp=2)
        burst(loop, 6, prompt=40, out=5)
        timed: set[int] = set()
        while loop.has_requests() or loop.queue:
            clock.t += 0.01
            for b in adapter.in_flight:  # the workers' lines for what is in the pipeline
                if b.num_tokens and b.mb_id not in timed:
                    timed.add(b.mb_id)
                    writers[0].write(b.mb_id, clock.t, clock.t + 0.004)
                    writers[1].write(b.mb_id, clock.t + 0.004, clock.t + 0.009)
            loop.step()
        assert len(rec.ends) == 6, spec
        assert adapter.policies.num_failures == 0, spec
        assert rec.iterations and adapter.counters.missing_stage_times == 0, spec

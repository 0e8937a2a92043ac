"""The SGLang backend's parts that run without SGLang: settings, launcher, view, checks, channel."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from fastpp.backends.sglang import checks, launcher
from fastpp.backends.sglang.adapter import SGLangAdapter, state_digest
from fastpp.backends.sglang.channel import Decision, _decode_record
from fastpp.backends.sglang.faults import PolicyFault, _Faulty
from fastpp.backends.sglang.host_timing import LoopStepTimer
from fastpp.backends.sglang.recorder import RecordWriter, read_jsonl
from fastpp.backends.sglang.settings import PluginSettings
from fastpp.backends.sglang.slot_state import SGLangSlots
from fastpp.backends.sglang.view import ParkedRequest, SGLangView
from fastpp.policies import make_policies
from fastpp.run_files import read_iterations_csv
from fastpp.scheduler_config import SchedulerConfig
from fastpp.signals import Signals
from fastpp.types import SLO, IterationRecord

PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "cpu_smollm2-135m_pp2.json"


# ---------------------------------------------------------------------- settings
def test_settings_round_trip_through_the_environment():
    s = PluginSettings(
        policy="predictive+ds",
        profile="p.json",
        record_dir="/r",
        slo=SLO(1.5, 0.1),
        chunk_candidates=(16, 32),
        token_step=4,
        epoch=12.5,
        queue_order="late_last",
        inject_fault=("chunk",),
        fault_every=3,
    )
    assert PluginSettings.from_env(s.to_env()) == s
    assert PluginSettings.from_env({}) is None  # no policy: the plugin stays inert


@pytest.mark.parametrize(
    "env, message",
    [
        ({"FASTPP_SGLANG_POLICY": "greedy", "FASTPP_SGLANG_SLO_MS": "1000"}, "TTFT_MS,TPOT_MS"),
        ({"FASTPP_SGLANG_POLICY": "greedy", "FASTPP_SGLANG_TOKEN_STEP": "x"}, "FASTPP_SGLANG_TOKEN_STEP"),
        ({"FASTPP_SGLANG_POLICY": "greedy", "FASTPP_SGLANG_INJECT_FAULT": "oops"}, "unknown target"),
        (
            {"FASTPP_SGLANG_POLICY": "greedy", "FASTPP_SGLANG_QUEUE_ORDER": "lifo"},
            "FASTPP_SGLANG_QUEUE_ORDER",
        ),
    ],
)
def test_bad_settings_name_the_variable(env, message):
    with pytest.raises(ValueError, match=message):
        PluginSettings.from_env(env)


# ---------------------------------------------------------------------- launcher
def test_cpu_thread_binding_splits_cores_over_ranks():
    assert launcher.cpu_thread_binding(2, [0, 1]) == "0|1"
    assert launcher.cpu_thread_binding(2, [0, 1, 2, 3]) == "0,1|2,3"
    with pytest.raises(ValueError, match="at least 4"):
        launcher.cpu_thread_binding(4, [0, 1])


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
    return d


def test_cpu_launch_applies_the_cpu_workarounds_and_the_plugin(model_dir, monkeypatch):
    monkeypatch.delenv("SGLANG_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    spec = launcher.LaunchSpec(
        model=str(model_dir),
        pp=2,
        policy="greedy+ds",
        chunk_candidates=(64, 128),
        port=31000,
        sglang_args=("--device", "cpu", "--max-total-tokens", "4096"),
    )
    argv, env = launcher.build_command(spec, python="/x/python")
    assert argv[:3] == ["/x/python", "-m", "sglang.launch_server"]
    assert argv[argv.index("--pp-size") + 1] == "2"
    assert argv[argv.index("--chunked-prefill-size") + 1] == "128"  # the largest candidate
    assert argv.count("--max-total-tokens") == 1 and "4096" in argv  # the user's value wins
    assert "--attention-backend" in argv and "--disable-cuda-graph" in argv
    assert env["SGLANG_CPU_OMP_THREADS_BIND"]
    assert env["PYTHONPATH"].split(":")[0] == str(launcher.SHIMS_DIR)
    assert env["SGLANG_PLUGINS"] == "fastpp"
    assert PluginSettings.from_env(env).policy == "greedy+ds"


def test_gpu_launch_has_no_cpu_workarounds_and_plain_launch_no_plugin(model_dir, monkeypatch):
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    monkeypatch.delenv("FASTPP_SGLANG_POLICY", raising=False)
    argv, env = launcher.build_command(launcher.LaunchSpec(model=str(model_dir), pp=4), python="/x/python")
    assert "--attention-backend" not in argv and "--chunked-prefill-size" not in argv
    assert "SGLANG_PLUGINS" not in env and "FASTPP_SGLANG_POLICY" not in env
    assert str(launcher.SHIMS_DIR) not in env.get("PYTHONPATH", "")


def test_launch_refuses_flags_fastpp_owns(model_dir):
    with pytest.raises(ValueError, match="--pp-size"):
        launcher.LaunchSpec(model=str(model_dir), sglang_args=("--pp-size", "2"))
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        launcher.build_command(launcher.LaunchSpec(model="/nonexistent"), python="/x/python")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "needs fastpp's plugin: pass --policy"),
        ({"policy": "slack", "sglang_args": ("--schedule-policy", "lpm")}, "--schedule-policy lpm sorts it"),
        (
            {"policy": "slack", "sglang_args": ("--enable-priority-scheduling",)},
            "--enable-priority-scheduling",
        ),
        ({"policy": "slack", "queue_order": "lifo"}, "--queue-order must be one of fcfs, late_last"),
    ],
)
def test_launch_refuses_a_queue_order_sglang_would_undo(model_dir, spec, message):
    spec = {"queue_order": "late_last", **spec}
    with pytest.raises(ValueError, match=message):
        launcher.LaunchSpec(model=str(model_dir), **spec)


def test_launch_passes_the_queue_order_to_the_plugin(model_dir, monkeypatch):
    spec = launcher.LaunchSpec(
        model=str(model_dir),
        policy="static:64",
        queue_order="late_last",
        sglang_args=("--schedule-policy", "fcfs"),
    )
    _, env = launcher.build_command(spec, python="/x/python")
    assert PluginSettings.from_env(env).queue_order == "late_last"


def test_tied_model_is_untied_for_pp(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    safetensors = pytest.importorskip("safetensors.torch")
    from fastpp.backends.sglang.untie import untie

    src = tmp_path / "tied"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    emb = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    safetensors.save_file({"model.embed_tokens.weight": emb}, str(src / "model.safetensors"))
    assert launcher.model_ties_embeddings(str(src))
    dst = untie(src, tmp_path / "untied")
    state = safetensors.load_file(str(dst / "model.safetensors"))
    assert torch.equal(state["lm_head.weight"], emb)
    assert not launcher.model_ties_embeddings(str(dst)) and (dst / "READY").exists()


# ---------------------------------------------------------------------- the view over fakes
class FakeReq:
    def __init__(self, rid, prompt, generated=0, prefix_len=0, extend_end=None, done=False):
        self.rid = rid
        self.origin_input_ids = list(range(prompt))
        self.output_ids = list(range(generated))
        self.prefix_len = prefix_len
        self.extend_end = extend_end
        self.done = done

    def finished(self):
        return self.done


def fake_scheduler(running, waiting=(), chunked=None, in_flight=(1,)):
    batches = [SimpleNamespace(reqs=list(r)) for r in running]
    return SimpleNamespace(
        waiting_queue=list(waiting),
        chunked_req=chunked,
        running_mbs=batches,
        mbs=[object() if k in in_flight else None for k in range(len(running))],
        max_total_num_tokens=10_000,
        token_to_kv_pool_allocator=SimpleNamespace(available_size=lambda: 9000),
        tree_cache=SimpleNamespace(evictable_size=lambda: 100),
        running_batch=batches[0],
    )


def make_view(sched, parked=None, slots=2, token_step=1):
    config = SchedulerConfig(
        num_slots=slots,
        kv_capacity_tokens=10_000,
        chunk_candidates=(16, 32, 64),
        default_chunk=64,
        token_step=token_step,
    )
    ids: dict = {}
    rid_of: dict = {}

    def identity(req):
        ident = ids.setdefault(req.rid, (len(ids), 1.0))
        rid_of[ident[0]] = req.rid
        return ident

    slots = SGLangSlots(identity, rid_of, park=None, restore=None)
    slots.parked.update(parked or {})
    slots.begin(sched, 0, sched.running_mbs[0])
    view = SGLangView(sched, config, Signals(), lambda: 5.0, identity, slots)
    view.begin(5.0, 0)
    return view


def test_view_presents_sglang_state_under_the_policy_view_members():
    decoding = [FakeReq(f"d{i}", 10, generated=3) for i in range(4)]
    chunked = FakeReq("c", 100, prefix_len=32, extend_end=64)
    waiting = [FakeReq("w0", 20), FakeReq("w1", 30)]
    finished = FakeReq("f", 5, generated=2, done=True)
    sched = fake_scheduler([decoding + [finished], [FakeReq("e", 8, generated=1)]], waiting, chunked)
    parked = {"p": ParkedRequest(FakeReq("p", 7, generated=2), parked_at=4.0)}
    view = make_view(sched, parked)
    assert view.num_slots == 2 and view.slot == 0 and view.now == 5.0
    assert view.num_running(0) == 4 and view.num_running(1) == 1  # finished ones do not count
    assert view.sum_decode_ctx(0) == 4 * 13
    assert [r.ctx_len for r in view.iter_running(0)] == [13] * 4
    assert view.num_waiting == 2 and view.waiting_prefill_tokens == 20 + 30 + (100 - 64)
    assert view.chunked.num_computed == 64 and view.chunked.remaining_prefill == 36
    assert [r.prompt_len for r in view.iter_waiting_newest_first()] == [30, 20]
    assert view.kv_free_tokens == 9100 and view.kv_total_tokens == 10_000
    assert view.is_in_flight(1) and not view.is_in_flight(0)
    assert view.num_parked == 1 and next(view.iter_parked()).parked_at == 4.0


@pytest.mark.parametrize("spec", ["greedy+ds", "predictive+ds", "static:32"])
def test_policies_run_on_the_sglang_view(spec):
    from fastpp.profile import load_profile

    sched = fake_scheduler(
        [[FakeReq(f"d{i}", 10, generated=3) for i in range(6)], []], waiting=[FakeReq("w", 40)], in_flight=()
    )
    view = make_view(sched)
    profile = load_profile(PROFILE) if spec.startswith("predictive") else None
    chunk_policy, balancer = make_policies(spec, view._config, profile)
    assert isinstance(chunk_policy.choose(view), int)
    plan = balancer.plan(view, 0)
    if spec.endswith("+ds"):  # 6 decodes in slot 0, none in slot 1: it parks toward 3 / 3
        assert len(plan.park_ids) == 3


def test_state_digest_changes_with_replicated_state():
    a = [FakeReq("a", 5, generated=1), FakeReq("b", 5, generated=1)]
    sched = fake_scheduler([a, []], waiting=[FakeReq("w", 3)])
    base = state_digest(sched, 0, sched.running_mbs[0], {})
    assert base == state_digest(sched, 0, sched.running_mbs[0], {})
    assert base != state_digest(sched, 1, sched.running_mbs[0], {})
    assert base != state_digest(sched, 0, sched.running_mbs[0], {"a": None})
    sched.waiting_queue.append(FakeReq("w2", 3))
    assert base != state_digest(sched, 0, sched.running_mbs[0], {})


def test_faulty_wrapper_raises_every_nth_call():
    inner = SimpleNamespace(choose=lambda view: 7, last_reason="x")
    wrapped = _Faulty(inner, "choose", every=3)
    assert wrapped.choose(None) == 7 and wrapped.choose(None) == 7
    with pytest.raises(PolicyFault):
        wrapped.choose(None)
    assert wrapped.last_reason == "x"


def test_adapter_fits_chunks_to_the_startup_ceiling_and_page_grid():
    adapter = SGLangAdapter(PluginSettings(policy="static:64"))
    adapter.ceiling, adapter.page_size = 256, 16
    assert adapter._fit(100, "r") == (96, "r (fitted 100->96)")
    assert adapter._fit(1000, "r")[0] == 256
    assert adapter._fit(3, "r")[0] == 16
    assert adapter._fit(128, "r") == (128, "r")


def test_leader_takes_one_set_of_stage_records_per_returning_microbatch():
    # the plugin calls before_result (BEFORE hook) then result (AFTER hook) on each returning
    # microbatch; with two microbatches in flight, a second receive would wait on one the last
    # stage has not run yet (SGLang's watchdog then kills the server)
    adapter = SGLangAdapter(PluginSettings(policy="static:64"), clock=lambda: 1.0)
    received = []
    adapter.channel = SimpleNamespace(recv_records=lambda: received.append(1) or [])
    adapter.host = SimpleNamespace(observe=lambda rec: None, returned=lambda *args: None)
    adapter.records, adapter.ready, adapter.is_leader = None, True, True
    adapter._awaiting_records = 2
    batch = SimpleNamespace(reqs=[], forward_mode=None, decoding_reqs=None)
    sched = SimpleNamespace(mbs=[batch, object()])
    adapter.before_result(batch)
    adapter.result(sched, batch)
    assert len(received) == 1 and adapter._awaiting_records == 1


def test_loop_step_timer_writes_each_non_idle_step_once():
    ticks = iter(range(100))
    written: list[dict] = []
    timer = LoopStepTimer(lambda: float(next(ticks)), written.append, rank=1)
    timer.begin("ingest", slot=0)
    timer.end("ingest")
    timer.begin("schedule")
    timer.end("schedule")
    timer.begin("launch")
    timer.end("launch")
    timer.begin("ingest", slot=1)  # an idle step: not written
    timer.end("ingest")
    timer.begin("ingest", slot=0)
    timer.begin("process_result")
    timer.end("process_result")
    timer.begin("process_result")  # a second call within the step keeps the first interval
    timer.end("process_result")
    timer.end("send_activations")  # an end without its begin is ignored
    timer.begin("ingest", slot=1)  # the next step starts: the last one is written
    assert written == [
        {"rank": 1, "step": 0, "slot": 0, "ingest": [0.0, 1.0], "schedule": [2.0, 3.0], "launch": [4.0, 5.0]},
        {"rank": 1, "step": 2, "slot": 0, "process_result": [9.0, 10.0]},
    ]


# ---------------------------------------------------------------------- channel and records
def test_decision_and_record_encodings_round_trip(tmp_path):
    import pickle

    d = Decision(3, 1, 64, "optimal", ("a",), ("b",), "0badcafe", "")
    assert pickle.loads(pickle.dumps(d)) == d
    rec = IterationRecord(5, 1, 0, 1.25, 2.5, 70, 64, 6, 1024, 4096, 120, 64)
    torch = pytest.importorskip("torch")
    from fastpp.backends.sglang.channel import _RECORD_FIELDS

    buf = torch.tensor([float(getattr(rec, f)) for f in _RECORD_FIELDS], dtype=torch.float64)
    assert _decode_record(buf) == rec
    w = RecordWriter(tmp_path, 0)
    w.iteration(rec)
    w.decision({"seq": 1})
    w.close()
    assert read_iterations_csv(tmp_path / "iterations.csv") == [rec]
    (tmp_path / "decisions.jsonl").open("a").write('{"seq": 2, "cut sh')  # a kill mid-line
    assert read_jsonl(tmp_path / "decisions.jsonl") == [{"seq": 1}]


# ---------------------------------------------------------------------- checks
def _batch(mb, slot, decision, mode="decode", chunks=(), decodes=(), chunk=64, budget=None, parked=()):
    n_pre = sum(c[2] for c in chunks)
    return {
        "rank": 0,
        "mb": mb,
        "slot": slot,
        "decision": decision,
        "mode": mode,
        "chunks": list(chunks),
        "decodes": list(decodes),
        "chunk": chunk,
        "adder_chunk_budget": budget,
        "parked": list(parked),
        "num_tokens": n_pre + len(decodes),
        "num_prefill_tokens": n_pre,
    }


def _write_run(root, batches_by_rank, decisions):
    root.mkdir(parents=True, exist_ok=True)
    for rank, batches in batches_by_rank.items():
        (root / f"batches_rank{rank}.jsonl").write_text("".join(json.dumps(b) + "\n" for b in batches))
    (root / "decisions.jsonl").write_text("".join(json.dumps(d) + "\n" for d in decisions))


def _decision(seq, slot, chunk=64, park=(), restore=()):
    return {
        "seq": seq,
        "slot": slot,
        "chunk": chunk,
        "reason": "",
        "park": list(park),
        "restore": list(restore),
        "fallback": "",
    }


def test_checks_pass_a_consistent_run_and_catch_divergent_ranks(tmp_path):
    batches = [
        _batch(0, 0, 1, "extend", chunks=[["a", 0, 64]], budget=64),
        _batch(1, 1, 2, "extend", chunks=[["a", 64, 10], ["b", 0, 20]], budget=64),
        _batch(2, 0, 3, decodes=["c"], parked=["d"]),
    ]
    decisions = [_decision(1, 0), _decision(2, 1), _decision(3, 0, park=["d"])]
    _write_run(tmp_path / "ok", {0: batches, 1: batches}, decisions)
    assert checks.rank_disagreements(tmp_path / "ok", 2) == []
    assert checks.applied_vs_decided(tmp_path / "ok") == []
    diverged = [dict(b) for b in batches]
    diverged[1]["chunks"] = [["a", 64, 10]]  # rank 1 formed a different microbatch
    _write_run(tmp_path / "bad", {0: batches, 1: diverged}, decisions)
    assert checks.rank_disagreements(tmp_path / "bad", 2) == [
        "microbatch 1: rank 1 differs from rank 0 in ['chunks']"
    ]


def test_checks_catch_a_budget_sglang_did_not_apply_and_a_parked_request_that_ran(tmp_path):
    batches = [
        _batch(0, 0, 1, "extend", chunks=[["a", 0, 64]], budget=128),
        _batch(1, 1, 2, decodes=["d", "e"]),
    ]
    decisions = [_decision(1, 0, chunk=64, park=["d"]), _decision(2, 1)]
    _write_run(tmp_path, {0: batches}, decisions)
    problems = checks.applied_vs_decided(tmp_path)
    assert any("adder got 128, the policy decided 64" in p for p in problems)
    assert any("request d runs while parked" in p for p in problems)


# ---------------------------------------------------------------------- fastpp serve --backend sglang
def test_serve_sglang_stops_sglang_on_sigterm_and_finishes_the_record_dir(tmp_path, model_dir):
    """The CLI's foreground path with a stand-in for SGLang's interpreter: a process that just
    sleeps in its own session. SIGTERM to fastpp must end it and write summary.json."""
    import os
    import signal
    import subprocess
    import sys
    import time

    fake = tmp_path / "python"
    pidfile = tmp_path / "engine.pid"
    fake.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 120\n")
    fake.chmod(0o755)
    records = tmp_path / "rec"
    records.mkdir()
    (records / "requests.jsonl").write_text(
        json.dumps(
            {
                "req_id": 0,
                "arrived_at": 1.0,
                "prompt_len": 4,
                "output_len": 2,
                "num_generated": 2,
                "scheduled_at": 1.1,
                "first_token_at": 1.5,
                "finished_at": 2.0,
                "finish_reason": "length",
                "detail": "",
                "num_retractions": 0,
                "num_parked": 0,
                "itl_ms": [500.0],
            }
        )
        + "\n"
    )
    cmd = [
        sys.executable,
        "-c",
        "from fastpp.cli.app import main; main()",
        "serve",
        "--backend",
        "sglang",
        "--engine-python",
        str(fake),
        "--model",
        str(model_dir),
        "--policy",
        "static:64",
        "--record-dir",
        str(records),
        "--device",
        "cpu",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    engine_pid = int(pidfile.read_text())
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert "sglang.launch_server" in out and "--chunked-prefill-size 64" in out
    with pytest.raises(ProcessLookupError):
        os.kill(engine_pid, 0)
    summary = json.loads((records / "summary.json").read_text())
    assert summary["completed"] == 1


# ---------------------------------------------------------------------- queue order
def _late_last_adapter(order="late_last"):
    from fastpp.scheduler_config import late_thresholds

    settings = PluginSettings(policy="static:64", slo=SLO(1.0, 0.1), queue_order=order)
    adapter = SGLangAdapter(settings)
    config = SchedulerConfig(num_slots=2, kv_capacity_tokens=1000, slo=settings.slo, queue_order=order)
    adapter._late_after, adapter._late_max_wait = late_thresholds(config)
    adapter.pp_rank = 0
    # when rank 0 first saw each request (our clock): a and b long ago, c just now; d was
    # retracted after its first token, so it is never late
    adapter._ids.update({"a": (0, 0.0), "b": (1, 0.5), "c": (2, 2.6), "d": (3, 0.2)})
    return adapter


def _queue():
    return [FakeReq("a", 8), FakeReq("b", 8), FakeReq("d", 8, generated=2), FakeReq("c", 8)]


def test_rank_0_puts_the_waiting_queue_in_late_last_order_and_the_other_ranks_follow():
    leader, follower = _late_last_adapter(), _late_last_adapter()
    sched = fake_scheduler([[], []], waiting=_queue())
    order = leader._late_last(sched, now=3.0)
    # a and b waited past the SLO TTFT without a first token: behind d and c
    assert order == ("d", "c", "a", "b") and [r.rid for r in sched.waiting_queue] == list(order)
    assert leader._late_last(sched, now=3.0) == ()  # already in order: nothing to send
    other = fake_scheduler([[], []], waiting=_queue())
    follower._apply_order(other, order)
    assert [r.rid for r in other.waiting_queue] == list(order) and follower.num_divergences == 0
    # after 10 x the SLO TTFT a late request goes first again (a); b and c are late by then
    sched = fake_scheduler([[], []], waiting=_queue())
    assert leader._late_last(sched, now=10.2) == ("a", "d", "b", "c")


def test_a_queue_order_that_does_not_match_is_a_divergence_and_fcfs_leaves_the_queue():
    follower = _late_last_adapter()
    other = fake_scheduler([[], []], waiting=_queue()[:3])
    follower._apply_order(other, ("d", "c", "a", "b"))
    assert [r.rid for r in other.waiting_queue] == ["a", "b", "d"] and follower.num_divergences == 1
    sched = fake_scheduler([[], []], waiting=_queue())
    assert _late_last_adapter("fcfs")._late_last(sched, now=3.0) == ()
    assert [r.rid for r in sched.waiting_queue] == ["a", "b", "d", "c"]

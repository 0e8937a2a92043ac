"""One policy, three executors, the same decisions: the simulator (our Scheduler), an engine with
SGLang's slot-state shape (SGLangSlots over per-slot running batches and a parked set, the
SGLang view) and one with vLLM's (the vLLM Adapter over tests/vllm_fake.py) each drive a
PolicyHost; fed the same scripted arrivals and lengths, at the same instants, with the same
stage times, the hosts decide the same chunk budgets and park / restore sets step for step, and
the requests end with the same records.

How: the simulator runs the workload and its trace is kept (arrivals and decisions from its
host, returns with their stage times from its driver). The two fake engines replay that
timeline: an arrival is added to the engine, a decision step of a slot runs the engine's own
host and then the engine's own batch forming, a return folds the engine's own batch in with
the simulator's stage times. Nothing of the simulator's decisions is copied: a fake that
decided differently would form a different batch and diverge.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from conftest import FakeClock, make_profile
from fastpp.backends.sglang.slot_state import SGLangSlots, live_reqs
from fastpp.backends.sglang.view import SGLangView
from fastpp.backends.vllm.adapter import Adapter
from fastpp.plan import BalancePlan
from fastpp.policies import make_policies
from fastpp.policy_host import BatchFeatures, PolicyHost, StepDecision
from fastpp.scheduler import Scheduler
from fastpp.scheduler_config import SchedulerConfig
from fastpp.sim.engine import PipelineSimulation
from fastpp.types import SLO, FinishReason, Request
from vllm_fake import FakeRequest, FakeVllm

PP = 2
KV_TOKENS = 1 << 22  # never binding: admission and retraction are the engines' own business
POLICIES = ("greedy", "greedy+ds", "predictive", "predictive+ds", "greedy+parkall")


class ParkAll:
    """A balancer that parks every decode of the launching slot: only the liveness rule brings
    them back (when nothing is in flight), so the pin covers that rule too."""

    observes = False

    def plan(self, view, slot):
        return BalancePlan(park_ids=tuple(r.req_id for r in view.iter_running(slot)))

    def observe(self, rec):
        return None


def build_policies(spec: str, config: SchedulerConfig):
    if spec.endswith("+parkall"):
        return make_policies(spec.removesuffix("+parkall"), config, None)[0], ParkAll()
    return make_policies(spec, config, make_profile(pp=PP))


def scripted_requests(n: int = 48, seed: int = 11) -> list[Request]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(40.0) if i % 12 else 0.2  # bursts with gaps between them
        out.append(Request(i, round(t, 6), rng.randint(20, 700), rng.randint(3, 90)))
    return out


def make_config() -> SchedulerConfig:
    # a tight SLO for the toy profile's millisecond microbatches: greedy and predictive move C
    return SchedulerConfig(
        num_slots=PP,
        kv_capacity_tokens=KV_TOKENS,
        max_context=1 << 16,
        chunk_candidates=tuple(range(64, 1025, 64)),
        token_step=2,
        slo=SLO(0.02, 0.01),
    )


# ---------------------------------------------------------------------- (a) the simulator
class TracingDriver:
    """The simulator's driver, with each return (and its stage times) put on the trace."""

    def __init__(self, inner, trace: list, now) -> None:
        self._inner, self._trace, self._now = inner, trace, now

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def stages_finished(self, plan, times):
        self._trace.append(("return", self._now(), plan.slot, tuple(times)))
        self._inner.stages_finished(plan, times)


def simulate(spec: str, requests: list[Request]) -> tuple[list, list, list]:
    """The simulator's trace, its decisions and its records."""
    profile = make_profile(pp=PP)
    config = make_config()
    chunk, balancer = build_policies(spec, config)
    sched = Scheduler(config, lambda: 0.0, chunk, balancer)
    trace: list = []
    sched.host.trace = trace.append
    sim = PipelineSimulation(profile, sched, requests)
    sim.driver = TracingDriver(sim.driver, trace, lambda: sim.clock.now)
    result = sim.run()
    decisions = [e[3] for e in trace if e[0] == "step"]
    return trace, decisions, result.records


def stage_spans(times) -> list[tuple[int, float, float]]:
    return [(stage, start, end) for stage, (start, end) in enumerate(times)]


# ---------------------------------------------------------------------- (b) SGLang's shape
@dataclass(eq=False)
class FakeReq:
    """What SGLangSlots and SGLangView read of SGLang's Req."""

    rid: str
    origin_input_ids: list
    max_new: int
    output_ids: list = field(default_factory=list)
    prefix_len: int = 0
    extend_end: int = 0
    done: bool = False
    kv: int = 0

    def finished(self) -> bool:
        return self.done

    @property
    def fill(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)


class FakeBatch:
    def __init__(self) -> None:
        self.reqs: list[FakeReq] = []


class FakeSGLang:
    """SGLang's scheduler state as the slot state and the view read it, and batch forming as
    SGLang does with --enable-mixed-chunk (the slot's decodes, the chunked request, then FCFS)."""

    def __init__(self) -> None:
        self.waiting_queue: list[FakeReq] = []
        self.chunked_req: FakeReq | None = None
        self.running_mbs = [FakeBatch() for _ in range(PP)]
        self.mbs: list = [None] * PP
        self.max_total_num_tokens = KV_TOKENS
        self.kv_used = 0
        self.token_to_kv_pool_allocator = self
        self.tree_cache = None

    def available_size(self) -> int:
        return self.max_total_num_tokens - self.kv_used

    def form(self, decodes: list[FakeReq], budget: int) -> list[tuple[FakeReq, int, int]]:
        budget -= len(decodes)
        chunks = []
        r = self.chunked_req
        if r is not None and budget > 0:
            n = min(r.fill - r.extend_end, budget)
            chunks.append((r, r.extend_end, n))
            r.extend_end += n
            budget -= n
            if r.extend_end == r.fill:
                self.chunked_req = None
        while budget > 0 and self.chunked_req is None and self.waiting_queue:
            r = self.waiting_queue.pop(0)
            r.kv = r.fill
            self.kv_used += r.kv
            n = min(r.fill, budget)
            chunks.append((r, 0, n))
            r.extend_end = n
            budget -= n
            if n < r.fill:
                self.chunked_req = r
        for d in decodes:  # each decode step writes its token's KV
            d.kv += 1
            self.kv_used += 1
        return chunks


def replay_sglang(spec: str, trace: list) -> tuple[list[StepDecision], list]:
    config = make_config()
    chunk, balancer = build_policies(spec, config)
    clock = FakeClock()
    sched = FakeSGLang()
    ids: dict[str, tuple[int, float]] = {}
    rid_of: dict[int, str] = {}

    def park(batch, reqs):
        batch.reqs = [r for r in batch.reqs if r not in reqs]

    def restore(_sched, batch, reqs):
        batch.reqs.extend(reqs)
        return batch

    slots = SGLangSlots(lambda req: ids[req.rid], rid_of, park=park, restore=restore)
    host = PolicyHost(config, chunk, balancer, slots)
    host.view = view = SGLangView(sched, config, host.signals, clock, lambda req: ids[req.rid], slots)
    decisions: list[StepDecision] = []
    records = {}
    for event in trace:
        kind, t = event[0], event[1]
        clock.t = t
        if kind == "arrive":
            _, _, req_id, prompt, output = event
            req = FakeReq(f"r{req_id}", list(range(prompt)), output)
            ids[req.rid] = (req_id, t)
            rid_of[req_id] = req.rid
            records[req_id] = host.arrive(req_id, t, prompt, output)
            sched.waiting_queue.append(req)
        elif kind == "step":
            slot = event[2]
            slots.begin(sched, slot, sched.running_mbs[slot])
            view.begin(t, slot)
            d = host.begin_step(slot, t)
            decisions.append(d)
            sched.running_mbs[slot] = slots.live_batch
            decodes = list(d.decodes)
            chunks = sched.form(decodes, d.budget)
            for r, _, _ in chunks:
                host.records.scheduled(records[ids[r.rid][0]], t)
            if decodes or chunks:
                f = BatchFeatures.of(
                    [r.fill for r in decodes], [(past, n, past + n == r.fill) for r, past, n in chunks]
                )
                sched.mbs[slot] = (decodes, chunks, f.head(len(decisions), slot, d.budget, d.reason))
        else:
            slot, times = event[2], event[3]
            decodes, chunks, head = sched.mbs[slot]
            sched.mbs[slot] = None
            host.stage_records(head, stage_spans(times))
            host.returned(slot, t, bool(decodes))
            done = [r for r in decodes] + [r for r, past, n in chunks if past + n == r.fill]
            for r in done:
                r.output_ids.append(0)
                rec = records[ids[r.rid][0]]
                host.records.took(rec, len(r.output_ids), t)
                if len(r.output_ids) >= r.max_new:
                    r.done = True
                    sched.kv_used -= r.kv
                    host.records.end(rec, t, FinishReason.LENGTH)
                elif r not in decodes:
                    sched.running_mbs[slot].reqs.append(r)  # joins where its last chunk ran
            batch = sched.running_mbs[slot]
            batch.reqs = live_reqs(sched, batch)
    return decisions, [records[i] for i in sorted(records)]


# ---------------------------------------------------------------------- (c) vLLM's shape
def replay_vllm(spec: str, trace: list) -> tuple[list[StepDecision], list]:
    config = make_config()
    chunk, balancer = build_policies(spec, config)
    clock = FakeClock()
    engine = FakeVllm(kv_blocks=KV_TOKENS, block_size=1)
    times_of: dict[int, dict[int, tuple[float, float]]] = {}
    adapter = Adapter(config, chunk, balancer, engine, clock, max_budget=1 << 20, stage_times=times_of.get)
    decisions: list[StepDecision] = []
    adapter.host.trace = lambda e: decisions.append(e[3]) if e[0] == "step" else None
    requests: dict[str, FakeRequest] = {}
    queue: list = []  # vLLM's batch queue: outputs in launch order, empty ones included
    records = []

    def fold_in(out) -> None:
        engine.update(out, requests)
        adapter.returned(out)

    def drain_empty() -> None:  # an empty output at the head of the queue resolves at once
        while queue and not queue[0].num_scheduled_tokens:
            fold_in(queue.pop(0))

    for event in trace:
        kind, t = event[0], event[1]
        clock.t = t
        if kind == "arrive":
            _, _, req_id, prompt, output = event
            r = requests[f"r{req_id}"] = FakeRequest(f"r{req_id}", prompt, output, arrival_time=t)
            engine.waiting.append(r)
            records.append(adapter.arrive(r).rec)
        elif kind == "step":
            decision = adapter.begin_step(event[2])
            out = engine.schedule(decision.budget, decision.held_ids)
            adapter.launched(decision, out, out.num_scheduled_tokens)
            queue.append(out)
            drain_empty()
        else:  # the simulator's stages serve in launch order: the oldest comes back
            slot, times = event[2], event[3]
            assert adapter.in_flight[0].slot == slot
            times_of[adapter.in_flight[0].mb_id] = dict(enumerate(times))
            fold_in(queue.pop(0))
            drain_empty()
    return decisions, records


# ---------------------------------------------------------------------- the comparison
def key(d: StepDecision, req_id) -> tuple:
    return (
        d.slot,
        d.at,
        d.budget,
        d.reason,
        d.park_ids,
        d.restore_ids,
        d.num_liveness,
        tuple(req_id(r) for r in d.decodes),
        d.balance,
        d.fallback,
    )


@pytest.fixture(scope="module")
def requests() -> list[Request]:
    return scripted_requests()


@pytest.mark.parametrize("spec", POLICIES)
def test_the_same_policy_decides_the_same_on_every_executor(spec, requests):
    trace, sim_decisions, sim_records = simulate(spec, requests)
    assert all(r.finish_reason is FinishReason.LENGTH for r in sim_records)
    expected = [key(d, lambda r: r.req_id) for d in sim_decisions]
    if "+" in spec:  # the pin covers balancing: parks and restores happen
        assert sum(len(d.park_ids) for d in sim_decisions) > 0
        assert sum(len(d.restore_ids) for d in sim_decisions) > 0
    if spec.endswith("+parkall"):
        assert sum(d.num_liveness for d in sim_decisions) > 0
    assert len({d.budget for d in sim_decisions}) > 1, "the policy never changed C: a weak pin"

    sglang_decisions, sglang_records = replay_sglang(spec, trace)
    sglang_ids = {f"r{r.req_id}": r.req_id for r in requests}
    assert [key(d, lambda r: sglang_ids[r.rid]) for d in sglang_decisions] == expected

    vllm_decisions, vllm_records = replay_vllm(spec, trace)
    assert [key(d, lambda t: t.req_id) for d in vllm_decisions] == expected

    want = [r.to_dict() for r in sim_records]
    assert [r.to_dict() for r in sglang_records] == want
    assert [r.to_dict() for r in vllm_records] == want


def test_a_different_policy_is_told_apart():
    """The comparison can fail: greedy's decisions are not predictive's."""
    reqs = scripted_requests()
    _, greedy, _ = simulate("greedy", reqs)
    _, predictive, _ = simulate("predictive", reqs)
    assert [key(d, lambda r: r.req_id) for d in greedy] != [key(d, lambda r: r.req_id) for d in predictive]

"""Every registered policy runs against two implementations of the policy interface and decides
the same: our Scheduler's view, and ``MinimalView`` below, written from fastpp/view.py alone.

A seeded simulation drives the real Scheduler. At each decision, a mirror copies the real view
into a MinimalView through the PolicyView protocol only (requests become plain ``Req`` objects
holding only RequestView fields), asks a twin policy (built from the same spec) on it, and
checks that the twin's answer equals the real policy's. A policy that read anything outside the
protocol (a scheduler attribute, ``r.rec``, ``r.fill_len``) would fail here with an
AttributeError, and one that depended on how our Scheduler stores state would disagree.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice

import pytest

from conftest import make_profile
from fastpp.plan import BalancePlan
from fastpp.policies import BALANCERS, POLICIES, make_policies
from fastpp.profile import Profile
from fastpp.scheduler import Scheduler
from fastpp.scheduler_config import SchedulerConfig
from fastpp.sim.engine import PipelineSimulation
from fastpp.types import SLO, IterationRecord
from fastpp.view import PolicyView, RequestView
from fastpp.workloads import make_requests


@dataclass(frozen=True, slots=True)
class Req:
    """A request as the protocol describes it, and nothing more."""

    req_id: int
    arrived_at: float
    prompt_len: int
    num_computed: int
    remaining_prefill: int
    ctx_len: int
    num_generated: int
    parked_at: float | None


def _req(r: RequestView) -> Req:
    return Req(
        r.req_id,
        r.arrived_at,
        r.prompt_len,
        r.num_computed,
        r.remaining_prefill,
        r.ctx_len,
        r.num_generated,
        r.parked_at,
    )


@dataclass(slots=True)
class MinimalView:
    """A PolicyView over plain lists: the second, independent implementation."""

    now: float
    num_slots: int
    slot: int
    slo: SLO
    chunk_candidates: tuple[int, ...]
    default_chunk: int
    token_step: int
    kv_total_tokens: int
    kv_free_tokens: int
    waiting: list[Req]
    chunked: Req | None
    running: list[list[Req]]
    in_flight: list[bool]
    parked: list[Req]
    recent_ttft: deque = field(default_factory=deque)
    recent_token_gap: deque = field(default_factory=deque)
    recent_arrivals: deque = field(default_factory=deque)
    num_arrivals: int = 0

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def waiting_prefill_tokens(self) -> int:
        chunked = self.chunked.remaining_prefill if self.chunked is not None else 0
        return sum(r.remaining_prefill for r in self.waiting) + chunked

    @property
    def waiting_arrival_sum(self) -> float:
        return sum(r.arrived_at for r in self.waiting)

    def iter_waiting(self) -> Iterator[Req]:
        return iter(self.waiting)

    def iter_waiting_newest_first(self) -> Iterator[Req]:
        return reversed(self.waiting)

    def num_running(self, slot: int) -> int:
        return len(self.running[slot])

    def sum_decode_ctx(self, slot: int) -> int:
        return sum(r.ctx_len for r in self.running[slot])

    def iter_running(self, slot: int) -> Iterator[Req]:
        return iter(self.running[slot])

    def is_in_flight(self, slot: int) -> bool:
        return self.in_flight[slot]

    @property
    def num_parked(self) -> int:
        return len(self.parked)

    def iter_parked(self) -> Iterator[Req]:
        return iter(self.parked)

    @classmethod
    def copy_of(cls, v: PolicyView) -> MinimalView:
        """Everything ``v`` shows, read through the protocol only. Signal samples are the same
        (immutable) tuple objects: a history is append-only, so a policy may remember one."""
        n = v.num_slots
        chunked = v.chunked
        return cls(
            now=v.now,
            num_slots=n,
            slot=v.slot,
            slo=v.slo,
            chunk_candidates=v.chunk_candidates,
            default_chunk=v.default_chunk,
            token_step=v.token_step,
            kv_total_tokens=v.kv_total_tokens,
            kv_free_tokens=v.kv_free_tokens,
            waiting=[_req(r) for r in v.iter_waiting()],
            chunked=None if chunked is None else _req(chunked),
            running=[[_req(r) for r in v.iter_running(s)] for s in range(n)],
            in_flight=[v.is_in_flight(s) for s in range(n)],
            parked=[_req(r) for r in v.iter_parked()],
            recent_ttft=deque(v.recent_ttft),
            recent_token_gap=deque(v.recent_token_gap),
            recent_arrivals=deque(v.recent_arrivals),
            num_arrivals=v.num_arrivals,
        )


def test_minimal_view_implements_the_protocols():
    view = MinimalView(0.0, 2, 0, SLO(), (64, 128), 64, 0, 100, 100, [], None, [[], []], [False] * 2, [])
    assert isinstance(view, PolicyView)
    assert isinstance(Req(0, 0.0, 8, 0, 8, 0, 0, None), RequestView)


class MirroredChunkPolicy:
    """The real policy decides; its twin decides on a MinimalView copy; both must agree."""

    def __init__(self, real, twin) -> None:
        self.real, self.twin = real, twin
        self.last_reason = ""
        self.decisions = 0

    def choose(self, view: PolicyView) -> int:
        want = self.real.choose(view)
        got = self.twin.choose(MinimalView.copy_of(view))
        assert (got, self.twin.last_reason) == (want, self.real.last_reason), (
            f"decision {self.decisions}: twin on MinimalView chose {got}, real view {want}"
        )
        self.last_reason = self.real.last_reason
        self.decisions += 1
        return want

    def observe(self, rec: IterationRecord) -> None:
        self.real.observe(rec)
        self.twin.observe(rec)


class MirroredBalancer:
    def __init__(self, real, twin) -> None:
        self.real, self.twin = real, twin
        self.decisions = self.parks = 0

    def plan(self, view: PolicyView, slot: int) -> BalancePlan:
        want = self.real.plan(view, slot)
        got = self.twin.plan(MinimalView.copy_of(view), slot)
        assert got == want, f"decision {self.decisions}: twin planned {got}, real view {want}"
        self.decisions += 1
        self.parks += len(want.park_ids)
        return want

    def observe(self, rec: IterationRecord) -> None:
        self.real.observe(rec)
        self.twin.observe(rec)


def _mirrored_run(
    spec: str, profile: Profile, requests, **config
) -> tuple[MirroredChunkPolicy, MirroredBalancer]:
    cfg = SchedulerConfig(
        num_slots=profile.pp,
        kv_capacity_tokens=profile.kv_capacity_tokens,
        token_step=profile.token_step,
        **config,
    )
    # real and twin each built once: a policy that is its own balancer (slack) stays one object
    (real_chunk, real_balancer), (twin_chunk, twin_balancer) = (
        make_policies(spec, cfg, profile) for _ in range(2)
    )
    chunk = MirroredChunkPolicy(real_chunk, twin_chunk)
    balancer = MirroredBalancer(real_balancer, twin_balancer)
    sched = Scheduler(cfg, lambda: 0.0, chunk, balancer)
    result = PipelineSimulation(profile, sched, requests).run()
    assert all(r.is_finished for r in result.records)
    return chunk, balancer


# Every chunk policy and every balancer of the registry, each with every argument it takes.
SPECS = [
    "static:96",
    "greedy",
    "greedy:p90",
    "greedy:tile",
    "predictive",
    "predictive:tokens",
    "upstream:256",
    "static:96+ds",
    "predictive+ds",
    "predictive+ds:tpot_first",
    "greedy+ds:e2e_first",
    "slack",
]


def test_specs_cover_the_registry():
    names = {s.split("+")[0].split(":")[0] for s in SPECS}
    balancers = {s.split("+")[1].split(":")[0] for s in SPECS if "+" in s} | {"none"}
    assert names == set(POLICIES) and balancers == set(BALANCERS)


@pytest.mark.parametrize("spec", SPECS)
def test_policy_decides_the_same_on_the_minimal_view(spec):
    # a small pipeline (tile of 16 tokens = 16 decodes per tile) and a burst of short-prompt,
    # long-output requests: slots outgrow the tile, so delay scheduling parks and restores
    profile = make_profile(pp=2, kv_tokens=20_000, step=16)
    requests = make_requests("random:48:96:0.5", seed=3, rate=None, num_requests=90)
    chunk, balancer = _mirrored_run(
        spec,
        profile,
        requests,
        chunk_candidates=(32, 48, 64, 96, 128, 192),
        default_chunk=96,
        max_context=4096,
        slo=SLO(0.5, 0.03),
    )
    assert chunk.decisions > 100
    if "+ds" in spec or spec == "slack":
        assert balancer.parks > 0, "the run was meant to make the balancer park"


def test_a_policy_reading_outside_the_protocol_is_caught():
    """The check has teeth: a policy that reads a scheduler-only field fails on MinimalView."""

    class Peeking:
        last_reason = "peek"

        def choose(self, view):
            return 64 + sum(r.fill_len for r in islice(view.iter_waiting(), 1))  # not in RequestView

        def observe(self, rec):
            return None

    cfg = SchedulerConfig(num_slots=2, kv_capacity_tokens=4000, chunk_candidates=(64,), default_chunk=64)
    profile = make_profile(pp=2)
    sched = Scheduler(cfg, lambda: 0.0, MirroredChunkPolicy(Peeking(), Peeking()))
    requests = make_requests("random:48:8", seed=0, rate=10.0, num_requests=4)
    PipelineSimulation(profile, sched, requests).run()  # the scheduler contains the failure ...
    assert "chunk policy: AttributeError" in sched.policies.errors  # ... and names it

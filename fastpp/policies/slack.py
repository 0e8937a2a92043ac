"""SlackPolicy: the chunk budget and the decode membership of each microbatch, chosen together
against every request's own SLO slack (docs/POLICIES.md, "slack").

One object is both the chunk policy and the decode balancer (``make_policies("slack")`` uses
it for both). It builds on the predictive controller (fastpp/policies/predictive.py): the same
ALP predictor, packing the next D_p microbatches, the tile floor and the KV trend; what it
changes is what the load and the TPOT budget are measured against.

TTFT slack (the chunk's lower bound). A waiting request i has slack s_i = arrival_i +
``deadline_ratio`` (0.9) x SLO TTFT - now and, in admission order, A_i prompt tokens at or ahead
of it (the continuing chunk included). The 10% margin covers what the prediction leaves out (the
pipeline's other slots, the first token's trip back). A chunk C whose slot round takes R(C) (its
D_p microbatches + the round overhead) and prefills K(C) tokens per second meets i's deadline
iff A_i <= K(C) x (s_i - R(C)). C keeps up iff it meets the deadline of every request that can
still make it (s_i > R(C); a request already past that point misses whatever C is, so it does
not drive the chunk up) and K(C) covers the prompt-token inflow. The first ``max_walk`` waiting
requests are checked. When every one of them is past its deadline, no chunk saves any, and the
smallest chunk would let a backlog drain at the tile floor's pace: the queue overflows, and the
chunk is the largest within the TPOT bound. Once ``inflow_kv_share`` (half) of the KV pool is
used, while the pool fills no faster than ``inflow_kv_slope`` (1%) of itself per second and TPOT
has room (the median of the last 32 token gaps is under ``inflow_tpot_ratio`` x SLO TPOT), the
deadlines alone set the chunk: a prompt that waits holds no KV, while a larger chunk lengthens
the round and so keeps every running request resident longer, and the TPOT room lets a later,
larger chunk drain what waits. A pool filling fast is a queue that grows with it (a burst still
arriving), and with the token gap near the SLO there is no room to drain it later: then the
chunk covers the inflow. So it does once the head of the queue is past its deadline: the queue
then overflows rather than buffers, and under sustained overload a queue left to grow while the
pool hovers at ``inflow_kv_share`` wastes the other half of it. While less than
``early_kv_share`` (half) of the KV pool is in use, a request counts against the earlier
deadline arrival_i + ``early_ratio`` (0.7) x SLO TTFT as long as the round can still make it:
with memory to spare a larger chunk's longer KV residency costs nothing, and the margin absorbs
a burst that lands on the queue; with the pool fuller, the chunk stays just in time, since
larger chunks hold KV longer.

Bursty arrivals: the predictive controller's rule. While less than ``burst_kv_share`` (half)
of the KV pool is used and the last ``burst_gaps`` (64) gaps between arrivals have a
coefficient of variation above ``burst_gap_cv`` (2.5; Poisson arrivals give about 1), no chunk
is chosen just in time: C is the largest within the TPOT bound (``tpot_coeff``'s, even while
the pool fills). A chunk that meets the deadlines of the requests already waiting falls behind
as the rest of a burst lands, and with the pool that roomy a larger chunk costs nothing in KV.

Over-commitment (the chunk's cap): the predictive controller's rule. Once a retracted request
waits, C is the smallest candidate above the launching slot's decodes until none waits and less
than ``over_committed_kv_share`` (0.8) of the pool is used: prompts are admitted about as fast
as finishing requests free their KV, not in the bursts a deadline or an overflowing queue would
ask for, each of which the pool gives back as more retractions. The KV ceiling is the predictive
controller's too: after a KV-pressure decision no scan (the stretch's included) goes past the
candidate below the largest chosen since the previous one, until the pool is under
``kv_bound_share`` used, the ceiling rising one candidate every ``kv_ceiling_hold_s``.

TPOT slack (the chunk's upper bound). The round bound is the predictive controller's
(``tpot_coeff`` x SLO TPOT, ``kv_bound_tpot_coeff`` while the KV pool fills). A running request
j, first seen decoding at t_j with g_j tokens, can take a next gap of up to
b_j = SLO TPOT x (generated - g_j + 1) - (now - t_j) and keep its TPOT since then within the SLO:
its banked slack. When no TPOT-safe C keeps up, catch-up may stretch the round up to the
``bank_quantile`` (the median) of b_j over the slots' requests (each slot's quantile when it
last launched; the smallest), at most ``catchup_tpot_ratio`` x SLO TPOT, only while the KV
pool has room (with the pool filling, a longer round only keeps requests resident longer), and
only when a stretched chunk then keeps up. A stretch that saves no deadline would lengthen the
trip of every microbatch behind it through the pipeline, so the first tokens of requests
already on course come later, and spend TPOT for nothing.

Decode membership (the balancer). A decode-only microbatch just above a tile boundary (at most
``park_excess_ratio`` of a tile above a multiple of the tile step) costs nearly a whole tile
more; its excess requests with the most banked slack (at least ``min_park_bank_rounds`` slot
rounds) sit out: they are parked. Parked requests come back, into the launching slot, as soon
as their banked slack falls under that many rounds, after ``max_park_slo_ratio`` x SLO TPOT
parked, or when the slot has room below its tile boundary and below an even share of all
decodes (running and parked over the D_p slots; without that cap the first slot to launch
with room took up to a tile of parked requests and the slots drifted apart, until one slot's
decodes set every beat). Nothing is parked while prompts
wait with KV to admit them: then the chunk budget, not the decode count, sets the
microbatch's size. The tile cap is the predictive controller's: a slot holding its decodes
launches decode only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import islice
from math import inf
from typing import ClassVar

from fastpp.plan import NO_BALANCE, BalancePlan
from fastpp.policies.predictive import PredictiveChunkPolicy, PredictiveConfig
from fastpp.policies.rules import first_above, tile_step, under_kv_pressure
from fastpp.predictor import LatencyPredictor
from fastpp.profile import Profile
from fastpp.types import IterationRecord
from fastpp.view import PolicyView

_PRUNE_EVERY = 4096  # decisions between prunings of the first-sighting table
_GAP_SAMPLES = 32  # token gaps whose median says whether TPOT has room (8 rounds at D_p = 4)


@dataclass(frozen=True, slots=True)
class SlackConfig:
    """Knobs of the slack policy (module docstring); ``predictive`` holds the shared ones."""

    predictive: PredictiveConfig = field(default_factory=PredictiveConfig)
    max_walk: int = 64  # waiting requests whose TTFT deadlines are checked
    # a waiting request's deadline: arrival + this x SLO TTFT (a margin for the prediction)
    deadline_ratio: float = 0.9
    # while less than early_kv_share of the KV pool is used: the earlier deadline arrival +
    # early_ratio x SLO TTFT, for each request that can still make it (module docstring)
    early_ratio: float = 0.7
    early_kv_share: float = 0.5
    # from this used share of the KV pool, while the pool fills no faster than inflow_kv_slope of
    # itself per second and the token gap is under inflow_tpot_ratio x SLO TPOT, the chunk need
    # not cover the prompt-token inflow (module docstring; inflow_kv_share 1 = it always does)
    inflow_kv_share: float = 0.5
    inflow_kv_slope: float = 0.01
    inflow_tpot_ratio: float = 0.85
    bank_quantile: float = 0.5  # catch-up stretches the round to this quantile of b_j ...
    catchup_tpot_ratio: float = 1.5  # ... and at most to this x SLO TPOT
    park_excess_ratio: float = 0.25  # park when a decode-only slot is this share of a tile over
    min_park_bank_rounds: float = 2.0  # a request sits out only with this many rounds banked
    max_park_slo_ratio: float = 1.0  # parked at most this x SLO TPOT

    def __post_init__(self) -> None:
        if self.max_walk < 1:
            raise ValueError(f"max_walk must be >= 1, got {self.max_walk!r}")
        if not 0 < self.deadline_ratio <= 1:
            raise ValueError(f"deadline_ratio must be in (0, 1], got {self.deadline_ratio!r}")
        if not 0 < self.early_ratio <= self.deadline_ratio:
            raise ValueError(f"early_ratio must be in (0, deadline_ratio], got {self.early_ratio!r}")
        for name in ("early_kv_share", "inflow_kv_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        for name in ("inflow_kv_slope", "inflow_tpot_ratio"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.bank_quantile < 1:
            raise ValueError(f"bank_quantile must be in [0, 1), got {self.bank_quantile!r}")
        if not self.catchup_tpot_ratio >= 1:
            raise ValueError(f"catchup_tpot_ratio must be >= 1, got {self.catchup_tpot_ratio!r}")
        if not 0 <= self.park_excess_ratio < 1:
            raise ValueError(f"park_excess_ratio must be in [0, 1), got {self.park_excess_ratio!r}")
        for name in ("min_park_bank_rounds", "max_park_slo_ratio"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")


class SlackPolicy(PredictiveChunkPolicy):
    """Chunk budget and decode membership against per-request SLO slack (module docstring)."""

    observes: ClassVar[bool] = True

    def __init__(
        self,
        predictor: LatencyPredictor,
        config: SlackConfig | None = None,
        candidates: tuple[int, ...] | None = None,
    ) -> None:
        self.slack = config or SlackConfig()
        super().__init__(predictor, self.slack.predictive, candidates)
        self._seen: dict[int, tuple[float, int]] = {}  # req_id -> (first seen decoding, tokens)
        self._slot_bank: dict[int, float] = {}  # slot -> bank quantile when it last launched
        self._banks: dict[int, float] = {}  # the launching slot's b_j, by request
        self._tracked: tuple[float, int] | None = None  # (now, slot) of the last tracking
        self._decisions = 0
        self._last_rec: IterationRecord | None = None
        self.num_parks = self.num_restores = 0

    @classmethod
    def from_profile(
        cls,
        profile: Profile,
        config: SlackConfig | None = None,  # type: ignore[override]
        candidates: tuple[int, ...] | None = None,
    ) -> SlackPolicy:
        """A policy for ``profile``'s deployment: its ALP predictor and round overhead, as
        ``PredictiveChunkPolicy.from_profile`` sets them."""
        cfg = config or SlackConfig()
        base = PredictiveChunkPolicy.from_profile(profile, cfg.predictive, candidates)
        policy = cls(base.predictor, replace(cfg, predictive=base.config), candidates)
        policy._num_stages = profile.pp
        return policy

    # ------------------------------------------------------------------ chunk budget
    def choose(self, view: PolicyView) -> int:
        cfg, scfg = self.config, self.slack
        cands = self.candidates or view.chunk_candidates
        self._num_stages = self._num_stages or view.num_slots
        n_dec = view.num_running(view.slot)
        first = first_above(cands, n_dec)
        if first is None:
            return self._done(cands[-1], "guard: decodes exceed every candidate")
        self._track(view)
        ruled = self._rule_chunk(view, cands, first, n_dec)
        if ruled >= 0:
            return ruled

        deadlines = self._deadlines(view)
        inflow = self._inflow(view, view.now) * cfg.throughput_coeff
        if self._queue_buffers(view, deadlines):
            inflow = 0.0  # the waiting queue is the cheaper buffer (module docstring)
        slo_tpot = view.slo.tpot_s
        # every checked request past its deadline: no chunk saves one, the queue must drain
        # (from the back: the latest arrivals are the likeliest still in time, so it stops at once)
        overflowing = bool(deadlines) and all(slack <= 0 for _, _, slack in reversed(deadlines))
        # bursty arrivals with the pool roomy: no chunk is just in time (module docstring)
        bursty = bool(deadlines) and self.bursty(view)

        def meets(capacity: float, round_s: float) -> bool:
            if capacity < inflow or overflowing or bursty:
                return False
            for ahead, early, slack in deadlines:
                if early > round_s:
                    slack = early
                if slack > round_s and ahead > capacity * (slack - round_s):
                    return False
            return True

        filling = self.kv.kv_bound(cfg.kv_bound_share, cfg.kv_horizon_s)
        kv_bound = filling and not self.kv_lifted(view)  # as self.kv_bound(view), the trend read once
        budget = self.tpot_budget(view, kv_bound, bursty)
        floor = self.floor_index(view, cands, first)
        found = self._scan(view, cands, floor, self.scan_stop(cands, floor), meets, budget)
        if found[0] < 0 and floor > first:
            found = self._scan(view, cands, first, floor, meets, budget)
        reason = ""
        # only while the pool is not projected to fill: the lift restores the budget, never stretches;
        # not while overflowing or bursty either, where no chunk meets and the stretch cannot save one
        if not found[3] and found[0] >= 0 and not (filling or overflowing or bursty):
            bank = min(self._slot_bank.values(), default=inf)
            stretch = min(bank, scfg.catchup_tpot_ratio * slo_tpot) - cfg.round_overhead_s
            if stretch > budget:
                stop = self.scan_stop(cands, found[0])
                wider = self._scan(view, cands, found[0], stop, meets, stretch)
                if wider[3]:  # only a stretch that saves the deadlines is worth its round
                    found, reason = wider, ": catch-up on banked slack"
        k, capacity, beat, met = found
        self._scan_chose(k)
        if not reason:
            reason = ": overflowing queue" if overflowing else self._tag(bursty, kv_bound)
        if met:
            return self._done(cands[k], "optimal" + reason, inflow, capacity, beat)
        if k >= 0:
            return self._done(cands[k], "best-effort" + reason, inflow, capacity, beat)
        return self._done(cands[first], "infeasible" + reason, inflow)

    def _deadlines(self, view: PolicyView) -> list[tuple[int, float, float]]:
        """(prompt tokens at or ahead of it, slack to the early deadline, TTFT slack; in s) of
        the first ``max_walk`` waiting requests, in admission order, the continuing chunk
        first. The early slack is -inf (never used) unless less than ``early_kv_share`` of the
        pool is used (``pool_under``)."""
        scfg = self.slack
        now, ttft = view.now, scfg.deadline_ratio * view.slo.ttft_s
        early = scfg.early_ratio * view.slo.ttft_s if self.pool_under(view, scfg.early_kv_share) else -inf
        out: list[tuple[int, float, float]] = []
        ahead = 0
        chunked = view.chunked
        if chunked is not None:
            ahead = chunked.remaining_prefill
            out.append((ahead, chunked.arrived_at + early - now, chunked.arrived_at + ttft - now))
        for r in islice(view.iter_waiting(), scfg.max_walk):
            ahead += r.remaining_prefill
            out.append((ahead, r.arrived_at + early - now, r.arrived_at + ttft - now))
        return out

    # ------------------------------------------------------------------ TPOT slack
    def _track(self, view: PolicyView) -> None:
        """First sightings and banked slack b_j of the launching slot's decodes (once per
        decision instant and slot); the slot's bank quantile is kept for the catch-up rule."""
        now, slot = view.now, view.slot
        if self._tracked == (now, slot):
            return
        self._tracked = (now, slot)
        seen, slo_tpot = self._seen, view.slo.tpot_s
        banks: dict[int, float] = {}
        for r in view.iter_running(slot):
            entry = seen.get(r.req_id)
            if entry is None:
                entry = seen[r.req_id] = (now, r.num_generated)
            banks[r.req_id] = slo_tpot * (r.num_generated - entry[1] + 1) - (now - entry[0])
        self._banks = banks
        if banks:
            values = sorted(banks.values())
            self._slot_bank[slot] = values[int(self.slack.bank_quantile * len(values))]
        else:
            self._slot_bank.pop(slot, None)
        self._decisions += 1
        if self._decisions % _PRUNE_EVERY == 0:
            live = {r.req_id for s in range(view.num_slots) for r in view.iter_running(s)}
            live.update(r.req_id for r in view.iter_parked())
            self._seen = {i: v for i, v in seen.items() if i in live}

    def _bank_of(self, view: PolicyView, req_id: int, generated: int) -> float:
        entry = self._seen.get(req_id)
        if entry is None:
            return 0.0  # never seen decoding: no slack known
        return view.slo.tpot_s * (generated - entry[1] + 1) - (view.now - entry[0])

    # ------------------------------------------------------------------ decode membership
    def plan(self, view: PolicyView, slot: int) -> BalancePlan:
        """Park the launching slot's excess over a tile boundary, restore parked requests whose
        slack ran low or that have room (module docstring)."""
        scfg = self.slack
        self._track(view)
        running = view.num_running(slot)
        unit = tile_step(view)
        round_s = self._round_estimate(view)
        need = scfg.min_park_bank_rounds * round_s
        restore: list[int] = []
        if view.num_parked:
            deadline = view.now - scfg.max_park_slo_ratio * view.slo.tpot_s
            # up to the next tile boundary, and no further than an even share of all decodes
            to_boundary = (-running) % unit if running else unit
            room = min(to_boundary, max(0, self._even_share(view) - running))
            for r in view.iter_parked():  # longest parked first
                due = (r.parked_at is not None and r.parked_at <= deadline) or self._bank_of(
                    view, r.req_id, r.num_generated
                ) < need
                if due or len(restore) < room:
                    restore.append(r.req_id)
        park: list[int] = []
        excess = (running + len(restore)) % unit
        if (
            not restore
            and running > unit
            and 0 < excess <= scfg.park_excess_ratio * unit
            and not self._prefill_pressure(view)
        ):
            rich = sorted(((b, i) for i, b in self._banks.items() if b >= need), reverse=True)
            if len(rich) >= excess:
                park = [i for _, i in rich[:excess]]
        if not park and not restore:
            return NO_BALANCE
        self.num_parks += len(park)
        self.num_restores += len(restore)
        return BalancePlan(tuple(park), tuple(restore), f"slack: park {len(park)}, restore {len(restore)}")

    @staticmethod
    def _even_share(view: PolicyView) -> int:
        """Decodes per slot if every running and parked request were spread evenly."""
        total = view.num_parked + sum(view.num_running(s) for s in range(view.num_slots))
        return -(-total // view.num_slots)

    def _queue_buffers(self, view: PolicyView, deadlines: list[tuple[int, float, float]]) -> bool:
        """True when the waiting queue, not the chunk, should absorb the inflow: at least
        ``inflow_kv_share`` of the KV pool used and the pool filling no faster than
        ``inflow_kv_slope`` of itself per second (both read from the KV trend ``choose`` has just
        updated), the head of the queue (the continuing chunk, else the first waiting request:
        the first of ``deadlines``) not yet past its deadline, and the
        median of the last ``_GAP_SAMPLES`` token gaps under ``inflow_tpot_ratio`` x SLO TPOT
        (False before any gap is measured)."""
        scfg = self.slack
        if self.kv.share < scfg.inflow_kv_share or self.kv.slope > scfg.inflow_kv_slope:
            return False
        if deadlines and deadlines[0][2] < 0:
            return False  # a queue whose head is past its deadline overflows: it buffers nothing
        gaps = sorted(gap for _, gap in islice(reversed(view.recent_token_gap), _GAP_SAMPLES))
        return bool(gaps) and gaps[len(gaps) // 2] < scfg.inflow_tpot_ratio * view.slo.tpot_s

    def _round_estimate(self, view: PolicyView) -> float:
        """The last slot round (a token gap sample), else the SLO TPOT."""
        gaps = view.recent_token_gap
        return gaps[-1][1] if gaps else view.slo.tpot_s

    def _prefill_pressure(self, view: PolicyView) -> bool:
        if view.num_waiting == 0 and view.chunked is None:
            return False
        return not under_kv_pressure(view, self.config.kv_free_watermark)

    # ------------------------------------------------------------------ learning
    def observe(self, rec: IterationRecord) -> None:
        """Learn once per record, though the executor hands it to this object twice (as the
        chunk policy and as the balancer)."""
        if rec is self._last_rec:
            return
        self._last_rec = rec
        super().observe(rec)

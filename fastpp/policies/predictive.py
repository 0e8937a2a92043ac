"""PredictiveChunkPolicy: the smallest chunk that keeps up with the load and keeps TPOT within
its SLO, using the ALP latency predictor (PAPER.md 3.2).

For each candidate C, in ascending order (lazily: stop as soon as the answer is known):

* pack the next D_p microbatches (the launching slot and the D_p - 1 after it) as the scheduler
  would: each slot's decodes first, then the continuing chunked request, then the waiting queue
  FCFS; where the queue runs dry the rest of the budget is filled with a fresh prompt standing
  for future arrivals, so the prediction is of a full microbatch (conservative, and monotone
  in C, which justifies stopping at the first TPOT violation);
* round(C) = the sum of the D_p microbatches' predicted times: a stage runs the D_p
  microbatches one after another, so a request's token comes back once per round of all of
  them (the online update learns from the slowest stage of each microbatch, the stage that
  sets it). PAPER.md 3.2 writes D_p x T_iter(C); with unequal slots, D_p x the slowest
  microbatch overstates the round and holds the chunk below what TPOT allows
  (``bottleneck_round=True`` restores it);
* TPOT bound: round(C) + round_overhead_s <= coeff * SLO TPOT, with coeff = tpot_coeff
  while the KV pool has room and kv_bound_tpot_coeff while it is filling (below);
* capacity(C) = sum over the D_p microbatches of (C - their decodes) / (round(C) +
  round_overhead_s): the prompt tokens per second the pipeline sustains in steady state with
  chunk C, a slot round being the D_p microbatches plus the round's host, token-return and
  link time;
* required rate = (prompt tokens arrived in the last window_s) / window + (prompt tokens of
  requests waiting longer than stale_ratio * SLO TTFT) / (their remaining TTFT budget),
  infinite when that budget is under one SLO TPOT (catch up as fast as TPOT allows).

The answer: the smallest C meeting both ("optimal"); else the largest TPOT-safe C
("best-effort"); else the smallest candidate ("infeasible": no SLO guarantee). Under KV pressure
the smallest candidate above every slot's decode count ("kv-pressure"). The chosen C is always a
candidate above the launching slot's decode count (when such a candidate exists), except at the
tile cap, where it is that decode count itself ("tile-cap: decode only") or the end of the
slot's last tile ("tile-cap: leftover fill").

Six rules beyond the paper's:

* Tile floor: while more prompt tokens wait than the largest sub-tile candidate would carry in
  the next D_p microbatches, the scan starts at the efficient tile (``rules.
  efficient_tile_index``: the smallest candidate whose predicted time per token is within
  ``tile_tolerance`` of the largest candidate's; 256 on A100 for Qwen2.5-14B and 32B, where
  128 tokens cost 57-99% more per token). A smaller C only runs when the floor itself breaks
  TPOT. With a shallower queue (a decode-heavy load's few short prompts) there is no floor:
  the small chunk prefills what waits and keeps the round, and so TPOT and KV residency, short.
* KV-aware TPOT budget: in steady state the pool fills with the decodes of admitted requests,
  and their residency is their output length times TPOT. Spending the whole TPOT budget on
  catching up a backlog then lengthens every request's stay and fills the pool faster, which
  ends in KV pressure and retractions. So the budget is ``tpot_coeff`` (the reference's 1.05)
  while the pool has room, and the tighter ``kv_bound_tpot_coeff`` once its used share,
  projected ``kv_horizon_s`` ahead on the trend measured over ``kv_trend_window_s``
  (``rules.KVTrend``), reaches ``kv_bound_share``. The reason then says ``kv-bound``. The
  tighter budget trades TTFT now for KV room later, a trade that loses while the pool still has
  room and the queue's head has already waited ``kv_lift_wait_ratio`` x SLO TTFT
  (``rules.backlog_waits``): the bound is then lifted until the used share reaches
  ``kv_lift_max_share``. A finite burst (the paper's fixed runs of 400 prompts fill the pool to
  about 80%) then keeps the whole budget; sustained load, which fills the pool past 90%, keeps
  the tighter one (docs/POLICIES.md). Nor is the bound lifted while the running decodes reach
  ``kv_lift_decode_share`` x D_p x the tile cap (below): the slots are then full of decodes,
  new prompts are admitted only as fast as decodes finish, and a larger chunk would lengthen
  every request's stay without clearing the backlog sooner. With one microbatch more in
  flight than stages (an async batch depth), whose rounds are longer, this happens with the
  pool under 90% full.
* Bursty arrivals: while less than ``burst_kv_share`` (half) of the KV pool is used and the
  last ``burst_gaps`` (64) gaps between arrivals have a coefficient of variation above
  ``burst_gap_cv`` (2.5; Poisson arrivals and the Azure trace stay under 2), no chunk is chosen
  just in time: C is the largest within the TPOT bound, ``tpot_coeff``'s even while the pool
  fills ("best-effort: bursty arrivals"). The inflow of a burst's first seconds understates
  the rest of it, still to land; a chunk sized to it falls behind, and with the pool that roomy
  a larger chunk's longer KV residency costs nothing (docs/RESULTS.md section 7: under gamma
  arrivals with cv 4, Qwen2.5-32B azure-conv, 2.00 -> 2.19 req/s against the best static
  chunk's 2.38).
* Tile cap: a slot whose decodes reach ``rules.decode_tile_cap`` launches decode only (the
  budget is its decode count). When the KV pool holds about a tile boundary's worth of decodes
  per slot, or a little more (CNN-Reversed on Qwen2.5-32B, near the 128 boundary), a slot that
  drifts past the boundary pays for a second tile it cannot fill: its round slows for every
  request in it, residency and so KV use grow, admission stalls and the queue runs away. Capped
  at the boundary, the slots stay on the cheaper tile (as a static chunk of 128 does by
  construction: it admits nothing into a slot holding 128 decodes; docs/RESULTS.md section 1).
  A slot already past a boundary has room left in its last tile: when the prompt next in line
  is longer than that room, the budget fills it ("tile-cap: leftover fill"). Such a fill
  completes no prompt, so no decode joins the slot, and takes no tile the decodes do not
  already occupy (Qwen2.5-32B sharegpt-synthetic with one microbatch more in flight than
  stages: steady-state goodput 23.50 -> 23.62 req/s; CNN-Reversed unchanged).
* Over-commitment: a retracted request waiting (one with generated tokens, at either end of the
  queue: ``rules.retracted_waits``) means admission promised the KV pool more than it holds.
  From then on, until no retracted request waits and less than ``over_committed_kv_share`` of
  the pool is used, C is the smallest candidate above the launching slot's decodes
  ("over-committed"): prefill takes only what the slot's tile leaves beside them, so prompts
  are admitted about as fast as finishing requests free their KV. Without it, a decode-heavy
  load under overload (CNN-Reversed served as a backlog) catches up in bursts of short prompts
  whose growth the pool gives back as retractions, over and over (docs/RESULTS.md section 9).
  A load whose pool never runs short never retracts, so the rule never acts.
* KV ceiling: a KV-pressure decision after the scan chose candidate k since the previous one
  caps the scan at candidate k - 1 (never below its start). With the pool full, admission waits
  on finishing requests, not on the chunk; where time per token is flat above the tile, a
  larger chunk only lengthens the round, and so every request's stay, the decodes resident and
  the next KV pressure (Qwen2.5-14B azure-conv served as a backlog: 768 alternating with
  128-token drain microbatches, against a steady 640). The ceiling is dropped once less than
  ``kv_bound_share`` of the pool is used, and rises one candidate every ``kv_ceiling_hold_s``
  (10 s), so a load that grows out of it gets the larger chunk back.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import islice

from fastpp._mypyc import mypyc_attr
from fastpp.policies.rules import (
    KVTrend,
    backlog_waits,
    decode_tile_cap,
    efficient_tile_index,
    first_above,
    gaps_cv,
    kv_pressure_index,
    prompts_outrun,
    retracted_waits,
    tile_step,
    under_kv_pressure,
    waiting_head,
)
from fastpp.predictor import ALPPredictor, LatencyPredictor
from fastpp.profile import Profile
from fastpp.types import IterationRecord, pickle_by_constructor
from fastpp.view import PolicyView

_INF = float("inf")


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassable when compiled (fastpp/_mypyc.py)
@dataclass(frozen=True, slots=True)
class PredictiveConfig:
    """Knobs of the predictive controller; defaults match the reference implementation."""

    tpot_coeff: float = 1.05  # TPOT bound: D_p * beat <= coeff * SLO TPOT
    throughput_coeff: float = 1.0  # scales the required prefill rate
    window_s: float = 10.0  # sliding window of the prompt-token arrival rate
    stale_ratio: float = 0.25  # a request waiting > ratio * SLO TTFT needs catching up
    # below this free KV share: drain mode. 0.03, not the reference's 0.10: with the KV-aware
    # TPOT budget, draining at 10% free stalled prefill that the admission reserve already
    # bounds (Qwen2.5-32B azure-conv steady state 6.22 -> 6.38 req/s; CNN-Reversed 4.59 -> 4.50)
    kv_free_watermark: float = 0.03
    round_overhead_s: float = 0.0  # per slot round, beyond D_p beats (host, token return, links)
    learn: bool = True  # update the predictor online from each microbatch's bottleneck stage
    tile_tolerance: float = 1.25  # efficient tile: time per token within this of the largest C's
    # TPOT bound while the KV pool is filling. 0.8, not 0.9, since the round is the sum of its
    # microbatches: steady state (docs/RESULTS.md) Qwen2.5-14B sharegpt-synthetic 47.0 -> 48.5,
    # azure-conv 13.25 -> 13.5 req/s (its cost on the azure-conv fixed runs, 6.50 -> 6.38 req/s,
    # the lift below more than recovers: 7.00)
    kv_bound_tpot_coeff: float = 0.8
    kv_bound_share: float = 0.8  # ... i.e. its projected used share reaches this
    kv_horizon_s: float = 10.0  # projection horizon of the KV trend
    kv_trend_window_s: float = 5.0  # the trend is measured over this window
    # the round as D_p x its slowest microbatch (PAPER.md 3.2) instead of the sum of the D_p
    # microbatches' times: a stage runs them one after another, so the sum is the round
    bottleneck_round: bool = False
    tile_cap: bool = True  # no prefill into a slot holding the tile cap's decodes
    # the KV bound is lifted while the oldest waiting prompt has waited this share of the SLO
    # TTFT and the pool's used share is below kv_lift_max_share (0 turns the lift off)
    kv_lift_wait_ratio: float = 0.4
    kv_lift_max_share: float = 0.9
    # ... and the running decodes are under this share of D_p x the tile cap: past it the
    # slots, not the chunk, hold the backlog back (module docstring)
    kv_lift_decode_share: float = 0.9
    # once a retracted request waits (admission over-committed the KV pool), prefill takes only
    # the launching slot's tile leftover until none waits and the pool's used share is under
    # this (module docstring; 0 turns the rule off)
    over_committed_kv_share: float = 0.8
    # after a KV-pressure decision the scan stays below the largest candidate chosen since the
    # previous one, until the pool's used share is under kv_bound_share; the ceiling rises one
    # candidate per this many seconds (module docstring; 0 turns the rule off)
    kv_ceiling_hold_s: float = 10.0
    # bursty arrivals: while less than burst_kv_share of the KV pool is used and the last
    # burst_gaps gaps between arrivals have a coefficient of variation above burst_gap_cv, no
    # chunk is chosen just in time (module docstring; inf turns the rule off)
    burst_gap_cv: float = 2.5
    burst_gaps: int = 64
    burst_kv_share: float = 0.5

    def __post_init__(self) -> None:
        for name in (
            "tpot_coeff",
            "throughput_coeff",
            "window_s",
            "kv_bound_tpot_coeff",
            "kv_trend_window_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("stale_ratio", "kv_free_watermark", "kv_lift_wait_ratio"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")
        if not self.tile_tolerance >= 1:
            raise ValueError(f"tile_tolerance must be >= 1, got {self.tile_tolerance!r}")
        if not 0 < self.kv_lift_decode_share <= 1:
            raise ValueError(f"kv_lift_decode_share must be in (0, 1], got {self.kv_lift_decode_share!r}")
        if not 0 < self.kv_lift_max_share <= 1:
            raise ValueError(f"kv_lift_max_share must be in (0, 1], got {self.kv_lift_max_share!r}")
        if not 0 <= self.over_committed_kv_share <= 1:
            share = self.over_committed_kv_share
            raise ValueError(f"over_committed_kv_share must be in [0, 1], got {share!r}")
        if not 0 < self.kv_bound_share <= 1:
            raise ValueError(f"kv_bound_share must be in (0, 1], got {self.kv_bound_share!r}")
        if self.kv_horizon_s < 0:
            raise ValueError(f"kv_horizon_s must be >= 0, got {self.kv_horizon_s!r}")
        if self.round_overhead_s < 0:
            raise ValueError(f"round_overhead_s must be >= 0, got {self.round_overhead_s!r}")
        if self.kv_ceiling_hold_s < 0:
            raise ValueError(f"kv_ceiling_hold_s must be >= 0, got {self.kv_ceiling_hold_s!r}")
        if self.burst_gaps < 2:
            raise ValueError(f"burst_gaps must be >= 2, got {self.burst_gaps!r}")
        if not self.burst_gap_cv > 0:
            raise ValueError(f"burst_gap_cv must be > 0, got {self.burst_gap_cv!r}")
        if not 0 <= self.burst_kv_share <= 1:
            raise ValueError(f"burst_kv_share must be in [0, 1], got {self.burst_kv_share!r}")


@dataclass(slots=True)
class Decision:
    """What the last choose() decided and why (kept for logs, tests and timelines)."""

    chunk: int = 0
    reason: str = ""
    required_tok_s: float = 0.0
    capacity_tok_s: float = 0.0
    beat_s: float = 0.0

    # Written out (as fastpp/plan.py's value types): one per chunk decision.
    def __init__(
        self,
        chunk: int = 0,
        reason: str = "",
        required_tok_s: float = 0.0,
        capacity_tok_s: float = 0.0,
        beat_s: float = 0.0,
    ) -> None:
        self.chunk = chunk
        self.reason = reason
        self.required_tok_s = required_tok_s
        self.capacity_tok_s = capacity_tok_s
        self.beat_s = beat_s


@dataclass(slots=True)
class _Stream:
    """The prompt tokens the next microbatches would take, as one concatenated stream.

    Request i covers stream positions [starts[i], starts[i] + lens[i]) and has ``offsets[i]``
    tokens already in KV before its first position (only the chunked request has any).
    ``cum_sq[i]`` = sum of lens[k]^2 for k < i, for whole requests in the middle of a slice.
    """

    starts: list[int] = field(default_factory=list)
    lens: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    cum_sq: list[int] = field(default_factory=lambda: [0])
    total: int = 0

    def add(self, length: int, offset: int) -> None:
        self.starts.append(self.total)
        self.lens.append(length)
        self.offsets.append(offset)
        self.cum_sq.append(self.cum_sq[-1] + length * length)
        self.total += length

    def features(self, a: int, b: int) -> tuple[int, int]:
        """(sum L_past*L_pre, sum L_pre^2) of the chunks covering positions [a, b). Positions
        past the end belong to one fresh prompt (future arrivals)."""
        spp = sps = 0
        end = min(b, self.total)
        if a < end:
            starts, lens, offsets = self.starts, self.lens, self.offsets
            i = bisect_right(starts, a) - 1
            j = bisect_right(starts, end - 1) - 1
            if i == j:
                pre = end - a
                spp += (offsets[i] + a - starts[i]) * pre
                sps += pre * pre
            else:
                pre = starts[i] + lens[i] - a  # tail of request i
                spp += (offsets[i] + a - starts[i]) * pre
                sps += pre * pre
                sps += self.cum_sq[j] - self.cum_sq[i + 1]  # whole requests, no prefix
                pre = end - starts[j]  # head of request j
                spp += offsets[j] * pre
                sps += pre * pre
        pad = b - max(a, self.total)
        if pad > 0:
            sps += pad * pad
        return spp, sps


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassable when compiled (fastpp/_mypyc.py)
class PredictiveChunkPolicy:
    """ALP-based smallest-feasible-chunk controller (module docstring)."""

    def __init__(
        self,
        predictor: LatencyPredictor,
        config: PredictiveConfig | None = None,
        candidates: tuple[int, ...] | None = None,
    ) -> None:
        self.predictor = predictor
        self.config = config or PredictiveConfig()
        self.candidates = candidates  # None: the view's
        self.last_reason = ""
        self.last = Decision()
        self.reasons: Counter[str] = Counter()
        self._beats: dict[int, list] = {}  # mb_id -> [max duration, record of that stage]
        self._num_stages = 0
        self._first_arrival_at: float | None = None
        self._window: deque[tuple[float, int]] = deque()  # arrivals in the inflow window
        self._window_tokens = 0
        self._arrivals_seen = 0
        self.kv = KVTrend(self.config.kv_trend_window_s)
        self._tile: tuple[tuple[int, ...], int] | None = None  # (candidates, floor index)
        self._over_committed = False  # a retracted request waited; see admission_throttled
        self._ceiling = -1  # the largest candidate index the scan may choose (-1: none); scan_stop
        self._ceiling_at = 0.0  # when the ceiling was last set or raised
        self._largest_since_pressure = -1  # largest candidate index the scan chose since then
        self._gaps_cv = (-1, 0.0)  # (arrivals counted, CV of the last burst_gaps gaps then)

    @classmethod
    def from_profile(
        cls,
        profile: Profile,
        config: PredictiveConfig | None = None,
        candidates: tuple[int, ...] | None = None,
    ) -> PredictiveChunkPolicy:
        """A controller for ``profile``'s deployment: an ALP predictor with the profile's
        bottleneck table and prior, and the per-round overhead (host launch, token return,
        activation transfers of a 2048-token microbatch) the profile states."""
        links = (profile.pp - 1) * profile.link.time_s(2048 * profile.activation_bytes_per_token)
        overhead = profile.host_overhead_s + (profile.token_return_s if profile.pp > 1 else 0.0)
        base = config or PredictiveConfig()
        if config is None or config.round_overhead_s == 0.0:
            base = replace(base, round_overhead_s=overhead + links)
        policy = cls(ALPPredictor.from_profile(profile), base, candidates)
        policy._num_stages = profile.pp
        return policy

    # ------------------------------------------------------------------ decision
    def choose(self, view: PolicyView) -> int:
        cfg = self.config
        cands = self.candidates or view.chunk_candidates
        slot, d_p = view.slot, view.num_slots
        self._num_stages = self._num_stages or d_p
        n_dec = view.num_running(slot)
        first = first_above(cands, n_dec)  # the decode guard
        if first is None:
            return self._done(cands[-1], "guard: decodes exceed every candidate")
        ruled = self._rule_chunk(view, cands, first, n_dec)
        if ruled >= 0:
            return ruled

        required = self._required_rate(view) * cfg.throughput_coeff
        kv_bound = self.kv_bound(view)
        bursty = self.bursty(view)
        tpot_budget = self.tpot_budget(view, kv_bound, bursty)
        floor = self.floor_index(view, cands, first)

        def meets(capacity: float, round_s: float) -> bool:
            return capacity >= required and not bursty

        found = self._scan(view, cands, floor, self.scan_stop(cands, floor), meets, tpot_budget)
        if found[0] < 0 and floor > first:  # even the tile breaks TPOT: try below it
            found = self._scan(view, cands, first, floor, meets, tpot_budget)
        k, capacity, beat, met = found
        self._scan_chose(k)
        tag = self._tag(bursty, kv_bound)
        if met:
            return self._done(cands[k], "optimal" + tag, required, capacity, beat)
        if k >= 0:
            return self._done(cands[k], "best-effort" + tag, required, capacity, beat)
        return self._done(cands[first], "infeasible" + tag, required)

    def _rule_chunk(self, view: PolicyView, cands: tuple[int, ...], first: int, n_dec: int) -> int:
        """The chunk the rules ahead of the scan decide, in order (KV pressure, idle, tile cap,
        over-commitment), after updating the KV trend; -1 when none applies. ``first`` indexes
        the smallest candidate above the launching slot's ``n_dec`` decodes. Shared with
        ``SlackPolicy.choose``."""
        self.kv.update(view)
        if under_kv_pressure(view, self.config.kv_free_watermark):
            self._lower_ceiling(view.now)
            return self._done(cands[kv_pressure_index(view, cands)], "kv-pressure")
        if view.num_waiting == 0 and view.chunked is None:
            return self._done(cands[first], "idle: no prompt waiting")
        if self.at_tile_cap(view, n_dec):
            return self._tile_cap_chunk(view, n_dec)
        if self.admission_throttled(view):
            return self._done(cands[first], "over-committed: tile leftover only")
        self._relax_ceiling(view.now)  # a scan follows: its ceiling as of now
        return -1

    def _tile_cap_chunk(self, view: PolicyView, n_dec: int) -> int:
        """At the tile cap: the slot's ``n_dec`` decodes only, unless the prompt next in line
        (the continuing chunk, else the queue's head) is longer than the room left in the
        slot's last tile; then the budget fills that room ("tile-cap: leftover fill"). The fill
        completes no prompt, so no decode joins the slot, and it takes no tile beyond the one
        its decodes already occupy (module docstring, "Tile cap")."""
        room = -n_dec % tile_step(view)
        head = view.chunked
        if head is None:
            head = waiting_head(view)
        if room > 0 and head is not None and head.remaining_prefill > room:
            return self._done(n_dec + room, "tile-cap: leftover fill")
        return self._done(n_dec, "tile-cap: decode only")

    def _lower_ceiling(self, now: float) -> None:
        """At a KV-pressure decision: the scan's ceiling becomes the candidate below the largest
        it chose since the previous one (module docstring, "KV ceiling")."""
        if self.config.kv_ceiling_hold_s > 0 and self._largest_since_pressure > 0:
            self._ceiling = self._largest_since_pressure - 1
            self._ceiling_at = now
        self._largest_since_pressure = -1

    def _scan_chose(self, k: int) -> None:
        if k > self._largest_since_pressure:
            self._largest_since_pressure = k

    def _relax_ceiling(self, now: float) -> None:
        """Once per scanning decision: drop the KV ceiling once less than ``kv_bound_share`` of
        the pool is used (the share of the KV trend just updated), else raise it one candidate
        per ``kv_ceiling_hold_s`` (module docstring)."""
        if self._ceiling < 0:
            return
        if self.kv.share < self.config.kv_bound_share:
            self._ceiling = -1
        elif now - self._ceiling_at >= self.config.kv_ceiling_hold_s:
            self._ceiling += 1
            self._ceiling_at = now

    def scan_stop(self, cands: tuple[int, ...], start: int) -> int:
        """The end (exclusive) of a scan from ``start``: one past the KV ceiling's candidate,
        never below ``start + 1``; ``len(cands)`` without a ceiling."""
        if self._ceiling < 0:
            return len(cands)
        return max(start + 1, min(len(cands), self._ceiling + 1))

    def admission_throttled(self, view: PolicyView) -> bool:
        """True from the moment a retracted request waits (``rules.retracted_waits``) until none
        does and less than ``over_committed_kv_share`` of the KV pool is used (the share of the KV
        trend ``choose`` has just updated); always False with the share 0 (module docstring)."""
        share = self.config.over_committed_kv_share
        if share <= 0:
            return False
        if retracted_waits(view):
            self._over_committed = True
        elif self.kv.share < share:
            self._over_committed = False
        return self._over_committed

    def kv_bound(self, view: PolicyView) -> bool:
        """True when the round's TPOT budget is ``kv_bound_tpot_coeff``'s: the KV pool is
        projected to fill (``rules.KVTrend.kv_bound``) and the backlog is not already waiting
        long while the pool still has room (``rules.backlog_waits``; module docstring)."""
        cfg = self.config
        return self.kv.kv_bound(cfg.kv_bound_share, cfg.kv_horizon_s) and not self.kv_lifted(view)

    def kv_lifted(self, view: PolicyView) -> bool:
        """True when the lift applies: the queue's head has waited ``kv_lift_wait_ratio`` x SLO
        TTFT while the pool is under ``kv_lift_max_share`` full (module docstring)."""
        cfg = self.config
        return (
            cfg.kv_lift_wait_ratio > 0
            and self.kv.share < cfg.kv_lift_max_share
            and backlog_waits(view, cfg.kv_lift_wait_ratio * view.slo.ttft_s)
            and not self.decodes_fill_slots(view)
        )

    @staticmethod
    def _tag(bursty: bool, kv_bound: bool) -> str:
        """What a scanned decision's reason adds: why its TPOT budget is what it is."""
        return ": bursty arrivals" if bursty else ": kv-bound" if kv_bound else ""

    def tpot_budget(self, view: PolicyView, kv_bound: bool, bursty: bool) -> float:
        """The scan's bound on round(C), in seconds: ``kv_bound_tpot_coeff`` x SLO TPOT while
        the pool is filling (``kv_bound``) and arrivals are not bursty, else ``tpot_coeff``'s;
        less the round overhead."""
        cfg = self.config
        coeff = cfg.kv_bound_tpot_coeff if kv_bound and not bursty else cfg.tpot_coeff
        return coeff * view.slo.tpot_s - cfg.round_overhead_s

    def pool_under(self, view: PolicyView, share: float) -> bool:
        """Less than ``share`` of the KV pool used (the share of the KV trend ``choose`` has
        just updated; a pool of no tokens has no room)."""
        return view.kv_total_tokens > 0 and self.kv.share < share

    def bursty(self, view: PolicyView) -> bool:
        """True while less than ``burst_kv_share`` of the KV pool is used (the share of the KV
        trend ``choose`` has just updated) and the last ``burst_gaps`` gaps between arrivals
        have a coefficient of variation above ``burst_gap_cv`` (``rules.gaps_cv``, computed once
        per new arrival; False before ``burst_gaps`` gaps, or while they are all 0: a backlog,
        not a burst). Module docstring, "Bursty arrivals"."""
        cfg = self.config
        if not self.pool_under(view, cfg.burst_kv_share) or view.num_arrivals <= cfg.burst_gaps:
            return False
        counted, cv = self._gaps_cv
        if counted != view.num_arrivals:
            cv = gaps_cv(view.recent_arrivals, cfg.burst_gaps)
            self._gaps_cv = (view.num_arrivals, cv)
        return cv > cfg.burst_gap_cv

    def decodes_fill_slots(self, view: PolicyView) -> bool:
        """True when the running decodes of all slots reach ``kv_lift_decode_share`` x D_p x
        the tile cap: the slots then admit only as fast as decodes finish, and a larger chunk
        would lengthen every stay without clearing the backlog sooner (module docstring)."""
        d_p = view.num_slots
        running = sum(view.num_running(s) for s in range(d_p))
        full = self.config.kv_lift_decode_share * d_p
        if running < full * tile_step(view):
            return False  # the cap is never below one tile step
        return running >= full * self.slot_decode_cap(view)

    def at_tile_cap(self, view: PolicyView, n_dec: int) -> bool:
        """True when the launching slot's ``n_dec`` decodes reach the tile cap: then it
        launches decode only."""
        if not self.config.tile_cap or n_dec < tile_step(view):
            return False  # the cap is never below one tile step: nothing to measure
        return n_dec >= self.slot_decode_cap(view)

    def slot_decode_cap(self, view: PolicyView) -> int:
        """The most decodes a slot should hold (``rules.decode_tile_cap``, each decode
        microbatch timed by the predictor)."""
        predict = self.predictor.predict_one

        def decode_time(n: int, ctx: float) -> float:
            return predict(n, 0, 0, int(n * ctx))

        return decode_tile_cap(view, decode_time, self.config.round_overhead_s)

    def floor_index(self, view: PolicyView, cands: tuple[int, ...], first: int) -> int:
        """Where the scan starts: the efficient tile while more prompt tokens wait than a
        sub-tile chunk would carry in the next D_p microbatches (the queue is more than a round
        deep); else ``first`` (a short queue of short prompts, as on a decode-heavy load, then
        gets the small, fast chunk that keeps TPOT and KV residency low)."""
        tile = self.tile_index(cands)
        if tile <= first:
            return first
        return tile if prompts_outrun(view, cands[tile - 1]) else first

    def tile_index(self, cands: tuple[int, ...]) -> int:
        """Index of the efficient tile among ``cands`` (computed once per candidate set, from
        the predictor's time of a microbatch of c prompt tokens)."""
        if self._tile is None or self._tile[0] != cands:
            predict = self.predictor.predict_one
            index = efficient_tile_index(cands, lambda c: predict(c, 0, 0, 0), self.config.tile_tolerance)
            self._tile = (cands, index)
        return self._tile[1]

    def _scan(
        self,
        view: PolicyView,
        cands: tuple[int, ...],
        start: int,
        stop: int,
        meets: Callable[[float, float], bool],
        tpot_budget: float,
    ) -> tuple[int, float, float, bool]:
        """Candidates [start, stop) in ascending order: (index, capacity, beat, met) of the
        first whose (capacity, round time) ``meets`` the load, else of the largest TPOT-safe
        one (met False), else (-1, 0, 0, False). The round time is round(C) (module docstring)
        plus the round overhead; TPOT-safe: round(C) within ``tpot_budget``; the beat reported
        is the slowest microbatch's. With more slots than stages (an async batch depth), stage
        0 computes the other slots' microbatches while one slot's tokens travel back, so only
        the part of the overhead that outlasts them counts: round = max(round(C), round(C) x
        stages / D_p + overhead)."""
        cfg = self.config
        slot, d_p = view.slot, view.num_slots
        stream = self._stream(view, d_p * cands[stop - 1])
        slots = [(slot + j) % d_p for j in range(d_p)]
        decs = [view.num_running(s) for s in slots]
        ctxs = [view.sum_decode_ctx(s) for s in slots]
        predict = self.predictor.predict_one
        overhead = cfg.round_overhead_s
        sum_round = not cfg.bottleneck_round
        extra = d_p - self._num_stages if d_p > self._num_stages > 0 else 0  # slots beyond the stages
        safe, safe_capacity, safe_beat = -1, 0.0, 0.0
        for k in range(start, stop):
            c = cands[k]
            beat = 0.0
            total = 0.0
            prefill = 0
            pos = 0
            for dec, ctx in zip(decs, ctxs, strict=True):
                n_pre = c - dec if c > dec else 0
                spp, sps = stream.features(pos, pos + n_pre)
                pos += n_pre
                prefill += n_pre
                t = predict(dec + n_pre, spp, sps, ctx)
                total += t
                if t > beat:
                    beat = t
            busy = total if sum_round else d_p * beat
            if extra:  # the round trip overlaps the extra slots' microbatches
                spare = busy * extra / d_p
                round_s = busy + (overhead - spare if overhead > spare else 0.0)
                if round_s > tpot_budget + overhead:
                    break  # larger chunks only take longer
            else:
                if busy > tpot_budget:
                    break  # larger chunks only take longer
                round_s = busy + overhead
            capacity = prefill / round_s
            safe, safe_capacity, safe_beat = k, capacity, beat
            if meets(capacity, round_s):
                return k, capacity, beat, True
        return safe, safe_capacity, safe_beat, False

    def _required_rate(self, view: PolicyView) -> float:
        """Prompt tokens per second the pipeline must prefill: inflow plus catch-up."""
        cfg, now = self.config, view.now
        inflow = self._inflow(view, now)

        # Stale requests: FCFS order is arrival order (retracted ones go to the front and are
        # older still), so the fresh ones are a suffix: walk it from the newest end.
        stale_before = now - cfg.stale_ratio * view.slo.ttft_s
        fresh_tokens = fresh_n = 0
        fresh_arrival_sum = 0.0
        for r in view.iter_waiting_newest_first():
            if r.arrived_at < stale_before:
                break
            fresh_tokens += r.remaining_prefill
            fresh_n += 1
            fresh_arrival_sum += r.arrived_at
        stale_n = view.num_waiting - fresh_n
        stale_tokens = view.waiting_prefill_tokens - fresh_tokens
        arrival_sum = view.waiting_arrival_sum - fresh_arrival_sum
        chunked = view.chunked
        if chunked is not None:
            if chunked.arrived_at < stale_before:
                stale_n += 1
                arrival_sum += chunked.arrived_at
            else:
                stale_tokens -= chunked.remaining_prefill
        if stale_n <= 0 or stale_tokens <= 0:
            return inflow
        mean_wait = now - arrival_sum / stale_n
        budget = view.slo.ttft_s - mean_wait
        if budget <= view.slo.tpot_s:
            return _INF  # the backlog is already late: drain as fast as TPOT allows
        return inflow + stale_tokens / budget

    def _inflow(self, view: PolicyView, now: float) -> float:
        """Prompt tokens per second arrived over the last window_s (amortised O(1): only new
        arrivals are ingested; a young run divides by its age, not the whole window)."""
        fresh = view.num_arrivals - self._arrivals_seen
        if fresh > 0:
            arrivals = view.recent_arrivals
            new = list(islice(reversed(arrivals), fresh))[::-1]
            if self._first_arrival_at is None and new:
                self._first_arrival_at = new[0][0]
            self._window.extend(new)
            self._window_tokens += sum(n for _, n in new)
            self._arrivals_seen = view.num_arrivals
        cutoff = now - self.config.window_s
        window = self._window
        while window and window[0][0] < cutoff:
            self._window_tokens -= window.popleft()[1]
        # an arrival at t = 0.0 is a real start, not a missing one: test for None explicitly
        start = self._first_arrival_at
        if start is None:
            return 0.0
        span = min(self.config.window_s, now - start)
        return self._window_tokens / span if span > 0 else 0.0

    @staticmethod
    def _stream(view: PolicyView, limit: int) -> _Stream:
        """The continuing chunk then the FCFS queue, up to ``limit`` tokens."""
        stream = _Stream()
        chunked = view.chunked
        if chunked is not None:
            stream.add(chunked.remaining_prefill, chunked.num_computed)
        if stream.total < limit:
            for r in view.iter_waiting():
                stream.add(r.remaining_prefill, r.num_computed)
                if stream.total >= limit:
                    break
        return stream

    def _done(
        self, chunk: int, reason: str, required: float = 0.0, capacity: float = 0.0, beat: float = 0.0
    ) -> int:
        self.last_reason = reason
        self.last = Decision(chunk, reason, required, capacity, beat)
        self.reasons[reason.split(":")[0]] += 1
        return chunk

    # ------------------------------------------------------------------ learning
    @property
    def observes(self) -> bool:
        """True when it learns online (``config.learn``): then it needs every stage record."""
        return self.config.learn

    def observe(self, rec: IterationRecord) -> None:
        """Learn from each microbatch's bottleneck stage: keep the slowest stage-iteration of a
        microbatch and update the predictor once its last stage reports."""
        if not self.config.learn:
            return
        entry = self._beats.get(rec.mb_id)
        duration = rec.finished_at - rec.started_at
        if entry is None:
            entry = self._beats[rec.mb_id] = [duration, rec]
        elif duration > entry[0]:
            entry[0], entry[1] = duration, rec
        if rec.stage >= self._num_stages - 1:
            del self._beats[rec.mb_id]
            r = entry[1]
            self.predictor.learn_one(r.num_tokens, r.sum_past_x_pre, r.sum_pre_sq, r.sum_dec_ctx, entry[0])


pickle_by_constructor(Decision)

"""Delay scheduling (PAPER.md section 4): keep each slot's decode microbatch on a tile boundary.

A GEMM over 129 rows costs about what 256 do, so a decode microbatch just above a multiple of the
tile (``base_unit`` requests; one decode is one token) slows its pipeline stage for every request
in it. When the slot about to launch holds a few requests too many, the balancer parks the excess
for a while; when a slot is short, it restores parked requests into it. Moving a request between
slots changes which microbatch carries it, not where its KV lives: on PP every stage holds every
request's KV for its own layers, and parked requests keep their KV (the scheduler counts it; the
reference implementation did not, see its section 7 item 7).

Rules for the launching slot (reference ``BatchRebalancer``, section 3), with D_p slots and
``n_total`` = running decodes of all slots + parked requests:

* tier = base_unit * D_p; th = floor(n_total / tier) * tier; margin = load_alpha * tier.
* Suppression band (``th > 0``, ``n_total < th + margin``, no prefill pressure): hold the slot at
  exactly th / D_p, parking the excess or restoring into a shortfall. Hysteresis: only when there
  are clearly more requests than a tier holds (more than the margin) is the next tier used.
* Otherwise: restore toward the mean n_total // D_p; without prefill pressure also park down to
  th / D_p + base_unit, so a slot never holds more than one tile above its share.

Our additions: a parked request is restored at the first launch once it has been parked
``max_park_s`` (so no longer than that plus one launch interval); the expired ones go first,
into this slot, whatever the rules say, and the rules then park as many others if that puts the
slot above its bound, so the deferral rotates instead of breaking the tier. Only the launching
slot is touched: the others may be in flight.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import islice
from typing import TYPE_CHECKING, ClassVar

from fastpp.plan import NO_BALANCE, BalancePlan
from fastpp.policies.rules import tile_step
from fastpp.types import IterationRecord

if TYPE_CHECKING:
    from fastpp.view import PolicyView


class BalanceMode(StrEnum):
    """Whose latency a park should spare (reference ``--br-mode``)."""

    AUTO = "auto"  # TPOT_FIRST while the TPOT signal is near the SLO, else E2E_FIRST
    TPOT_FIRST = "tpot_first"  # TPOT slack is short: spare per-request TPOT
    E2E_FIRST = "e2e_first"  # TPOT slack is ample: spare end-to-end latency


class Victims(StrEnum):
    """Which end of the slot's running list is parked.

    The running list is in the order requests joined the slot: new prefills and restored
    requests append at the tail, so the head holds those decoding here longest.
    """

    OLDEST = "oldest"  # head of the list
    NEWEST = "newest"  # tail of the list


@dataclass(frozen=True, slots=True)
class DelayConfig:
    """Knobs of delay scheduling; reference flag defaults in brackets, times in seconds."""

    base_unit: int = 0  # requests per tile [128]; 0 = the view's token_step (128 if unknown)
    load_alpha: float = 0.4  # hysteresis margin as a share of a tier [0.4]
    waiting_tok_threshold: int = 1024  # prompt tokens waiting that count as prefill pressure [1024]
    kv_free_threshold: float = 0.10  # ... if at least this share of the KV pool is free [0.10]
    mode: BalanceMode = BalanceMode.AUTO
    # What TPOT_FIRST parks; E2E_FIRST parks the other end. OLDEST follows PAPER.md section 4,
    # NEWEST reproduces the reference code (see DelayScheduler for why we chose the paper).
    tpot_first_victims: Victims = Victims.OLDEST
    tpot_mode_ratio: float = 0.9  # AUTO picks TPOT_FIRST when signal >= ratio * SLO TPOT [0.9]
    signal_window_s: float = 5.0  # the TPOT signal averages slot-round gaps over this window
    max_park_slo_ratio: float = 1.0  # park bound as a multiple of the SLO TPOT
    max_park_s: float | None = None  # absolute park bound; overrides the ratio when set

    def __post_init__(self) -> None:
        for name, enum in (("mode", BalanceMode), ("tpot_first_victims", Victims)):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, enum(value))
            except ValueError:
                known = ", ".join(e.value for e in enum)
                raise ValueError(f"{name} must be one of {known}, got {value!r}") from None
        if self.base_unit < 0:
            raise ValueError(f"base_unit must be >= 0 requests (0 = token_step), got {self.base_unit}")
        if not 0.0 <= self.load_alpha <= 1.0:
            raise ValueError(f"load_alpha must be in [0, 1], got {self.load_alpha}")
        if self.waiting_tok_threshold < 0:
            raise ValueError(f"waiting_tok_threshold must be >= 0, got {self.waiting_tok_threshold}")
        if not 0.0 <= self.kv_free_threshold <= 1.0:
            raise ValueError(f"kv_free_threshold must be in [0, 1], got {self.kv_free_threshold}")
        if not self.tpot_mode_ratio > 0:
            raise ValueError(f"tpot_mode_ratio must be > 0, got {self.tpot_mode_ratio}")
        if not self.signal_window_s > 0:
            raise ValueError(f"signal_window_s must be > 0, got {self.signal_window_s}")
        if not self.max_park_slo_ratio > 0:
            raise ValueError(f"max_park_slo_ratio must be > 0, got {self.max_park_slo_ratio}")
        if self.max_park_s is not None and not self.max_park_s > 0:
            raise ValueError(f"max_park_s must be > 0 seconds, got {self.max_park_s}")


@dataclass(slots=True)
class DelayScheduler:
    """DecodeBalancer of PAPER.md section 4. One instance per Scheduler (it keeps a signal window).

    Victim mapping. The paper's text and the reference code disagree: the paper defers the
    OLDEST requests when TPOT slack is short, the reference's TPOT_FIRST parks the NEWEST. We
    follow the paper (``tpot_first_victims=OLDEST``; NEWEST gives the reference). Per-request
    TPOT is (last - first) / (n - 1): one deferral adds the same delay to any request, but a
    request that has decoded longest has the largest n so far, so the delay is spread over the
    most tokens and its mean moves least; a new request may be short and take the whole hit.
    Parking the head also rotates: restored requests rejoin at the tail, so the next park picks
    someone else instead of re-deferring the same few. With ample slack, E2E_FIRST parks the
    newest so the old requests, nearer their end, finish and free KV sooner. In our simulator
    (decode-heavy cnn-reversed-synthetic, Qwen2.5-14B on PP4) OLDEST gave lower P90/P99 TPOT
    than NEWEST at every load tried, with E2E within 0.5%; NEWEST won SLO attainment only when
    the SLO was below the achievable mean TPOT (hurting few requests a lot beats many a little).

    TPOT signal (AUTO mode): the mean of the slot-round gaps ``view.recent_token_gap`` that
    returned within the last ``signal_window_s`` (a slot round is one token of every request in
    it, so it approximates TPOT). With no sample yet the slack counts as ample (E2E_FIRST), as in
    the reference whose signal starts at half the SLO.

    Park bound: ``max_park_slo_ratio`` = 1 keeps the extra gap of a deferred request near one
    SLO TPOT. A shorter bound costs no tier crossings (an expired request is swapped for one of
    the slot's own when the slot is at its bound), it only spreads the deferral over more
    requests, each of whose mean TPOT then moves less.

    Cost: counts come from the view (O(D_p)), victims are a slice of one end of the running list
    (no sort; NEWEST copies the slot's list at C speed), restores a prefix of the parked order,
    and the signal window is kept incrementally (only the new gap samples are read). About
    6 us per call, 13-17 us when it parks, at 512 decodes over D_p = 4
    (benchmarks/balancer_speed.py).
    """

    config: DelayConfig = field(default_factory=DelayConfig)
    observes: ClassVar[bool] = False  # decides from the view's signals, not from records
    num_parks: int = field(default=0, init=False)  # requests parked so far
    num_restores: int = field(default=0, init=False)  # restored so far, forced ones included
    num_forced_restores: int = field(default=0, init=False)  # restored at the park bound
    last_mode: BalanceMode | None = field(default=None, init=False)  # of the last park
    # incremental TPOT-signal window: samples within it, their sum, the newest one read
    _gaps: deque[tuple[float, float]] = field(default_factory=deque, init=False, repr=False)
    _gap_sum: float = field(default=0.0, init=False, repr=False)
    _last_gap: tuple[float, float] | None = field(default=None, init=False, repr=False)

    def plan(self, view: PolicyView, slot: int) -> BalancePlan:
        """Park decodes of ``slot`` and/or restore parked requests into it (never another slot)."""
        cfg = self.config
        running = view.num_running(slot)
        num_parked = view.num_parked
        if not running and not num_parked:
            return NO_BALANCE
        num_slots = view.num_slots
        n_total = num_parked
        for s in range(num_slots):
            n_total += view.num_running(s)
        unit = cfg.base_unit or tile_step(view)
        tier = unit * num_slots
        share = n_total // tier * unit  # th / D_p: this slot's part of the tier below n_total
        pressure = self._has_prefill_pressure(view)
        hi: int | None
        if share and n_total < share * num_slots + cfg.load_alpha * tier and not pressure:
            # suppression band: just above a tier, hold every slot at its tier share
            case, lo, hi = "band", share, share
        else:
            # above the band: even out toward the mean. Under prefill pressure never park: the
            # chunk budget is being spent on prompts anyway, and a deferral would only add delay.
            case, lo = "mean", n_total // num_slots
            hi = None if pressure else share + unit
        forced = self._count_expired(view) if num_parked else 0
        want = min(lo - running, num_parked) if running < lo else 0
        n_restore = max(forced, want)
        # Park from the requests already here only, so a request never leaves and returns in
        # one decision, and never park more than the slot holds. hi >= 1, so a rule never
        # empties the slot.
        n_park = 0 if hi is None else min(running, max(0, running + n_restore - hi))
        if not n_restore and not n_park:
            return NO_BALANCE
        park_ids: tuple[int, ...] = ()
        victims = ""
        if n_park:
            victims = self._victims(view)
            if victims is Victims.OLDEST:
                park_ids = tuple(r.req_id for r in islice(view.iter_running(slot), n_park))
            else:
                tail = list(view.iter_running(slot))[running - n_park :]
                park_ids = tuple(r.req_id for r in tail)
        # longest parked first: the expired ones are a prefix of this order
        restore_ids = tuple(r.req_id for r in islice(view.iter_parked(), n_restore))
        self.num_parks += n_park
        self.num_restores += n_restore
        self.num_forced_restores += forced
        reason = f"{case} {lo}..{'inf' if hi is None else hi}: park {n_park}"
        if victims:
            reason += f" {victims}"
        reason += f", restore {n_restore}" + (f" ({forced} past max_park)" if forced else "")
        return BalancePlan(park_ids, restore_ids, reason)

    def observe(self, rec: IterationRecord) -> None:
        """Nothing to learn per stage-iteration: the signals come from the view."""
        return None

    # ------------------------------------------------------------------ helpers
    def max_park_s(self, view: PolicyView) -> float:
        """The park bound in seconds: absolute if configured, else relative to the SLO TPOT."""
        cfg = self.config
        return cfg.max_park_s if cfg.max_park_s is not None else cfg.max_park_slo_ratio * view.slo.tpot_s

    def tpot_signal(self, view: PolicyView) -> float | None:
        """Mean slot-round gap (seconds) of the samples within the window, None if none."""
        horizon = view.now - self.config.signal_window_s
        gaps = view.recent_token_gap
        fresh: list[tuple[float, float]] = []
        found = False
        for sample in reversed(gaps):  # newest first, stop at what we already hold
            if sample is self._last_gap:
                found = True
                break
            if sample[0] < horizon:
                break
            fresh.append(sample)
        window = self._gaps
        if not found:  # first call, or our newest sample left the window or the history
            window.clear()
            self._gap_sum = 0.0
        if fresh:
            self._last_gap = fresh[0]
            for sample in reversed(fresh):
                window.append(sample)
                self._gap_sum += sample[1]
        while window and window[0][0] < horizon:
            self._gap_sum -= window.popleft()[1]
        if not window:
            self._gap_sum = 0.0  # drop float drift whenever the window empties
            return None
        return self._gap_sum / len(window)

    def _has_prefill_pressure(self, view: PolicyView) -> bool:
        """Prompts are waiting and there is KV to admit them (the reference's "KV headroom").

        Then the microbatches carry prefill chunks anyway, so their size is set by the chunk
        budget, not by the decode count, and holding decodes back would only delay them.
        """
        cfg = self.config
        if view.waiting_prefill_tokens <= cfg.waiting_tok_threshold:
            return False
        total = view.kv_total_tokens
        return total > 0 and view.kv_free_tokens / total > cfg.kv_free_threshold

    def _count_expired(self, view: PolicyView) -> int:
        """Parked requests at or past the bound: a prefix of ``iter_parked`` (longest first)."""
        deadline = view.now - self.max_park_s(view)
        n = 0
        for r in view.iter_parked():
            if r.parked_at is None or r.parked_at > deadline:
                break
            n += 1
        return n

    def _victims(self, view: PolicyView) -> Victims:
        """The end of the running list to park from, per the mode (AUTO reads the signal)."""
        cfg = self.config
        mode = cfg.mode
        if mode is BalanceMode.AUTO:
            signal = self.tpot_signal(view)
            tight = signal is not None and signal >= cfg.tpot_mode_ratio * view.slo.tpot_s
            mode = BalanceMode.TPOT_FIRST if tight else BalanceMode.E2E_FIRST
        self.last_mode = mode
        if mode is BalanceMode.TPOT_FIRST:
            return cfg.tpot_first_victims
        return Victims.NEWEST if cfg.tpot_first_victims is Victims.OLDEST else Victims.OLDEST

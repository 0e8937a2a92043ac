"""Greedy chunk controller (PAPER.md section 3.1): feedback on observed TTFT and TPOT.

The controller walks a sorted candidate list one step at a time. Every D_p calls it looks at
what the pipeline did since its last decision and moves the chunk C one candidate down when TPOT
is (nearly) violated or the queue is so short that small chunks cost nothing, one candidate up
when first tokens are slow while TPOT has room. A KV-pressure rule overrides both: it cuts the
chunk to just above the running count so prefill nearly stops and decodes finish and free KV.

Units: times in seconds, chunks in tokens (C counts decode tokens too, see ``Scheduler``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar

from fastpp.policies.rules import index_above, kv_pressure_index, prompts_outrun, under_kv_pressure
from fastpp.types import IterationRecord

if TYPE_CHECKING:
    from fastpp.view import PolicyView

Sample = tuple[float, float]  # (time, value) as the view's signal deques hold them


class Statistic(StrEnum):
    """How the samples of a signal are reduced to the one number the rule compares."""

    MEAN = "mean"  # mean of the samples that arrived since the last decision (reference)
    P90 = "p90"  # P90 of the samples of the last ``window_s`` seconds (what the SLO measures)


@dataclass(frozen=True, slots=True)
class GreedyConfig:
    """Knobs of the greedy controller; reference flag defaults, times in seconds.

    Candidates: the view's ``chunk_candidates`` (``--chunk-candidates``), within
    ``[min_chunk, max_chunk]`` where those bounds are set.

    The ratios multiply the SLO (alpha, beta, gamma of the paper). The defaults are the
    reference implementation's (shrink when TPOT > 1.08 SLO or TTFT < 0.1 SLO, grow when
    TTFT > 0.3 SLO and TPOT < 0.85 SLO). PAPER.md's example (0.9 / 0.3 / 0.6 / 0.7) shrinks
    earlier on TPOT and grows later; both are configuration, and we keep the code's values
    because its published results were measured with them.
    """

    min_chunk: int | None = None  # smallest candidate used; None = the view's smallest
    max_chunk: int | None = None  # largest candidate used; None = the view's largest
    kv_free_watermark: float = 0.10  # free KV share below which the pressure rule fires
    tpot_violation_ratio: float = 1.08  # shrink when TPOT > ratio * SLO TPOT
    ttft_low_ratio: float = 0.1  # shrink when TTFT < ratio * SLO TTFT (little load)
    ttft_high_ratio: float = 0.3  # grow when TTFT > ratio * SLO TTFT ...
    tpot_safe_ratio: float = 0.85  # ... and TPOT < ratio * SLO TPOT
    statistic: Statistic = Statistic.MEAN
    window_s: float = 10.0  # P90 window (statistic="p90" only)
    # The efficient tile in tokens (``greedy:tile``): while more prompt tokens wait than a chunk
    # below it carries in D_p microbatches, C is lifted to the smallest candidate >= it.
    # None = no floor (the paper's controller).
    tile_floor: int | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "statistic", Statistic(self.statistic))
        except ValueError:
            known = ", ".join(s.value for s in Statistic)
            raise ValueError(f"statistic must be one of {known}, got {self.statistic!r}") from None
        if self.min_chunk is not None and self.min_chunk < 1:
            raise ValueError(f"min_chunk must be >= 1 token, got {self.min_chunk}")
        if self.max_chunk is not None and self.max_chunk < (self.min_chunk or 1):
            raise ValueError(f"max_chunk must be >= min_chunk ({self.min_chunk}), got {self.max_chunk}")
        if not 0.0 <= self.kv_free_watermark < 1.0:
            raise ValueError(f"kv_free_watermark must be in [0, 1), got {self.kv_free_watermark}")
        for name in ("tpot_violation_ratio", "ttft_low_ratio", "ttft_high_ratio", "tpot_safe_ratio"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.ttft_low_ratio >= self.ttft_high_ratio:
            raise ValueError(
                f"ttft_low_ratio must be < ttft_high_ratio ({self.ttft_high_ratio}), "
                f"got {self.ttft_low_ratio}"
            )
        if self.tpot_safe_ratio > self.tpot_violation_ratio:
            raise ValueError(
                f"tpot_safe_ratio must be <= tpot_violation_ratio "
                f"({self.tpot_violation_ratio}), got {self.tpot_safe_ratio}"
            )
        if not self.window_s > 0:
            raise ValueError(f"window_s must be > 0 seconds, got {self.window_s}")
        if self.tile_floor is not None and self.tile_floor < 1:
            raise ValueError(f"tile_floor must be >= 1 token, got {self.tile_floor}")


@dataclass(slots=True)
class GreedyChunkPolicy:
    """ChunkPolicy of PAPER.md section 3.1. One instance per Scheduler (it keeps state).

    Cadence: a decision every ``view.num_slots`` (D_p) calls, the first call included. A new C
    reaches the last stage only after a full trip through the pipeline, and the token gaps it
    causes show up a round later still; deciding more often would react to its own echo and
    overshoot. Between decisions the current C is returned.

    Rule at a decision, first match wins:

    1. KV pressure (free share < ``kv_free_watermark``): remember the current C (once) and use
       the pressure chunk of ``fastpp.policies.rules``. Unlike the reference, this does not wait
       for a new TTFT sample: under pressure admissions stall and first tokens may stop coming,
       which is exactly when the rule is needed.
    2. Pressure over and a C remembered: restore it in one decision. The pressure C says
       nothing about the load, so stepping back up one candidate at a time would waste
       D_p-call rounds at a chunk too small for the queue that built up meanwhile.
    3. No TTFT sample (since the last decision for ``mean``, in the window for ``p90``): hold.
       TTFT is the load signal; without it, growing or shrinking would be a guess.
    4. TPOT > ``tpot_violation_ratio`` * SLO, or TTFT < ``ttft_low_ratio`` * SLO: one step down
       ("shrink:tpot" / "shrink:idle"). At low load small chunks cost no TTFT and spare TPOT.
    5. TTFT > ``ttft_high_ratio`` * SLO and TPOT < ``tpot_safe_ratio`` * SLO: one step up.
    6. Otherwise hold. Steps clamp at both ends of the candidate list.

    Signals. TTFT: ``view.recent_ttft``. TPOT: ``view.recent_token_gap``, one sample per decode
    microbatch return, the slot round a decoding request waits between two tokens; per-request
    TPOT arrives only when a request finishes, far too late for a controller.
    No gap sample means no decode microbatch returned, so no request's TPOT is at risk: TPOT
    then counts as having room. ``mean`` (the reference) averages the samples since the last
    decision; when no TTFT sample came it holds and keeps the TPOT samples for the next
    decision, and a TPOT mean with no new sample keeps its previous value. ``p90`` takes the
    P90 of the last ``window_s`` seconds: the SLO is on P90s, and a mean hides the tail the
    SLO counts (reference notes, section 7 item 4).

    Tile floor (every call, with ``tile_floor`` set): while more prompt tokens wait than the
    candidate below the tile would carry beside the slots' decodes in the next D_p
    microbatches (``rules.prompts_outrun``, the predictive policy's floor condition), a C
    below the tile is lifted to it ("tile-floor"), the controller's C included, so a climb
    goes on from there. After an idle spell the controller sits at the smallest candidate, and
    a burst would otherwise find it several feedback rounds below the chunk it needs, paying
    for tile time it does not fill. A short queue of short prompts (a decode-heavy load) keeps
    the small chunk, which keeps KV residency low. The lift also applies after a KV-pressure
    cut: admission, not the chunk, keeps KV from being over-committed.

    Safety guard (every call): the decode guard of ``fastpp.policies.rules``. It changes only
    what is returned, not the controller's C: other slots may hold fewer decodes.

    Cost: O(1) between decisions; a decision walks only the new samples (``mean``) or the
    window (``p90``, a sort of a few hundred floats), from the newest end of each deque.
    """

    config: GreedyConfig = field(default_factory=GreedyConfig)
    last_reason: str = field(default="hold", init=False)
    observes: ClassVar[bool] = False  # decides from the view's signals, not from records
    num_decisions: int = field(default=0, init=False)
    _candidates: tuple[int, ...] = field(default=(), init=False, repr=False)
    _index: int = field(default=0, init=False, repr=False)  # current C = _candidates[_index]
    _floor: int = field(default=0, init=False, repr=False)  # index of the tile; 0 = no floor
    _restore_index: int | None = field(default=None, init=False, repr=False)
    _num_calls: int = field(default=0, init=False, repr=False)
    # mean statistic: the newest sample already consumed per signal, and the last TPOT mean
    _seen_ttft: Sample | None = field(default=None, init=False, repr=False)
    _seen_gap: Sample | None = field(default=None, init=False, repr=False)
    _tpot_mean: float | None = field(default=None, init=False, repr=False)

    @property
    def chunk(self) -> int | None:
        """The controller's current C (before the safety guard); None before the first call."""
        return self._candidates[self._index] if self._candidates else None

    def choose(self, view: PolicyView) -> int:
        """C for the microbatch about to launch in ``view.slot``."""
        if not self._candidates:
            self._candidates = self._make_candidates(view)
            if self.config.tile_floor is not None:
                self._floor = index_above(self._candidates, self.config.tile_floor - 1)
        if self._num_calls % view.num_slots == 0:
            self.last_reason = self._decide(view)
            self.num_decisions += 1
        else:
            self.last_reason = "hold"
        self._num_calls += 1
        if self._index < self._floor and prompts_outrun(view, self._candidates[self._floor - 1]):
            self._index = self._floor
            self.last_reason = "tile-floor"
        chunk = self._candidates[self._index]
        num_decodes = view.num_running(view.slot)
        if chunk > num_decodes:
            return chunk
        self.last_reason = "guard"
        return self._candidates[index_above(self._candidates, num_decodes)]

    def observe(self, rec: IterationRecord) -> None:
        """Nothing to learn per stage-iteration: the signals come from the view."""
        return None

    # ------------------------------------------------------------------ the rule
    def _decide(self, view: PolicyView) -> str:
        cfg = self.config
        if under_kv_pressure(view, cfg.kv_free_watermark):  # memory first
            self._skip_samples(view)
            if self._restore_index is None:
                self._restore_index = self._index
            self._index = kv_pressure_index(view, self._candidates)
            return "kv-pressure"
        if self._restore_index is not None:
            self._skip_samples(view)
            self._index, self._restore_index = self._restore_index, None
            return "restore"
        ttft, tpot = self._signals(view)
        if ttft is None:
            return "hold"
        slo = view.slo
        top = len(self._candidates) - 1
        if tpot is not None and tpot > cfg.tpot_violation_ratio * slo.tpot_s:
            self._index = max(self._index - 1, 0)
            return "shrink:tpot"
        if ttft < cfg.ttft_low_ratio * slo.ttft_s:
            self._index = max(self._index - 1, 0)
            return "shrink:idle"
        if ttft > cfg.ttft_high_ratio * slo.ttft_s and (
            tpot is None or tpot < cfg.tpot_safe_ratio * slo.tpot_s
        ):
            self._index = min(self._index + 1, top)
            return "grow"
        return "hold"

    def _make_candidates(self, view: PolicyView) -> tuple[int, ...]:
        cfg = self.config
        lo = cfg.min_chunk or 0
        hi = cfg.max_chunk if cfg.max_chunk is not None else view.chunk_candidates[-1]
        cands = tuple(c for c in view.chunk_candidates if lo <= c <= hi)
        if not cands:
            raise ValueError(
                f"no chunk candidate of {view.chunk_candidates} lies within "
                f"min_chunk..max_chunk = {cfg.min_chunk}..{cfg.max_chunk}"
            )
        return cands

    # ------------------------------------------------------------------ signals
    def _signals(self, view: PolicyView) -> tuple[float | None, float | None]:
        """(TTFT, TPOT) in seconds per the configured statistic; None where no sample counts."""
        if self.config.statistic is Statistic.P90:
            horizon = view.now - self.config.window_s
            return (
                _p90(_values_since(view.recent_ttft, horizon)),
                _p90(_values_since(view.recent_token_gap, horizon)),
            )
        ttft_new = _new_values(view.recent_ttft, self._seen_ttft)
        if not ttft_new:
            return None, self._tpot_mean  # hold; the TPOT samples wait for the next decision
        gap_new = _new_values(view.recent_token_gap, self._seen_gap)
        self._skip_samples(view)
        if gap_new:
            self._tpot_mean = sum(gap_new) / len(gap_new)
        return sum(ttft_new) / len(ttft_new), self._tpot_mean

    def _skip_samples(self, view: PolicyView) -> None:
        """Mark every sample so far as consumed (a decision that did not read them)."""
        if view.recent_ttft:
            self._seen_ttft = view.recent_ttft[-1]
        if view.recent_token_gap:
            self._seen_gap = view.recent_token_gap[-1]


def _new_values(samples: Sequence[Sample], seen: Sample | None) -> list[float]:
    """Values of the samples newer than ``seen`` (the newest one consumed before).

    Walks from the newest end and stops at ``seen`` itself (samples are distinct objects, so
    several at the same instant are told apart) or at anything older than it, should it have
    dropped out of the bounded history.
    """
    if seen is None:
        return [v for _, v in samples]
    seen_at = seen[0]
    out = []
    for sample in reversed(samples):
        if sample is seen or sample[0] < seen_at:
            break
        out.append(sample[1])
    return out


def _values_since(samples: Sequence[Sample], horizon: float) -> list[float]:
    """Values of the samples at or after ``horizon``, walking from the newest end."""
    out = []
    for at, value in reversed(samples):
        if at < horizon:
            break
        out.append(value)
    return out


def _p90(values: list[float]) -> float | None:
    """P90 with linear interpolation (numpy's default, as the metrics use); None if empty."""
    if not values:
        return None
    values.sort()
    k = 0.9 * (len(values) - 1)
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)

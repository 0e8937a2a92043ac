"""Rules every chunk policy shares, written once.

* The decode guard: C is the whole budget of a microbatch, so a C at or below the launching
  slot's decode count would leave some decodes without their token and the prompt with
  nothing; a policy returns a candidate strictly above it (the largest when none is).
* KV pressure: below a free share of the pool, admitting more prompts only leads to
  retractions. A policy then shrinks C to the smallest candidate above the largest decode count
  of any slot: every decode still gets its token, prefill nearly stops, finishing requests free
  KV. A heuristic, not an out-of-memory guarantee (the scheduler retracts when memory runs out).
* The efficient tile: the smallest candidate whose predicted time per token is within a
  tolerance of the largest candidate's (``efficient_tile_index``). On a GPU, 128 tokens cost
  about as much as 256 (tile and wave quantisation), so a chunk below that wastes pipeline time
  while prompts wait.
  ``prompts_outrun`` is the condition for keeping to it: more prompt tokens wait than a
  smaller chunk would carry in the next D_p microbatches.
* The KV trend (``KVTrend``): the share of the KV pool in use and its rate of change, measured
  from the view at each decision over a sliding window; ``kv_bound`` says whether the pool is
  filling (its share projected over a horizon reaches a limit).
* The backlog wait (``backlog_waits``): whether the head of the waiting queue has waited a
  given time (the predictive policy lifts its KV bound for an old backlog).
* The tile cap (``decode_tile_cap``): the most decodes a slot should hold when the KV pool
  cannot fill the tile above a boundary enough to pay for it.
* Over-commitment (``retracted_waits``): whether a retracted request (one with generated
  tokens) waits at either end of the queue, the sign that admission promised the KV pool more
  than it holds.
* Bursty arrivals (``gaps_cv``): the coefficient of variation of the last gaps between
  arrivals (about 1 for Poisson arrivals, far above it for bursts).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from itertools import islice, pairwise
from math import sqrt
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastpp.view import PolicyView, RequestView


DEFAULT_TILE_STEP = 128  # tokens per tile when the profile knows no tile step


def tile_step(view: PolicyView) -> int:
    """The view's tile step in tokens, ``DEFAULT_TILE_STEP`` when it knows none."""
    return view.token_step if view.token_step > 0 else DEFAULT_TILE_STEP


def first_above(candidates: tuple[int, ...], n: int) -> int | None:
    """Index of the smallest candidate strictly above ``n``; None if none is."""
    i = bisect_right(candidates, n)
    return i if i < len(candidates) else None


def index_above(candidates: tuple[int, ...], n: int) -> int:
    """Index of the smallest candidate strictly above ``n``; of the largest if none is."""
    i = first_above(candidates, n)
    return len(candidates) - 1 if i is None else i


def under_kv_pressure(view: PolicyView, free_watermark: float) -> bool:
    """True when the free share of the KV pool is below ``free_watermark``."""
    return view.kv_free_tokens < free_watermark * view.kv_total_tokens


def max_running(view: PolicyView) -> int:
    """The largest decode count of any slot."""
    return max(view.num_running(s) for s in range(view.num_slots))


def kv_pressure_index(view: PolicyView, candidates: tuple[int, ...]) -> int:
    """Index of the pressure chunk: the smallest candidate above every slot's decode count."""
    return index_above(candidates, max_running(view))


def efficient_tile_index(
    candidates: tuple[int, ...], time_of: Callable[[int], float], tolerance: float
) -> int:
    """Index of the smallest candidate c whose time per token ``time_of(c) / c`` is at most
    ``tolerance`` x the largest candidate's: below it a microbatch pays for tokens it does not
    carry. ``time_of`` is a latency prediction of a microbatch of c prompt tokens."""
    best = time_of(candidates[-1]) / candidates[-1]
    for i, c in enumerate(candidates):
        if time_of(c) / c <= tolerance * best:
            return i
    return len(candidates) - 1


class KVTrend:
    """The KV pool's used share and its slope (share per second) over the last ``window_s``,
    from one sample per decision (``update``). Deterministic: it reads only ``view.now`` and
    the view's KV counts."""

    __slots__ = ("window_s", "_samples", "share", "slope")

    def __init__(self, window_s: float) -> None:
        if not window_s > 0:
            raise ValueError(f"KV trend window must be > 0 s, got {window_s!r}")
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()
        self.share = 0.0  # used share of the pool at the last update
        self.slope = 0.0  # share per second over the window (0 until it spans a tenth of it)

    def update(self, view: PolicyView) -> None:
        total = view.kv_total_tokens
        share = (total - view.kv_free_tokens) / total if total > 0 else 0.0
        now, samples = view.now, self._samples
        if samples and samples[-1][0] >= now:
            samples[-1] = (samples[-1][0], share)  # one sample per instant: the latest
        else:
            samples.append((now, share))
        while len(samples) > 2 and samples[1][0] <= now - self.window_s:
            samples.popleft()
        t0, s0 = samples[0]
        span = now - t0
        self.share = share
        self.slope = (share - s0) / span if span >= 0.1 * self.window_s else 0.0

    def projected(self, horizon_s: float) -> float:
        """The used share ``horizon_s`` from now if the trend holds (never below the present)."""
        return self.share + max(0.0, self.slope) * horizon_s

    def kv_bound(self, limit: float, horizon_s: float) -> bool:
        """True when the pool is, or within ``horizon_s`` will be, at least ``limit`` full."""
        return self.projected(horizon_s) >= limit


def prompts_outrun(view: PolicyView, chunk: int) -> bool:
    """True when more prompt tokens wait than microbatches of ``chunk`` tokens would carry
    beside their decodes in the next D_p launches (the queue is more than a round deep)."""
    d_p, slot = view.num_slots, view.slot
    carried = 0
    for j in range(d_p):
        dec = view.num_running((slot + j) % d_p)
        carried += chunk - dec if chunk > dec else 0
    return view.waiting_prefill_tokens > carried


def waiting_head(view: PolicyView) -> RequestView | None:
    """The head of the waiting queue (FCFS: its oldest prompt not yet started), or None."""
    return next(iter(view.iter_waiting()), None)


def backlog_waits(view: PolicyView, wait_s: float) -> bool:
    """True when the head of the waiting queue has waited at least ``wait_s``."""
    head = waiting_head(view)
    return head is not None and view.now - head.arrived_at >= wait_s


def decode_tile_cap(view: PolicyView, decode_time: Callable[[int, float], float], overhead_s: float) -> int:
    """The most decodes a slot should hold (the tile cap): a multiple of the tile step.

    The KV pool holds about ``n = kv_total / (used tokens per resident request) / D_p`` decodes
    per slot. A decode-only slot costs a whole tile (``view.token_step`` tokens) whether it is
    full or not, so when the pool cannot fill the tile above the last boundary under ``n``
    enough to pay for it, the slots are better capped at that boundary: the decodes past it
    would cost more GPU time than they add tokens, and the slower rounds keep every request
    resident longer. The cap is that boundary when its decode throughput (decodes per round of
    D_p microbatches plus ``overhead_s``, each microbatch timed by ``decode_time(decodes,
    mean context)``) is at least that of ``n`` decodes; else the boundary above ``n``.
    Without a measurable population (nothing resident) the cap is the pool's whole size. The
    cap is never below one tile step.
    """
    d_p = view.num_slots
    step = tile_step(view)
    running = sum(view.num_running(s) for s in range(d_p))
    resident = running + view.num_parked + (1 if view.chunked is not None else 0)
    used = view.kv_total_tokens - view.kv_free_tokens
    if resident == 0 or used <= 0 or running == 0:
        return max(step, view.kv_total_tokens)
    per_slot = view.kv_total_tokens * resident / used / d_p
    high = step * max(1, -(-int(per_slot) // step))
    low = high - step
    if low < step:
        return high
    ctx = sum(view.sum_decode_ctx(s) for s in range(d_p)) / running

    def throughput(n: float) -> float:
        return d_p * n / (d_p * decode_time(int(n), ctx) + overhead_s)

    return low if throughput(low) >= throughput(per_slot) else high


def retracted_waits(view: PolicyView) -> bool:
    """Whether the first or the last waiting request was retracted (it has generated tokens:
    the retraction order puts it at the front or the back of the queue)."""
    for requests in (view.iter_waiting(), view.iter_waiting_newest_first()):
        r = next(requests, None)
        if r is not None and r.num_generated > 0:
            return True
    return False


def gaps_cv(arrivals: Sequence[tuple[float, int]], n: int) -> float:
    """Coefficient of variation (population) of the last ``n`` gaps between the (time, tokens)
    ``arrivals``, in arrival order; 0.0 with fewer than ``n`` gaps or a mean gap of 0."""
    times = [t for t, _ in islice(reversed(arrivals), n + 1)]
    if len(times) <= n:
        return 0.0
    gaps = [later - earlier for later, earlier in pairwise(times)]
    mean = sum(gaps) / n
    if mean <= 0:
        return 0.0
    return sqrt(sum((g - mean) ** 2 for g in gaps) / n) / mean

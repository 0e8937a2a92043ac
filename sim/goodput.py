"""Goodput search: the highest Poisson arrival rate a deployment serves within its SLO.

Scenario: probe one rate at a time (every seed simulated at that rate), decide feasible or not,
and narrow a bracket [highest feasible, lowest infeasible] until it is narrower than
``precision``. Goodput (PAPER.md section 1) is the highest rate at which P90 TTFT and P90 TPOT of
the requests both meet the SLO; ``criterion="attainment"`` uses the stricter per-request share.

Search (``find_goodput``, independent of the simulator; assumes feasibility is monotone in rate):
probe ``low``; if it fails, halve down to ``min_rate`` until a rate passes (none: goodput 0 and
the reason). Otherwise probe ``high``; if it passes, double up to ``max_rate`` until one fails
(none: goodput is at least ``max_rate``, margin infinite, and a note says so). Then bisect. Every
probe lies inside the current bracket, so no reported feasible probe sits above an infeasible one.
With a ``confirm`` judge the answer must also pass it (below); one that fails it is withdrawn
and the search goes on under it.
``precision`` is absolute, in requests per second: the search stops once lowest infeasible minus
highest feasible is below it, so the true goodput lies in [rate, rate + margin).

Probe rules (``slo_goodput``):
- Pooling: the request records of all seeds are pooled before the percentiles are taken.
- Failures: rejected, aborted and unfinished requests count as TTFT = infinity in the P90 (and as
  misses in attainment), so more than 10% of them fail the P90 criterion outright.
- Length: unless ``num_requests`` is given, each seed gets max(300, ceil(span x rate)) requests
  with span = max(120 s, LIFETIMES x mean output length x SLO TPOT): every probe covers at
  least 120 s of arrivals, and several lifetimes of a request that decodes at the SLO's pace,
  so that a decode-heavy load (CNN-Reversed: ~880 output tokens, 3 minutes per request at
  200 ms) has filled its KV cache and shows its real queue. At most ``MAX_FIRST_LOOK``
  requests per seed (a lax TPOT SLO or a high rate would otherwise ask for millions), and a
  ``num_requests`` above it is refused.
- Convergence in length (P90 criterion): "P90 <= SLO" is "at most 10% of requests miss the
  objective". After each run the share of misses is estimated by batch means (``is_unsettled``:
  each seed's run cut into consecutive batches by arrival, the first dropped as warm-up, so
  that the standard error reflects requests that queue together). While 10% lies within
  ``SETTLE_Z`` standard errors of it, for TTFT or TPOT, the verdict is a coin toss that a longer
  look could flip: the probe is looked at twice as long, at most ``MAX_DOUBLINGS`` times, the
  last look always at ``MAX_REQUESTS_PER_SEED`` requests (or the starting length if longer). A
  longer look goes on with the same simulation (each seed's arrivals run a quarter of that
  cap past it, ``run_until_ended``), so looking at n, 2n, 4n requests costs one run of 4n,
  every look judges its requests amid the load that follows them, never a queue draining at
  the end of the arrivals, and a rate and seed give the same run whatever the starting length
  (its
  metrics say ``converged=0`` if it is still unsettled then, and the longest run's verdict
  stands). Far from the boundary one run decides; near it the probe grows until the P90s have
  settled, so the answer does not depend on the starting length. A probe that fails the
  steady-state rule alone is lengthened the same way: a burst passes on a longer look, a queue
  that really grows fails its P90s then.
- The answer is confirmed on the longest look (method 4): a pass that settled on a shorter look
  is only tentative, since the queue's excursions near the boundary can outlast a short look
  that happened to see none, and every run starts from an empty system. The search's answer
  is looked at again at the cap (its runs go on, nothing is redone); if it fails there, it is
  withdrawn and the search goes on below it, confirming every pass from then on
  (``find_goodput``'s ``confirm``; a confirmed probe's metrics say ``confirmed=1``). PP=4
  static:512 on azure-conv at 5.94 req/s passes settled on 713 and 1,426 requests per seed
  and fails at 12,000 (P90 TTFT 4.9 s; docs/GOODPUT.md). So the reported goodput
  passed on 12,000 requests per seed, whatever the starting length. Settled fails are not
  confirmed: a run starts from an empty system, so a short look errs toward passing.
- Swamped probes stop early (P90 criterion): a look fails at once, without running its
  requests to the end, when in every seed more than ``SWAMPED_SHARE`` of the requests it
  judges are already certain to miss an objective (``SloMisses``: a late first token, none
  after waiting longer than the SLO, or rejected; or, having met TTFT, a TPOT over the SLO, or
  a request still decoding that has already spent longer since its first token than the SLO's
  pace allows for every token it asked for). Then one pooled P90 misses with several times the
  10% it may, which no longer look flips; the probe's metrics say ``stopped_early=1`` and the
  lower bounds on the shares missed. If only some seeds are swamped, those go on (the same
  simulation, nothing redone) and the look is judged as usual. The longest look (the cap: a
  confirmation, or a probe's last doubling) has no longer look to flip its verdict, so there a
  seed counts as swamped as soon as its certain misses alone fail its P90s
  (``sure_p90_failure``: ``certain_p90_miss``, about 10% of its requests, missing TTFT, or
  twice that many missing either); when every seed is and the pooled counts fail the pool's
  P90s the same way, the verdict is the one the whole look would give and only the metrics
  differ (``stopped_early=1`` instead of the P90s). The failed confirmations of decode-heavy
  loads, which used to run all 12,000 requests per seed with P90 TTFTs of 10-35 s, stop there,
  and so do the probes of a tight TPOT objective that every rate misses (SLO x0.2: 40 ms).
- Steady state: per seed, split the requests by arrival order into quarters and pool each
  quarter over seeds. The first quarter is warm-up; if the last quarter's median TTFT exceeds
  the second's by more than ``STEADY_GROWTH_RATIO`` x the second's + ``STEADY_SLACK_SLO_FRAC``
  x TTFT SLO (``fastpp.sim.steady``), the queue is still growing and the probe is infeasible
  ("queue not stationary") even if the pooled P90s pass: that rate would violate the SLO in a
  longer run.
  ``require_steady=False`` (CLI ``--no-steady``) drops this rule: the paper's benchmark judged
  fixed runs of 1,000 prompts, which at a decode-heavy load end before the KV cache has filled.
- Seeds: the verdict is on the records of all seeds pooled; each seed is also judged alone at
  every probe (on the pooled look's requests; a seed that fails the steady-state rule alone is
  looked at longer, its run going on, as a single-seed search would), and
  ``GoodputResult.seed_rates`` holds each seed's own goodput among the probed rates (the
  spread a single-seed search would show).

Cost: a probe's runs keep no per-token times in their records (``record_token_times=False``):
the verdict reads only TTFT, TPOT and the finish, and a decode-heavy look at the cap holds some
10 million tokens per seed (CNN-Reversed: 12,000 x ~880), whose times cost more to append and
to keep (the collector walks them) than the rest of the records. The cyclic garbage collector
is paused while a probe runs (``_collector_paused``).

Units: rates in requests per second, latencies in milliseconds (``_ms``), wall times in seconds.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from fastpp.metrics import SLO_SLACK_MS, meets_slo, slo_attainment
from fastpp.sim.engine import GiveUp, PipelineSimulation
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, open_simulation
from fastpp.sim.steady import COMPLETED, check_steady_state, quantile, ttft_ms
from fastpp.types import SLO, FinishReason, RequestRecord

MIN_REQUESTS = 300  # requests per seed per probe, at least
MAX_FIRST_LOOK = 100_000  # ... and at most (memory: each seed's run holds 1.25x this many)
ARRIVAL_SPAN_S = 120.0  # seconds of arrivals each probe covers, at least (default length rule)
LIFETIMES = 2.0  # ... and this many request lifetimes at the SLO's TPOT
MAX_DOUBLINGS = 4  # an unsettled probe is looked at longer at most this often ...
MAX_REQUESTS_PER_SEED = 12_000  # ... the last time at this length (or the start, if longer)
UNSTEADY = "queue not stationary"  # the reason a probe fails the steady-state rule with
SWAMPED_SHARE = 0.5  # a look stops early, failed, once every seed has this share of TTFT misses
BATCHES = 8  # batch means per seed run (the first is warm-up) for the settling test
SETTLE_Z = 2.0  # unsettled while 10% misses lies within this many standard errors
# Version of the rules above: sweeps put it in a goodput point's id, so that cached rows of an
# older method are not reused (1: halves test, fixed length; 2: issue 13's converging probes;
# 3: a longer look goes on with the same run, and the search starts at DEFAULT_LOW; 4: the
# answer is confirmed on the longest look).
GOODPUT_METHOD = 4
EXPANSION_FACTOR = 16.0  # default cap = high x this; default floor = low / this
# slo_goodput's first probe and upper bracket guess, req/s. A low first probe is the dearest one
# (a lightly loaded pipeline runs many small microbatches per request), and 2 req/s is below the
# goodput of every 32B/14B deployment docs/RESULTS.md finds feasible; the search halves below it.
DEFAULT_LOW = 2.0
DEFAULT_HIGH = 8.0

Criterion = Literal["p90", "attainment"]


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One probed rate: feasible or not, why not, and the metrics that decided it."""

    rate: float  # requests per second
    ok: bool  # criterion met (and, for slo_goodput, the queue was stationary)
    metrics: dict[str, float] = field(default_factory=dict)  # key metrics, latencies in ms
    reason: str = ""  # why infeasible ("" when ok)
    seed_ok: tuple[bool, ...] = ()  # slo_goodput: the verdict on each seed's records alone

    def describe(self) -> str:
        """One line: ``4.25 req/s  ok  p90_ttft_ms=812 ...`` or ``... FAIL (reason)``."""
        shown = "  ".join(f"{k}={_fmt(v)}" for k, v in self.metrics.items())
        verdict = "ok" if self.ok else f"FAIL ({self.reason})"
        return f"{self.rate:8.4g} req/s  {verdict}  {shown}".rstrip()


@dataclass(frozen=True, slots=True)
class GoodputResult:
    """Outcome of a goodput search.

    ``rate`` is the highest feasible probed rate (0.0 when none passed, then ``reason`` says
    why); the true goodput lies in [rate, rate + margin) if feasibility is monotone.
    """

    rate: float  # requests per second; 0.0 when no probe was feasible
    margin: float  # bracket width, req/s: lowest infeasible - rate (inf: feasible at the cap)
    probes: tuple[ProbeResult, ...]  # every probe, in the order run
    reason: str = ""  # why goodput is 0 ("" otherwise)
    notes: tuple[str, ...] = ()  # bracket expansions, exhausted probe budget
    criterion: str = ""  # what "feasible" meant, in words
    seeds: tuple[int, ...] = ()  # slo_goodput: the seeds pooled at every probe
    seed_rates: tuple[float, ...] = ()  # each seed's own goodput among the probed rates

    @property
    def best(self) -> ProbeResult | None:
        """The probe at the goodput rate, or None when goodput is 0."""
        feasible = [p for p in self.probes if p.ok]
        return max(feasible, key=lambda p: p.rate) if feasible else None

    @property
    def attainment(self) -> float:
        """Per-request SLO attainment at the goodput rate (NaN when unknown or goodput is 0)."""
        best = self.best
        return math.nan if best is None else best.metrics.get("slo_attainment", math.nan)

    def to_dict(self) -> dict:
        """A JSON-ready dict (``inf`` margins serialize as ``Infinity``)."""
        return {
            "goodput": self.rate,
            "margin": self.margin,
            "attainment": self.attainment,
            "reason": self.reason,
            "notes": list(self.notes),
            "criterion": self.criterion,
            "seeds": list(self.seeds),
            "seed_goodputs": list(self.seed_rates),
            "probes": [
                {"rate": p.rate, "ok": p.ok, "reason": p.reason, **p.metrics, "seed_ok": list(p.seed_ok)}
                for p in self.probes
            ],
        }

    def describe(self) -> str:
        """A short multi-line report: verdict, notes, then one line per probe by rate."""
        if self.rate > 0:
            head = f"goodput {self.rate:.4g} req/s (+{self.margin:.3g})"
            if not math.isnan(self.attainment):
                head += f", per-request attainment {100 * self.attainment:.1f}%"
        else:
            head = f"goodput 0: {self.reason}"
        if len(self.seed_rates) > 1:
            head += f"; seeds alone {min(self.seed_rates):.4g}..{max(self.seed_rates):.4g} req/s"
        lines = [head + (f"  [{self.criterion}]" if self.criterion else "")]
        lines += [f"note: {n}" for n in self.notes]
        lines += [p.describe() for p in sorted(self.probes, key=lambda p: p.rate)]
        return "\n".join(lines)


def find_goodput(
    criterion: Callable[[float], ProbeResult],
    *,
    low: float,
    high: float,
    precision: float,
    max_probes: int,
    min_rate: float | None = None,
    max_rate: float | None = None,
    progress: Callable[[ProbeResult], None] | None = None,
    confirm: Callable[[float], ProbeResult] | None = None,
    high_fails: bool = False,
    defer_confirmation: bool = False,
    grid: float | None = None,
) -> GoodputResult:
    """Highest rate r with ``criterion(r).ok``, assuming feasibility falls monotonically with r.

    Brackets (halving from ``low`` down to ``min_rate``, default low/16; doubling from ``high``
    up to ``max_rate``, default high x 16), then bisects until the bracket is narrower than
    ``precision`` req/s (absolute) or ``max_probes`` probes have run. ``progress`` sees every
    probe. Deterministic whenever ``criterion`` and ``confirm`` are.

    ``confirm`` re-judges a passed rate on stronger evidence (``slo_goodput``: the longest
    look). When given, the search's answer must pass it: the highest passed rate is confirmed;
    if it fails there, its probe is replaced by the confirmation, the bracket closes under it,
    and the search goes on below: the passes already there are confirmed, the highest first,
    then by halves (a pass above one that fails confirmation is withdrawn with it, its reason
    says so), and every new pass is confirmed as it is probed (the first looks proved
    optimistic there; confirming only each new answer would walk down a step at a time). A
    confirmation replaces its probe and does not count against ``max_probes``.

    ``high_fails``: ``high`` is known to fail (an upper bound on the answer, such as a
    deployment's capacity bound under the steady-queue rule), so it is not probed: once ``low``
    passes the bracket is [low, high] at once, which is where a failed probe at ``high`` would
    have put it, so the search goes on exactly as it would have after that probe.

    ``defer_confirmation``: after the first withdrawal, the highest pass below it is not
    confirmed before the bisection above it (the eager confirmations there decide first): it
    is confirmed only if no confirmed pass lands above it, and from a second withdrawal on the
    rule above applies. With monotone first looks and confirmations the answer is the same
    (the bisection between that pass and the withdrawn rate is the one the rule above runs
    once it has confirmed the pass), one confirmation fewer whenever a pass above it confirms;
    ``fastpp goodput`` keeps the rule above.

    ``grid``: probe only whole multiples of ``grid`` req/s (``low`` rounded down, ``high`` and
    ``max_rate`` up, every halving, doubling and midpoint to a multiple; below one ``grid`` the
    halvings go on as halves), and stop when the bracket's ends are neighbours. The answer is
    then the highest multiple that passes, which, with monotone verdicts, does not depend on
    where the bracket started: two searches of the same deployment from different brackets
    (the planner's, which start from the goodput of whichever candidate finished first) agree.
    """
    if grid is not None:
        if not (math.isfinite(grid) and grid > 0):
            raise ValueError(f"grid must be > 0 req/s, got {grid!r}")
        low = _on_grid(low, grid, math.floor)
        high = max(_on_grid(high, grid, math.ceil), low + grid)
        if max_rate is not None:
            max_rate = _on_grid(max_rate, grid, math.ceil)
        if min_rate is not None:
            min_rate = min(min_rate, low)
    floor = low / EXPANSION_FACTOR if min_rate is None else min_rate
    cap = high * EXPANSION_FACTOR if max_rate is None else max_rate
    if not 0 < floor <= low < high <= cap:
        raise ValueError(
            f"need 0 < min_rate <= low < high <= max_rate, got {floor:g}, {low:g}, {high:g}, {cap:g}"
        )
    if not precision > 0:
        raise ValueError(f"precision must be > 0 req/s, got {precision!r}")
    if max_probes < 1:
        raise ValueError(f"max_probes must be >= 1, got {max_probes}")

    probes: list[ProbeResult] = []
    notes: list[str] = []

    def checked(result: ProbeResult, rate: float) -> ProbeResult:
        if not math.isclose(result.rate, rate):
            raise ValueError(f"criterion probed {rate:g} req/s but reported {result.rate:g}")
        if progress is not None:
            progress(result)
        return result

    confirmed: set[float] = set()  # rates judged by confirm
    eager = False  # once a first look's pass was withdrawn, confirm every pass at once

    def confirmation(rate: float) -> ProbeResult:
        result = checked(confirm(rate), rate)
        confirmed.add(rate)
        if not result.ok:
            notes.append(f"{rate:g} req/s passed its first looks but failed confirmation")
        return result

    def probe(rate: float) -> bool:
        result = checked(criterion(rate), rate)
        if eager and result.ok and confirm is not None:
            result = confirmation(rate)
        probes.append(result)
        return result.ok

    def budget_left() -> bool:
        if len(probes) < max_probes:
            return True
        exhausted = f"probe budget of {max_probes} exhausted"
        if exhausted not in notes:
            notes.append(exhausted)
        return False

    def done(lo: float, hi: float, reason: str = "") -> GoodputResult:
        return GoodputResult(lo, hi - lo, tuple(probes), reason, tuple(notes))

    def none_feasible(hi: float) -> GoodputResult:
        lowest = min(probes, key=lambda p: p.rate)
        why = (
            f"even {lowest.rate:g} req/s fails: {lowest.reason}"
            if lowest.reason
            else f"even {lowest.rate:g} req/s is infeasible"
        )
        return done(0.0, hi, why)

    def snap(rate: float, rounding: Callable[[float], float] = round) -> float:
        return rate if grid is None else _on_grid(rate, grid, rounding)

    def half(hi: float) -> float:
        """The next rate down from ``hi``: its half, on the grid while the grid has a point
        below ``hi`` (below one grid step the halves go on, the same from any bracket)."""
        return hi / 2 if grid is None or hi <= grid * (1 + 1e-9) else snap(hi / 2, math.floor)

    def halve_below(hi: float) -> tuple[float, float]:
        """Halve down from ``hi`` (infeasible) to the floor: (first feasible or 0, hi)."""
        rate = half(hi)
        while rate >= floor * (1 - 1e-9) and budget_left():
            if probe(rate):
                return rate, hi
            hi, rate = rate, half(rate)
        return 0.0, hi

    def bisect(lo: float, hi: float) -> tuple[float, float]:
        while hi - lo >= precision and math.isfinite(hi) and budget_left():
            mid = snap((lo + hi) / 2)
            if not lo < mid < hi:  # neighbours on the grid
                break
            if probe(mid):
                lo = mid
            else:
                hi = mid
        return lo, hi

    # bracket: lo = highest feasible rate seen (0 if none), hi = lowest infeasible (inf if none)
    lo, hi = 0.0, math.inf
    low_ok = probe(low)
    if low_ok and high_fails:
        lo, hi = low, high
    elif low_ok:
        lo, rate = low, high
        while budget_left():
            if not probe(rate):
                hi = rate
                break
            lo = rate
            if rate >= cap:
                break
            rate = min(snap(rate * 2, math.ceil), cap)
        if lo >= high and math.isfinite(hi):
            notes.append(f"high {high:g} req/s was feasible: expanded upward to {hi:g}")
    else:
        lo, hi = halve_below(low)
        if lo == 0.0:
            return none_feasible(hi)
        notes.append(f"low {low:g} req/s was infeasible: expanded downward to {lo:g}")
    lo, hi = bisect(lo, hi)

    # The answer must stand confirmation. One that fails it is withdrawn and closes the
    # bracket under it; the first looks proved optimistic there, so the passes below are
    # confirmed, the highest first, then by halves (a pass above a failed confirmation is
    # withdrawn with it), and from then on every pass is confirmed as it is probed.
    def confirm_at(rate: float) -> bool:
        at = max(i for i, p in enumerate(probes) if p.rate == rate)
        probes[at] = confirmation(rate)
        return probes[at].ok

    while confirm is not None and lo > 0 and lo not in confirmed:
        if confirm_at(lo):
            break
        eager, hi = True, lo
        below = [p.rate for p in probes if p.ok and p.rate < hi]
        lo = max((r for r in below if r in confirmed), default=0.0)
        pending = sorted(r for r in below if r > lo)
        if defer_confirmation and pending:  # once: bisect above the highest pass, unconfirmed
            defer_confirmation, lo, pending = False, pending[-1], []
        first = True
        while pending:  # the highest first (the likeliest answer), then by halves
            mid = pending[-1] if first else pending[len(pending) // 2]
            first = False
            if confirm_at(mid):
                lo, pending = mid, [r for r in pending if r > mid]
            else:
                hi, pending = mid, [r for r in pending if r < mid]
        for i, p in enumerate(probes):  # tentative passes above a failed confirmation
            if p.ok and p.rate > hi:
                probes[i] = replace(
                    p, ok=False, reason=f"withdrawn: {hi:g} req/s below it failed confirmation"
                )
        if lo == 0.0:
            lo, hi = halve_below(hi)
            if lo == 0.0:
                return none_feasible(hi)
        lo, hi = bisect(lo, hi)

    if math.isinf(hi) and lo >= cap:
        notes.append(f"feasible at the cap {cap:g} req/s: goodput is at least this")
    elif math.isinf(hi) and lo >= high:
        notes.append(f"high {high:g} req/s was feasible: expanded upward past {lo:g}")
    return done(lo, hi)


def _on_grid(rate: float, grid: float, rounding: Callable[[float], float]) -> float:
    """``rate`` rounded (``math.floor``, ``math.ceil`` or ``round``) to a whole multiple of
    ``grid``, at least one ``grid``; the same multiple always gives the same float."""
    nudge = {math.floor: 1e-9, math.ceil: -1e-9}.get(rounding, 0.0)  # 0.3 / 0.1 = 2.9999999999999996
    return max(1, int(rounding(rate / grid + nudge))) * grid


def probe_span_s(workload: WorkloadConfig, slo: SLO, samples: int = 4000) -> float:
    """Seconds of arrivals a probe covers: max(120 s, LIFETIMES x mean output x SLO TPOT), the
    mean output estimated from ``samples`` lengths of the workload (seeded, deterministic)."""
    lengths = replace(workload, rate=None, num_requests=samples, duration_s=None, seed=0)
    mean_output = sum(r.output_len for r in lengths.requests()) / samples
    return max(ARRIVAL_SPAN_S, LIFETIMES * mean_output * slo.tpot_s)


def first_look_length(span_s: float, rate: float) -> int:
    """The length rule: requests per seed of a probe's first look at ``rate`` when it covers
    ``span_s`` seconds of arrivals (:func:`probe_span_s`), at least ``MIN_REQUESTS`` and at
    most ``MAX_FIRST_LOOK``."""
    wanted = span_s * rate
    return MAX_FIRST_LOOK if not wanted < MAX_FIRST_LOOK else max(MIN_REQUESTS, math.ceil(wanted))


def open_probe_runs(
    workload: WorkloadConfig, deployment: DeploymentConfig, rate: float, seeds: Sequence[int], cap: int
) -> list[PipelineSimulation]:
    """One simulation per seed for a probe at ``rate``, to be looked at over its first n, 2n,
    ... requests (``run_until_ended``), the last look at ``cap``. Its arrivals go on a quarter
    of the cap past it, so no look sees the queue drain, and every starting length sees the
    same run of a rate and seed."""
    return [
        open_simulation(
            replace(workload, rate=rate, seed=seed, num_requests=cap + cap // 4, duration_s=None),
            deployment,
            record_iterations=False,
            record_token_times=False,
        )
        for seed in seeds
    ]


def slo_goodput(
    workload: WorkloadConfig,
    deployment: DeploymentConfig,
    *,
    seeds: Sequence[int] = (0, 1),
    num_requests: int | None = None,
    precision: float = 0.1,
    low: float = DEFAULT_LOW,
    high: float = DEFAULT_HIGH,
    criterion: Criterion = "p90",
    attainment: float = 0.9,
    max_probes: int = 16,
    progress: Callable[[ProbeResult], None] | None = None,
    require_steady: bool = True,
    converge: bool | None = None,
    high_fails: bool = False,
    defer_confirmation: bool = False,
    on_open: Callable[[PipelineSimulation], None] | None = None,
    grid: float | None = None,
) -> GoodputResult:
    """Goodput of ``deployment`` on ``workload``'s length distribution (module docstring rules).

    Each probe simulates ``replace(workload, rate=r, seed=s)`` for every seed in ``seeds`` and
    judges the pooled records: ``"p90"`` = the paper's P90 TTFT and P90 TPOT test against
    ``deployment.slo``; ``"attainment"`` = at least ``attainment`` of all requests meet both
    objectives themselves. Arrivals follow ``workload.arrival`` (Poisson by default).
    ``num_requests`` per seed; None = the module's length rule (:func:`probe_span_s`).
    ``require_steady=False`` drops the steady-queue rule and judges the criterion alone, as the
    paper's benchmark did on fixed runs of 1,000 prompts (then give ``num_requests``).
    ``converge`` (default: ``require_steady``) doubles a probe whose verdict its first half does
    not share (module docstring); ``num_requests`` is then the starting length. Off, every probe
    is one run of ``num_requests`` (the fixed-run protocol).
    ``high_fails``: ``high`` is known infeasible and not probed; ``defer_confirmation``: the
    first withdrawal's highest pass below is confirmed last; ``grid``: probe only whole multiples
    of it, so the answer does not depend on the bracket (all three ``find_goodput``).
    ``on_open`` sees every simulation the search opens (to read its counters afterwards).
    """
    converge = require_steady if converge is None else converge
    if workload.replay is not None:
        raise ValueError("goodput needs synthetic arrivals at a chosen rate, not a replayed trace")
    if criterion not in ("p90", "attainment"):
        raise ValueError(f"criterion must be 'p90' or 'attainment', got {criterion!r}")
    if not 0 < attainment <= 1:
        raise ValueError(f"attainment must be in (0, 1], got {attainment!r}")
    if not seeds:
        raise ValueError("give at least one seed")
    if num_requests is not None and not 2 <= num_requests <= MAX_FIRST_LOOK:
        raise ValueError(
            f"num_requests (-n) must be in [2, {MAX_FIRST_LOOK:,}] per seed, got {num_requests:,}"
        )
    slo = deployment.slo
    span_s = probe_span_s(workload, slo)

    def opened(sim: PipelineSimulation) -> PipelineSimulation:
        if on_open is not None:
            on_open(sim)
        return sim

    def run(rate: float, n: int) -> list[list[RequestRecord]]:
        return [
            opened(
                open_simulation(
                    replace(workload, rate=rate, seed=seed, num_requests=n, duration_s=None),
                    deployment,
                    record_iterations=False,
                    record_token_times=False,
                )
            )
            .run()
            .records
            for seed in seeds
        ]

    def verdict(runs: Sequence[Sequence[RequestRecord]], rate: float) -> ProbeResult:
        # metrics stay free of wall times so that a seed's result is byte-identical across runs
        return judge_records(
            runs, slo, rate=rate, criterion=criterion, attainment=attainment, require_steady=require_steady
        )

    def swamped(ttft: int, tpot: int, rate: float, total: int, misses: Sequence[SloMisses]) -> ProbeResult:
        """A look stopped on ``ttft`` + ``tpot`` certain misses among its ``total`` requests
        (``misses``: each seed's counts, which also say how many of them were rejected, and why)."""
        waited = f"{ttft} of {total} requests already waited over {slo.ttft_s * 1e3:g} ms for a first token"
        if rejected := sum(m.rejected for m in misses):
            why = next(m.rejected_detail for m in misses if m.rejected)
            waited = (
                f"{ttft} of {total} requests got no first token within {slo.ttft_s * 1e3:g} ms, "
                f"{rejected} of them rejected ({why})"
            )
        if tpot:
            reason = (
                f"P90 TTFT/TPOT: {waited}, {tpot} more already decode slower than "
                f"{slo.tpot_s * 1e3:g} ms per token (probe stopped early)"
            )
        else:
            reason = f"P90 TTFT: {waited} (probe stopped early)"
        return ProbeResult(
            rate,
            False,
            {
                "num_requests": float(total),
                "ttft_missed_at_least": ttft / total,
                "tpot_missed_at_least": tpot / total,
                "stopped_early": 1.0,
            },
            reason,
            seed_ok=(False,) * len(seeds),
        )

    def seed_verdict(
        sim: PipelineSimulation, records: Sequence[RequestRecord], rate: float, n: int, cap: int
    ) -> bool:
        """One seed's own verdict at the pooled look's length; a seed that fails the steady
        state rule alone is looked at longer (its run goes on), as the pooled probe would be:
        one seed's short run reads a burst in its last quarter as a growing queue."""
        alone = verdict([records], rate)
        while alone.reason.startswith(UNSTEADY) and n < cap:
            n = min(2 * n, cap)
            alone = verdict([sim.run_until_ended(n)], rate)
        return alone.ok

    def look(
        sims: Sequence[PipelineSimulation], n: int, rate: float, final: bool
    ) -> tuple[ProbeResult, list[list[RequestRecord]], bool]:
        """Each seed's run looked at over its first n requests: (verdict, records, unsettled).
        ``final``: no longer look can follow, so any sure P90 failure ends the look."""
        misses = [SloMisses(slo) for _ in sims]
        enough = sure_p90_failure(n) if final else swamped_look(n)
        runs = [
            sim.run_until_ended(n, miss.give_up_when(enough) if criterion == "p90" else None)
            for sim, miss in zip(sims, misses, strict=True)
        ]
        ttft, tpot = sum(m.ttft_missed for m in misses), sum(m.tpot_missed for m in misses)
        total = n * len(sims)
        if all(sim.gave_up for sim in sims) and sure_p90_failure(total)(ttft, tpot):
            # every seed fails its own P90s beyond doubt, and so does the pool (which a mix of
            # seeds sure by TTFT alone and seeds sure by both objectives may not: then go on)
            return swamped(ttft, tpot, rate, total, misses), runs, False
        runs = [
            sim.run_until_ended(n) if sim.gave_up else r  # go on where it stopped
            for r, sim in zip(runs, sims, strict=True)
        ]
        whole = verdict(runs, rate)
        # a queue that only looks unsteady may be a burst: a longer look shows which
        unsettled = (criterion == "p90" and is_unsettled(runs, slo)) or whole.reason.startswith(UNSTEADY)
        return whole, runs, unsettled

    def concluded(
        whole: ProbeResult,
        sims: Sequence[PipelineSimulation],
        runs: Sequence[Sequence[RequestRecord]],
        n: int,
        cap: int,
        unsettled: bool,
    ) -> ProbeResult:
        """The probe's result from its last look: the seeds judged alone, the look's length."""
        if whole.seed_ok:  # swamped: every seed failed beyond doubt
            seed_ok = whole.seed_ok
        else:  # each seed alone, lengthened as a single-seed search would be
            seed_ok = tuple(
                seed_verdict(sim, records, whole.rate, n, cap)
                for sim, records in zip(sims, runs, strict=True)
            )
        return replace(
            whole,
            metrics={**whole.metrics, "requests_per_seed": float(n), "converged": float(not unsettled)},
            seed_ok=seed_ok,
        )

    # the runs of the passed probes, kept for their confirmation: rate -> (sims, cap, result)
    passed: dict[float, tuple[list[PipelineSimulation], int, ProbeResult]] = {}

    def judge(rate: float) -> ProbeResult:
        n = num_requests or first_look_length(span_s, rate)
        if not converge:  # one fixed run per seed, judged whole
            runs = run(rate, n)
            whole = verdict(runs, rate)
            return replace(
                whole,
                metrics={**whole.metrics, "requests_per_seed": float(n), "converged": 1.0},
                seed_ok=tuple(verdict([records], rate).ok for records in runs),
            )
        cap = max(n, MAX_REQUESTS_PER_SEED)
        sims = [opened(sim) for sim in open_probe_runs(workload, deployment, rate, seeds, cap)]
        for doubling in range(MAX_DOUBLINGS + 1):
            if doubling:
                if n >= cap:
                    break
                n = cap if doubling == MAX_DOUBLINGS else min(2 * n, cap)
            whole, runs, unsettled = look(sims, n, rate, final=n >= cap)
            if not unsettled:
                break
        result = concluded(whole, sims, runs, n, cap, unsettled)
        if result.ok:
            passed[rate] = (sims, cap, result)
        return result

    def confirm(rate: float) -> ProbeResult:
        """A passed probe at the longest look: its runs go on to the cap, judged there."""
        sims, cap, result = passed.pop(rate)
        if result.metrics["requests_per_seed"] < cap:
            whole, runs, unsettled = look(sims, cap, rate, final=True)
            result = concluded(whole, sims, runs, cap, cap, unsettled)
        return replace(result, metrics={**result.metrics, "confirmed": 1.0})

    result = find_goodput(
        _collector_paused(judge),
        low=low,
        high=high,
        precision=precision,
        max_probes=max_probes,
        progress=progress,
        confirm=_collector_paused(confirm) if converge else None,
        high_fails=high_fails,
        defer_confirmation=defer_confirmation,
        grid=grid,
    )
    result = replace(result, seeds=tuple(seeds), seed_rates=_seed_rates(result.probes, len(seeds)))
    if criterion == "p90":
        words = f"P90 TTFT <= {slo.ttft_s * 1e3:g} ms and P90 TPOT <= {slo.tpot_s * 1e3:g} ms"
    else:
        words = (
            f">= {100 * attainment:g}% of requests meet TTFT <= {slo.ttft_s * 1e3:g} ms "
            f"and TPOT <= {slo.tpot_s * 1e3:g} ms"
        )
    words += f"{', steady queue' if require_steady else ''}; seeds {tuple(seeds)} pooled"
    return replace(result, criterion=words)


def _collector_paused(probe: Callable[[float], ProbeResult]) -> Callable[[float], ProbeResult]:
    """``probe`` with Python's cyclic garbage collector paused while it runs (and restored as
    it was). A look allocates millions of short-lived tuples and records but leaves few
    cycles (about two objects per request), while the search keeps the runs of its passed
    probes for their confirmation: hundreds of thousands of live objects, which every full
    collection walked again (about a tenth of a search's CPU). The cycles a probe leaves are
    collected after it, as usual."""

    def paused(rate: float) -> ProbeResult:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return probe(rate)
        finally:
            if was_enabled:
                gc.enable()

    return paused


def judge_records(
    runs: Sequence[Sequence[RequestRecord]],
    slo: SLO,
    *,
    rate: float,
    criterion: Criterion = "p90",
    attainment: float = 0.9,
    require_steady: bool = True,
) -> ProbeResult:
    """Judge one probe from its per-seed records (pooled), as ``slo_goodput`` does; with
    ``require_steady=False`` a growing queue is reported in the metrics but does not fail it."""
    pooled = [r for records in runs for r in records]
    p90_ttft = _p90([ttft_ms(r) for r in pooled])  # failures as infinite TTFT
    p90_tpot = _p90_tpot_ms(pooled)
    share = slo_attainment(pooled, slo)
    steady = check_steady_state(runs, slo)
    failures: list[str] = []
    if criterion == "p90":
        # the paper's test (fastpp.metrics.meets_slo), on a TTFT P90 that counts failures
        if not meets_slo({"p90_ttft_ms": p90_ttft, "p90_tpot_ms": p90_tpot}, slo):
            if not p90_ttft <= slo.ttft_s * 1e3 + SLO_SLACK_MS:
                failures.append(f"P90 TTFT: {p90_ttft:.2f} ms > {slo.ttft_s * 1e3:g} ms")
            if p90_tpot > slo.tpot_s * 1e3 + SLO_SLACK_MS:
                failures.append(f"P90 TPOT: {p90_tpot:.2f} ms > {slo.tpot_s * 1e3:g} ms")
    elif not share >= attainment:
        failures.append(f"attainment {100 * share:.1f}% < {100 * attainment:g}%")
    num_failed = sum(r.finish_reason not in COMPLETED for r in pooled)
    if num_failed and failures:
        failures.append(f"{num_failed} of {len(pooled)} requests rejected/aborted/unfinished")
    if require_steady and not steady.is_stationary:
        failures.append(f"{UNSTEADY}: {steady.describe()}")
    metrics = {
        "p90_ttft_ms": p90_ttft,
        "p90_tpot_ms": p90_tpot,
        "slo_attainment": share,
        "num_requests": float(len(pooled)),
        "num_failed": float(num_failed),
        "median_ttft_q2_ms": steady.early_ms,
        "median_ttft_q4_ms": steady.late_ms,
    }
    return ProbeResult(rate, not failures, metrics, "; ".join(failures))


def _seed_rates(probes: Sequence[ProbeResult], num_seeds: int) -> tuple[float, ...]:
    """Per seed, its own goodput among the probed rates: the highest rate it passed below the
    lowest rate it failed (0.0 when it passed none)."""
    out = []
    for i in range(num_seeds):
        judged = sorted((p.rate, p.seed_ok[i]) for p in probes if len(p.seed_ok) > i)
        lowest_fail = min((r for r, ok in judged if not ok), default=math.inf)
        out.append(max((r for r, ok in judged if ok and r < lowest_fail), default=0.0))
    return tuple(out)


def is_unsettled(runs: Sequence[Sequence[RequestRecord]], slo: SLO) -> bool:
    """Could a longer probe flip the P90 verdict? P90 <= SLO is "at most 10% of requests miss
    it"; the share of misses is estimated with batch means (each run cut by arrival into
    ``BATCHES`` consecutive batches, the first dropped as warm-up), whose spread accounts for
    the correlation of requests that queue together. Unsettled iff, for TTFT or TPOT, 0.10 lies
    within ``SETTLE_Z`` standard errors of the share of misses: even when the other objective
    already misses beyond those errors, since on a short look both shares move with the same
    bursts (a TPOT share 2.06 errors above 10% on 398 requests per seed, TTFT's 0.99, passed
    on 3,184: docs/GOODPUT.md)."""
    ttft_slo, tpot_slo = slo.ttft_s * 1e3 + SLO_SLACK_MS, slo.tpot_s * 1e3 + SLO_SLACK_MS
    shares: list[tuple[float, float]] = []  # per batch: share missing TTFT, share missing TPOT
    for records in runs:
        ordered = sorted(records, key=lambda r: (r.arrived_at, r.req_id))
        size = len(ordered) // BATCHES
        for b in range(1, BATCHES if size else 0):
            batch = ordered[b * size : (b + 1) * size]
            ttft_miss = sum(not ttft_ms(r) <= ttft_slo for r in batch)
            tpots = [t for r in batch if (t := r.tpot_s) is not None]
            tpot_miss = sum(t * 1e3 > tpot_slo for t in tpots)
            shares.append((ttft_miss / len(batch), tpot_miss / max(1, len(tpots))))
    if len(shares) < 2:
        return False
    for k in (0, 1):
        values = np.array([s[k] for s in shares])
        se = values.std(ddof=1) / math.sqrt(values.size)
        if abs(values.mean() - 0.1) < SETTLE_Z * se:
            return True
    return False


def certain_p90_miss(n: int) -> int:
    """The fewest misses among ``n`` TTFTs that put their P90 over the SLO for sure: then the
    value at rank int(0.9 (n - 1)) (``quantile``'s interpolation starts there) is a miss."""
    return n - int(0.9 * (n - 1))


def swamped_look(n: int) -> Callable[[int, int], bool]:
    """Give up on a look of ``n`` requests (per seed) once more than ``SWAMPED_SHARE`` of them
    are certain to miss TTFT or TPOT: one objective then misses on over a quarter of them,
    several times the 10% a P90 allows, which no longer look flips."""
    return lambda ttft, tpot: ttft + tpot > SWAMPED_SHARE * n


def sure_p90_failure(n: int) -> Callable[[int, int], bool]:
    """Does a look of ``n`` requests fail its P90s whatever comes next, given ``ttft`` certain
    TTFT misses and ``tpot`` certain misses of TPOT alone (``SloMisses``)? Yes with c =
    ``certain_p90_miss(n)`` TTFT misses; otherwise at most c - 1 - ttft of the ``tpot`` requests
    end without completing (TTFT misses), the rest complete and miss TPOT: at least
    ttft + tpot - c + 1 of the m <= n completed requests with a TPOT, which fails their P90 once
    it reaches c >= certain_p90_miss(m) (monotone in m), so also with ttft + tpot >= 2c - 1."""
    sure = certain_p90_miss(n)
    return lambda ttft, tpot: ttft >= sure or ttft + tpot >= 2 * sure - 1


class SloMisses:
    """Counts, as a run goes on, the requests already certain to miss an objective.

    TTFT: a first token later than the SLO, none yet after waiting longer than it, or ended
    without one (rejected, aborted). Counted over the leading records (by arrival) whose TTFT
    fate is known, so each check only reads the requests that arrived since the SLO's span
    before the last one.
    TPOT, among those that met TTFT: a completed request whose TPOT is over the SLO, or one
    still decoding whose time since its first token already exceeds the SLO's pace for every
    token it asked for, ``(now - first) / (output_len - 1) > SLO TPOT``: its last token comes
    later than now and it produces at most ``output_len`` tokens, so its TPOT can only be
    larger (the same float operations as ``RequestRecord.tpot_s``, which are monotone). Such a
    request either completes and misses TPOT or ends without completing, a TTFT miss
    (``ttft_ms``): either way it fails one objective. The open ones (met TTFT, still
    decoding within the pace) are kept aside and read again at each check."""

    def __init__(self, slo: SLO) -> None:
        self.ttft_limit_s = slo.ttft_s + SLO_SLACK_MS / 1e3
        self.tpot_limit_ms = slo.tpot_s * 1e3 + SLO_SLACK_MS
        self.upto = 0  # records[:upto] have a known TTFT fate
        self.ttft_missed = 0  # TTFT misses among them
        self.tpot_missed = 0  # of the others: certain TPOT misses (or ended without completing)
        self.rejected = 0  # of the TTFT misses: requests the scheduler refused (a prompt too long)
        self.rejected_detail = ""  # the first one's reason
        self._open: list[RequestRecord] = []  # met TTFT, TPOT fate still open

    def count(self, records: Sequence[RequestRecord], now: float) -> tuple[int, int]:
        """(certain TTFT misses, certain misses of TPOT alone) among ``records`` at ``now``."""
        limit, upto, missed = self.ttft_limit_s, self.upto, self.ttft_missed
        opened = self._open
        while upto < len(records):
            r = records[upto]
            if r.first_token_at is not None:
                late = r.first_token_at - r.arrived_at > limit
                missed += late
                if not late:
                    opened.append(r)
            elif r.finish_reason is not None or now - r.arrived_at > limit:
                missed += 1
                if r.finish_reason == FinishReason.REJECTED:
                    self.rejected += 1
                    self.rejected_detail = self.rejected_detail or r.detail
            else:
                break  # still waiting within the SLO: its fate, and the later ones', is open
            upto += 1
        self.upto, self.ttft_missed = upto, missed
        self.tpot_missed += self._settle_open(now)
        return self.ttft_missed, self.tpot_missed

    def _settle_open(self, now: float) -> int:
        """Certain misses among the open requests; the settled ones leave the list."""
        tpot_limit = self.tpot_limit_ms
        still, missed = [], 0
        for r in self._open:
            if r.finish_reason is not None:  # ended: its TPOT is known, or it never completed
                t = r.tpot_s
                missed += r.finish_reason not in COMPLETED or (t is not None and t * 1e3 > tpot_limit)
            elif (
                r.output_len >= 2
                and r.first_token_at is not None
                and (now - r.first_token_at) / (r.output_len - 1) * 1e3 > tpot_limit
            ):
                missed += 1
            else:
                still.append(r)
        self._open = still
        return missed

    def give_up_when(self, enough: Callable[[int, int], bool]) -> GiveUp:
        """A ``run_until_ended`` give-up predicate: ``enough(ttft_missed, tpot_missed)``."""
        return lambda records, now: enough(*self.count(records, now))


def _p90_tpot_ms(records: Sequence[RequestRecord]) -> float:
    """P90 TPOT (ms) over the completed requests that have one: ``summarize``'s
    ``p90_tpot_ms`` without the rest of the summary (NaN when none has a TPOT)."""
    tpots = [
        t
        for r in records
        if r.finish_reason in COMPLETED and r.first_token_at is not None and (t := r.tpot_s) is not None
    ]
    return float(np.percentile(np.array(tpots, float) * 1e3, 90)) if tpots else math.nan


def _p90(values_ms: Sequence[float]) -> float:
    """P90 with np.percentile's linear interpolation, safe with infinities (NaN when empty)."""
    return quantile(values_ms, 0.9)


def _fmt(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)

"""Is a run's queue stationary? The steady-state rule of the goodput search (``fastpp.sim.goodput``)
and the "queue steady" row of ``fastpp simulate``.

Per run, the requests are split by arrival order into quarters and each quarter pooled over the
runs. The first quarter is warm-up; if the last quarter's median TTFT exceeds the second's by
more than ``STEADY_GROWTH_RATIO`` x the second's + ``STEADY_SLACK_SLO_FRAC`` x the TTFT SLO, the
queue is still growing: the arrival rate is above what the deployment sustains, however the
P90s of this run came out (a longer run would miss more). A request that was rejected, aborted
or left unfinished counts as an infinite TTFT.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fastpp.types import SLO, FinishReason, RequestRecord

STEADY_GROWTH_RATIO = 0.25  # allowed rise of the last quarter's median TTFT over the second's
STEADY_SLACK_SLO_FRAC = 0.05  # plus this share of the TTFT SLO (absolute floor against noise)
COMPLETED = (FinishReason.LENGTH, FinishReason.STOP)  # finish reasons of a served request


@dataclass(frozen=True, slots=True)
class SteadyState:
    """Median TTFT of the second and of the last quarter of the requests by arrival (ms)."""

    early_ms: float  # second quarter (the first is warm-up)
    late_ms: float  # last quarter
    is_stationary: bool

    def describe(self) -> str:
        return (
            f"median TTFT {self.early_ms:.1f} ms in the second quarter of arrivals, "
            f"{self.late_ms:.1f} ms in the last"
        )


def check_steady_state(runs: Sequence[Sequence[RequestRecord]], slo: SLO) -> SteadyState:
    """Is the queue stationary? ``runs`` holds one record list per seed (its own clock); the
    rule is the module docstring's (too few requests to judge: stationary)."""
    early: list[float] = []
    late: list[float] = []
    for records in runs:
        ordered = sorted(records, key=lambda r: (r.arrived_at, r.req_id))
        q = len(ordered) // 4
        early += [ttft_ms(r) for r in ordered[q : 2 * q]]
        late += [ttft_ms(r) for r in ordered[len(ordered) - q :] if q]
    med1, med2 = quantile(early, 0.5), quantile(late, 0.5)
    if math.isinf(med2) or math.isnan(med1):
        stationary = math.isnan(med1) and not math.isinf(med2)  # too few requests to judge: pass
    else:
        allowed = med1 * (1 + STEADY_GROWTH_RATIO) + STEADY_SLACK_SLO_FRAC * slo.ttft_s * 1e3
        stationary = med2 <= allowed
    return SteadyState(med1, med2, stationary)


def ttft_ms(r: RequestRecord) -> float:
    """TTFT in ms of a completed request; infinity for rejected, aborted or unfinished ones."""
    if r.finish_reason not in COMPLETED or r.first_token_at is None:
        return math.inf
    return (r.first_token_at - r.arrived_at) * 1e3


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile with np.percentile's linear interpolation, safe with infinities
    (np.percentile would give inf * 0 = NaN next to one); NaN when empty."""
    if not values:
        return math.nan
    v = np.sort(np.asarray(values, float))
    pos = q * (v.size - 1)
    i, frac = int(pos), pos - int(pos)
    if frac == 0 or math.isinf(v[i]):
        return float(v[i])
    if math.isinf(v[i + 1]):
        return math.inf
    return float(v[i] + (v[i + 1] - v[i]) * frac)

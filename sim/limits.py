"""How large a simulation may be: checked up front, so a run too large for memory is refused
with the option to change, instead of ending in a MemoryError after minutes.

* :data:`MAX_REQUESTS`: requests in one simulation. A run keeps every request's record, its
  token times and its stage records: about :data:`BYTES_PER_REQUEST` each on the default
  workload (``fastpp simulate -n 25000 -d pp4`` peaks ~260 MB above ``-n 5000``), so a million
  requests need ~20 GB.
* :data:`MAX_SPAN_S`: simulated seconds the arrivals may span (30 days). Summaries count
  tokens and requests per simulated second, so their cost grows with the span however few
  the requests (``-r 1e-9 -n 20`` spans ~600 years).

``fastpp simulate``, ``goodput`` and ``sweep`` get these checks from ``WorkloadConfig`` and
``PipelineSimulation``; each message names the option (``-n``, ``--rate``, ``--duration``,
``--replay-speed``) and the field of the config.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fastpp.types import Request

MAX_REQUESTS = 1_000_000
BYTES_PER_REQUEST = 20_000  # the default workload's footprint per request, rounded up
MAX_SPAN_S = 30 * 86400.0


def _limit_text() -> str:
    return f"at most {MAX_REQUESTS:,} requests, ~{BYTES_PER_REQUEST // 1000} KB of records each"


def _span_text() -> str:
    return (
        f"at most {MAX_SPAN_S:,.0f} s = {MAX_SPAN_S / 86400:.0f} days: summaries count per simulated second"
    )


def check_request_count(num_requests: float, what: str) -> None:
    """Refuse more than :data:`MAX_REQUESTS` requests; ``what`` names them and where they
    came from, with the option ("10,000,000 requests (-n)")."""
    if num_requests > MAX_REQUESTS:
        raise ValueError(
            f"{what} are more than one simulation holds ({_limit_text()}: about "
            f"{num_requests * BYTES_PER_REQUEST / 1e9:,.0f} GB here); split the run into shorter ones"
        )


def check_span(span_s: float, what: str) -> None:
    """Refuse arrivals spanning more than :data:`MAX_SPAN_S` simulated seconds; ``what``
    names the span and the options that set it ("20 requests (-n) at 1e-09 req/s (-r)")."""
    if not span_s <= MAX_SPAN_S:
        raise ValueError(
            f"{what} span {span_s:.3g} s of simulated time, more than a simulation covers ({_span_text()})"
        )


def check_workload_extent(rate: float | None, num_requests: int | None, duration_s: float | None) -> None:
    """The checks a synthetic workload's settings allow before any request exists: its
    request count (``num_requests``, or ``rate x duration_s`` expected) and its span
    (``duration_s``, or ``num_requests / rate`` expected)."""
    if num_requests is not None:
        check_request_count(num_requests, f"{num_requests:,} requests (-n, num_requests)")
    if rate is None or not math.isfinite(rate) or rate <= 0:
        return  # all at t=0, or a bad rate the arrival process refuses itself
    if duration_s is not None and math.isfinite(duration_s):
        check_span(duration_s, "arrivals (--duration, duration_s)")
        check_request_count(
            rate * duration_s,
            f"about {rate * duration_s:,.0f} requests "
            f"({duration_s:g} s of --duration at {rate:g} req/s of --rate)",
        )
    if num_requests is not None:
        check_span(num_requests / rate, f"{num_requests:,} requests (-n) at {rate:g} req/s (--rate) would")


def check_requests(requests: Sequence[Request]) -> None:
    """The requests a simulation is given: their number and the span of their arrivals
    (a replayed trace slowed by ``--replay-speed``, or a list a caller built)."""
    check_request_count(len(requests), f"{len(requests):,} requests")
    if requests:
        first = min(r.arrived_at for r in requests)
        last = max(r.arrived_at for r in requests)
        check_span(last - first, "the workload's arrivals (a trace's, slowed by --replay-speed)")

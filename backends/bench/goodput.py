"""sglang's per-request goodput (``--goodput ttft:MS tpot:MS e2el:MS``) of a bench run.

A sent request is good when it succeeded (finish reason ``length`` or ``stop``) and met every
given objective: TTFT, TPOT = (E2E - TTFT) / (n - 1) for n >= 2 output tokens (0 for one token,
as sglang counts it), and E2E latency ("e2el"), all in ms and inclusive (``<=``). Reported with
sglang's keys: ``goodput_slos_ms``, ``request_goodput`` (good requests per second of the run),
``slo_attainment`` (good / sent) and ``slo_attainment_by_metric``. This is not FastPP's goodput
(the highest rate whose P90s meet the SLO, ``fastpp goodput``); the bench's SLO section has the
P90 verdict of one run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fastpp.metrics import SLO_SLACK_MS
from fastpp.types import FinishReason, RequestRecord

_COMPLETED = (FinishReason.LENGTH, FinishReason.STOP)


def observed_ms(record: RequestRecord) -> dict[str, float]:
    """A completed request's ttft, tpot and e2el in ms, as sglang measures them."""
    assert record.first_token_at is not None and record.finished_at is not None
    ttft = record.first_token_at - record.arrived_at
    e2e = record.finished_at - record.arrived_at
    n = record.num_generated
    tpot = (e2e - ttft) / (n - 1) if n > 1 else 0.0
    return {"ttft": ttft * 1e3, "tpot": tpot * 1e3, "e2el": e2e * 1e3}


def sglang_goodput(
    records: Sequence[RequestRecord], slos_ms: Mapping[str, float], duration_s: float
) -> dict[str, Any]:
    """sglang's goodput keys for the sent ``records`` (NaN where nothing was sent or the run took
    no time)."""
    num_good = 0
    num_met = dict.fromkeys(slos_ms, 0)
    for rec in records:
        if rec.finish_reason not in _COMPLETED or rec.first_token_at is None or rec.finished_at is None:
            continue
        seen = observed_ms(rec)
        met = [key for key, slo in slos_ms.items() if seen[key] <= slo + SLO_SLACK_MS]
        for key in met:
            num_met[key] += 1
        num_good += len(met) == len(slos_ms)
    sent = len(records)
    return {
        "goodput_slos_ms": dict(slos_ms),
        "request_goodput": num_good / duration_s if duration_s > 0 else math.nan,
        "slo_attainment": num_good / sent if sent else math.nan,
        "slo_attainment_by_metric": {k: (n / sent if sent else math.nan) for k, n in num_met.items()},
    }

"""Chrome trace export of a pipeline timeline (opens in Perfetto and chrome://tracing).

Scenario: after a run (simulated or real), show what every stage did over time, so pipeline
bubbles and P-P / P-D / D-D imbalances are visible. Layout: one process "pipeline"; one thread
(track) per stage, named by ``thread_name`` metadata; one complete event (``"ph": "X"``) per
``IterationRecord``, named ``mb{mb_id} s{slot}``; optional counter tracks (``"ph": "C"``) for
series such as the chunk budget or the queue length.

Units: records hold seconds; trace ``ts``/``dur`` are microseconds (the format's unit), shown in
ms (``displayTimeUnit``). The event list is capped at ``max_events`` (default 200_000, which
Perfetto loads quickly), keeping the earliest; ``otherData`` records whether it was truncated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fastpp.types import IterationRecord

MAX_EVENTS = 200_000  # data events kept in one trace (metadata events are not counted)
PID = 0  # the single "pipeline" process
_US = 1e6  # microseconds per second
_ROUND = 3  # decimals kept on ts/dur in us (ns resolution keeps files small)


def _kind(it: IterationRecord) -> str:
    """Trace category: which phases the microbatch holds (filterable in Perfetto)."""
    if it.num_prefill_tokens and it.num_decode_reqs:
        return "mixed"
    return "prefill" if it.num_prefill_tokens else "decode"


def _slice(it: IterationRecord) -> dict:
    return {
        "name": f"mb{it.mb_id} s{it.slot}",
        "cat": _kind(it),
        "ph": "X",
        "pid": PID,
        "tid": it.stage,
        "ts": round(it.started_at * _US, _ROUND),
        "dur": round(max(0.0, it.duration_s) * _US, _ROUND),
        "args": {
            "mb_id": it.mb_id,
            "slot": it.slot,
            "tokens": it.num_tokens,
            "prefill_tokens": it.num_prefill_tokens,
            "decode_reqs": it.num_decode_reqs,
            "chunk_budget": it.chunk_budget,
            "reason": it.reason,
        },
    }


def chrome_trace(
    iterations: Sequence[IterationRecord],
    *,
    stage_names: Sequence[str] | None = None,
    extra_tracks: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    max_events: int = MAX_EVENTS,
) -> dict:
    """The Chrome trace (JSON object format) of ``iterations``; ``json.dump`` it as is.

    Tracks: stage k is thread k, named ``stage_names[k]`` (default ``"stage k"``); every stage
    from 0 to max(max stage, len(stage_names) - 1) gets a track, even an idle one.
    ``extra_tracks`` maps a counter name to ``(time_s, value)`` samples, e.g.
    ``{"chunk budget": [(0.0, 512), (1.3, 256)]}``. Of all slices and counter samples only the
    ``max_events`` earliest (by time) are kept; ``otherData`` holds ``truncated``,
    ``num_events`` (before the cap) and ``num_events_kept``. Raises ValueError for a negative
    ``max_events`` or stage index.
    """
    if max_events < 0:
        raise ValueError(f"max_events must be >= 0, got {max_events}")
    names = list(stage_names or ())
    num_stages = max([len(names)] + [it.stage + 1 for it in iterations])
    if any(it.stage < 0 for it in iterations):
        raise ValueError("iteration stage must be >= 0")
    meta: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": "pipeline"}}
    ]
    for k in range(num_stages):
        label = names[k] if k < len(names) else f"stage {k}"
        track = {"ph": "M", "pid": PID, "tid": k}
        meta.append({"name": "thread_name", **track, "args": {"name": label}})
        meta.append({"name": "thread_sort_index", **track, "args": {"sort_index": k}})

    samples = [(name, t, v) for name, series in (extra_tracks or {}).items() for t, v in series]
    # keep the earliest: one stable argsort over slice starts and counter sample times
    times = np.array([it.started_at for it in iterations] + [t for _, t, _ in samples], float)
    kept = np.argsort(times, kind="stable")[:max_events]
    events = []
    for i in kept.tolist():
        if i < len(iterations):
            events.append(_slice(iterations[i]))
        else:
            name, t, v = samples[i - len(iterations)]
            events.append({"name": name, "ph": "C", "pid": PID, "ts": round(float(t) * _US, _ROUND),
                           "args": {"value": float(v)}})
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "fastpp.timeline",
            "num_stages": num_stages,
            "truncated": len(times) > len(kept),
            "num_events": len(times),
            "num_events_kept": len(kept),
            "max_events": max_events,
        },
    }


def write_chrome_trace(
    iterations: Sequence[IterationRecord],
    path: str | Path,
    *,
    stage_names: Sequence[str] | None = None,
    extra_tracks: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    max_events: int = MAX_EVENTS,
) -> Path:
    """Write ``chrome_trace(...)`` to ``path`` as compact JSON; returns the path."""
    trace = chrome_trace(
        iterations, stage_names=stage_names, extra_tracks=extra_tracks, max_events=max_events
    )
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        f.write(json.dumps(trace, separators=(",", ":")))  # dumps uses the C encoder; dump does not
    return path

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
from functools import lru_cache, partial
from pathlib import Path

import numpy as np

from fastpp.iteration_log import Head, IterationLog
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
    log = IterationLog.of(iterations)
    plan = _TracePlan(log, stage_names, extra_tracks, max_events)
    events = [_slice(log[i]) if i < len(log) else _counter(plan.sample(i)) for i in plan.kept]
    return {"traceEvents": plan.meta + events, "displayTimeUnit": "ms", "otherData": plan.other}


def write_chrome_trace(
    iterations: Sequence[IterationRecord],
    path: str | Path,
    *,
    stage_names: Sequence[str] | None = None,
    extra_tracks: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    max_events: int = MAX_EVENTS,
) -> Path:
    """Write ``chrome_trace(...)`` to ``path`` as compact JSON; returns the path.

    The bytes are those of ``json.dumps(chrome_trace(...), separators=(",", ":"))``, but each
    slice's text is formatted directly (``_slice_json``) from the columns of an IterationLog
    instead of built as a dict and encoded: a run of an hour has 200,000 of them.
    """
    log = IterationLog.of(iterations)
    plan = _TracePlan(log, stage_names, extra_tracks, max_events)
    dumps = partial(json.dumps, separators=(",", ":"))
    slice_parts: dict[Head, tuple[str, str]] = {}
    parts = [dumps(e) for e in plan.meta]
    heads, stages, starts, ends = log.heads, log.stages, log.started_at, log.finished_at
    n = len(log)
    for i in plan.kept:
        parts.append(
            _slice_json(heads[i], stages[i], starts[i], ends[i], slice_parts)
            if i < n
            else dumps(_counter(plan.sample(i)))
        )
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        f.write('{"traceEvents":[')
        f.write(",".join(parts))
        f.write('],"displayTimeUnit":"ms","otherData":')
        f.write(dumps(plan.other))
        f.write("}")
    return path


class _TracePlan:
    """What a trace holds: its metadata events, which slices and counter samples are kept (in
    time order) and its ``otherData``; shared by ``chrome_trace`` and ``write_chrome_trace``."""

    def __init__(
        self,
        log: IterationLog,
        stage_names: Sequence[str] | None,
        extra_tracks: Mapping[str, Sequence[tuple[float, float]]] | None,
        max_events: int,
    ) -> None:
        if max_events < 0:
            raise ValueError(f"max_events must be >= 0, got {max_events}")
        names = list(stage_names or ())
        num_stages = max(len(names), max(log.stages, default=-1) + 1)
        if min(log.stages, default=0) < 0:
            raise ValueError("iteration stage must be >= 0")
        self.meta: list[dict] = [
            {"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": "pipeline"}}
        ]
        for k in range(num_stages):
            label = names[k] if k < len(names) else f"stage {k}"
            track = {"ph": "M", "pid": PID, "tid": k}
            self.meta.append({"name": "thread_name", **track, "args": {"name": label}})
            self.meta.append({"name": "thread_sort_index", **track, "args": {"sort_index": k}})
        self._num_slices = len(log)
        self._samples = [(name, t, v) for name, series in (extra_tracks or {}).items() for t, v in series]
        # keep the earliest: one stable argsort over slice starts and counter sample times
        times = np.array(log.started_at + [t for _, t, _ in self._samples], float)
        self.kept: list[int] = np.argsort(times, kind="stable")[:max_events].tolist()
        self.other = {
            "generator": "fastpp.timeline",
            "num_stages": num_stages,
            "truncated": len(times) > len(self.kept),
            "num_events": len(times),
            "num_events_kept": len(self.kept),
            "max_events": max_events,
        }

    def sample(self, i: int) -> tuple[str, float, float]:
        """Counter sample ``i`` (an index past the slices, as in ``kept``)."""
        return self._samples[i - self._num_slices]


def _counter(sample: tuple[str, float, float]) -> dict:
    name, t, v = sample
    return {
        "name": name,
        "ph": "C",
        "pid": PID,
        "ts": round(float(t) * _US, _ROUND),
        "args": {"value": float(v)},
    }


def _slice_json(
    head: Head, stage: int, started_at: float, finished_at: float, parts: dict[Head, tuple[str, str]]
) -> str:
    """The compact JSON text of ``_slice`` of this stage iteration (floats by repr, as json
    writes them). The text before ``tid`` and from ``args`` on is the same for every stage of a
    microbatch: ``parts`` keeps it by the microbatch's head, so it is formatted once per
    microbatch, by f-strings (integers print as json prints them; the one string field,
    ``reason``, goes through ``json.dumps``, cached: a run has few distinct reasons)."""
    both = parts.get(head)
    if both is None:
        mb_id, slot, tokens, prefill, decodes, _, _, _, budget, reason, _ = head
        kind = ("mixed" if decodes else "prefill") if prefill else "decode"  # as _kind
        both = parts[head] = (
            f'{{"name":"mb{mb_id} s{slot}","cat":"{kind}","ph":"X","pid":{PID},"tid":',
            f',"args":{{"mb_id":{mb_id},"slot":{slot},"tokens":{tokens},'
            f'"prefill_tokens":{prefill},"decode_reqs":{decodes},'
            f'"chunk_budget":{budget},"reason":{_json_text(reason)}}}}}',
        )
    head_text, tail_text = both
    return (
        f'{head_text}{stage},"ts":{round(started_at * _US, _ROUND)!r},'
        f'"dur":{round(max(0.0, finished_at - started_at) * _US, _ROUND)!r}{tail_text}'
    )


_json_text = lru_cache(maxsize=4096)(json.dumps)  # a reason's JSON text

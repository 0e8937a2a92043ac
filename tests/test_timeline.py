"""fastpp.sim.timeline: Chrome trace JSON of a hand-made pipeline schedule."""

from __future__ import annotations

import json

import pytest

from fastpp.timeline import chrome_trace, write_chrome_trace
from fastpp.types import IterationRecord


def it(mb_id, stage, start, end, slot=0, prefill=8, decode=0) -> IterationRecord:
    return IterationRecord(
        mb_id,
        stage,
        slot,
        start,
        end,
        prefill + decode,
        prefill,
        decode,
        0,
        prefill * prefill,
        0,
        64,
        "greedy",
    )


def schedule(num_mb=3, num_stages=2, dur=0.004):
    """Microbatch m enters stage k at (m + k) * dur: the textbook pipeline."""
    return [
        it(m, k, (m + k) * dur, (m + k + 1) * dur, slot=m % 2)
        for m in range(num_mb)
        for k in range(num_stages)
    ]


def slices(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_trace_is_valid_json_with_one_track_per_stage(tmp_path):
    path = write_chrome_trace(schedule(), tmp_path / "t.json", stage_names=["gpu0", "gpu1"])
    trace = json.loads(path.read_text())
    assert trace["displayTimeUnit"] == "ms"
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "pipeline"}} in meta
    threads = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert threads == {0: "gpu0", 1: "gpu1"}
    assert {e["tid"] for e in slices(trace)} == {0, 1}
    assert trace["otherData"]["truncated"] is False


def test_slices_are_in_microseconds_with_args():
    trace = chrome_trace([it(7, 1, 0.5, 0.5125, slot=1, prefill=4, decode=3)])
    (event,) = slices(trace)
    assert event["name"] == "mb7 s1" and event["cat"] == "mixed"
    assert event["ts"] == pytest.approx(500_000.0) and event["dur"] == pytest.approx(12_500.0)
    assert event["args"] == {
        "mb_id": 7,
        "slot": 1,
        "tokens": 7,
        "prefill_tokens": 4,
        "decode_reqs": 3,
        "chunk_budget": 64,
        "reason": "greedy",
    }
    # stage 1 alone still yields tracks for stages 0 and 1
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert names == ["stage 0", "stage 1"]


def test_truncation_keeps_the_earliest_events():
    full = schedule(num_mb=10)
    trace = chrome_trace(list(reversed(full)), max_events=5)
    kept = slices(trace)
    assert len(kept) == 5
    assert max(e["ts"] for e in kept) <= min(e["ts"] for e in slices(chrome_trace(full))[5:])
    assert trace["otherData"] == trace["otherData"] | {
        "truncated": True,
        "num_events": 20,
        "num_events_kept": 5,
        "max_events": 5,
    }


def test_counter_tracks_and_empty_input():
    trace = chrome_trace(schedule(), extra_tracks={"chunk budget": [(0.0, 512), (0.008, 256)]})
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert [(e["name"], e["ts"], e["args"]["value"]) for e in counters] == [
        ("chunk budget", 0.0, 512.0),
        ("chunk budget", 8000.0, 256.0),
    ]
    empty = chrome_trace([])
    assert slices(empty) == [] and empty["otherData"]["truncated"] is False
    json.dumps(empty)
    with pytest.raises(ValueError, match="max_events"):
        chrome_trace([], max_events=-1)


def test_the_written_file_is_the_trace_encoded_byte_for_byte(tmp_path):
    """write_chrome_trace formats slices directly; it must write json.dumps(chrome_trace(...))."""
    odd = [
        it(0, 0, 1 / 3, 2 / 3),
        it(1, 1, 0.1 + 0.2, 1e-7, slot=1, prefill=0, decode=5),
        IterationRecord(2, 0, 0, 2.0, 2.5, 9, 9, 0, 0, 81, 0, 64, 'quote " \\ é'),
    ]
    kw = {
        "stage_names": ["a", "b"],
        "extra_tracks": {"chunk budget": [(0.0, 512), (0.4, 256)]},
        "max_events": 4,
    }
    path = write_chrome_trace(odd, tmp_path / "t.json", **kw)
    assert path.read_text() == json.dumps(chrome_trace(odd, **kw), separators=(",", ":"))

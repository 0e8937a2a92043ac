"""A run folder's two tables as Parquet: requests.parquet and iterations.parquet.

Scenario: an hour's replay writes 67 MB of requests.jsonl and iterations.csv, formatted number
by number in Python (~2 s); a user who loads them into pandas, polars or DuckDB parses them all
back. Parquet holds the same columns typed and compressed, written and read by pyarrow in C:
``fastpp simulate --table-format parquet``. The columns are those of the text files, so either
folder reads back the same (``fastpp.run_files.read_run`` takes whichever is there):

    requests.parquet    the keys of ``RequestRecord.to_dict``; ``itl_ms`` is a list<double>
                        column (the gaps in ms, rounded to 4 decimals, as in requests.jsonl)
    iterations.parquet  the fields of ``IterationRecord``, one row per stage and microbatch

Needs pyarrow (``pip install 'fastpp[parquet]'``), imported only here and only when used.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np

from fastpp.iteration_log import HEAD_FIELDS, IterationLog
from fastpp.types import ITERATION_FIELDS, FinishReason, IterationRecord, RequestRecord

REQUESTS_PARQUET = "requests.parquet"
ITERATIONS_PARQUET = "iterations.parquet"

# requests.parquet: (column, arrow type name) in to_dict's order, itl_ms last
_REQUEST_COLUMNS = (
    ("req_id", "int64"),
    ("arrived_at", "float64"),
    ("prompt_len", "int64"),
    ("output_len", "int64"),
    ("num_generated", "int64"),
    ("scheduled_at", "float64"),
    ("first_token_at", "float64"),
    ("finished_at", "float64"),
    ("finish_reason", "string"),
    ("detail", "string"),
    ("num_retractions", "int64"),
    ("num_parked", "int64"),
)
_ITERATION_TYPES = {"started_at": "float64", "finished_at": "float64", "reason": "string"}


def _pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("Parquet tables need pyarrow: pip install 'fastpp[parquet]'") from None
    return pa, pq


def write_records_parquet(records: Iterable[RequestRecord], path: str | Path) -> Path:
    """requests.parquet of ``records`` (module docstring); returns the path."""
    pa, pq = _pyarrow()
    records = list(records)
    path = Path(path)
    columns = {}
    for name, kind in _REQUEST_COLUMNS:
        values = [getattr(r, name) for r in records]
        if name == "finish_reason":
            values = [None if v is None else str(v) for v in values]
        columns[name] = pa.array(values, type=getattr(pa, kind)())
    lengths = np.fromiter((len(r.token_times) for r in records), np.int64, count=len(records))
    times = np.fromiter((t for r in records for t in r.token_times), float, count=int(lengths.sum()))
    gaps = np.round(np.diff(times) * 1e3, 4)  # as requests.jsonl: difference, x 1e3, 4 decimals
    ends = np.cumsum(lengths)
    within = np.ones(gaps.size, bool)  # drop each record's last token -> next record's first
    within[ends[(ends > 0) & (ends <= gaps.size)] - 1] = False
    offsets = np.concatenate(([0], np.cumsum(np.maximum(lengths - 1, 0))))
    columns["itl_ms"] = pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(gaps[within], pa.float64())
    )
    pq.write_table(pa.table(columns), path)
    return path


def write_iterations_parquet(iterations: Iterable[IterationRecord], path: str | Path) -> Path:
    """iterations.parquet of ``iterations`` (module docstring); returns the path. The fields a
    microbatch's stages share become columns once per microbatch (a simulated log shares one
    head tuple between them), then are taken row by row in C."""
    pa, pq = _pyarrow()
    log = IterationLog.of(iterations)
    path = Path(path)
    heads: list[tuple] = []  # distinct heads, in order of first use
    row_head: list[int] = []  # per row: its index in heads
    prev = None
    for head in log.heads:
        if head is not prev:
            heads.append(head)
            prev = head
        row_head.append(len(heads) - 1)
    take = pa.array(row_head, pa.int64())
    shared = zip(*heads, strict=True) if heads else [()] * len(HEAD_FIELDS)
    columns = {
        name: pa.array(values, type=_arrow_type(pa, name)).take(take)
        for name, values in zip(HEAD_FIELDS, shared, strict=True)
    }
    columns["stage"] = pa.array(log.stages, pa.int64())
    columns["started_at"] = pa.array(log.started_at, pa.float64())
    columns["finished_at"] = pa.array(log.finished_at, pa.float64())
    pq.write_table(pa.table({name: columns[name] for name in ITERATION_FIELDS}), path)
    return path


def _arrow_type(pa: Any, name: str) -> Any:
    return getattr(pa, _ITERATION_TYPES.get(name, "int64"))()


def _read_columns(path: Path, needed: Iterable[str]) -> dict[str, list]:
    _, pq = _pyarrow()
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises its own error types for a damaged file
        raise ValueError(f"{path}: not a Parquet table: {exc}") from None
    missing = [name for name in needed if name not in table.column_names]
    if missing:
        raise ValueError(f"{path}: no column {', '.join(missing)}")
    return {name: table.column(name).to_pylist() for name in table.column_names}


def read_records_parquet(path: str | Path) -> list[RequestRecord]:
    """The RequestRecords of a requests.parquet (token times rebuilt from the first token time
    and the gaps, as ``read_records_jsonl`` does); ValueError naming the file and column."""
    path = Path(path)
    cols = _read_columns(path, [name for name, _ in _REQUEST_COLUMNS] + ["itl_ms"])
    out = []
    for i in range(len(cols["req_id"])):
        rec = RequestRecord(
            cols["req_id"][i], cols["arrived_at"][i], cols["prompt_len"][i], cols["output_len"][i]
        )
        rec.num_generated = cols["num_generated"][i]
        rec.scheduled_at = cols["scheduled_at"][i]
        rec.first_token_at = cols["first_token_at"][i]
        rec.finished_at = cols["finished_at"][i]
        reason = cols["finish_reason"][i]
        try:
            rec.finish_reason = None if reason is None else FinishReason(reason)
        except ValueError:
            raise ValueError(
                f"{path}, row {i}: finish_reason {reason!r} is not one of "
                f"{', '.join(str(r) for r in FinishReason)}"
            ) from None
        rec.detail = cols["detail"][i] or ""
        rec.num_retractions = cols["num_retractions"][i]
        rec.num_parked = cols["num_parked"][i]
        if rec.first_token_at is not None:  # summed as read_records_jsonl does, to the last bit
            gaps = [g / 1e3 for g in cols["itl_ms"][i] or ()]
            rec.token_times = list(accumulate(gaps, initial=float(rec.first_token_at)))
        out.append(rec)
    return out


def read_iterations_parquet(path: str | Path) -> IterationLog:
    """The stage records of an iterations.parquet; ValueError naming the file and column."""
    path = Path(path)
    cols = _read_columns(path, ITERATION_FIELDS)
    log = IterationLog()
    heads = zip(*(cols[name] for name in HEAD_FIELDS), strict=True)
    for head, stage, start, end in zip(
        heads, cols["stage"], cols["started_at"], cols["finished_at"], strict=True
    ):
        log.add(head, stage, start, end)
    return log

"""One run on disk, whoever ran it (the simulator, the CPU engine, an engine plugin): a folder
with the same four files, so a simulated and a real run compare file by file and any recorded
run can become a profile (``fastpp profile --from-records DIR``).

    summary.json     the summary (keys of ``sglang.benchmark.serving`` plus ours)
    requests.jsonl   one RequestRecord per line (``RequestRecord.to_dict``; gaps in ms)
    iterations.csv   one IterationRecord per stage and microbatch (its field names as header)
    timeline.json    Chrome trace of the iterations, one track per stage (Perfetto opens it)

With ``table_format="parquet"`` the two tables are requests.parquet and iterations.parquet
instead (the same columns, typed; ``fastpp.run_parquet``); ``read_run`` reads either.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import accumulate, chain
from pathlib import Path
from typing import Any

import numpy as np

from fastpp.iteration_log import HEAD_FIELDS, IterationLog
from fastpp.run_parquet import (
    ITERATIONS_PARQUET,
    REQUESTS_PARQUET,
    read_iterations_parquet,
    read_records_parquet,
    write_iterations_parquet,
    write_records_parquet,
)
from fastpp.timeline import write_chrome_trace
from fastpp.types import ITERATION_FIELDS, FinishReason, IterationRecord, RequestRecord

SUMMARY = "summary.json"
REQUESTS = "requests.jsonl"
ITERATIONS = "iterations.csv"
TIMELINE = "timeline.json"
TABLE_FORMATS = ("text", "parquet")  # requests.jsonl + iterations.csv, or the two .parquet


def json_safe(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by None, recursively: they are not JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def write_json(obj: Any, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(json_safe(obj), indent=2) + "\n")
    return path


def write_records_jsonl(records: Iterable[RequestRecord], path: str | Path) -> Path:
    """Write one ``RequestRecord.to_dict()`` JSON object per line; returns the path.

    The lines are ``json.dumps(r.to_dict())`` byte for byte, written faster: every record's
    gaps come from one numpy pass (the arithmetic of ``to_dict``: difference, x 1e3, rounded to
    4 decimals), and each distinct gap is formatted once (json writes a float as its repr). In
    a simulated run the decodes of one microbatch share their gap, so an hour's 4 million gaps
    hold a few percent distinct values.
    """
    path = Path(path)
    records = list(records)
    gap_texts = _itl_ms_texts(records)
    dumps = json.dumps
    with path.open("w", encoding="utf-8") as f:
        for r, itl in zip(records, gap_texts, strict=True):
            head = dumps(r.to_dict(itl_ms=[]))  # ..., "itl_ms": []}: itl_ms is the last key
            f.write(f"{head[:-3]}[{itl}]}}\n")
    return path


def _itl_ms_texts(records: Sequence[RequestRecord]) -> list[str]:
    """Per record, the text json writes inside the brackets of its ``itl_ms`` list."""
    lengths = np.fromiter((len(r.token_times) for r in records), np.int64, count=len(records))
    times = np.fromiter(chain.from_iterable(r.token_times for r in records), float, count=int(lengths.sum()))
    gaps = np.round(np.diff(times) * 1e3, 4)  # gap i: token i to token i + 1, any record
    distinct = np.unique(gaps)
    which = np.searchsorted(distinct, gaps)  # cheaper than unique's return_inverse (no argsort)
    texts = np.array([repr(g) for g in distinct.tolist()], dtype=object)[which].tolist()
    out, start = [], 0
    for n in lengths.tolist():
        out.append(", ".join(texts[start : start + n - 1]))
        start += n  # skip the gap from this record's last token to the next record's first
    return out


def write_iterations_csv(iterations: Iterable[IterationRecord], path: str | Path) -> Path:
    """Write ``IterationRecord.to_dict()`` rows under a header of its field names (header only
    when there are no iterations); returns the path.

    The file is ``csv.writer``'s (excel dialect: CRLF, minimal quoting), written faster: the
    fields are formatted with ``str`` as csv does, from the columns of an IterationLog, and the
    part of a row after the times (the microbatch's counts and reason, equal on all its stages)
    is formatted once per microbatch. An hour has 276,000 rows.
    """
    path = Path(path)
    log = IterationLog.of(iterations)
    fields = list(ITERATION_FIELDS)
    assert fields[:5] == ["mb_id", "stage", "slot", "started_at", "finished_at"], fields
    assert tuple(fields[5:]) == HEAD_FIELDS[2:], fields  # a head is mb_id, slot, then these
    prev, suffix = None, ""
    with path.open("w", encoding="utf-8", newline="") as f:
        f.write(_csv_line(fields))
        for head, stage, start, end in zip(
            log.heads, log.stages, log.started_at, log.finished_at, strict=True
        ):
            if head is not prev and head != prev:
                suffix = _csv_line([0, *head[2:]])[2:]  # as csv quotes them
            prev = head
            f.write(f"{head[0]},{stage},{head[1]},{start!s},{end!s},{suffix}")
    return path


def _csv_line(values: Sequence[Any]) -> str:
    """One row as ``csv.writer`` writes it (excel dialect), line end included."""
    buf = io.StringIO()
    csv.writer(buf).writerow(values)
    return buf.getvalue()


WriteFn = Callable[[], object]
Submit = Callable[[str, WriteFn], None]  # (file name, a call that writes it)


def write_run(
    out_dir: str | Path,
    records: Sequence[RequestRecord],
    iterations: Sequence[IterationRecord],
    summary: dict,
    *,
    stage_names: Sequence[str] | None = None,
    timeline: bool = True,
    submit: Submit | None = None,
    table_format: str = "text",
) -> dict[str, Path]:
    """Write one run's folder (module docstring); returns the paths by kind. The timeline is
    written only when there are iterations and ``timeline`` is set; ``table_format`` is one of
    TABLE_FORMATS.

    ``submit`` runs each file's writer (all but summary.json): by default here and now; the CLI
    passes one that writes in a forked child (``fastpp.cli.forked_writes``), so the files of a
    long run are written side by side while it goes on.
    """
    if table_format not in TABLE_FORMATS:
        raise ValueError(f"table format must be one of {', '.join(TABLE_FORMATS)}, got {table_format!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"summary": write_json(summary, out / SUMMARY)}
    text = ((REQUESTS, write_records_jsonl), (ITERATIONS, write_iterations_csv))
    parquet = ((REQUESTS_PARQUET, write_records_parquet), (ITERATIONS_PARQUET, write_iterations_parquet))
    tables, other = (parquet, text) if table_format == "parquet" else (text, parquet)
    for name, _ in other:  # a folder written before in the other format: no stale tables left
        (out / name).unlink(missing_ok=True)
    paths["records"], paths["iterations"] = out / tables[0][0], out / tables[1][0]
    writes: list[tuple[Path, WriteFn]] = [
        (paths["records"], partial(tables[0][1], records, paths["records"])),
        (paths["iterations"], partial(tables[1][1], iterations, paths["iterations"])),
    ]
    if timeline and iterations:
        paths["timeline"] = out / TIMELINE
        writes.append(
            (
                paths["timeline"],
                partial(write_chrome_trace, iterations, paths["timeline"], stage_names=stage_names),
            )
        )
    for path, write in writes:
        if submit is None:
            write()
        else:
            submit(str(path), write)
    return paths


# ------------------------------------------------------------------------------------ reading

_INT_FIELDS = {
    "mb_id",
    "stage",
    "slot",
    "num_tokens",
    "num_prefill_tokens",
    "num_decode_reqs",
    "sum_past_x_pre",
    "sum_pre_sq",
    "sum_dec_ctx",
    "chunk_budget",
    "num_sampled",
}
# columns a file may lack (written before they existed): their defaults are used
_OPTIONAL_FIELDS = {"num_sampled": -1}


def read_iterations_csv(path: str | Path, *, torn_tail: bool = False) -> list[IterationRecord]:
    """The IterationRecords of an iterations.csv; ValueError naming the file, line and field of
    a malformed row. ``torn_tail``: a malformed LAST row is dropped instead (a file streamed by
    a process that was killed mid-write)."""
    path = Path(path)
    out = []
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        header = set(reader.fieldnames or ())
        missing = set(ITERATION_FIELDS) - header - set(_OPTIONAL_FIELDS)
        if missing:
            raise ValueError(f"{path}: header lacks {', '.join(sorted(missing))}")
        rows = list(reader)
        if torn_tail and rows and (None in rows[-1].values() or not _is_iteration_row(rows[-1])):
            rows.pop()
        for line, row in enumerate(rows, start=2):
            values: dict[str, Any] = {}
            for name in ITERATION_FIELDS:
                if name not in header:
                    values[name] = _OPTIONAL_FIELDS[name]
                    continue
                text = row[name]
                try:
                    values[name] = (
                        int(text) if name in _INT_FIELDS else text if name == "reason" else float(text)
                    )
                except (TypeError, ValueError):
                    raise ValueError(f"{path}, line {line}: field {name}: {text!r} is not a number") from None
            out.append(IterationRecord(**values))
    return out


def _is_iteration_row(row: dict) -> bool:
    try:
        float(row["finished_at"]), int(row["chunk_budget"])
        if "num_sampled" in row:  # the last column: a line cut short lacks it or has part of it
            int(row["num_sampled"])
    except (TypeError, ValueError, KeyError):
        return False
    return True


def read_records_jsonl(path: str | Path, *, torn_tail: bool = False) -> list[RequestRecord]:
    """The RequestRecords of a requests.jsonl (token times rebuilt from the first token time
    and the gaps); ValueError naming the file, line and field of a malformed one.
    ``torn_tail``: a last line that is not JSON is dropped instead (see read_iterations_csv)."""
    path = Path(path)
    out = []
    lines = path.read_text(encoding="utf-8").splitlines()
    if torn_tail and lines:
        try:
            json.loads(lines[-1])
        except json.JSONDecodeError:
            lines.pop()
    for line, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            d = json.loads(text)
            rec = RequestRecord(
                int(d["req_id"]), float(d["arrived_at"]), int(d["prompt_len"]), int(d["output_len"])
            )
            rec.num_generated = int(d["num_generated"])
            rec.scheduled_at = d["scheduled_at"]
            rec.first_token_at = d["first_token_at"]
            rec.finished_at = d["finished_at"]
            reason = d["finish_reason"]
            rec.finish_reason = None if reason is None else FinishReason(reason)
            rec.detail = d["detail"]
            rec.num_retractions = int(d["num_retractions"])
            rec.num_parked = int(d["num_parked"])
            if rec.first_token_at is not None:
                gaps = [g / 1e3 for g in d["itl_ms"]]
                rec.token_times = list(accumulate(gaps, initial=float(rec.first_token_at)))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}, line {line}: not JSON: {exc}") from None
        except KeyError as exc:
            raise ValueError(f"{path}, line {line}: missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}, line {line}: bad value: {exc}") from None
        out.append(rec)
    return out


@dataclass(slots=True)
class RunFiles:
    """A run folder read back."""

    summary: dict
    records: list[RequestRecord]
    iterations: list[IterationRecord]


def read_run(run_dir: str | Path) -> RunFiles:
    """Read a folder ``write_run`` wrote, with its tables in either format (Parquet where both
    are there). FileNotFoundError names a missing file."""
    d = Path(run_dir)
    if not (d / SUMMARY).is_file():
        raise FileNotFoundError(f"{d}: no {SUMMARY} (is this a run folder written by fastpp?)")
    tables = []
    for text, parquet in ((REQUESTS, REQUESTS_PARQUET), (ITERATIONS, ITERATIONS_PARQUET)):
        if (d / parquet).is_file():
            tables.append(d / parquet)
        elif (d / text).is_file():
            tables.append(d / text)
        else:
            raise FileNotFoundError(f"{d}: no {text} or {parquet} (is this a run folder written by fastpp?)")
    try:
        summary = json.loads((d / SUMMARY).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{d / SUMMARY}: not JSON: {exc}") from None
    requests, iterations = tables
    records = (
        read_records_parquet(requests) if requests.name == REQUESTS_PARQUET else read_records_jsonl(requests)
    )
    iters = (
        list(read_iterations_parquet(iterations))
        if iterations.name == ITERATIONS_PARQUET
        else read_iterations_csv(iterations)
    )
    return RunFiles(summary, records, iters)

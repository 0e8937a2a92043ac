"""The sweep's results table on disk: ``results.jsonl`` (one JSON object per row, appended as
points finish) and ``results.csv`` (regenerated from the JSONL when a sweep ends).

Rules: every row has a ``point_id``; the first row with an id wins. A line that does not parse
(an interrupted append) is dropped with a note, never a crash, and the file is rewritten
without it before anything is appended. Non-finite floats are written as JSON null (CSV: empty).
Rewrites go through a temporary file and ``os.replace``, so a crash never leaves half a table.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from fastpp.run_files import json_safe

RESULTS_JSONL = "results.jsonl"
RESULTS_CSV = "results.csv"


def read_rows(path: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Rows of a results JSONL by point_id, in file order, and notes on the lines dropped.

    A missing file is an empty table. Unparseable lines and lines without a point_id are
    dropped (the last line of an interrupted run is the usual case) and described in the notes.
    """
    rows: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    if not path.exists():
        return rows, notes
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            where = "last line" if number == len(lines) else f"line {number}"
            notes.append(
                f"{path}: ignored the {where}, which is not a complete JSON row "
                "(interrupted write?); its point will be run again"
            )
            continue
        if not isinstance(row, dict) or not isinstance(row.get("point_id"), str):
            notes.append(f"{path}: ignored line {number}, a row without a point_id")
            continue
        rows.setdefault(row["point_id"], row)
    return rows, notes


def row_line(row: dict[str, Any]) -> str:
    """One JSONL line (with its newline); NaN and infinities become null."""
    return json.dumps(json_safe(row), allow_nan=False) + "\n"


def rewrite_rows(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    """Replace ``path`` with exactly ``rows``, atomically."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as fh:
        fh.writelines(row_line(r) for r in rows)
    os.replace(tmp, path)
    return path


def append_row(fh: IO[str], row: dict[str, Any]) -> None:
    """Append one row and flush, so an interruption loses at most the line being written."""
    fh.write(row_line(row))
    fh.flush()


def table_columns(rows: Sequence[dict[str, Any]], preferred: Sequence[str]) -> list[str]:
    """Columns present in any row: those in ``preferred`` in that order, then the rest sorted."""
    present = {k for r in rows for k in r}
    return [c for c in preferred if c in present] + sorted(present - set(preferred))


def write_csv(rows: Sequence[dict[str, Any]], path: Path, preferred: Sequence[str]) -> Path:
    """Write ``rows`` as CSV with ``table_columns`` order (missing values and null: empty)."""
    columns = table_columns(rows, preferred)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            safe = json_safe(row)
            writer.writerow([_cell(safe.get(c)) for c in columns])
    os.replace(tmp, path)
    return path


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)

"""Request-length files: the Azure trace and length-CSV readers (the samplers that use them
are in :mod:`fastpp.length_tables`).

Every data problem raises :class:`WorkloadError` naming the file, the 1-based line (the header
is line 1) and the column. Times are in seconds; lengths are int64 token counts >= 1.
"""

from __future__ import annotations

import csv
import datetime as dt
import operator
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
LENGTH_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")
BUILTIN_TABLES_FILE = "length_tables.json"
# A length past this is a broken file (no model has a context near it); larger values would
# not even fit the int64 arrays.
MAX_LENGTH_TOKENS = 100_000_000
# Arrivals are kept as int64 nanoseconds since the first row: at most ~292 years of trace.
MAX_SPAN_NS = 2**63 - 1

# YYYY-MM-DD HH:MM:SS[.fffffff]; the Azure 2023 files carry 7 fractional digits. Parsing the
# fixed format by hand is ~5x faster than datetime.strptime and keeps the 100 ns digit that
# strptime's %f would make us trim.
_TIMESTAMP_RE = re.compile(r"(\d{4}-\d{2}-\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?")


class WorkloadError(ValueError):
    """Bad or missing workload data. Row errors set ``path``, ``line`` (1-based) and ``column``."""

    def __init__(
        self,
        message: str,
        *,
        path: Path | None = None,
        line: int | None = None,
        column: str | None = None,
    ) -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.column = column

    @classmethod
    def at(cls, path: Path, line: int, column: str, problem: str) -> WorkloadError:
        """``<file> line <n>: <column>: <problem>``, the one format for every row error."""
        message = f"{path.name} line {line}: {column}: {problem}"
        return cls(message, path=path, line=line, column=column)


def frozen_int64(values: Any) -> np.ndarray:
    array = np.array(values, dtype=np.int64)  # a copy, so the caller's array stays theirs
    array.flags.writeable = False
    return array


def check_lengths(prompt_lens: np.ndarray, output_lens: np.ndarray) -> None:
    if prompt_lens.ndim != 1 or prompt_lens.shape != output_lens.shape:
        raise ValueError(
            f"prompt_lens and output_lens must be 1-D and equally long, "
            f"got shapes {prompt_lens.shape} and {output_lens.shape}"
        )
    if prompt_lens.size and (prompt_lens.min() < 1 or output_lens.min() < 1):
        raise ValueError("every prompt and output length must be >= 1")


@dataclass(frozen=True, slots=True, eq=False)
class LengthTable:
    """(prompt, output) length pairs read from a file. Arrays are read-only int64, all >= 1."""

    prompt_lens: np.ndarray
    output_lens: np.ndarray
    source: str  # where the rows came from (the file name)
    num_clamped_outputs: int = 0  # rows whose output length 0 was raised to 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_lens", frozen_int64(self.prompt_lens))
        object.__setattr__(self, "output_lens", frozen_int64(self.output_lens))
        check_lengths(self.prompt_lens, self.output_lens)

    def __len__(self) -> int:
        return int(self.prompt_lens.size)


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """A request trace with real arrival times: seconds since the first row, non-decreasing."""

    arrival_s: np.ndarray  # float64, arrival_s[0] == 0 for a trace read from a file
    prompt_lens: np.ndarray  # int64 >= 1
    output_lens: np.ndarray  # int64 >= 1
    source: str
    num_clamped_outputs: int = 0  # rows whose GeneratedTokens 0 was raised to 1

    def __post_init__(self) -> None:
        arrival_s = np.array(self.arrival_s, dtype=np.float64)
        arrival_s.flags.writeable = False
        object.__setattr__(self, "arrival_s", arrival_s)
        object.__setattr__(self, "prompt_lens", frozen_int64(self.prompt_lens))
        object.__setattr__(self, "output_lens", frozen_int64(self.output_lens))
        check_lengths(self.prompt_lens, self.output_lens)
        if arrival_s.shape != self.prompt_lens.shape:
            raise ValueError("arrival_s must be as long as the length arrays")
        if not np.all(np.isfinite(arrival_s)) or np.any(np.diff(arrival_s) < 0):
            raise ValueError("arrival_s must be finite and non-decreasing")

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    @property
    def duration_s(self) -> float:
        """Time from the first to the last arrival (0 for fewer than two rows)."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0

    def lengths(self) -> LengthTable:
        """The trace without its timestamps."""
        clamped = self.num_clamped_outputs
        return LengthTable(self.prompt_lens, self.output_lens, self.source, clamped)


def _rows(path: Path, required: tuple[str, ...]):
    """Yield (line, texts of the ``required`` columns in that order) for each data row, after
    checking that the header names every required column."""
    path = Path(path)
    if path.is_dir():
        raise WorkloadError(f"data file {path} is a folder, not a CSV file", path=path)
    try:
        # -sig: tolerate a BOM; surrogateescape: a byte that is not UTF-8 is named with its line
        handle = path.open(newline="", encoding="utf-8-sig", errors="surrogateescape")
    except FileNotFoundError:
        raise WorkloadError(f"data file not found: {path}", path=path) from None
    except OSError as exc:
        raise WorkloadError(f"data file {path}: cannot read it ({exc.strerror or exc})", path=path) from None
    with handle:
        reader = csv.reader(handle)
        try:
            header = [name.strip() for name in next(reader, [])]
            _check_text(path, 1, [], header)
            for name in required:
                if name not in header:
                    expected = ", ".join(required)
                    raise WorkloadError.at(
                        path, 1, name, f"missing column; expected {expected}, got header {header}"
                    )
            pick = operator.itemgetter(*(header.index(name) for name in required))
            for row in reader:
                if not row:  # a blank line holds no request
                    continue
                line = reader.line_num
                if len(row) != len(header):
                    column = header[len(row)] if len(row) < len(header) else f"field {len(header) + 1}"
                    raise WorkloadError.at(
                        path, line, column, f"row has {len(row)} fields, header has {len(header)}"
                    )
                _check_text(path, line, header, row)
                yield line, pick(row)
        except csv.Error as exc:  # a field over the csv module's limit, a NUL byte, ...
            raise WorkloadError.at(path, reader.line_num, "row", f"not readable as CSV: {exc}") from None


def _check_text(path: Path, line: int, header: list[str], row: list[str]) -> None:
    """Raise naming the line and column (``header``'s name, else the field number) when a cell
    holds bytes that are not UTF-8 (read with surrogateescape, they show as lone surrogates)."""
    if all(cell.isascii() for cell in row):
        return
    for i, cell in enumerate(row):
        try:
            cell.encode("utf-8")
        except UnicodeEncodeError as exc:
            column = header[i] if i < len(header) else f"field {i + 1}"
            byte = ord(cell[exc.start]) - 0xDC00
            problem = f"not UTF-8 text (byte 0x{byte:02x}); is this a CSV file?"
            raise WorkloadError.at(path, line, column, problem) from None


def _count(path: Path, line: int, column: str, text: str, minimum: int) -> int:
    text = text.strip()
    if not (text.isascii() and text.isdigit()):
        raise WorkloadError.at(path, line, column, f"expected a non-negative integer, got {text!r}")
    digits = text.lstrip("0")  # a long digit string is refused before int() reads it
    if len(digits) > len(str(MAX_LENGTH_TOKENS)) or int(digits or "0") > MAX_LENGTH_TOKENS:
        shown = text if len(text) <= 30 else f"{text[:12]}...({len(text)} digits)"
        problem = f"{shown} tokens is more than {MAX_LENGTH_TOKENS:,}"
        raise WorkloadError.at(path, line, column, problem)
    value = int(text)
    if value < minimum:
        problem = f"expected an integer >= {minimum}, got {text!r}"
        raise WorkloadError.at(path, line, column, problem)
    return value


def _read_lengths(
    path: Path, line: int, columns: tuple[str, str], prompt_text: str, output_text: str
) -> tuple[int, int]:
    # A prompt of 0 tokens is not a request; an output of 0 is clamped (>= 1 token is produced).
    prompt_len = _count(path, line, columns[0], prompt_text, minimum=1)
    output_len = _count(path, line, columns[1], output_text, minimum=0)
    return prompt_len, output_len


def read_length_csv(path: str | Path) -> LengthTable:
    """Read a length-only CSV (``num_prefill_tokens``, ``num_decode_tokens``; others ignored).

    A 0 decode count is clamped to 1 and counted in ``num_clamped_outputs``; a 0 prefill count,
    a negative or non-integer value or a missing column raises :class:`WorkloadError`.
    """
    path = Path(path)
    prompt_lens: list[int] = []
    output_lens: list[int] = []
    for line, (prompt_text, output_text) in _rows(path, LENGTH_COLUMNS):
        prompt_len, output_len = _read_lengths(path, line, LENGTH_COLUMNS, prompt_text, output_text)
        prompt_lens.append(prompt_len)
        output_lens.append(output_len)
    if not prompt_lens:
        raise WorkloadError(f"{path.name}: no data rows", path=path)
    outputs = np.array(output_lens, dtype=np.int64)
    num_clamped = int(np.count_nonzero(outputs == 0))
    return LengthTable(np.array(prompt_lens, dtype=np.int64), np.maximum(outputs, 1), path.name, num_clamped)


def read_azure_trace(path: str | Path) -> Trace:
    """Read an Azure LLM inference trace CSV (2023 format: TIMESTAMP, ContextTokens,
    GeneratedTokens) into a :class:`Trace` with arrivals in seconds since the first row.

    Raises :class:`WorkloadError` (file, line, column) for a wrong header, a malformed timestamp,
    a timestamp earlier than the row before, a non-integer or negative length, or a 0-token
    prompt. GeneratedTokens 0 is clamped to 1 and counted in ``num_clamped_outputs``.
    """
    path = Path(path)
    time_col, prompt_col, output_col = AZURE_COLUMNS
    day_ordinals: dict[str, int] = {}
    arrival_ns: list[int] = []  # exact integer ns; float64 of epoch seconds would lose the 100 ns
    prompt_lens: list[int] = []
    output_lens: list[int] = []
    for line, (text, prompt_text, output_text) in _rows(path, AZURE_COLUMNS):
        text = text.strip()
        match = _TIMESTAMP_RE.fullmatch(text)
        if match is None:
            raise WorkloadError.at(
                path, line, time_col, f"expected 'YYYY-MM-DD HH:MM:SS.fffffff', got {text!r}"
            )
        day, hours, minutes, seconds, fraction = match.groups()
        ordinal = day_ordinals.get(day)
        if ordinal is None:
            try:
                ordinal = dt.date.fromisoformat(day).toordinal()
            except ValueError:
                raise WorkloadError.at(path, line, time_col, f"invalid date in {text!r}") from None
            day_ordinals[day] = ordinal
        h, m, s = int(hours), int(minutes), int(seconds)
        if h > 23 or m > 59 or s > 59:
            raise WorkloadError.at(path, line, time_col, f"invalid time of day in {text!r}")
        ns = (ordinal * 86400 + h * 3600 + m * 60 + s) * 10**9 + (
            int(fraction.ljust(9, "0")) if fraction else 0
        )
        if arrival_ns and ns < arrival_ns[-1]:
            raise WorkloadError.at(
                path, line, time_col, f"timestamp {text!r} is earlier than the previous row's"
            )
        if arrival_ns and ns - arrival_ns[0] > MAX_SPAN_NS:
            years = (ns - arrival_ns[0]) / 1e9 / (365.25 * 86400)
            raise WorkloadError.at(
                path,
                line,
                time_col,
                f"timestamp {text!r} is {years:,.0f} years after the first "
                f"row's; a trace spans at most {MAX_SPAN_NS / 1e9 / (365.25 * 86400):.0f} years",
            )
        prompt_len, output_len = _read_lengths(path, line, (prompt_col, output_col), prompt_text, output_text)
        arrival_ns.append(ns)
        prompt_lens.append(prompt_len)
        output_lens.append(output_len)
    if not arrival_ns:
        raise WorkloadError(f"{path.name}: no data rows", path=path)
    first = arrival_ns[0]
    arrival_s = np.array([ns - first for ns in arrival_ns], dtype=np.int64) / 1e9
    outputs = np.array(output_lens, dtype=np.int64)
    num_clamped = int(np.count_nonzero(outputs == 0))
    return Trace(
        arrival_s, np.array(prompt_lens, dtype=np.int64), np.maximum(outputs, 1), path.name, num_clamped
    )

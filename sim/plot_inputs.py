"""Reading results for plotting: simulate folders, sweep tables, goodput JSON, as plain row dicts.

Scenario: ``fastpp plot`` (and notebooks) get a path and must know what it holds without the
objects that wrote it. Three recognised inputs, found by their file layout, not their names:

- runs: a run folder (``fastpp.run_files``: ``summary.json``, ``requests.jsonl`` of
  ``RequestRecord.to_dict`` rows, ``iterations.csv``; or their ``.parquet`` forms), written by
  ``fastpp serve --record-dir`` or an engine plugin, or a ``fastpp simulate`` folder holding
  one run folder per deployment (and a ``summary.json`` listing their summaries in order), or a
  folder of several such (``runs/simulate``: :func:`select_runs` picks the newest);
- a sweep table: ``results.jsonl`` or ``results.csv`` (one row per grid point: axis columns such
  as workload, policy, deployment, rate, slo_scale and metric columns such as goodput,
  p90_ttft_ms), or a folder holding one, or a folder of such folders (``runs/sweep``: the
  newest);
- ``fastpp goodput --json`` output: a list of ``{deployment, policy, goodput, probes: [...]}``.

Rows stay dicts so that columns added later pass through; every reader of a metric goes through
:func:`num`, which turns a missing, empty or non-numeric cell into NaN. No matplotlib here.
Units are those of the files: timestamps in seconds, latencies in ms.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

Row = Mapping[str, Any]
Columns = Mapping[str, np.ndarray]  # a table as one array per column (iterations.csv)
SourceKind = Literal["run_dir", "sweep", "goodput"]
PlotKind = Literal["auto", "goodput", "rate", "cdf", "chunk", "timeline", "slo"]  # figure families

# Columns that name a system (one bar / line each): simulate summaries and goodput JSON say
# "deployment", sweep tables "deploy"; a row has one of the two.
SERIES_KEYS = ("deployment", "deploy", "policy")
RESULTS_NAMES = ("results.jsonl", "results.csv")  # what a sweep folder holds, in preference order


class PlotInputError(ValueError):
    """A path that holds no recognised result, or a plot kind its data cannot make."""


@dataclass(frozen=True, slots=True)
class RunData:
    """One deployment of a ``fastpp simulate`` folder."""

    run_id: str  # run folder name, e.g. ``pp4-static-512``
    summary: dict[str, Any]
    requests: list[dict[str, Any]] = field(default_factory=list)  # RequestRecord.to_dict rows
    iterations: Columns = field(default_factory=dict)  # IterationRecord columns (read_columns)
    name: str = ""  # the label to show, when the summary's system label is not enough

    @property
    def label(self) -> str:
        return self.name or system_label(self.summary) or self.run_id


# ---- cells and rows ------------------------------------------------------------------------------


def num(row: Row, key: str) -> float:
    """``row[key]`` as a float; NaN when missing, empty, boolean or not a number."""
    value = row.get(key)
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def system_label(row: Row, keys: Sequence[str] = SERIES_KEYS) -> str:
    """The system a row belongs to: its ``system`` column, else the values of the given columns
    joined (``pp4 static:512``); "" when it has none of them."""
    if row.get("system") not in (None, ""):
        return str(row["system"])
    return " ".join(unique(str(row[k]) for k in keys if row.get(k) not in (None, "")))


def unique(values: Iterable[Any]) -> list[Any]:
    """Distinct values in order of first appearance (the order plots use for series)."""
    return list(dict.fromkeys(values))


def varies(rows: Sequence[Row], key: str) -> bool:
    """True iff ``key`` takes more than one value over the rows that have it."""
    return len({_hashable(r[key]) for r in rows if r.get(key) not in (None, "")}) > 1


def has_values(rows: Sequence[Row], key: str) -> bool:
    """True iff some row holds a number under ``key``."""
    return any(not math.isnan(num(r, key)) for r in rows)


def _hashable(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, list | dict) else value


def _cell(text: str) -> Any:
    """A CSV cell as the JSON reader would give it: None, bool, int, float or str."""
    if text == "":
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def _read_text(path: Path) -> str:
    """The file's text; PlotInputError naming it when it is not UTF-8 (not a result file)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        byte = exc.object[exc.start]
        raise PlotInputError(f"{path}: not UTF-8 text (byte 0x{byte:02x} at offset {exc.start})") from None


def _load_json(path: Path) -> Any:
    """The file's JSON value; PlotInputError naming it when it is not UTF-8 or not JSON."""
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise PlotInputError(f"{path}: not JSON ({exc.msg})") from exc


def _csv_rows(path: Path, limit: int | None = None) -> list[list[str]]:
    """The rows of a CSV file (header first; the first ``limit`` only, when given);
    PlotInputError naming the file when it is not UTF-8 text or the csv module cannot read it."""
    with io.StringIO(_read_text(path), newline="") as f:
        reader = csv.reader(f)
        try:
            return list(itertools.islice(reader, limit))
        except csv.Error as exc:
            raise PlotInputError(f"{path}:{reader.line_num}: not readable as CSV ({exc})") from None


def _read_csv(path: Path) -> list[dict[str, Any]]:
    rows = _csv_rows(path)
    header = rows[0] if rows else []
    return [
        {k: _cell(row[i] if i < len(row) else "") for i, k in enumerate(header)} for row in rows[1:] if row
    ]


PLOT_ITERATION_COLUMNS = (
    "mb_id",
    "stage",
    "slot",
    "started_at",
    "finished_at",
    "num_tokens",
    "num_prefill_tokens",
    "num_decode_reqs",
    "chunk_budget",
)


def read_columns(path: str | Path, names: Sequence[str] | None = None) -> Columns:
    """A CSV table (iterations.csv) as one numpy array per column (``names`` only, when given,
    and those the file has): floats where every cell is a number (an empty cell is NaN), else
    strings. Numeric columns are parsed by ``numpy.loadtxt`` (C speed: 160,000 rows in about
    0.3 s); columnar, so the plots never loop over rows."""
    path = Path(path)
    rows = _csv_rows(path, 2)  # refuses a file that is not UTF-8 text before numpy reads it
    header = rows[0] if rows else []
    first = rows[1] if len(rows) > 1 else None
    wanted = [i for i, n in enumerate(header) if names is None or n in names]
    if first is None:
        return {header[i]: np.zeros(0) for i in wanted}
    numeric = [i for i in wanted if i < len(first) and _is_number(first[i])]
    out: dict[str, np.ndarray] = {}
    if numeric:
        try:
            data = np.loadtxt(
                path,
                delimiter=",",
                skiprows=1,
                usecols=numeric,
                ndmin=2,
                dtype=float,
                comments=None,
                quotechar='"',
                encoding="utf-8",
            )
        except ValueError:  # an empty or text cell further down: the slow, general reader
            return _read_columns_slowly(path, header, wanted)
        out = {header[i]: data[:, j] for j, i in enumerate(numeric)}
    if len(numeric) < len(wanted):
        rest = _read_columns_slowly(path, header, [i for i in wanted if i not in numeric])
        out.update(rest)
    return {header[i]: out[header[i]] for i in wanted}


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_columns_slowly(path: Path, header: Sequence[str], wanted: Sequence[int]) -> dict[str, np.ndarray]:
    rows = _csv_rows(path)[1:]
    for line, row in enumerate(rows, 2):
        if len(row) != len(header):
            raise PlotInputError(f"{path}:{line}: row has {len(row)} fields, header has {len(header)}")
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in header]
    return {header[i]: _column(columns[i]) for i in wanted}


def _column(cells: Sequence[str]) -> np.ndarray:
    try:
        return np.array(cells, dtype=float)
    except ValueError:
        pass
    try:
        return np.array([float(c) if c else math.nan for c in cells])
    except ValueError:
        return np.array(cells, dtype=str)


def num_rows(table: Columns | Sequence[Row]) -> int:
    """Rows of a columns table (its first column's length) or of a row list."""
    if isinstance(table, Mapping):
        return len(next(iter(table.values()))) if table else 0
    return len(table)


def _fast_loads() -> Any:
    """orjson's parser when it is installed (4x faster on per-token ITL lists), else None."""
    try:
        import orjson
    except ImportError:
        return None
    return orjson.loads


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    fast = _fast_loads()
    for i, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = fast(line) if fast is not None else json.loads(line)
        except ValueError:  # orjson refuses what json reads (NaN): the standard parser decides
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PlotInputError(f"{path}:{i}: not a JSON line ({exc.msg})") from exc
        if not isinstance(row, dict):
            raise PlotInputError(f"{path}:{i}: expected a JSON object per line")
        rows.append(row)
    return rows


# ---- loaders -------------------------------------------------------------------------------------


def load_results(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a sweep table: ``results.jsonl`` / ``results.csv``, any ``.jsonl``/``.csv``, or a
    folder holding ``results.jsonl`` (preferred) or ``results.csv``. CSV cells are typed."""
    path = Path(path)
    if path.is_dir():
        found = [path / n for n in RESULTS_NAMES if (path / n).is_file()]
        if not found:
            raise PlotInputError(f"{path}: no {' or '.join(RESULTS_NAMES)} in this folder")
        path = found[0]
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    if path.suffix == ".csv":
        return _read_csv(path)
    raise PlotInputError(f"{path}: a results table is .jsonl or .csv")


def load_goodput_json(path: str | Path) -> list[dict[str, Any]]:
    """The results of ``fastpp goodput --json`` (a list, or one object), each with ``probes``."""
    path = Path(path)
    data = _load_json(path)
    results = [data] if isinstance(data, dict) else data
    if not (
        isinstance(results, list)
        and results
        and all(isinstance(r, dict) and isinstance(r.get("probes"), list) for r in results)
    ):
        raise PlotInputError(f"{path}: not `fastpp goodput --json` output (no probes list)")
    return results


REQUEST_TABLES = ("requests.jsonl", "requests.parquet")  # text or ``--table-format parquet``


def _is_run(path: Path) -> bool:
    return (path / "summary.json").is_file() and any((path / n).is_file() for n in REQUEST_TABLES)


def _read_requests(run: Path) -> list[dict[str, Any]]:
    if (run / "requests.jsonl").is_file():
        return _read_jsonl(run / "requests.jsonl")
    return _parquet(run / "requests.parquet").to_pylist()


def _read_iterations(run: Path) -> Columns:
    if (run / "iterations.csv").is_file():
        return read_columns(run / "iterations.csv", PLOT_ITERATION_COLUMNS)
    if (run / "iterations.parquet").is_file():
        table = _parquet(run / "iterations.parquet")
        return {
            n: table.column(n).to_numpy().astype(float)
            for n in PLOT_ITERATION_COLUMNS
            if n in table.column_names
        }
    return {}


def _parquet(path: Path) -> Any:
    """A Parquet table (pyarrow, the ``fastpp[parquet]`` extra); PlotInputError naming the file."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise PlotInputError(f"{path}: Parquet tables need pyarrow: pip install 'fastpp[parquet]'") from None
    try:
        return pq.read_table(path)
    except Exception as exc:  # pyarrow raises its own error types for a damaged file
        raise PlotInputError(f"{path}: not a Parquet table: {exc}") from None


def _summary_list(path: Path) -> list[dict[str, Any]] | None:
    """The summaries a ``fastpp simulate`` folder lists in its summary.json, else None."""
    listed = path / "summary.json"
    if not listed.is_file() or _is_run(path):
        return None
    data = _load_json(listed)
    return data if isinstance(data, list) else None


def _is_run_set(path: Path) -> bool:
    return _summary_list(path) is not None


def _subdirs(path: Path) -> list[Path]:
    return sorted(d for d in path.iterdir() if d.is_dir())


@dataclass(frozen=True, slots=True)
class RunSelection:
    """What a path given to ``fastpp plot`` holds and which part of it is plotted."""

    path: Path  # the run folder or ``fastpp simulate`` folder that is plotted
    notes: tuple[str, ...] = ()  # what was chosen or left out, and why (for the user)


def select_runs(path: str | Path) -> RunSelection:
    """The one run set under ``path``: a run folder, a ``fastpp simulate`` folder, or, for a
    folder of several simulate folders (``runs/simulate`` after several invocations), the
    newest of them (by its summary.json's time). Never several invocations at once."""
    path = Path(path)
    if _is_run(path):
        return RunSelection(path)
    candidates = ([path] if _is_run_set(path) else []) + [d for d in _subdirs(path) if _is_run_set(d)]
    if not candidates:
        return RunSelection(path)  # bare run folders (recorded runs) or nothing: load_run_dir says
    if len(candidates) == 1:
        return RunSelection(candidates[0])
    newest = max(candidates, key=lambda d: ((d / "summary.json").stat().st_mtime, d.name))
    return RunSelection(
        newest,
        (
            f"{path} holds {len(candidates)} `fastpp simulate` runs; plotting the newest, {newest} "
            f"(pass a run's own folder to plot another)",
        ),
    )


def load_run_dir(path: str | Path, notes: list[str] | None = None) -> list[RunData]:
    """Every run of a run folder (one) or of a ``fastpp simulate`` folder: the run folders its
    ``summary.json`` lists, in that order (a folder whose summary is not in the list, left by an
    earlier invocation, is skipped and named in ``notes``). A folder of recorded run folders
    without such a list gives all of them, by name. Iterations are empty where the file is
    absent."""
    path = Path(path)
    order = _summary_list(path) or []
    dirs = [path] if _is_run(path) else [d for d in _subdirs(path) if _is_run(d)]
    if not dirs and not order:
        raise PlotInputError(f"{path}: no run folders and no summary.json: not a simulate or run folder")
    summaries = {d: _load_json(d / "summary.json") for d in dirs}
    if order:
        listed = [d for d in dirs if summaries[d] in order]
        stale = [d.name for d in dirs if d not in listed]
        if stale and notes is not None:
            notes.append(f"{path}: skipped {', '.join(stale)}: not in its summary.json (left by another run)")
        dirs = sorted(listed, key=lambda d: (order.index(summaries[d]), d.name))
    runs = [RunData(d.name, summaries[d], _read_requests(d), _read_iterations(d)) for d in dirs]
    if not runs:  # only summary.json: the summaries still plot as rows
        runs = [RunData(system_label(s) or f"run{i}", s) for i, s in enumerate(order)]
    return runs


GOODPUT_JSON = "goodput.json"  # what `fastpp goodput --plot DIR` writes into DIR


def detect(path: str | Path) -> tuple[SourceKind, Path]:
    """What ``path`` holds and the path to read it from (a ``summary.json`` file maps to its
    folder). Raises :class:`PlotInputError` naming the path when it is none of the three."""
    path = Path(path)
    if not path.exists():
        raise PlotInputError(f"{path}: no such file or folder")
    if path.is_dir():
        if any((path / n).is_file() for n in RESULTS_NAMES):
            return "sweep", path
        if (path / "summary.json").is_file() or any(
            _is_run(d) or (d / "summary.json").is_file() for d in _subdirs(path)
        ):
            return "run_dir", path
        sweeps = [d for d in _subdirs(path) if any((d / n).is_file() for n in RESULTS_NAMES)]
        if sweeps:  # a folder of sweeps (runs/sweep): the newest one, never several mixed
            return "sweep", max(sweeps, key=lambda d: (_newest_table_mtime(d), d.name))
        if (path / GOODPUT_JSON).is_file():  # a `fastpp goodput --plot DIR` folder
            load_goodput_json(path / GOODPUT_JSON)
            return "goodput", path / GOODPUT_JSON
    elif path.suffix in (".jsonl", ".csv"):
        return "sweep", path
    elif path.suffix == ".json":
        if path.name == "summary.json":
            return "run_dir", path.parent
        load_goodput_json(path)  # raises with the reason when it is not goodput output
        return "goodput", path
    raise PlotInputError(
        f"{path}: not a recognised result (expected a `fastpp simulate` output folder, a run "
        f"folder, a sweep results.jsonl/.csv or its folder, a `fastpp goodput --json` file or a "
        f"`fastpp goodput --plot` folder)"
    )


def _newest_table_mtime(folder: Path) -> float:
    return max((folder / n).stat().st_mtime for n in RESULTS_NAMES if (folder / n).is_file())


def probe_rows(results: Sequence[Row]) -> list[dict[str, Any]]:
    """Goodput search results flattened to one row per probe (system columns copied in),
    sorted by rate within each system. A failed probe's null P90 TTFT reads as inf: the search's
    TTFT P90 counts failed requests as infinite, and JSON wrote that infinity as null. A probe
    the search stopped early has no P90s, only the shares of requests already sure to miss each
    objective: its P90 reads as inf for the objective more than 10% of its requests missed (both
    when neither share alone does), and as unknown (NaN, not drawn) for the other."""
    rows = []
    for res in results:
        probes = sorted(res.get("probes", []), key=lambda p: num(p, "rate"))
        for p in probes:
            row = {
                k: res.get(k)
                for k in ("deployment", "policy", "workload", "model", "gpu", "slo_ttft_ms", "slo_tpot_ms")
            }
            row.update(p)
            if row.get("stopped_early"):
                ttft_over = num(row, "ttft_missed_at_least") > 0.1
                tpot_over = num(row, "tpot_missed_at_least") > 0.1
                both = not (ttft_over or tpot_over)
                row["p90_ttft_ms"] = math.inf if ttft_over or both else math.nan
                row["p90_tpot_ms"] = math.inf if tpot_over or both else math.nan
            elif row.get("p90_ttft_ms") is None and not row.get("ok", True):
                row["p90_ttft_ms"] = math.inf
            rows.append(row)
    return rows

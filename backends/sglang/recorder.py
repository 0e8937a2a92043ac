"""The plugin's records of an SGLang run, in fastpp's run format (fastpp.run_files), written as
the run goes.

SGLang ends its scheduler processes with signals, so nothing can wait for a clean shutdown to
write: every file is appended line by line and flushed. Files under the record directory:

* ``requests.jsonl`` (PP rank 0): one ``RequestRecord.to_dict()`` per finished request, as
  ``fastpp serve --backend torch --record-dir`` and the simulator write them;
* ``iterations.csv`` (PP rank 0): one ``IterationRecord`` per stage per microbatch, every
  rank's stages (the other ranks send theirs to rank 0);
* ``decisions.jsonl`` (PP rank 0): what the policies decided at each step (our intent);
* ``batches_rank{r}.jsonl`` (every rank): what SGLang's batches actually carried, read from
  SGLang's own objects when each microbatch launched (the applied side, for checks);
* ``host_rank{r}.jsonl`` (every rank): each PP-loop step's phase timings (``host_timing``);
* ``setup.json`` (PP rank 0, at start-up): the deployment (``fastpp.run_setup``);
* ``summary.json`` (with ``setup.json`` as its ``setup``) and ``timeline.json``: written
  afterwards by ``finalize_record_dir``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, TextIO

from fastpp.run_setup import SETUP_KEY
from fastpp.types import ITERATION_FIELDS, IterationRecord, RequestRecord

SETUP_FILE = "setup.json"


class RecordWriter:
    """Appends one rank's records under ``root``; line-buffered so a killed process loses at
    most the line being written."""

    def __init__(self, root: str | Path, pp_rank: int) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.pp_rank = pp_rank
        self._files: dict[str, TextIO] = {}
        self._iter_writer: Any = None

    def _open(self, name: str) -> TextIO:
        f = self._files.get(name)
        if f is None:
            f = self._files[name] = (self.root / name).open("a", encoding="utf-8", buffering=1)
        return f

    def setup(self, setup: dict) -> None:
        """The run's setup (fastpp.run_setup), merged into summary.json by finalize_record_dir."""
        (self.root / SETUP_FILE).write_text(json.dumps(setup, indent=2) + "\n", encoding="utf-8")

    def batch(self, entry: dict) -> None:
        self._open(f"batches_rank{self.pp_rank}.jsonl").write(json.dumps(entry) + "\n")

    def host(self, entry: dict) -> None:
        self._open(f"host_rank{self.pp_rank}.jsonl").write(json.dumps(entry) + "\n")

    def decision(self, entry: dict) -> None:
        self._open("decisions.jsonl").write(json.dumps(entry) + "\n")

    def request(self, rec: RequestRecord) -> None:
        self._open("requests.jsonl").write(json.dumps(rec.to_dict()) + "\n")

    def iteration(self, rec: IterationRecord) -> None:
        if self._iter_writer is None:
            path = self.root / "iterations.csv"
            new = not path.exists() or path.stat().st_size == 0
            f = self._open("iterations.csv")
            self._iter_writer = csv.DictWriter(f, fieldnames=list(ITERATION_FIELDS))
            if new:
                self._iter_writer.writeheader()
        self._iter_writer.writerow(rec.to_dict())

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        self._iter_writer = None


def read_jsonl(path: str | Path) -> list[dict]:
    """The JSON objects of a .jsonl file, skipping a last line cut short by a kill."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def finalize_record_dir(root: str | Path, slo: Any = None, num_stages: int | None = None) -> dict[str, Path]:
    """Write ``summary.json`` and ``timeline.json`` from the streamed files (after the run)."""
    from fastpp.metrics import summarize
    from fastpp.run_files import read_iterations_csv, read_records_jsonl, write_json
    from fastpp.timeline import write_chrome_trace

    root = Path(root)
    requests = root / "requests.jsonl"
    records = read_records_jsonl(requests, torn_tail=True) if requests.exists() else []
    summary = summarize(records, slo=slo, backend="sglang+fastpp") if records else {}
    setup = root / SETUP_FILE
    if setup.exists():
        summary[SETUP_KEY] = json.loads(setup.read_text(encoding="utf-8"))
    out = {"summary": write_json(summary, root / "summary.json")}
    path = root / "iterations.csv"
    iterations = read_iterations_csv(path, torn_tail=True) if path.exists() else []
    if iterations:
        stages = num_stages or 1 + max(it.stage for it in iterations)
        out["timeline"] = write_chrome_trace(
            iterations, root / "timeline.json", stage_names=[f"stage {i}" for i in range(stages)]
        )
    return out

"""The run folder of a vLLM deployment served with ``--record-dir``: what a simulation writes.

Written by the scheduler in vLLM's engine-core process, as the run goes (line-buffered: a
reader sees each line at once, and a killed engine still leaves its records up to then):

* ``decisions.jsonl``: one line per ``schedule()`` call: the slot, the budget and decodes our
  policies chose, and what vLLM's SchedulerOutput scheduled (``scheduled``: request id ->
  tokens). Tests compare the two. ``at`` and ``schedule_started_at``: when the call returned
  and was entered (the host's scheduling time per microbatch, ours included).
* ``returns.jsonl``: one line per folded-in output: when ``update_from_output`` was entered
  (``update_started_at``: the engine core had the sampled tokens), when vLLM's part returned
  (``returned_at``: the token instants of requests.jsonl) and when ours did (``done_at``).
  With the stage times of iterations.csv these give the host side of the PP loop
  (docs/engines/vllm.md).
* ``requests.jsonl`` (one RequestRecord per ended request) and ``iterations.csv`` (one
  IterationRecord per stage and microbatch).

At shutdown (vLLM calls ``Scheduler.shutdown``; give it time with ``--shutdown-timeout``, which
``fastpp serve --backend vllm`` sets) the folder is rewritten by ``fastpp.run_files.write_run``,
the writer every executor uses: requests sorted by id (those still running written unfinished),
plus ``summary.json`` (with the deployment's ``setup``: pp, KV pool, page size, model shape,
layers per stage; ``fastpp.run_setup``) and ``timeline.json``. Memory grows with the run (one
record per request and per stage-iteration), as with ``fastpp serve --record-dir``.
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

from fastpp.metrics import summarize
from fastpp.run_files import ITERATIONS, REQUESTS, write_run
from fastpp.run_setup import SETUP_KEY, RunSetup
from fastpp.types import ITERATION_FIELDS, SLO, IterationRecord, RequestRecord

log = logging.getLogger("fastpp.vllm")

DECISIONS = "decisions.jsonl"
RETURNS = "returns.jsonl"


class RunRecorder:
    """Collects one deployment's records and writes its run folder (module docstring)."""

    def __init__(
        self,
        out_dir: str | Path,
        slo: SLO,
        num_stages: int,
        backend: str = "vllm",
        setup: RunSetup | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.setup = setup  # written into summary.json (what a profile from these records needs)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.slo = slo
        self.num_stages = num_stages
        self.backend = backend
        self.requests: list[RequestRecord] = []
        self.iterations: list[IterationRecord] = []
        # line-buffered: one write per line, a few microseconds against steps of milliseconds
        self._decisions = (self.out_dir / DECISIONS).open("w", buffering=1, encoding="utf-8")
        self._returns = (self.out_dir / RETURNS).open("w", buffering=1, encoding="utf-8")
        self._requests = (self.out_dir / REQUESTS).open("w", buffering=1, encoding="utf-8")
        self._iterations_file = (self.out_dir / ITERATIONS).open(
            "w", buffering=1, encoding="utf-8", newline=""
        )
        self._iterations = csv.DictWriter(self._iterations_file, fieldnames=list(ITERATION_FIELDS))
        self._iterations.writeheader()
        self._closed = False

    def on_decision(self, entry: dict) -> None:
        self._decisions.write(json.dumps(entry, separators=(",", ":")) + "\n")

    def on_return(self, entry: dict) -> None:
        self._returns.write(json.dumps(entry, separators=(",", ":")) + "\n")

    def on_iteration(self, rec: IterationRecord) -> None:
        self.iterations.append(rec)
        self._iterations.writerow(rec.to_dict())

    def on_request_end(self, rec: RequestRecord) -> None:
        self.requests.append(rec)
        self._requests.write(json.dumps(rec.to_dict()) + "\n")

    def close(self, unfinished: list[RequestRecord] | None = None) -> None:
        """Write the run folder (once); ``unfinished`` are records of requests still running."""
        if self._closed:
            return
        self._closed = True
        for f in (self._decisions, self._returns, self._requests, self._iterations_file):
            f.close()
        records = sorted([*self.requests, *(unfinished or [])], key=lambda r: r.req_id)
        summary = summarize(records, slo=self.slo, backend=self.backend) if records else {}
        if self.setup is not None:
            summary[SETUP_KEY] = self.setup.to_dict()
        names = [f"stage {i}" for i in range(self.num_stages)]
        write_run(self.out_dir, records, self.iterations, summary, stage_names=names)
        log.info(
            "fastpp: wrote %d requests and %d stage iterations to %s",
            len(records),
            len(self.iterations),
            self.out_dir,
        )

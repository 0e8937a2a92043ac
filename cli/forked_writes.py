"""Run-folder files written by forked children while the command goes on.

Scenario: ``fastpp simulate --replay azure-conv`` keeps an hour of records in memory and writes
110 MB of them (requests.jsonl, iterations.csv, timeline.json): about 4 s of formatting, as long
as most of the simulation. Each file's writer is plain Python, so threads would take turns; a
forked child instead starts with the records already in its memory (copy-on-write: nothing is
pickled or copied up front), writes its one file and exits, while the parent goes on with the
next file, the next deployment's simulation or the summary table. On two cores the three files
of a run take about as long as the slowest of them.

Where ``os.fork`` does not exist (Windows) the writers run in the parent, one after the other.
A child that fails prints its traceback and exits non-zero; ``wait`` then names its file.
"""

from __future__ import annotations

import gc
import os
import sys
import traceback
from collections.abc import Callable

MAX_CHILDREN = 3  # one per file of a run; more would only wait for the cores


class ForkedWrites:
    """Submit file writers; ``wait`` for all of them before reporting the files written."""

    def __init__(self, max_children: int = MAX_CHILDREN, *, fork: bool | None = None) -> None:
        self.max_children = max(1, max_children)
        self.fork = hasattr(os, "fork") if fork is None else fork
        self._children: dict[int, str] = {}  # pid -> the file it writes
        self.failed: list[str] = []  # files whose writer failed

    def submit(self, name: str, write: Callable[[], object]) -> None:
        """Write the file ``name`` with ``write()``: in a forked child when forking is on."""
        if not self.fork:
            self._run_here(name, write)
            return
        while len(self._children) >= self.max_children:
            self._reap_oldest()
        sys.stdout.flush()  # a child must not inherit (and never print) the parent's buffers
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: write, then leave without running the parent's cleanup
            code = 1
            try:
                gc.disable()  # short-lived: a collection would only copy the parent's pages
                write()
                code = 0
            except BaseException:
                print(f"error: writing {name} failed:", file=sys.stderr)
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        self._children[pid] = name

    def wait(self) -> list[str]:
        """Wait for every child; returns the files whose writer failed (empty when none)."""
        while self._children:
            self._reap_oldest()
        return self.failed

    def _reap_oldest(self) -> None:
        pid = next(iter(self._children))
        _, status = os.waitpid(pid, 0)
        name = self._children.pop(pid)
        if os.waitstatus_to_exitcode(status) != 0:
            self.failed.append(name)

    def _run_here(self, name: str, write: Callable[[], object]) -> None:
        try:
            write()
        except OSError as exc:
            print(f"error: writing {name} failed: {exc}", file=sys.stderr)
            self.failed.append(name)

"""Per-stage compute times of each microbatch, from vLLM's worker processes to the scheduler.

vLLM's scheduler sees a step only as a whole (scheduled, then its output back); our policies
learn from each stage's time (IterationRecord). The fastpp plugin (plugin.py), loaded in every
worker, times each step the worker runs and appends one line per step to
``<folder>/stage<pp rank>.csv``: ``mb_id,t0,t1`` with ``time.time()`` instants. The scheduler
tags each SchedulerOutput with its microbatch id (``FASTPP_MB_ATTR``), which travels to the
workers with it (vLLM pickles the object).

What the instants mean: t0 when the worker starts the step (a later stage then waits for the
previous stage's activations), t1 when its forward ends, or, on the last stage, when sampling
ends. The reader turns them into a stage's compute interval: start = max(t0, previous stage's
t1).

The last stage writes its line before its output returns to the engine core, and earlier
stages finish before it, so when the scheduler folds a step in, all its lines are on disk.
"""

from __future__ import annotations

from pathlib import Path

FASTPP_MB_ATTR = "fastpp_mb_id"


def stage_file(folder: str | Path, stage: int) -> Path:
    return Path(folder) / f"stage{stage}.csv"


class StageTimesWriter:
    """Appends one stage's lines (one per step); opened on first use."""

    def __init__(self, folder: str | Path, stage: int) -> None:
        self.path = stage_file(folder, stage)
        self._f = None

    def write(self, mb_id: int, t0: float, t1: float) -> None:
        if self._f is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = self.path.open("a", buffering=1, encoding="utf-8")  # line-buffered
        self._f.write(f"{mb_id},{t0:.6f},{t1:.6f}\n")


class StageTimesReader:
    """``reader(mb_id)`` -> {stage: (t0, t1)} for a returned microbatch, None when a stage's
    line is missing. Reads only the lines appended since the last call."""

    def __init__(self, folder: str | Path, num_stages: int) -> None:
        self.folder = Path(folder)
        self.num_stages = num_stages
        self._files: dict[int, object] = {}
        self._partial: dict[int, str] = {}
        self._times: dict[int, dict[int, tuple[float, float]]] = {}
        self.num_bad_lines = 0

    def clear(self) -> None:
        """Remove the files a previous run left (call before the workers run a step)."""
        for stage in range(self.num_stages):
            stage_file(self.folder, stage).unlink(missing_ok=True)

    def __call__(self, mb_id: int) -> dict[int, tuple[float, float]] | None:
        self._poll()
        for old in [m for m in self._times if m < mb_id]:  # steps that never completed
            del self._times[old]
        times = self._times.get(mb_id)
        if times is None or len(times) < self.num_stages:
            return None
        return self._times.pop(mb_id)

    def _poll(self) -> None:
        for stage in range(self.num_stages):
            f = self._files.get(stage)
            if f is None:
                path = stage_file(self.folder, stage)
                if not path.is_file():
                    continue
                f = self._files[stage] = path.open(encoding="utf-8")
            text = self._partial.pop(stage, "") + f.read()  # type: ignore[attr-defined]
            lines = text.split("\n")
            if lines[-1]:
                self._partial[stage] = lines[-1]  # a line still being written
            for line in lines[:-1]:
                if not line:
                    continue
                try:
                    mb, t0, t1 = line.split(",")
                    self._times.setdefault(int(mb), {})[stage] = (float(t0), float(t1))
                except ValueError:
                    self.num_bad_lines += 1  # never let a torn file stop the engine

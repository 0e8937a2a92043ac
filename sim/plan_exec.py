"""Where the planner's jobs run: in this process, in a pool of processes, or as Ray tasks.

Unlike a sweep, a plan does not hand over all its work at once: each job is submitted when a
worker is free, carrying the best goodput found so far, so that the bound pruning and the
challenge probe see the latest best. The process pool also publishes each new best to the jobs
already running (``publish``; a shared value the workers read through
``plan_job.set_live_best``), so a search stops once it has failed below it; in this process
and on Ray a job sees the best it was given only. The rules are the sweep executors' (``fastpp.sim.sweep``):
processes are spawned, not forked; Ray's ``auto`` joins a running cluster or starts a local
instance, and only an instance started here is shut down; the names are ``EXECUTORS``.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from typing import Any, Protocol

from fastpp.sim.plan_job import CandidateJob, evaluate_candidate, set_live_best
from fastpp.sim.sweep import EXECUTORS, _import_ray, make_executor

Task = Callable[[CandidateJob], dict[str, Any]]


class JobRunner(Protocol):
    """Runs up to ``capacity`` jobs at once; ``take`` returns one finished job's row."""

    capacity: int

    def submit(self, job: CandidateJob) -> None: ...

    def take(self) -> dict[str, Any]: ...

    def publish(self, best: float) -> None:
        """The plan's best goodput so far, for the jobs already running (where they can see it)."""
        ...

    def close(self) -> None: ...


class SerialRunner:
    """One job at a time, in this process (the reference the others must match)."""

    capacity = 1

    def __init__(self, task: Task = evaluate_candidate) -> None:
        self._task = task
        self._queue: deque[CandidateJob] = deque()

    def submit(self, job: CandidateJob) -> None:
        self._queue.append(job)

    def take(self) -> dict[str, Any]:
        return self._task(self._queue.popleft())

    def publish(self, best: float) -> None:
        """Nothing runs between jobs here: each job starts with the latest best already."""

    def close(self) -> None:
        self._queue.clear()


class ProcessRunner:
    """A pool of ``workers`` spawned processes, kept for the whole plan."""

    def __init__(self, workers: int, task: Task = evaluate_candidate) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.capacity = workers
        self._task = task
        context = get_context("spawn")
        self._best = context.Value("d", 0.0, lock=False)  # one writer: this process
        self._pool = ProcessPoolExecutor(
            workers, mp_context=context, initializer=_read_best_from, initargs=(self._best,)
        )
        self._pending: set[Future] = set()

    def submit(self, job: CandidateJob) -> None:
        self._pending.add(self._pool.submit(self._task, job))

    def take(self) -> dict[str, Any]:
        done, self._pending = wait(self._pending, return_when=FIRST_COMPLETED)
        first, *rest = done
        self._pending |= set(rest)
        return first.result()

    def publish(self, best: float) -> None:
        self._best.value = best

    def close(self) -> None:
        for future in self._pending:
            future.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)


class RayRunner:
    """Ray tasks, ``capacity`` in flight (default: the cluster's CPUs)."""

    def __init__(
        self, address: str = "auto", workers: int | None = None, task: Task = evaluate_candidate
    ) -> None:
        self._ray = ray = _import_ray()
        self._started = not ray.is_initialized()
        if self._started:
            try:
                ray.init(address=address)
            except ConnectionError:
                if address != "auto":
                    raise
                ray.init()
        self.capacity = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote = ray.remote(task)
        self._pending: list[Any] = []

    def submit(self, job: CandidateJob) -> None:
        self._pending.append(self._remote.remote(job))

    def take(self) -> dict[str, Any]:
        done, self._pending = self._ray.wait(self._pending, num_returns=1)
        return self._ray.get(done[0])

    def publish(self, best: float) -> None:
        """Ray tasks see the best they were submitted with only."""

    def close(self) -> None:
        for ref in self._pending:
            self._ray.cancel(ref)
        if self._started:
            self._ray.shutdown()


def _read_best_from(best: Any) -> None:
    """A pool worker's initializer: its jobs read the plan's best from the shared ``best``."""
    set_live_best(lambda: best.value)


def make_runner(
    kind: str = "process", *, workers: int | None = None, ray_address: str | None = None
) -> JobRunner:
    """The runner ``kind`` names (process | serial | ray); ``make_executor`` checks the name and
    that Ray is installed first, so a bad choice fails before any work."""
    make_executor(kind, workers=workers, ray_address=ray_address)
    if kind == "serial":
        return SerialRunner()
    if kind == "process":
        return ProcessRunner(workers or os.cpu_count() or 1)
    return RayRunner(ray_address or "auto", workers)


__all__ = ["EXECUTORS", "JobRunner", "ProcessRunner", "RayRunner", "SerialRunner", "make_runner"]

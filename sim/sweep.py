"""Sweeps: run every point of a grid (``fastpp.sim.sweep_grid``) in parallel into one tidy table.

Scenario: ``plan_sweep`` expands and validates the grid (building each distinct profile and
scheduler once, so a bad name or an impossible deployment fails before any work), reads the
results already in the output folder and keeps the points still to run. ``execute_plan`` hands
those to an executor (serial, a process pool or Ray tasks), appends each row to
``results.jsonl`` as it completes, derives the best-static rows, then rewrites the JSONL in grid
order and regenerates ``results.csv``.

Determinism: a row holds only seeded simulation outputs (no wall times), so the same grid gives
byte-identical files whatever the executor, the number of workers or the completion order, and
a resumed sweep ends with the same files as an uninterrupted one. Rows of other grids found in
the folder are kept, after this grid's rows, in their file order.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fastpp.sim.analytic import analytic_profile
from fastpp.sim.goodput import slo_goodput
from fastpp.sim.goodput_fixed import fixed_goodput, parse_protocol
from fastpp.sim.run import build_scheduler, run_simulation
from fastpp.sim.sweep_grid import (
    AXIS_COLUMNS,
    DEFAULT_STATIC_CHUNKS,
    BestStaticTarget,
    SweepGrid,
    SweepPoint,
    grid_from_mapping,
    load_grid_file,
)
from fastpp.sim.sweep_table import (
    RESULTS_CSV,
    RESULTS_JSONL,
    append_row,
    read_rows,
    rewrite_rows,
    row_line,
    write_csv,
)
from fastpp.workloads import WORKLOADS

__all__ = [
    "SweepGrid",
    "SweepPoint",
    "BestStaticTarget",
    "SweepPlan",
    "SweepResult",
    "PointExecutor",
    "SerialExecutor",
    "ProcessExecutor",
    "RayExecutor",
    "EXECUTORS",
    "make_executor",
    "evaluate_point",
    "plan_sweep",
    "execute_plan",
    "execute_plans",
    "run_sweep",
    "best_static_row",
    "grid_from_mapping",
    "load_grid_file",
    "SIMULATE_COLUMNS",
    "GOODPUT_COLUMNS",
    "TABLE_COLUMNS",
    "DEFAULT_STATIC_CHUNKS",
]

# The summary keys a simulate row keeps (fastpp.metrics.summarize plus run_simulation's).
SIMULATE_COLUMNS = (
    "completed",
    "num_rejected",
    "num_aborted",
    "num_unfinished",
    "request_throughput",
    "output_throughput",
    "total_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p90_tpot_ms",
    "p99_tpot_ms",
    "p90_itl_ms",
    "p90_e2e_latency_ms",
    "slo_attainment",
    "slo_met",
    "mean_bubble_fraction",
    "num_microbatches",
    "num_decode_sitouts",
    "kv_capacity_tokens",
    "sim_end_s",
)
GOODPUT_COLUMNS = (
    "goodput",
    "margin",
    "seed_goodputs",
    "attainment",
    "num_probes",
    "num_candidates",
    "reason",
)
TABLE_COLUMNS = AXIS_COLUMNS + SIMULATE_COLUMNS + GOODPUT_COLUMNS
EXECUTORS = ("process", "serial", "ray")

Progress = Callable[[int, int], None]  # (points done, points to run)


def evaluate_point(point: SweepPoint) -> dict[str, Any]:
    """Compute one point's row: its axes, then its metrics (no wall times: rows are seeded
    outputs only). Top-level and pure, so process pools and Ray can ship it by reference."""
    row = point.axes()
    workload, deployment = point.workload_config(), point.deployment_config()
    try:
        if point.metric == "simulate":
            summary = run_simulation(workload, deployment, record_iterations=False).summary
            row.update({k: _plain(summary.get(k)) for k in SIMULATE_COLUMNS})
        else:
            if point.protocol is not None:
                res = fixed_goodput(
                    workload,
                    deployment,
                    parse_protocol(point.protocol, point.num_requests),
                    seeds=point.seeds,
                    precision=point.precision,
                )
            else:
                res = slo_goodput(
                    workload,
                    deployment,
                    seeds=point.seeds,
                    num_requests=point.num_requests,
                    precision=point.precision,
                    require_steady=point.steady,
                )
            row.update(
                goodput=res.rate,
                margin=res.margin,
                seed_goodputs=list(res.seed_rates),
                attainment=res.attainment,
                num_probes=len(res.probes),
                reason=res.reason,
            )
    except ValueError as exc:
        raise ValueError(f"{point.describe()}: {exc}") from exc
    return row


def best_static_row(target: BestStaticTarget, rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The winner row of a best-static group from its candidates' rows (all must be present).

    Highest goodput wins; ties go to the higher attainment at that rate, then to the smaller
    chunk. When no candidate has positive goodput, no chunk is named and ``reason`` says so.
    """
    cands = [rows[c.point_id] for c in target.candidates]

    def rank(r: dict[str, Any]) -> tuple[float, float, int]:
        attainment = r.get("attainment")  # None (NaN on disk) when goodput is 0
        share = -1.0 if attainment is None or math.isnan(attainment) else float(attainment)
        return (float(r["goodput"] or 0.0), share, -int(r["chunk"]))

    best = max(cands, key=rank)
    row = target.axes()
    row.update(
        goodput=best["goodput"],
        margin=best["margin"],
        seed_goodputs=best.get("seed_goodputs"),
        attainment=best["attainment"],
        num_candidates=len(cands),
        reason="",
    )
    if (best["goodput"] or 0.0) > 0:
        row.update(policy=best["policy"], chunk=best["chunk"])
    else:
        row["reason"] = "no static chunk meets the SLO at any probed rate"
    return row


class PointExecutor(Protocol):
    """Runs points and yields their rows (``evaluate_point``) in completion order."""

    def run(self, points: Sequence[SweepPoint]) -> Iterator[dict[str, Any]]: ...


@dataclass(frozen=True, slots=True)
class SerialExecutor:
    """In this process, in grid order (the reference the parallel executors must match)."""

    def run(self, points: Sequence[SweepPoint]) -> Iterator[dict[str, Any]]:
        for point in points:
            yield evaluate_point(point)


@dataclass(frozen=True, slots=True)
class ProcessExecutor:
    """A pool of ``workers`` spawned processes (spawn, not fork: the parent may hold threads,
    e.g. the progress bar's, or a Ray driver). The first failing point cancels the rest."""

    workers: int = field(default_factory=lambda: os.cpu_count() or 1)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")

    def run(self, points: Sequence[SweepPoint]) -> Iterator[dict[str, Any]]:
        if not points:
            return
        workers = min(self.workers, len(points))
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            pending = {pool.submit(evaluate_point, p) for p in points}
            try:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        yield future.result()
            finally:  # an error, an interrupt or an abandoned generator: drop queued points
                for future in pending:
                    future.cancel()


@dataclass(frozen=True, slots=True)
class RayExecutor:
    """One Ray task per point on the cluster at ``address``. ``"auto"`` joins a running
    cluster and falls back to a local instance when none is running. A Ray session already
    initialized in this process is used as is and left running; one started here is shut down."""

    address: str = "auto"

    def __post_init__(self) -> None:
        if not self.address:
            raise ValueError("address must name a Ray cluster (host:port, ray://..., or auto)")

    def run(self, points: Sequence[SweepPoint]) -> Iterator[dict[str, Any]]:
        ray = _import_ray()
        started = not ray.is_initialized()
        if started:
            try:
                ray.init(address=self.address)
            except ConnectionError:
                if self.address != "auto":
                    raise
                ray.init()  # no running cluster: a local instance on this machine
        pending: list[Any] = []
        try:
            task = ray.remote(evaluate_point)
            pending = [task.remote(p) for p in points]
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                yield ray.get(done[0])
        finally:  # an error or an interrupt: cancel what is left, then leave the cluster
            for ref in pending:
                ray.cancel(ref)
            if started:
                ray.shutdown()


def make_executor(
    kind: str = "process", *, workers: int | None = None, ray_address: str | None = None
) -> PointExecutor:
    """The executor ``kind`` names (process | serial | ray). Checks that Ray is installed now,
    so a missing extra fails before any work."""
    if kind == "serial":
        return SerialExecutor()
    if kind == "process":
        return ProcessExecutor() if workers is None else ProcessExecutor(workers)
    if kind == "ray":
        if importlib.util.find_spec("ray") is None:
            raise ImportError("executor 'ray' needs Ray: pip install 'fastpp[ray]'")
        return RayExecutor() if ray_address is None else RayExecutor(ray_address)
    raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {kind!r}")


@dataclass(slots=True)
class SweepPlan:
    """A validated grid, what the output folder already holds, and what is left to run."""

    grid: SweepGrid
    out_dir: Path
    points: list[SweepPoint]  # every point, grid order
    targets: list[BestStaticTarget]  # best-static groups (empty unless metric best-static)
    rows: dict[str, dict[str, Any]]  # rows on disk by point_id (this grid's and others')
    todo: list[SweepPoint]  # points without a row yet, grid order
    notes: list[str] = field(default_factory=list)  # dropped lines, skipped points

    @property
    def num_skipped(self) -> int:
        """Points of the grid that already have a row (not run again)."""
        return len(self.points) - len(self.todo)


@dataclass(slots=True)
class SweepResult:
    """The finished table (this grid's rows, grid order) and where it was written."""

    rows: list[dict[str, Any]]
    num_points: int  # points in the grid (best-static rows not counted)
    num_run: int  # points computed by this call
    num_skipped: int  # points found in the output folder
    jsonl_path: Path
    csv_path: Path
    notes: list[str] = field(default_factory=list)

    @property
    def best_static(self) -> list[dict[str, Any]]:
        """The best-static winner rows (empty unless metric best-static)."""
        return [r for r in self.rows if r["metric"] == "best-static"]


def plan_sweep(grid: SweepGrid, out_dir: Path) -> SweepPlan:
    """Expand and validate ``grid`` (every distinct profile and scheduler is built once, cheaply),
    then read ``out_dir``'s results and list the points still to run. Raises ValueError naming
    the bad value or point before any simulation; cleans an interrupted JSONL's partial line."""
    points, targets = grid.expand()
    _validate(points)
    path = out_dir / RESULTS_JSONL
    rows, notes = read_rows(path)
    if notes or (path.exists() and not path.read_bytes().endswith(b"\n")):
        rewrite_rows(path, rows.values())  # drop bad lines now, so appends start on a fresh line
    todo = [p for p in points if p.point_id not in rows]
    if len(todo) < len(points):
        notes.append(
            f"resuming: {len(points) - len(todo)} of {len(points)} points already in {path}, skipped"
        )
    return SweepPlan(grid, out_dir, points, targets, rows, todo, notes)


def execute_plan(
    plan: SweepPlan, executor: PointExecutor | None = None, progress: Progress | None = None
) -> SweepResult:
    """Run ``plan.todo`` on ``executor`` (default: a process pool), appending each row as it
    completes; then add the best-static rows and write the sorted JSONL and the CSV."""
    return execute_plans([plan], executor, progress)[0]


def execute_plans(
    plans: Sequence[SweepPlan], executor: PointExecutor | None = None, progress: Progress | None = None
) -> list[SweepResult]:
    """``execute_plan`` for several plans through one executor run: every plan's points are
    handed over at once (a point two plans share runs once, its row goes to both), so a pool
    stays busy across grids instead of idling at the end of each. Rows are appended to their
    plans' JSONL files as they complete; then each plan's table is finished as ``execute_plan``
    finishes it. Results in the order of ``plans``."""
    owners: dict[str, list[SweepPlan]] = {}  # point id -> the plans waiting for its row
    todo: list[SweepPoint] = []
    for plan in plans:
        plan.out_dir.mkdir(parents=True, exist_ok=True)
        for point in plan.todo:
            if point.point_id not in owners:
                todo.append(point)
            owners.setdefault(point.point_id, []).append(plan)
    if progress is not None:
        progress(0, len(todo))
    if todo:
        with ExitStack() as stack:
            files = {
                id(plan): stack.enter_context((plan.out_dir / RESULTS_JSONL).open("a"))
                for plan in plans
                if plan.todo
            }
            for done, row in enumerate((executor or ProcessExecutor()).run(todo), start=1):
                waiting = owners.pop(row.get("point_id"), None)
                if waiting is None:
                    raise RuntimeError(f"executor returned a row for an unknown point: {row!r:.200}")
                row = json.loads(row_line(row))  # in memory exactly as on disk (inf, NaN: None)
                for plan in waiting:
                    plan.rows[row["point_id"]] = row
                    append_row(files[id(plan)], row)
                if progress is not None:
                    progress(done, len(todo))
    if owners:
        raise RuntimeError(f"executor finished without {len(owners)} of the points")
    return [_finish(plan, len(plan.todo)) for plan in plans]  # every point ran, or it raised


def _finish(plan: SweepPlan, num_run: int) -> SweepResult:
    """Add the best-static rows, then write the plan's sorted JSONL and its CSV."""
    jsonl, rows = plan.out_dir / RESULTS_JSONL, plan.rows
    for target in plan.targets:  # derived, cheap: always recomputed from the candidate rows
        rows[target.point_id] = best_static_row(target, rows)
    order = _grid_order(plan)
    table = [rows[i] for i in order]
    in_grid = set(order)
    others = [r for i, r in rows.items() if i not in in_grid]
    notes = list(plan.notes)
    if others:
        notes.append(f"kept {len(others)} rows of other grids found in {jsonl}")
    rewrite_rows(jsonl, table + others)
    csv_path = write_csv(table + others, plan.out_dir / RESULTS_CSV, TABLE_COLUMNS)
    return SweepResult(table, len(plan.points), num_run, plan.num_skipped, jsonl, csv_path, notes)


def run_sweep(
    grid: SweepGrid, out_dir: Path, executor: PointExecutor | None = None, progress: Progress | None = None
) -> SweepResult:
    """``plan_sweep`` then ``execute_plan``: the whole sweep in one call."""
    return execute_plan(plan_sweep(grid, out_dir), executor, progress)


def _grid_order(plan: SweepPlan) -> list[str]:
    """Point ids in grid order, each best-static row right after its group's candidates."""
    after = {t.candidates[-1].point_id: t.point_id for t in plan.targets}
    order: list[str] = []
    for p in plan.points:
        order.append(p.point_id)
        if p.point_id in after:
            order.append(after[p.point_id])
    return order


def _validate(points: Sequence[SweepPoint]) -> None:
    """Build each distinct workload sampler, profile and scheduler once: unknown names,
    missing data files, impossible splits and bad policy arguments fail here, before any run."""
    for name in dict.fromkeys(p.workload for p in points):
        if name in WORKLOADS and WORKLOADS[name].needs_data_dir:  # else random:IN:OUT
            WORKLOADS[name].make_sampler(None)
    profiles: dict[tuple, Any] = {}
    checked: set[tuple] = set()
    for p in points:
        key = (p.model, p.gpu, p.pp, p.tp, p.profile)
        try:
            if key not in profiles:
                profiles[key] = (
                    analytic_profile(*key[:4]) if p.profile is None else p.deployment_config().load_profile()
                )
            if key + (p.policy,) not in checked:
                build_scheduler(profiles[key], p.deployment_config())
                checked.add(key + (p.policy,))
        except ValueError as exc:
            raise ValueError(f"{p.deploy} {p.policy} {p.model} on {p.gpu}: {exc}") from None


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError("executor 'ray' needs Ray: pip install 'fastpp[ray]'") from exc
    return ray


def _plain(value: Any) -> Any:
    """numpy scalars as Python numbers, so rows serialize the same everywhere."""
    if isinstance(value, np.generic):
        return value.item()
    return value

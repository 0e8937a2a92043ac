"""Regenerate docs/RESULTS.md and docs/figures/: the paper's experiments (PAPER.md section 5)
reproduced in simulation.

    python scripts/make_results.py                # everything; sweeps cached in runs/results/
    python scripts/make_results.py --fresh        # ignore the cache
    FASTPP_NATIVE=1 python scripts/make_results.py --fresh   # with the compiled simulator
                                                  # (built by python -m fastpp.native_build)
    python scripts/make_results.py --rerun predictive --rerun slack
                                                  # drop those policies' cached rows first

Goodput grids run through `fastpp sweep`'s machinery (resumable: an interrupted run picks up
where it stopped), all of them handed to one pool of worker processes at the start, so the pool
stays busy across grids; the other experiments run in this process meanwhile. Every number in
RESULTS.md is written by this script from the runs it makes.

The cache is keyed by what a point measures (its axes and the goodput method), not by the code
that runs it: after a change to a policy, ``--rerun NAME`` drops the cached rows of every policy
spec whose chunk policy is NAME (``predictive`` also drops ``predictive+ds``), so only those
cells run again; after a change to the scheduler or the simulator, use ``--fresh``. Each
point's CPU time is recorded in the cache when it runs (``point_cpu.json``), so the page states
what the whole page costs, and what this run took from the cache.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import resource
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from fastpp import _native
from fastpp.scheduler_config import ADMISSION_RESERVES, DEFAULT_ADMISSION_RESERVE, QUEUE_ORDERS
from fastpp.sim import experiments as ex
from fastpp.sim import plots
from fastpp.sim.goodput import slo_goodput
from fastpp.sim.goodput_fixed import PRESETS
from fastpp.sim.overload import overload_throughput
from fastpp.sim.plan_bound import RequestLengths, capacity_bound
from fastpp.sim.plan_candidates import DEFAULT_STATIC_GRID, DeploymentCandidate, Layout
from fastpp.sim.planner import sample_lengths
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, parse_deployment
from fastpp.sim.sweep import SweepGrid, SweepPoint, evaluate_point, execute_plans, plan_sweep
from fastpp.sim.sweep_table import RESULTS_JSONL, read_rows, rewrite_rows

MODELS = ("Qwen2.5-32B", "Qwen2.5-14B")
WORKLOADS = ("azure-conv", "sharegpt-synthetic", "cnn-dailymail-synthetic", "cnn-reversed-synthetic")
# The static grid (the planner's default, as benchmarks/policy_targets.py uses it): every multiple
# of 128 up to 1024, then 1536 and 2048; "best static" (the paper's PP_static) is the best of it
# on a workload.
FINE_GRID = DEFAULT_STATIC_GRID
STATIC = {"Qwen2.5-32B": FINE_GRID, "Qwen2.5-14B": FINE_GRID}
DYNAMIC = ("greedy", "greedy:tile", "predictive", "predictive+ds", "slack")
DYNAMIC_LABEL = {
    "greedy": "greedy",
    "greedy:tile": "greedy:tile",
    "predictive": "predictive",
    "predictive+ds": "predictive+DS",
    "slack": "slack",
}


def systems(model: str) -> tuple[str, ...]:
    """Section 1's deployments for ``model``: TP=4 at SGLang's default chunk, PP=4 at every
    static chunk of its grid, PP=4 with each dynamic policy."""
    return (
        "tp4@static:2048",
        *(f"pp4@static:{c}" for c in STATIC[model]),
        *(f"pp4@{p}" for p in DYNAMIC),
    )


# Goodput bracket width, req/s, per model: about 4% of the goodputs each model reaches on this
# hardware. Seeds and probe lengths are `fastpp goodput`'s (fastpp.sim.goodput: seeds 0 and 1
# pooled, probes lengthened until settled, the answer confirmed on the longest look), so its
# answers are the CLI's.
PRECISION = {"Qwen2.5-32B": 0.25, "Qwen2.5-14B": 0.5}
# The paper's protocol (section 8): the workloads its artifact benchmarked that way, each with
# its preset of fastpp.sim.goodput_fixed (azure: 400 prompts per rate, cnn-reversed: 1,000;
# rates 1..11 req/s), refined by bisection to the model's precision; seeds 0..2 pooled.
FIXED = {"azure-conv": "azure", "cnn-reversed-synthetic": "cnn-reversed"}
FIXED_MODELS = ("Qwen2.5-32B",)
FIXED_SEEDS = (0, 1, 2)
# Section 8's admission and retraction variants on CNN-Reversed (SchedulerConfig's options; the
# section's main grid runs the defaults, DEFAULT_ADMISSION / newest_front): the reference's
# admission check counts only the launching slot's decodes ("slot") and it retracts the
# fewest-output request to the back; "all" counts every admitted request's remaining output.
DEFAULT_ADMISSION = DEFAULT_ADMISSION_RESERVE
OTHER_ADMISSION = next(a for a in ADMISSION_RESERVES if a != DEFAULT_ADMISSION)
DEFAULT_RETRACTION = "newest_front"
ADMISSION_VARIANTS = (
    (OTHER_ADMISSION, DEFAULT_RETRACTION),
    (DEFAULT_ADMISSION, "fewest_output_back"),
    (OTHER_ADMISSION, "fewest_output_back"),
)
ADMISSION_POLICIES = ("predictive", "predictive+ds", "slack")
# ... each under the fixed runs and in steady state (goodput_grid arguments)
ADMISSION_PROTOCOLS: dict[str, dict] = {
    "fixed": {"seeds": FIXED_SEEDS, "protocol": "cnn-reversed"},
    "steady": {},
}
# The static chunks among which every workload's best static chunk lies in section 1 (default
# admission, depth 0): the grid of the variant runs below, which change one setting
NEAR_BEST_STATIC = (128, 256, 384, 512)
# ... and the other admission in steady state on every workload (its CNN-Reversed policy rows are
# the steady OTHER_ADMISSION / newest_front variant above): those policies and NEAR_BEST_STATIC
OTHER_ADMISSION_SYSTEMS = (
    *(f"pp4@static:{c}" for c in NEAR_BEST_STATIC),
    *(f"pp4@{p}" for p in ADMISSION_POLICIES),
)
SLO_SCALES = (1.0, 0.8, 0.6, 0.4, 0.2)
SLO_SYSTEMS = ("tp4@static:2048", "pp4@static:512", "pp4@static:256", "pp4@predictive")
NVLINK_SYSTEMS = ("tp4@static:2048", "pp4@static:512", "pp4@predictive")
# Section 7: one microbatch in flight beyond the stages (--pp-async-batch-depth 1), Qwen2.5-32B on
# every workload: NEAR_BEST_STATIC and the dynamic policies that choose per microbatch.
ASYNC_DEPTH = 1
ASYNC_DEPTH_SYSTEMS = (*(f"pp4@static:{c}" for c in NEAR_BEST_STATIC), "pp4@predictive", "pp4@slack")
# Section 7: steady state under bursty (gamma) arrivals of these coefficients of variation,
# Qwen2.5-32B on azure-conv: the static chunks 256..1024 step 128 (where the best lies at every
# cv measured) and the two dynamic policies; in this process, beside the sweeps
BURSTY_CVS = (2.0, 4.0)
BURSTY_CHUNKS = tuple(range(256, 1025, 128))
BURSTY_POLICIES = ("predictive", "slack")


class Report:
    """Collects markdown parts by section number (written in that order, whatever order the
    experiments finish in) and figure paths."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.figures = out / "figures"
        self.figures.mkdir(parents=True, exist_ok=True)
        self.parts: list[tuple[int, str]] = []

    def add(self, section: int, text: str) -> None:
        self.parts.append((section, text.strip() + "\n"))

    def text(self) -> str:
        return "\n".join(text for _, text in sorted(self.parts, key=lambda part: part[0]))

    def fig(self, name: str) -> Path:
        return self.figures / name

    def image(self, name: str, alt: str) -> str:
        return f"![{alt}](figures/{name}.png)"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.2f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def goodput_grid(precision: float = 0.25, **axes) -> SweepGrid:
    return SweepGrid(metric="goodput", precision=precision, **axes)


def sweep_grids() -> dict[str, SweepGrid]:
    """Every goodput grid of the page by cache folder name, in the order the pool takes them:
    the 32B grids first (the page's main results), the small grids last."""
    grids = {
        f"goodput-{model}": goodput_grid(
            PRECISION[model], workloads=WORKLOADS, models=(model,), deployments=systems(model)
        )
        for model in MODELS[:1]
    }
    for model in FIXED_MODELS:
        for workload, preset in FIXED.items():
            grids[f"fixed-{preset}-{model}"] = goodput_grid(
                PRECISION[model],
                seeds=FIXED_SEEDS,
                workloads=(workload,),
                models=(model,),
                deployments=systems(model),
                protocol=preset,
            )
        grids[other_admission_grid_name(model)] = goodput_grid(
            PRECISION[model],
            workloads=WORKLOADS,
            models=(model,),
            deployments=OTHER_ADMISSION_SYSTEMS,
            admission_reserve=OTHER_ADMISSION,
        )
        for admission, retraction in ADMISSION_VARIANTS:
            for kind, protocol in ADMISSION_PROTOCOLS.items():
                if (kind, admission, retraction) == ("steady", OTHER_ADMISSION, DEFAULT_RETRACTION):
                    continue  # in other_admission_grid_name's grid
                grids[admission_grid_name(kind, model, admission, retraction)] = goodput_grid(
                    PRECISION[model],
                    workloads=("cnn-reversed-synthetic",),
                    models=(model,),
                    deployments=tuple(f"pp4@{p}" for p in ADMISSION_POLICIES),
                    admission_reserve=admission,
                    retraction=retraction,
                    **protocol,
                )
    for model in MODELS[1:]:
        grids[f"goodput-{model}"] = goodput_grid(
            PRECISION[model], workloads=WORKLOADS, models=(model,), deployments=systems(model)
        )
    grids["queue-order"] = goodput_grid(
        workloads=("azure-conv",),
        models=MODELS[:1],
        deployments=QUEUE_ORDER_SYSTEMS,
        queue_order="late_last",
    )
    grids["slo-scale"] = goodput_grid(
        workloads=("azure-conv",), slo_scales=SLO_SCALES, deployments=SLO_SYSTEMS
    )
    grids["nvlink"] = goodput_grid(
        workloads=("azure-conv",),
        gpus=("H100-SXM",),
        models=("Qwen2.5-32B", "Qwen2.5-72B"),
        deployments=NVLINK_SYSTEMS,
    )
    grids["async-depth"] = goodput_grid(
        PRECISION[MODELS[0]],
        workloads=WORKLOADS,
        models=MODELS[:1],
        deployments=ASYNC_DEPTH_SYSTEMS,
        async_batch_depth=ASYNC_DEPTH,
    )
    grids["predictor-goodput"] = goodput_grid(
        workloads=("azure-conv",), deployments=("pp4@predictive", "pp4@predictive:tokens")
    )
    return grids


# Section 1's steady state again under --queue-order late_last (32B, azure-conv): the static
# chunks around the best one and the dynamic policies that use the TTFT deadline.
QUEUE_ORDER_SYSTEMS = ("pp4@static:256", "pp4@static:384", "pp4@static:512", "pp4@predictive", "pp4@slack")


def queue_order_steady(sweeps: SweepsInBackground) -> str:
    """Steady-state goodput of QUEUE_ORDER_SYSTEMS under each queue order (fcfs: section 1's
    own grid)."""
    model, workload = MODELS[0], "azure-conv"
    fcfs = {system_of(r): r["goodput"] for r in sweeps.rows(f"goodput-{model}") if r["workload"] == workload}
    late = {system_of(r): r["goodput"] for r in sweeps.rows("queue-order")}
    rows = [
        [s.removeprefix("pp4@"), fcfs[s], late[s], f"{late[s] / fcfs[s] - 1:+.1%}"]
        for s in QUEUE_ORDER_SYSTEMS
    ]
    best_static = max((s for s in QUEUE_ORDER_SYSTEMS if "static" in s), key=lambda s: late[s])
    changes = [late[s] / fcfs[s] - 1 for s in QUEUE_ORDER_SYSTEMS]
    return (
        f"Steady state under `--queue-order late_last` ({model}, {workload}; section 6 and "
        "docs/POLICIES.md say what it does), beside the default fcfs of the table above:\n\n"
        + table(["system", "fcfs (req/s)", "late_last (req/s)", "change"], rows)
        + f"\n\nUnder late_last the best of these static chunks is {best_static.removeprefix('pp4@')} "
        f"({late[best_static]:.2f} req/s); slack {late['pp4@slack']:.2f}, predictive "
        f"{late['pp4@predictive']:.2f}. "
        + (
            "The queue order moves every one of these systems by the same step: it changes "
            "which requests of a queue excursion miss, not how fast the pipeline serves."
            if len({late[s] - fcfs[s] for s in QUEUE_ORDER_SYSTEMS}) == 1
            else f"Change per system: from {min(changes):+.1%} to {max(changes):+.1%}."
        )
    )


def admission_grid_name(kind: str, model: str, admission: str, retraction: str) -> str:
    """The cache folder of section 8's admission variant grids (``kind``: fixed or steady)."""
    return f"{kind}-cnn-reversed-{model}-{admission}-{retraction}"


def other_admission_grid_name(model: str) -> str:
    """The cache folder of section 8's steady-state grid under OTHER_ADMISSION
    (OTHER_ADMISSION_SYSTEMS on every workload)."""
    return f"steady-{OTHER_ADMISSION}-{model}"


def timed_point(point: SweepPoint) -> tuple[dict, float]:
    """``evaluate_point`` and the CPU seconds it took in the worker process."""
    cpu0 = time.process_time()
    row = evaluate_point(point)
    return row, time.process_time() - cpu0


class TimedProcessExecutor:
    """The sweep's process pool (spawned workers, rows in completion order, the first failure
    cancels the rest) that also records each point's CPU seconds in ``cpu`` by point id."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.cpu: dict[str, float] = {}

    def run(self, points: Sequence[SweepPoint]) -> Iterator[dict[str, Any]]:
        if not points:
            return
        with ProcessPoolExecutor(min(self.workers, len(points)), mp_context=get_context("spawn")) as pool:
            pending = {pool.submit(timed_point, p) for p in points}
            try:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        row, cpu = future.result()
                        self.cpu[row["point_id"]] = cpu
                        yield row
            finally:
                for future in pending:
                    future.cancel()


class PointCosts:
    """Each goodput point's CPU seconds, as measured when it ran, kept in the cache folder."""

    def __init__(self, cache: Path) -> None:
        self.path = cache / "point_cpu.json"
        self.cpu: dict[str, float] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def save(self, new: dict[str, float]) -> None:
        self.cpu.update(new)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.cpu, indent=0, sort_keys=True))
        os.replace(tmp, self.path)


def drop_cached(cache: Path, names: Sequence[str]) -> int:
    """Remove from every grid folder under ``cache`` the rows whose chunk policy is one of
    ``names`` (``predictive`` matches predictive, predictive+ds, predictive:tokens); returns
    how many rows went."""
    dropped = 0
    for path in sorted(cache.glob(f"*/{RESULTS_JSONL}")):
        rows, _ = read_rows(path)
        keep = [
            r
            for r in rows.values()
            if (r.get("policy") or "").split("+")[0].split(":")[0].strip() not in names
        ]
        dropped += len(rows) - len(keep)
        rewrite_rows(path, keep)
    return dropped


class SweepsInBackground:
    """All of the page's grids through one process pool, on a thread of this process while it
    runs the other experiments; ``rows(name)`` waits for the pool, then gives a grid's rows."""

    def __init__(self, cache: Path, workers: int) -> None:
        self.plans = {name: plan_sweep(grid, cache / name) for name, grid in sweep_grids().items()}
        self.executor = TimedProcessExecutor(workers)
        self.costs = PointCosts(cache)
        self.results: dict[str, list[dict]] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="sweeps", daemon=True)
        self.point_ids = {p.point_id for plan in self.plans.values() for p in plan.points}
        self.num_todo = len({p.point_id for plan in self.plans.values() for p in plan.todo})

    def start(self) -> None:
        print(
            f"  sweeps: {self.num_todo} of {len(self.point_ids)} goodput points to run on "
            f"{self.executor.workers} worker processes",
            flush=True,
        )
        self.thread.start()

    def _run(self) -> None:
        t0 = time.perf_counter()

        def progress(done: int, total: int) -> None:
            if done and (done % 10 == 0 or done == total):
                print(f"  sweeps: {done}/{total} points, {time.perf_counter() - t0:.0f} s", flush=True)
                self.costs.save(self.executor.cpu)

        try:
            names = list(self.plans)
            done = execute_plans([self.plans[n] for n in names], self.executor, progress)
            self.results = {n: r.rows for n, r in zip(names, done, strict=True)}
        except BaseException as exc:  # re-raised in the main thread by rows()
            self.error = exc
        finally:
            self.costs.save(self.executor.cpu)

    def rows(self, name: str) -> list[dict]:
        self.thread.join()
        if self.error is not None:
            raise RuntimeError(f"the goodput sweeps failed: {self.error}") from self.error
        return self.results[name]

    def cpu_of_all_points(self) -> tuple[float, int]:
        """CPU seconds of every point of the page as recorded, and how many have no record."""
        known = [self.costs.cpu[i] for i in self.point_ids if i in self.costs.cpu]
        return sum(known), len(self.point_ids) - len(known)


def system_of(row: dict) -> str:
    return f"{row['deploy']}@{row['policy']}"


HEADERS = (
    "workload",
    "TP=4 (C=2048)",
    "PP=4 C=2048",
    "PP=4 best static",
    *(f"PP=4 {DYNAMIC_LABEL[p]}" for p in DYNAMIC),
)


def best_static_chunk(goodput: dict, workload: str, chunks: Sequence[int]) -> tuple[int, dict[int, float]]:
    """The best of ``chunks`` on ``workload`` (highest goodput, the smaller chunk on a tie) and
    every one's goodput, from ``goodput`` keyed by (workload, system)."""
    static = {c: goodput[(workload, f"pp4@static:{c}")] for c in chunks}
    return max(chunks, key=lambda c: (static[c], -c)), static


def summarize_grid(model: str, rows: list[dict], workloads: Sequence[str]) -> dict[str, dict]:
    """Per workload: every static chunk's goodput, the best static chunk (highest goodput, the
    smaller chunk on a tie) and every system's goodput, by system (``pp4@slack``)."""
    g = {(r["workload"], system_of(r)): r["goodput"] for r in rows}
    open_top = {(r["workload"], system_of(r)) for r in rows if r["margin"] is None}  # inf on disk
    out = {}
    for w in workloads:
        best, static = best_static_chunk(g, w, STATIC[model])
        out[w] = {"static": static, "best": best, "best_goodput": static[best]}
        out[w].update({s: g[(w, s)] for s in systems(model)})
        out[w]["at_least"] = {s for s in systems(model) if (w, s) in open_top}
        if f"pp4@static:{best}" in out[w]["at_least"]:
            out[w]["at_least"].add("best_goodput")
    return out


def figure9_row(w: str, f: dict, steady: dict | None = None) -> list:
    """A Figure 9 table row; with ``steady``, every cell's steady-state goodput in brackets."""

    def cell(key: str) -> str:
        value = (">= " if key in f["at_least"] else "") + f"{f[key]:.2f}"
        if key == "best_goodput":
            value += f" (C={f['best']})"
        if steady is None:
            return value
        return value + (
            f" [{steady[key]:.2f}, C={steady['best']}]" if key == "best_goodput" else f" [{steady[key]:.2f}]"
        )

    keys = ("tp4@static:2048", "pp4@static:2048", "best_goodput", *(f"pp4@{p}" for p in DYNAMIC))
    return [w, *(cell(k) for k in keys)]


def figure9_bars(f_by_w: dict[str, dict]) -> list[dict]:
    bars = []
    for w, f in f_by_w.items():
        for label, value in (
            ("TP=4", f["tp4@static:2048"]),
            ("PP=4 C=2048", f["pp4@static:2048"]),
            ("PP=4 best static", f["best_goodput"]),
            *((f"PP=4 {DYNAMIC_LABEL[p]}", f[f"pp4@{p}"]) for p in DYNAMIC),
        ):
            bars.append({"workload": w.replace("-synthetic", ""), "system": label, "goodput": value})
    return bars


def at_least(f: dict, c: int) -> str:
    """Static chunk ``c``'s goodput; ">= x" when every rate the search tried passed."""
    return (">= " if f"pp4@static:{c}" in f["at_least"] else "") + f"{f['static'][c]:.2f}"


def static_table(model: str, f_by_w: dict[str, dict]) -> str:
    """Goodput of every static chunk of the grid, per workload (the best in bold)."""
    grid = STATIC[model]
    return table(
        ["workload", *(f"C={c}" for c in grid)],
        [
            [w, *(at_least(f, c) if c != f["best"] else f"**{at_least(f, c)}**" for c in grid)]
            for w, f in f_by_w.items()
        ],
    )


@functools.cache
def workload_lengths(workload: str) -> RequestLengths:
    """The planner's lengths sample of ``workload`` (drawn once per page)."""
    return RequestLengths.of(sample_lengths(WorkloadConfig(name=workload)))


def bound_of(model: str, workload: str, system: str) -> float:
    """The planner's bubble-free capacity bound (fastpp.sim.plan_bound, req/s) of ``system``
    (``pp4@static:384``) on ``workload``: the same profile, lengths sample and chunk ceiling."""
    pp, tp, policy = parse_deployment(system)
    assert policy is not None, system
    profile = DeploymentConfig(model=model, pp=pp, tp=tp, policy=policy).load_profile()
    lengths = workload_lengths(workload)
    ceiling = DeploymentCandidate(Layout(dp=1, tp=tp, pp=pp), policy).max_tokens()
    return capacity_bound(profile, lengths, ceiling).rate


def bound_share_table(model: str, f_by_w: dict[str, dict]) -> str:
    """Per workload and system: the share of its capacity bound the goodput reaches, and the
    bound (req/s)."""
    keys = ("tp4@static:2048", "pp4@static:2048", "best_goodput", *(f"pp4@{p}" for p in DYNAMIC))
    rows = []
    for w, f in f_by_w.items():
        row: list[object] = [w]
        for key in keys:
            system = f"pp4@static:{f['best']}" if key == "best_goodput" else key
            bound = bound_of(model, w, system)
            row.append(f"{f[key] / bound:.0%} of {bound:.2f}")
        rows.append(row)
    return table(HEADERS, rows)


def goodput_section(rep: Report, sweeps: SweepsInBackground) -> dict:
    """The paper's Figure 9 in steady state: goodput per workload and system, for 32B and 14B."""
    found: dict = {}
    body = []
    for model in MODELS:
        f_by_w = summarize_grid(model, sweeps.rows(f"goodput-{model}"), WORKLOADS)
        for w, f in f_by_w.items():
            found[(model, w)] = f
        name = f"goodput_{model.lower().replace('.', '')}"
        plots.goodput_bars(
            figure9_bars(f_by_w),
            rep.fig(name),
            title=f"{model}, 4 x A100-40GB PCIe, steady state: goodput (P90 TTFT 2 s, TPOT 200 ms)",
        )
        body.append(
            f"### {model}\n\n"
            + table(HEADERS, [figure9_row(w, f) for w, f in f_by_w.items()])
            + "\n\n"
            + rep.image(name, model)
            + f"\n\nEvery static chunk ({model}, req/s; the best in bold):\n\n"
            + static_table(model, f_by_w)
            + f"\n\nShare of the bubble-free capacity bound reached ({model}): goodput / bound, "
            "and the bound in req/s. The bound is the planner's (`fastpp.sim.plan_bound`, "
            "docs/PLANNER.md): the rate at which the busiest resource (a stage, the host loop "
            "or the KV pool) would be 100% busy, with no bubbles, queueing or SLO; a dynamic "
            "policy's chunk ceiling is its largest candidate.\n\n" + bound_share_table(model, f_by_w)
        )
        if model == MODELS[0]:
            body.append(queue_order_steady(sweeps))
    grids = {STATIC[m] for m in MODELS}
    grid_words = (
        f"C in {fmt_grid(FINE_GRID)}"
        if grids == {FINE_GRID}
        else "; ".join(f"{m.split('-')[-1]}: C in {fmt_grid(STATIC[m])}" for m in MODELS)
    )
    rep.add(
        1,
        "## 1. Goodput per workload and system (the paper's Figure 9), steady state\n\n"
        "Goodput = the highest Poisson rate (req/s) at which P90 TTFT <= 2 s and P90 TPOT <= "
        "200 ms, found by bracketing and bisection (to 0.25 req/s for 32B, 0.5 req/s for 14B), "
        "seeds 0 and 1 pooled at every probe, each probe lengthened until its P90 verdict "
        "has settled and checked for a steady queue, the answer confirmed on 12,000 "
        "requests per seed: `fastpp goodput`'s method (`--protocol steady`), by the same "
        "code (`fastpp.sim.goodput`, docs/GOODPUT.md). Best static = the best "
        f"static chunk of the grid on that workload (PP_static; {grid_words}). Section 8 "
        "gives the same systems under the paper's fixed-run protocol.\n\n" + "\n\n".join(body),
    )
    return found


def fmt_grid(grid: Sequence[int]) -> str:
    """(128, 256, ..., 1024, 1536, 2048) as "128..1024 step 128, 1536, 2048" where it runs so."""
    run = [c for c in grid if c <= 1024]
    if run == list(range(128, 1025, 128)):
        return "128..1024 step 128, " + ", ".join(str(c) for c in grid if c > 1024)
    return ", ".join(map(str, grid))


def fixed_protocol_section(rep: Report, sweeps: SweepsInBackground, found: dict) -> dict:
    """Section 1's systems under the paper's protocol (fastpp.sim.goodput_fixed presets), with
    retractions, parks and P99 TPOT of the CNN-Reversed fixed runs at each policy's goodput."""
    paper: dict = {"goodput": {}, "at_rate": {}, "admission": {}}
    body = []
    for model in FIXED_MODELS:
        f_by_w = {}
        for workload, preset in FIXED.items():
            f_by_w.update(summarize_grid(model, sweeps.rows(f"fixed-{preset}-{model}"), (workload,)))
        for w, f in f_by_w.items():
            paper["goodput"][(model, w)] = f
        name = f"goodput_fixed_{model.lower().replace('.', '')}"
        plots.goodput_bars(
            figure9_bars(f_by_w),
            rep.fig(name),
            title=f"{model}, 4 x A100-40GB PCIe, the paper's fixed runs: goodput",
        )
        headers = ("workload (prompts per rate)", *HEADERS[1:])
        rows = []
        for w, f in f_by_w.items():
            row = figure9_row(w, f, steady=found[(model, w)])
            row[0] = f"{w} ({PRESETS[FIXED[w]].num_requests:,})"
            rows.append(row)
        body.append(
            f"### {model}\n\n"
            + table(headers, rows)
            + "\n\n"
            + rep.image(name, f"{model}, fixed runs")
            + f"\n\nEvery static chunk ({model}, fixed runs, req/s; the best in bold):\n\n"
            + static_table(model, f_by_w)
        )
        cnnr = "cnn-reversed-synthetic"
        n = PRESETS[FIXED[cnnr]].num_requests
        at_rate = []
        for policy in ("predictive", "predictive+ds", "slack"):
            rate = f_by_w[cnnr][f"pp4@{policy}"]
            if rate <= 0:
                continue
            s = ex.pooled_summary(
                WorkloadConfig(name=cnnr, rate=rate, num_requests=n),
                DeploymentConfig(model=model, policy=policy),
                FIXED_SEEDS,
            )
            paper["at_rate"][(model, policy)] = s
            at_rate.append(
                [policy, rate, s["p90_tpot_ms"], s["p99_tpot_ms"], s["num_retractions"], s["num_parked"]]
            )
        body.append(
            f"CNN-Reversed fixed runs ({model}, {n:,} prompts, seeds "
            f"{', '.join(map(str, FIXED_SEEDS))} pooled) at each policy's own goodput rate:\n\n"
            + table(
                ["policy", "rate (req/s)", "P90 TPOT (ms)", "P99 TPOT (ms)", "retractions", "parks"], at_rate
            )
        )
        variants = admission_variants(model, sweeps, f_by_w[cnnr], found[(model, cnnr)])
        paper["admission"][model] = variants
        body.append(admission_words(model, n, variants))
        body.append(other_admission_words(model, sweeps, found, variants))
    presets = "; ".join(
        f"{w}: `--protocol {p}`, {PRESETS[p].num_requests:,} prompts per rate" for w, p in FIXED.items()
    )
    rates = PRESETS["azure"].rates
    rep.add(
        8,
        "## 8. Goodput under the paper's protocol (Figure 9 as the paper measured it)\n\n"
        "The paper's artifact measured goodput with fixed runs: N prompts sent at each rate of "
        f"a grid ({rates[0]:g}..{rates[-1]:g} req/s), the P90s recorded, goodput = the highest "
        "rate up to which every rate meets P90 TTFT <= 2 s and P90 TPOT <= 200 ms; it ran "
        f"that way on Azure conversations and on CNN-Reversed. Here: {presets} "
        "(`fastpp goodput --protocol azure|cnn-reversed`, `fastpp.sim.goodput_fixed`, "
        "docs/GOODPUT.md), the bracket between the last rate that passes and the first that "
        "fails bisected with the same fixed runs to "
        + ", ".join(f"{PRECISION[m]:g} req/s ({m})" for m in FIXED_MODELS)
        + ", seeds "
        f"{', '.join(map(str, FIXED_SEEDS))} pooled at every rate. In square brackets: section 1's "
        'steady-state goodput of the same system; ">= x": every rate of the grid passes. '
        "A fixed run can end before its queue or, on a decode-heavy "
        "load, its KV cache has filled, so it credits rates that a longer run does not "
        "sustain; compare fixed-run numbers only at the same N.\n\n" + "\n\n".join(body),
    )
    return paper


def admission_variants(model: str, sweeps: SweepsInBackground, fixed: dict, steady: dict) -> dict:
    """CNN-Reversed goodput per (admission, retraction) and policy under the fixed runs, with
    retractions and P99 TPOT of the pooled fixed runs at that goodput, and in steady state:
    {(adm, ret): {policy: dict}}. ``fixed`` / ``steady``: the defaults' summarized grids."""
    cnnr = "cnn-reversed-synthetic"
    n = PRESETS[FIXED[cnnr]].num_requests

    def goodputs(kind: str, admission: str, retraction: str, default: dict) -> dict:
        if (admission, retraction) == (DEFAULT_ADMISSION, DEFAULT_RETRACTION):
            return {p: (default[f"pp4@{p}"], f"pp4@{p}" in default["at_least"]) for p in ADMISSION_POLICIES}
        if (kind, admission, retraction) == ("steady", OTHER_ADMISSION, DEFAULT_RETRACTION):
            rows = [r for r in sweeps.rows(other_admission_grid_name(model)) if r["workload"] == cnnr]
        else:
            rows = sweeps.rows(admission_grid_name(kind, model, admission, retraction))
        return {
            r["policy"]: (r["goodput"], r["margin"] is None)
            for r in rows
            if r["policy"] in ADMISSION_POLICIES
        }

    out: dict = {}
    for admission, retraction in ((DEFAULT_ADMISSION, DEFAULT_RETRACTION), *ADMISSION_VARIANTS):
        in_steady = goodputs("steady", admission, retraction, steady)
        cells = {}
        for policy, (rate, open_top) in goodputs("fixed", admission, retraction, fixed).items():
            s = {}
            if rate > 0:
                s = ex.pooled_summary(
                    WorkloadConfig(name=cnnr, rate=rate, num_requests=n),
                    DeploymentConfig(
                        model=model, policy=policy, admission_reserve=admission, retraction=retraction
                    ),
                    FIXED_SEEDS,
                )
            cells[policy] = {"goodput": rate, "open_top": open_top, "steady": in_steady[policy][0], **s}
        out[(admission, retraction)] = cells
    return out


def admission_words(model: str, n: int, variants: dict) -> str:
    """Section 8's admission/retraction table and what it says about the defaults."""

    def g(c: dict) -> str:
        return (">= " if c["open_top"] else "") + f"{c['goodput']:.2f}"

    rows = []
    for (admission, retraction), cells in variants.items():
        a, b, c = cells["predictive"], cells["predictive+ds"], cells["slack"]
        ratio = "n/a"
        if a["goodput"] > 0:
            ratio = (">= " if b["open_top"] else "") + f"{b['goodput'] / a['goodput']:.2f}x"
        rows.append(
            [
                f"{admission} / {retraction}",
                g(a),
                g(b),
                ratio,
                f"{a.get('num_retractions', 0)} / {b.get('num_retractions', 0)}",
                f"{a.get('p99_tpot_ms', 0):.0f} / {b.get('p99_tpot_ms', 0):.0f}",
                g(c),
                f"{a['steady']:.2f} / {b['steady']:.2f} / {c['steady']:.2f}",
            ]
        )
    front = variants[(DEFAULT_ADMISSION, DEFAULT_RETRACTION)]
    back = variants[(DEFAULT_ADMISSION, "fewest_output_back")]
    gain = max(back[p]["goodput"] - front[p]["goodput"] for p in ADMISSION_POLICIES)
    retraction = (
        f"Retraction to the back, fewest output first (with {DEFAULT_ADMISSION} admission), changes "
        f"the fixed-run goodput by at most {gain:+.2f} req/s and retracts "
        f"{total_retractions(back) - total_retractions(front):+d} requests over the three policies' runs"
        + (f", so the default stays `{DEFAULT_RETRACTION}`." if gain <= 0 else ".")
    )
    return (
        f"Admission and retraction (CNN-Reversed, {model}; fixed runs of {n:,} prompts, seeds "
        f"{', '.join(map(str, FIXED_SEEDS))} pooled, and steady state as section 1). Admission "
        f"`slot`{default_mark('slot')} counts only the launching slot's decodes, as the "
        f"reference's check does; `all`{default_mark('all')} keeps free a share of the remaining "
        "output of every admitted request, running, in flight or parked. Retraction "
        f"`newest_front`{default_mark('newest_front')} retracts the slot's newest request to the "
        f"front of the queue; `fewest_output_back`{default_mark('fewest_output_back')} the one "
        "with the fewest generated tokens to the back, as the reference. `fastpp goodput "
        f"--protocol cnn-reversed --admission {OTHER_ADMISSION} --retraction fewest_output_back` "
        "runs a row. "
        "Retractions and P99 TPOT are those of the pooled fixed runs at each policy's goodput "
        "rate (predictive / predictive+DS):\n\n"
        + table(
            [
                "admission / retraction",
                "predictive",
                "predictive+DS",
                "DS gain",
                "retractions",
                "P99 TPOT (ms)",
                "slack",
                "steady state (predictive / +DS / slack)",
            ],
            rows,
        )
        + f"\n\n{retraction}"
    )


def default_mark(option: str) -> str:
    """`` (the default)`` after the name of the default admission or retraction, else nothing."""
    return " (the default)" if option in (DEFAULT_ADMISSION, DEFAULT_RETRACTION) else ""


def total_retractions(cells: dict) -> int:
    """Retractions of ADMISSION_POLICIES' pooled fixed runs at their goodput rates (one
    admission_variants cell)."""
    return sum(cells[p].get("num_retractions", 0) for p in ADMISSION_POLICIES)


def p99_tpot_span(cells: dict) -> str:
    """The lowest and highest P99 TPOT of ADMISSION_POLICIES' fixed runs in one
    admission_variants cell, ms."""
    values = [cells[p].get("p99_tpot_ms", 0) for p in ADMISSION_POLICIES]
    return f"{min(values):.0f}..{max(values):.0f}"


def other_admission_words(model: str, sweeps: SweepsInBackground, found: dict, variants: dict) -> str:
    """Section 8's steady state under OTHER_ADMISSION on every workload beside the default's
    (section 1), and what it says about the default admission."""
    grid_rows = sweeps.rows(other_admission_grid_name(model))
    other = {(r["workload"], system_of(r)): r["goodput"] for r in grid_rows}
    rows, changes = [], []
    for w in WORKLOADS:
        base = found[(model, w)]
        best, static = best_static_chunk(other, w, NEAR_BEST_STATIC)
        row = [w, f"{base['best_goodput']:.2f} (C={base['best']}) / {static[best]:.2f} (C={best})"]
        changes.append((f"best static on {w}", static[best] - base["best_goodput"]))
        for p in ADMISSION_POLICIES:
            before, after = base[f"pp4@{p}"], other[(w, f"pp4@{p}")]
            row.append(f"{before:.2f} / {after:.2f}")
            changes.append((f"{p} on {w}", after - before))
        rows.append(row)
    outside = [w for w in WORKLOADS if found[(model, w)]["best"] not in NEAR_BEST_STATIC]
    steps = {name: round(d / step(model), 1) for name, d in changes}
    lowered = [v for v in steps.values() if v <= -1]
    most = -min(lowered, default=0.0)  # the largest drop, in search steps
    raised = [f"{name} ({v:+g} steps)" for name, v in steps.items() if v >= 1]
    base_cells = variants[(DEFAULT_ADMISSION, DEFAULT_RETRACTION)]
    other_cells = variants[(OTHER_ADMISSION, DEFAULT_RETRACTION)]
    cost = (
        f"at the CNN-Reversed fixed runs' goodput rates `{DEFAULT_ADMISSION}` retracts "
        f"{total_retractions(base_cells)} requests (work a real engine recomputes) where "
        f"`{OTHER_ADMISSION}` retracts {total_retractions(other_cells)}, with P99 TPOT "
        f"{p99_tpot_span(base_cells)} ms against {p99_tpot_span(other_cells)} ms"
    )
    other_higher = any(other_cells[p]["goodput"] > base_cells[p]["goodput"] for p in ADMISSION_POLICIES)
    if raised or other_higher:
        verdict = (
            f"`{OTHER_ADMISSION}` admission raises "
            + (", ".join(raised) if raised else "a fixed-run goodput (the table above)")
            + f" over the default `{DEFAULT_ADMISSION}`; {cost}."
        )
    else:
        verdict = (
            f"`{OTHER_ADMISSION}` admission raises none of these {len(steps)} goodputs by a step or "
            f"more and lowers {len(lowered)} of them by one step or more"
            + (f" (at most {most:g} step{'' if most == 1 else 's'})" if lowered else "")
            + f"; {cost}. `{DEFAULT_ADMISSION}` is the default because its goodput is never lower, "
            f"in steady state or in the fixed runs (the table above). `--admission {OTHER_ADMISSION}` "
            "is the choice when recomputed work counts more than goodput. The fixed runs credit "
            "slot admission more than the steady state does because a finite run ends before the "
            "requests admitted beyond the cache's room have all been retracted and recomputed."
        )
    grid = "..".join(map(str, (NEAR_BEST_STATIC[0], NEAR_BEST_STATIC[-1])))
    return (
        f"`{OTHER_ADMISSION}` admission in steady state on every workload ({model}; section 1's "
        f"method, `fastpp goodput -w W -d pp4@predictive --admission {OTHER_ADMISSION}`), req/s as "
        f"{DEFAULT_ADMISSION} (the default) / {OTHER_ADMISSION}. The static column: section 1's best "
        f"static chunk / the best of C = {grid} step 128 under {OTHER_ADMISSION}"
        + (
            f" (every workload's best static chunk under `{DEFAULT_ADMISSION}` is one of these)"
            if not outside
            else f" (the best static chunk under `{DEFAULT_ADMISSION}` lies outside it on "
            f"{', '.join(outside)})"
        )
        + ":\n\n"
        + table(
            ["workload", "best static", *(DYNAMIC_LABEL[p] for p in ADMISSION_POLICIES)],
            rows,
        )
        + f"\n\n{verdict}"
    )


def beat_section(rep: Report) -> dict:
    wl = WorkloadConfig(rate=4.0, num_requests=1000)
    deps = [DeploymentConfig(policy=p) for p in ("static:2048", "static:512", "greedy", "predictive")]
    runs = ex.run_rows(wl, deps, record_iterations=True)
    rows = [ex.iteration_time(r) for r in runs]
    plots.stage_timeline(
        [it.to_dict() for it in runs[0].result.iterations],
        rep.fig("timeline_static2048"),
        num_stages=4,
        title="PP=4 C=2048: the 40 stage-0 microbatches with most prefill",
    )
    plots.stage_timeline(
        [it.to_dict() for it in runs[-1].result.iterations],
        rep.fig("timeline_predictive"),
        num_stages=4,
        title="PP=4 predictive: the same kind of window",
    )
    ratio = rows[-1]["p90_beat_ms"] / rows[0]["p90_beat_ms"]
    rep.add(
        2,
        "## 2. Pipeline beat (stage-iteration time) per policy\n\n"
        f"{wl.describe()}, Qwen2.5-32B PP=4 on A100-40GB PCIe. The beat is the slowest stage's "
        "time for each microbatch.\n\n"
        + table(
            ["policy", "P50 beat (ms)", "P90 beat (ms)", "P99 beat (ms)", "mean stage idle"],
            [
                [
                    r["policy"],
                    r["p50_beat_ms"],
                    r["p90_beat_ms"],
                    r["p99_beat_ms"],
                    f"{r['mean_bubble_fraction']:.1%}",
                ]
                for r in rows
            ],
        )
        + f"\n\nPredictive / static 2048 P90 beat: {ratio:.2f}.\n\n"
        + rep.image("timeline_static2048", "timeline C=2048")
        + "\n"
        + rep.image("timeline_predictive", "timeline predictive"),
    )
    return {"beat_ratio": ratio}


PREDICTOR_RUN = WorkloadConfig(rate=5.0, num_requests=800)  # the ablation's one simulated run


def predictor_ablation() -> tuple[list[dict], list[dict]]:
    """Beat prediction errors of each predictor, with exact stage times and with 3% noise."""
    dep = DeploymentConfig(policy="predictive")
    return (
        ex.predictor_ablation(PREDICTOR_RUN, dep),
        ex.predictor_ablation(PREDICTOR_RUN, dep, noise_cv=0.03),
    )


def predictor_section(
    rep: Report, sweeps: SweepsInBackground, ablation: tuple[list[dict], list[dict]]
) -> dict:
    wl, (exact, noisy) = PREDICTOR_RUN, ablation
    rows = sweeps.rows("predictor-goodput")
    gp = {r["policy"]: r["goodput"] for r in rows}
    rep.add(
        3,
        "## 3. Predictor ablation\n\n"
        f"Beat prediction error on one simulated run ({wl.describe()}, PP=4 predictive), "
        "second half of the microbatches; online predictors start with no attention "
        "coefficients and learn by RLS; the tree is fitted on the first half.\n\n"
        + table(
            ["predictor", "MAPE, exact stage times", "MAPE, stage times with 3% noise"],
            [
                [a["predictor"], f"{a['mape']:.2%}", f"{b['mape']:.2%}"]
                for a, b in zip(exact, noisy, strict=True)
            ],
        )
        + f"\n\nGoodput on azure-conv with the ALP predictor: {gp['predictive']:.2f} req/s; "
        f"with the tokens-only predictor: {gp['predictive:tokens']:.2f} req/s.\n\n"
        "Read with care: the simulator's stage cost is a table plus exactly the attention "
        "terms ALP uses, so with exact stage times ALP learns it almost perfectly; that "
        "measures the cost model, not a GPU; the column with 3% noise is the fairer "
        "comparison. "
        + (
            "As in the paper, the better predictor does not change goodput: the controller's "
            "decisions sit on 128-token candidates, and both predictors rank the candidates alike."
            if gp["predictive"] == gp["predictive:tokens"]
            else f"Goodput differs by {gp['predictive'] - gp['predictive:tokens']:+.2f} req/s "
            "(ALP - tokens-only)."
        ),
    )
    return {"mape": {a["predictor"]: a["mape"] for a in noisy}, "gp": gp}


def slo_section(rep: Report, sweeps: SweepsInBackground) -> dict:
    scales = SLO_SCALES
    rows = sweeps.rows("slo-scale")
    for r in rows:
        r["system"] = system_of(r)
    plots.attainment_vs_slo_scale(
        rows,
        rep.fig("slo_scale"),
        metric="goodput",
        title="azure-conv, Qwen2.5-32B: goodput as the SLO tightens",
    )
    systems = list(dict.fromkeys(system_of(r) for r in rows))
    by = {(system_of(r), r["slo_scale"]): r for r in rows}
    rep.add(
        4,
        "## 4. SLO scaled from 1.0 down to 0.2\n\nGoodput (req/s) on azure-conv, Qwen2.5-32B "
        "on 4 x A100-40GB PCIe; scale s means P90 TTFT <= 2 s x s and P90 TPOT <= 200 ms x s."
        "\n\n"
        + table(
            ["system", *(f"x{s}" for s in scales)],
            [[s, *(by[(s, c)]["goodput"] for c in scales)] for s in systems],
        )
        + "\n\n"
        + "\n".join(f"- {s} at x0.2: {by[(s, 0.2)]['reason'] or 'feasible'}" for s in systems)
        + "\n\n"
        + rep.image("slo_scale", "goodput vs SLO scale"),
    )
    return {s: by[(s, 0.2)]["goodput"] for s in systems}


def ds_section(rep: Report) -> dict:
    cases = [("Qwen2.5-14B", 12.0), ("Qwen2.5-32B", 8.0)]
    out_rows, found = [], {}
    for model, rate in cases:
        wl = WorkloadConfig(name="cnn-reversed-synthetic", rate=rate, num_requests=1500)
        runs = ex.run_rows(
            wl, [DeploymentConfig(model=model, policy=p) for p in ("predictive", "predictive+ds")]
        )
        a, b = (ex.latency_row(r) for r in runs)
        found[model] = (a, b)
        for r in (a, b):
            out_rows.append(
                [
                    model,
                    f"{rate:g}",
                    r["policy"],
                    r["mean_e2e_latency_ms"] / 1e3,
                    r["p99_e2e_latency_ms"] / 1e3,
                    r["p90_tpot_ms"],
                    r["p99_tpot_ms"],
                    r["num_parked"],
                ]
            )
    rep.add(
        5,
        "## 5. Delay scheduling on a decode-heavy load\n\ncnn-reversed-synthetic (65 in / 884 "
        "out), 1,500 requests, PP=4 on 4 x A100-40GB PCIe, at a rate above the first DS tier "
        "(more than 512 running requests).\n\n"
        + table(
            [
                "model",
                "rate",
                "policy",
                "mean E2E (s)",
                "P99 E2E (s)",
                "P90 TPOT (ms)",
                "P99 TPOT (ms)",
                "parks",
            ],
            out_rows,
        ),
    )
    return found


def replay_section(rep: Report) -> dict:
    wl = WorkloadConfig(replay="azure-conv", replay_window_s=900, replay_speed=REPLAY_SPEED)
    pols = ("static:2048", "static:512", "greedy", "greedy:tile", "predictive", "predictive+ds", "slack")
    deps = [DeploymentConfig(pp=1, tp=4)] + [DeploymentConfig(policy=p) for p in pols]
    runs = ex.run_rows(wl, deps, record_iterations=True)
    rows = [ex.latency_row(r) for r in runs]
    label = [f"{r.deployment.label} {r.deployment.policy}" for r in runs]
    more = queue_order_runs(runs)
    reqs = {lbl: [x.to_dict() for x in r.result.records] for lbl, r in zip(label, runs, strict=True)}
    for metric, slo in (("ttft", 2000.0), ("tpot", 200.0)):
        plots.latency_cdf(
            reqs,
            rep.fig(f"replay_cdf_{metric}"),
            metric=metric,
            slo_ms=slo,
            log_x=metric == "ttft",
            title=f"Azure conv replay: {metric.upper()} CDF",
        )
    plots.chunk_over_time(
        {
            lbl: [it.to_dict() for it in r.result.iterations]
            for lbl, r in zip(label, runs, strict=True)
            if r.deployment.policy in ("greedy", "predictive")
        },
        rep.fig("replay_chunk"),
        title="chunk budget over the replay",
    )
    rep.add(
        6,
        "## 6. Replay of the real Azure conversation trace\n\n"
        f"{wl.describe()} ({rows[0]['num_requests']} requests), Qwen2.5-32B on 4 x A100-40GB "
        "PCIe. Per-request attainment = share of requests meeting both SLOs themselves.\n\n"
        + table(
            ["system", "attainment", "P90 TTFT (ms)", "P90 TPOT (ms)", "mean E2E (s)"],
            [
                [
                    lbl,
                    f"{r['slo_attainment']:.1%}",
                    r["p90_ttft_ms"],
                    r["p90_tpot_ms"],
                    r["mean_e2e_latency_ms"] / 1e3,
                ]
                for lbl, r in zip(label, rows, strict=True)
            ],
        )
        + "\n\n"
        + replay_words(wl, runs, label, rows)
        + "\n\n"
        + " ".join(rep.image(n, n) for n in ("replay_cdf_ttft", "replay_cdf_tpot", "replay_chunk"))
        + "\n\n"
        + overload_replay(more)
        + "\n\n"
        + queue_order_replay(more),
    )
    return dict(zip(label, rows, strict=True))


REPLAY_SPEED = 0.9
OVERLOAD_SPEED = 1.2
OVERLOAD_POLICIES = (
    "static:384",
    "static:512",
    "greedy",
    "greedy:tile",
    "predictive",
    "predictive+ds",
    "slack",
)
QUEUE_ORDER_SPEEDS = (REPLAY_SPEED, OVERLOAD_SPEED)
ReplayCells = dict[tuple[str, float, str], Any]  # (policy, speed, queue order) -> SimulationRun


def queue_order_runs(made: list) -> ReplayCells:
    """Every OVERLOAD_POLICIES replay (PP=4) at each of QUEUE_ORDER_SPEEDS under each queue
    order. ``made``: the runs section 6's first table already made at REPLAY_SPEED; those of
    the same deployment are taken as they are, not run again."""
    cells: ReplayCells = {
        (r.deployment.policy, REPLAY_SPEED, r.deployment.queue_order): r
        for r in made
        if r.deployment.policy in OVERLOAD_POLICIES
        and r.deployment == DeploymentConfig(policy=r.deployment.policy)
    }
    for speed in QUEUE_ORDER_SPEEDS:
        wl = WorkloadConfig(replay="azure-conv", replay_window_s=900, replay_speed=speed)
        deps = [
            DeploymentConfig(policy=p, queue_order=q)
            for q in QUEUE_ORDERS
            for p in OVERLOAD_POLICIES
            if (p, speed, q) not in cells
        ]
        for run in ex.run_rows(wl, deps):
            cells[(run.deployment.policy, speed, run.deployment.queue_order)] = run
    return cells


def overload_replay(cells: ReplayCells) -> str:
    """The same window replayed faster than PP=4 sustains at its busiest: what each policy
    saves when some requests must miss."""
    by = {p: ex.latency_row(cells[(p, OVERLOAD_SPEED, "fcfs")]) for p in OVERLOAD_POLICIES}
    best = max(OVERLOAD_POLICIES, key=lambda p: by[p]["slo_attainment"])
    statics = [p for p in OVERLOAD_POLICIES if p.startswith("static:")]
    best_static = max(statics, key=lambda p: by[p]["slo_attainment"])
    return (
        f"At {OVERLOAD_SPEED:g}x ({by[best]['num_requests']} requests), more than PP=4 sustains "
        "in the trace's busiest minutes:\n\n"
        + table(
            ["system", "attainment", "P90 TTFT (ms)", "P90 TPOT (ms)", "mean E2E (s)"],
            [
                [
                    f"pp4 {p}",
                    f"{r['slo_attainment']:.1%}",
                    f"{r['p90_ttft_ms']:.0f}",
                    f"{r['p90_tpot_ms']:.0f}",
                    f"{r['mean_e2e_latency_ms'] / 1e3:.1f}",
                ]
                for p, r in by.items()
            ],
        )
        + f"\n\nHighest attainment: pp4 {best} ({by[best]['slo_attainment']:.1%}); the best static "
        f"chunk pp4 {best_static} {by[best_static]['slo_attainment']:.1%}."
    )


def queue_order_replay(runs: ReplayCells) -> str:
    """Both replays under each queue order (SchedulerConfig.queue_order): attainment, and the
    TTFT tail that late_last pays for it."""
    cells = {key: run.summary for key, run in runs.items()}
    header = ["system"]
    for speed in QUEUE_ORDER_SPEEDS:
        header += [f"{speed:g}x attainment ({' / '.join(QUEUE_ORDERS)})", f"{speed:g}x P99 TTFT (s)"]
    rows = []
    for p in OVERLOAD_POLICIES:
        row = [f"pp4 {p}"]
        for speed in QUEUE_ORDER_SPEEDS:
            row.append(" / ".join(f"{cells[(p, speed, q)]['slo_attainment']:.1%}" for q in QUEUE_ORDERS))
            row.append(" / ".join(f"{cells[(p, speed, q)]['p99_ttft_ms'] / 1e3:.1f}" for q in QUEUE_ORDERS))
        rows.append(row)
    top = OVERLOAD_SPEED
    gains = [
        cells[(p, top, "late_last")]["slo_attainment"] - cells[(p, top, "fcfs")]["slo_attainment"]
        for p in OVERLOAD_POLICIES
    ]
    best = max(OVERLOAD_POLICIES, key=lambda p: cells[(p, top, "late_last")]["slo_attainment"])
    return (
        "The queue order (`--queue-order`, docs/POLICIES.md): `late_last` lets a request that has "
        "waited past the SLO TTFT without its first token wait behind those that can still meet "
        "theirs, for at most 10 x the SLO TTFT. Each cell: fcfs / late_last.\n\n"
        + table(header, rows)
        + f"\n\nAt {top:g}x late_last changes attainment by {min(gains) * 100:+.1f} to "
        f"{max(gains) * 100:+.1f} percentage points across these policies; the highest is pp4 {best} with "
        f"{cells[(best, top, 'late_last')]['slo_attainment']:.1%}. The requests it puts last wait "
        "longer: the P99 TTFT columns."
    )


def replay_words(wl: WorkloadConfig, runs: list, label: list[str], rows: list[dict]) -> str:
    """What the replay table shows, in words computed from it."""
    arrivals = sorted(r.arrived_at for r in runs[0].result.records)
    peak, j = 0, 0
    for i, t in enumerate(arrivals):  # the most arrivals in any 60 s window
        while arrivals[j] < t - 60.0:
            j += 1
        peak = max(peak, i - j + 1)
    by = dict(zip(label, rows, strict=True))
    good = [lbl for lbl, r in by.items() if r["slo_attainment"] >= 0.95]
    poor = [lbl for lbl, r in by.items() if r["slo_attainment"] < 0.95]
    low_tpot = min(by, key=lambda lbl: by[lbl]["p90_tpot_ms"])
    low_e2e = min(by, key=lambda lbl: by[lbl]["mean_e2e_latency_ms"])
    parks = by.get("pp4 predictive+ds", {}).get("num_parked")
    words = (
        f"At {wl.replay_speed:g}x the trace's busiest minute brings {peak / 60:.1f} req/s. "
        f"At least 95% of requests within both SLOs: {', '.join(good) or 'none'}; below 95%: "
        f"{', '.join(poor) or 'none'}. Lowest P90 TPOT: {low_tpot}; lowest mean E2E: {low_e2e}."
    )
    if parks is not None:
        words += f" Delay scheduling parks {parks} decodes over the replay."
    ref = by.get("pp4 static:512")
    if ref is not None:
        dynamic = [lbl for lbl in by if lbl.startswith("pp4 ") and not lbl.startswith("pp4 static:")]
        ahead = [
            lbl
            for lbl in dynamic
            if by[lbl]["slo_attainment"] >= ref["slo_attainment"]
            and by[lbl]["p90_tpot_ms"] < ref["p90_tpot_ms"]
            and by[lbl]["mean_e2e_latency_ms"] < ref["mean_e2e_latency_ms"]
        ]
        behind = [lbl for lbl in dynamic if lbl not in ahead]
        words += (
            " At least static:512's attainment with a lower P90 TPOT and mean E2E: "
            f"{', '.join(ahead) or 'none'}; not: {', '.join(behind) or 'none'}."
        )
    return words


def nvlink_section(rep: Report, sweeps: SweepsInBackground) -> dict:
    rows = sweeps.rows("nvlink")
    by = {(r["model"], system_of(r)): r["goodput"] for r in rows}
    nv = NVLINK_SYSTEMS
    models = ("Qwen2.5-32B", "Qwen2.5-72B")
    pp_more = [m for m in models if max(by[(m, s)] for s in nv[1:]) > by[(m, "tp4@static:2048")]]
    rep.add(
        7,
        "## 7. Beyond the paper: NVLink (4 x H100 SXM) and a larger model\n\nGoodput (req/s) "
        "on azure-conv.\n\n"
        + table(["model", *nv], [[m, *(by[(m, s)] for s in nv)] for m in models])
        + "\n\nOn NVLink the all-reduces that sink TP on PCIe cost little in the analytic "
        "profile (docs/CALIBRATION.md); a PP=4 system serves more than TP=4 on "
        f"{' and '.join(pp_more) or 'neither model'}. This is a prediction of the model: the "
        "paper did not measure NVLink, and the all-reduce constants here are fitted on "
        "vidur's NVLink measurements, not on SGLang.",
    )
    return by


def async_depth_section(rep: Report, sweeps: SweepsInBackground, found: dict) -> None:
    """Section 7: steady-state goodput at ASYNC_DEPTH microbatches in flight beyond the stages
    beside section 1's (depth 0), Qwen2.5-32B."""
    model = MODELS[0]
    deep = {(r["workload"], system_of(r)): r["goodput"] for r in sweeps.rows("async-depth")}
    rows, gains, larger, behind = [], [], [], []
    for w in WORKLOADS:
        base = found[(model, w)]
        best, static = best_static_chunk(deep, w, NEAR_BEST_STATIC)
        if best > base["best"]:
            larger.append(w)
        for p in ("predictive", "slack"):
            gap = static[best] - deep[(w, f"pp4@{p}")]
            if gap > step(model) + 1e-9:
                behind.append(f"{p} on {w} ({deep[(w, f'pp4@{p}')]:.2f} vs {static[best]:.2f})")
        top0 = max(base["best_goodput"], base["pp4@predictive"], base["pp4@slack"])
        top1 = max(static[best], deep[(w, "pp4@predictive")], deep[(w, "pp4@slack")])
        gains.append((w, top1 / top0 - 1))
        rows.append(
            [
                w,
                f"{base['best_goodput']:.2f} (C={base['best']}) / {static[best]:.2f} (C={best})",
                f"{base['pp4@predictive']:.2f} / {deep[(w, 'pp4@predictive')]:.2f}",
                f"{base['pp4@slack']:.2f} / {deep[(w, 'pp4@slack')]:.2f}",
                f"{top1 / top0 - 1:+.1%}",
            ]
        )
    grid = "..".join(map(str, (NEAR_BEST_STATIC[0], NEAR_BEST_STATIC[-1])))
    lo, hi = min(g for _, g in gains), max(g for _, g in gains)
    rep.add(
        7,
        f"### One more microbatch in flight\n\nSGLang's `--pp-async-batch-depth N` keeps pp + N "
        "microbatches in flight, so a slot's next microbatch can wait at stage 0 while its tokens "
        "travel back to the host; the simulator runs it as pp + N scheduler slots (`fastpp "
        f"goodput --pp-async-batch-depth {ASYNC_DEPTH}`). Steady-state goodput ({model}, 4 x "
        f"A100-40GB PCIe, PP=4, section 1's method), req/s as depth 0 (section 1) / depth "
        f"{ASYNC_DEPTH}; the static column: section 1's best static chunk / the best of C = "
        f"{grid} step 128 at depth {ASYNC_DEPTH}; the last column: the best of these systems at "
        f"depth {ASYNC_DEPTH} against the best at depth 0.\n\n"
        + table(["workload", "best static", "predictive", "slack", "best, depth 1 vs 0"], rows)
        + f"\n\nThe extra microbatch changes the best goodput by {lo:+.1%} to {hi:+.1%} across "
        "these workloads. A decode now waits for pp + 1 microbatches per token, so each "
        "microbatch carries less prefill for the same TPOT"
        + (
            ": the best static chunk at depth 1 is nowhere larger than at depth 0. "
            if not larger
            else f"; the best static chunk is larger at depth 1 on {', '.join(larger)}. "
        )
        + (
            "At depth 1 the dynamic policies stay within one search step of the best static chunk "
            "on every workload. "
            if not behind
            else "At depth 1 a dynamic policy falls more than one search step below the best "
            f"static chunk: {'; '.join(behind)}. "
        )
        + "A prediction of the model, not measured on GPUs.",
    )


def bursty_goodput() -> dict[tuple[float, str], float]:
    """Steady-state goodput (section 1's method) under gamma arrivals of each BURSTY_CVS, by
    (cv, policy spec), Qwen2.5-32B on azure-conv."""
    model = MODELS[0]
    out = {}
    for cv in BURSTY_CVS:
        wl = WorkloadConfig(arrival="gamma", cv=cv)
        for policy in (*(f"static:{c}" for c in BURSTY_CHUNKS), *BURSTY_POLICIES):
            res = slo_goodput(wl, DeploymentConfig(model=model, policy=policy), precision=PRECISION[model])
            out[(cv, policy)] = res.rate
    return out


def bursty_section(rep: Report, bursty: dict[tuple[float, str], float], found: dict) -> None:
    """Section 7: BURSTY_CVS beside section 1's Poisson arrivals (cv 1)."""
    model, w = MODELS[0], "azure-conv"
    base = found[(model, w)]
    rows, behind, ahead, chunks = [], [], [], []
    for cv in (1.0, *BURSTY_CVS):
        if cv == 1.0:
            goodput = {(w, f"pp4@static:{c}"): base["static"][c] for c in BURSTY_CHUNKS}
            dyn = {p: base[f"pp4@{p}"] for p in BURSTY_POLICIES}
        else:
            goodput = {(w, f"pp4@static:{c}"): bursty[(cv, f"static:{c}")] for c in BURSTY_CHUNKS}
            dyn = {p: bursty[(cv, p)] for p in BURSTY_POLICIES}
        best, static = best_static_chunk(goodput, w, BURSTY_CHUNKS)
        chunks.append(best)
        for p, g in dyn.items():
            if g < static[best] - step(model) - 1e-9:
                behind.append(f"{p} at cv {cv:g} ({g:.2f} vs {static[best]:.2f})")
            if g >= 1.05 * static[best]:
                ahead.append(f"{p} at cv {cv:g} ({g / static[best] - 1:+.1%})")
        rows.append(
            [
                f"{cv:g}" + (" (Poisson, section 1)" if cv == 1.0 else ""),
                f"{static[best]:.2f} (C={best})",
                *(f"{dyn[p]:.2f} ({dyn[p] / static[best] - 1:+.1%})" for p in BURSTY_POLICIES),
            ]
        )
    grid = f"{BURSTY_CHUNKS[0]}..{BURSTY_CHUNKS[-1]}"
    rep.add(
        7,
        "### Bursty arrivals\n\nSteady-state goodput under gamma arrivals, whose gaps have "
        "the coefficient of variation cv (1 is Poisson; `fastpp goodput --arrival gamma --cv "
        f"4`): {model} on {w}, 4 x A100-40GB PCIe, PP=4, section 1's method; the static column: "
        f"the best of C = {grid} step 128 at that cv; in brackets, against it.\n\n"
        + table(["cv", "best static", *BURSTY_POLICIES], rows)
        + "\n\n"
        + (
            "The burstier the arrivals, the larger the best static chunk "
            f"(C = {', '.join(map(str, chunks))} at cv {', '.join(f'{c:g}' for c in (1.0, *BURSTY_CVS))}). "
            if chunks == sorted(chunks) and chunks[-1] > chunks[0]
            else f"Best static chunk per cv: {', '.join(map(str, chunks))}. "
        )
        + (
            f"More than one search step below the best static chunk: {'; '.join(behind)}. For "
            "traffic that bursty, search the static chunks under it (`fastpp goodput --arrival "
            "gamma --cv CV -d pp4@static:C ...`) rather than relying on a dynamic policy. "
            if behind
            else "The dynamic policies stay within one search step of the best static chunk at every cv. "
        )
        + (f"At least 5% ahead: {'; '.join(ahead)}. " if ahead else "")
        + "A prediction of the model, not measured on GPUs.",
    )


def tpot_at_best_static(rep: Report, found: dict) -> dict:
    """At the best static chunk's goodput rate (azure-conv, 32B), the predictive and slack
    policies' P90 TPOT and mean E2E against the best static chunk's (2 seeds pooled)."""
    f = found[("Qwen2.5-32B", "azure-conv")]
    rate, best = f["static"][f["best"]], f["best"]
    wl = WorkloadConfig(rate=rate, num_requests=max(300, int(120 * rate)))
    out = {}
    for policy in (f"static:{best}", "predictive", "slack"):
        out[policy] = ex.pooled_summary(wl, DeploymentConfig(policy=policy), (0, 1))
    a, b, c = out[f"static:{best}"], out["predictive"], out["slack"]
    rep.add(
        1,
        f"At the best static chunk's goodput rate ({rate:.2f} req/s, C={best}; azure-conv, "
        "Qwen2.5-32B, seeds 0 and 1 pooled):\n\n"
        + table(
            ["policy", "P90 TTFT (ms)", "P90 TPOT (ms)", "mean E2E (s)", "attainment"],
            [
                [
                    p,
                    s["p90_ttft_ms"],
                    s["p90_tpot_ms"],
                    s["mean_e2e_latency_ms"] / 1e3,
                    f"{s['slo_attainment']:.1%}",
                ]
                for p, s in out.items()
            ],
        ),
    )
    return {
        "tpot": (a["p90_tpot_ms"], b["p90_tpot_ms"], c["p90_tpot_ms"]),
        "e2e": (a["mean_e2e_latency_ms"], b["mean_e2e_latency_ms"], c["mean_e2e_latency_ms"]),
    }


def verdict(ok: bool) -> str:
    return "**agrees**" if ok else "**does not agree**"


def gv(f: dict, key: str) -> str:
    """A goodput of a summarized grid for the text: ">= x" where every rate tried passed."""
    return (">= " if key in f["at_least"] else "") + f"{f[key]:.2f}"


def step(model: str) -> float:
    """One search step of ``model``'s goodput (its bracket width, req/s)."""
    return PRECISION[model]


# Section 9: throughput under overload (fastpp.sim.overload), per model and workload: the best
# static chunk of section 1 and the dynamic policies below, OVERLOAD_REQUESTS requests served as a
# backlog (all at t = 0) and as Poisson arrivals at OVERLOAD_RATE_RATIO x the best static chunk's
# goodput (above every system's overload throughput measured)
OVERLOAD_POLICIES_9 = ("predictive", "slack")
OVERLOAD_REQUESTS = 6000
OVERLOAD_RATE_RATIO = 1.5


def overload_section(rep: Report, found: dict) -> dict:
    """Section 9: each system's completion rate while its queue never empties, and the share of
    it that the steady-state goodput of section 1 reaches."""
    out: dict = {}
    body = []
    for model in MODELS:
        rows = []
        for w in WORKLOADS:
            f = found[(model, w)]
            rate = OVERLOAD_RATE_RATIO * f["best_goodput"]
            wl = WorkloadConfig(name=w, num_requests=OVERLOAD_REQUESTS)
            cells = {}
            for policy in (f"static:{f['best']}", *OVERLOAD_POLICIES_9):
                dep = DeploymentConfig(policy=policy, model=model)
                cells[policy] = (overload_throughput(wl, dep), overload_throughput(wl, dep, rate))
            out[(model, w)] = {"rate": rate, "best": f["best"], "cells": cells}

            best = cells[f"static:{f['best']}"]
            static, mine = best[1].rate, cells["slack"][1].rate
            rows.append(
                [
                    w,
                    f"{overload_cell(best)} (C={f['best']})",
                    *(overload_cell(cells[p]) for p in OVERLOAD_POLICIES_9),
                    f"{f['best_goodput'] / static:.0%}",
                    f"{f['pp4@slack'] / mine:.0%}",
                    f"{1.05 * f['best_goodput'] / mine:.0%}",
                ]
            )
        body.append(
            f"### {model}\n\n"
            + table(
                [
                    "workload",
                    "best static: backlog / overload",
                    *(f"{p}: backlog / overload" for p in OVERLOAD_POLICIES_9),
                    "best static goodput / its overload",
                    "slack goodput / its overload",
                    "+5% over best static / slack's overload",
                ],
                rows,
            )
        )
    rep.add(
        9,
        "## 9. Throughput under overload\n\n"
        "How many requests per second each system completes while its queue never empties "
        "(`fastpp.sim.overload.overload_throughput`, docs/GOODPUT.md): the completions between "
        "the first and the third quartile of the completion times, past the KV cache's filling "
        f"and before the drain. {OVERLOAD_REQUESTS:,} requests of the workload, seed 0, PP=4 "
        "on 4 x A100-40GB PCIe, served as a backlog (all at t = 0: a batch job) and under "
        f"sustained overload (Poisson arrivals at {OVERLOAD_RATE_RATIO:g} x the best static "
        'chunk\'s goodput of section 1); req/s, "(drained)" where the queue emptied inside the '
        "window. Goodput (section 1) is the rate a system sustains within the SLO; this is the "
        "rate it sustains at all, so goodput / overload throughput is the share queueing leaves "
        "it. The last column is what a policy's goodput 5% above the best static chunk's would "
        "be as a share of slack's own overload throughput.\n\n"
        + "\n\n".join(body)
        + "\n\n"
        + overload_words(out, found),
    )
    return out


def overload_cell(pair: tuple) -> str:
    """ "backlog / overload" req/s, each marked where its queue emptied inside the window."""
    return " / ".join(f"{t.rate:.2f}" + ("" if t.saturated else " (drained)") for t in pair)


def overload_words(out: dict, found: dict) -> str:
    """What section 9's tables show, in words computed from them."""
    gaps = []
    for (model, w), o in out.items():
        static = o["cells"][f"static:{o['best']}"]
        for policy in OVERLOAD_POLICIES_9:
            for kind, i in (("backlog", 0), ("overload", 1)):
                gaps.append((o["cells"][policy][i].rate / static[i].rate - 1, policy, model, w, kind))
    worst = {p: min(g for g in gaps if g[1] == p) for p in OVERLOAD_POLICIES_9}
    shares = [found[k]["best_goodput"] / o["cells"][f"static:{o['best']}"][1].rate for k, o in out.items()]
    need = {k: 1.05 * found[k]["best_goodput"] / o["cells"]["slack"][1].rate for k, o in out.items()}
    k_min = min(need, key=need.__getitem__)
    return (
        "Against the best static chunk, the lowest overload or backlog throughput: "
        + "; ".join(f"{p} {g:+.1%} ({m} {w}, {kind})" for p, (g, _, m, w, kind) in worst.items())
        + f". The best static chunk's goodput is {min(shares):.0%}..{max(shares):.0%} of its "
        "throughput under overload. A goodput 5% above it would be at least "
        f"{need[k_min]:.0%} of slack's overload throughput ({k_min[0]} {k_min[1]}), and "
        f"{max(need.values()):.0%} where it is most: a chunk policy gains goodput only by "
        "shrinking the share queueing takes, or by completing more under overload."
    )


def findings(found: dict, tpot: dict, beat: dict, slo: dict, ds: dict, paper: dict) -> str:
    lines = ["## Findings against the paper (its section 5)\n"]
    lines.append(
        "Steady state = section 1 (`fastpp goodput`, the sustained rate); the paper's protocol "
        "= section 8 (fixed runs of 400 prompts per rate on azure-conv, 1,000 on "
        "cnn-reversed-synthetic). Best static = the best chunk of the static grid (section 1). "
        '"Matches" means within one search step (0.25 req/s for 32B, 0.5 req/s for 14B).\n'
    )
    wide = []
    for model in MODELS:
        for w in ("azure-conv", "cnn-dailymail-synthetic"):
            f = found[(model, w)]
            wide.append((model, w, f))
    ok = all(f["best_goodput"] > 1.3 * f["tp4@static:2048"] for *_, f in wide)
    fixed = paper["goodput"]
    fixed_tp = [(m, f) for (m, w), f in fixed.items() if w == "azure-conv"]
    line = (
        f"1. Tuned PP beats TP on PCIe by a wide margin on prefill-heavy loads: {verdict(ok)}. "
        "Steady state: "
        + "; ".join(
            f"{m} {w}: best static {gv(f, 'best_goodput')} vs TP {gv(f, 'tp4@static:2048')} req/s"
            for m, w, f in wide
        )
        + "."
    )
    if fixed_tp:
        line += (
            " The paper's protocol, azure-conv: "
            + "; ".join(
                f"{m}: PP_static / TP = {gv(f, 'best_goodput')} / {gv(f, 'tp4@static:2048')}"
                + (f" = {f['best_goodput'] / f['tp4@static:2048']:.2f}" if f["tp4@static:2048"] > 0 else "")
                for m, f in fixed_tp
            )
            + " (the paper: 2.38)."
        )
    lines.append(line)

    def matches(model: str, f: dict, key: str) -> bool:
        return f[key] >= f["best_goodput"] - step(model)

    ok_steady = all(matches(m, f, "pp4@predictive") for (m, _), f in found.items())
    ok_fixed = all(matches(m, f, "pp4@predictive") for (m, _), f in fixed.items())

    def versus(table_: dict, key: str, other: str = "best_goodput") -> str:
        return "; ".join(f"{m} {w}: {gv(f, key)} vs {gv(f, other)}" for (m, w), f in table_.items())

    (ta, tb, _), (ea, eb, _) = tpot["tpot"], tpot["e2e"]
    cuts = tb < 0.9 * ta and eb < 0.9 * ea
    lines.append(
        "2. Predictive DCP matches or adds a little goodput over the tuned static chunk and "
        f"cuts TPOT and E2E: steady state {verdict(ok_steady and cuts)}, the paper's protocol "
        f"{verdict(ok_fixed)}. Goodput predictive vs best static, steady state: "
        + versus(found, "pp4@predictive")
        + "; the paper's protocol: "
        + versus(fixed, "pp4@predictive")
        + f". At the best static chunk's steady-state goodput rate (32B, azure-conv) P90 TPOT "
        f"{tb:.0f} vs {ta:.0f} ms and mean E2E {eb / 1e3:.1f} vs {ea / 1e3:.1f} s (predictive "
        "vs best static)."
    )

    ds_gain = lambda f: f["pp4@predictive+ds"] > 1.1 * f["pp4@predictive"]  # noqa: E731
    ok_steady = all(ds_gain(f) for (_, w), f in found.items() if w == "cnn-reversed-synthetic")
    fixed_cnnr = [(m, f) for (m, w), f in fixed.items() if w == "cnn-reversed-synthetic"]
    ok_fixed = all(ds_gain(f) for _, f in fixed_cnnr)
    line = (
        "3. DS adds a large gain on CNN-Reversed and nothing on prefill-heavy loads: steady state "
        f"{verdict(ok_steady)}, the paper's protocol {verdict(ok_fixed)}. Goodput with vs "
        "without DS, steady state: "
        + versus(found, "pp4@predictive+ds", "pp4@predictive")
        + ". The paper's protocol, cnn-reversed-synthetic: "
        + "; ".join(
            f"{m}: {gv(f, 'pp4@predictive+ds')} vs {gv(f, 'pp4@predictive')}"
            + (f" = {f['pp4@predictive+ds'] / f['pp4@predictive']:.2f}x" if f["pp4@predictive"] > 0 else "")
            for m, f in fixed_cnnr
        )
        + " (the paper: 1.41x)"
    )
    for m, *_ in fixed_cnnr:
        a, b = paper["at_rate"].get((m, "predictive")), paper["at_rate"].get((m, "predictive+ds"))
        if a and b:
            line += (
                f"; at each one's goodput rate, retractions {a['num_retractions']} vs "
                f"{b['num_retractions']} and P99 TPOT {a['p99_tpot_ms']:.0f} vs {b['p99_tpot_ms']:.0f} ms "
                "(predictive vs predictive+DS, section 8)"
            )
    for m, variants in paper["admission"].items():
        for (adm, ret), cells in variants.items():
            a, b = cells["predictive"], cells["predictive+ds"]
            if (adm, ret) != (OTHER_ADMISSION, DEFAULT_RETRACTION) or a["goodput"] <= 0:
                continue
            line += (
                f"; {m}, admission {adm} (section 8): "
                f"{'>= ' if b['open_top'] else ''}{b['goodput']:.2f} vs {a['goodput']:.2f} = "
                f"{'>= ' if b['open_top'] else ''}{b['goodput'] / a['goodput']:.2f}x, retractions "
                f"{a.get('num_retractions', 0)} vs {b.get('num_retractions', 0)}, P99 TPOT "
                f"{a.get('p99_tpot_ms', 0):.0f} vs {b.get('p99_tpot_ms', 0):.0f} ms"
            )
    lines.append(line + ". " + DS_WHY)
    for model, (a, b) in ds.items():
        lines.append(
            f"   Above the first DS tier ({model}, section 5): DS moves mean E2E "
            f"{a['mean_e2e_latency_ms'] / 1e3:.1f} -> {b['mean_e2e_latency_ms'] / 1e3:.1f} s "
            f"and P99 TPOT {a['p99_tpot_ms']:.0f} -> {b['p99_tpot_ms']:.0f} ms (the paper: "
            "E2E falls, P99 TPOT about 15% worse)."
        )
    lines.append(
        f"4. P90 iteration time drops by more than half: {verdict(beat['beat_ratio'] < 0.5)} "
        f"(predictive / static 2048 P90 beat = {beat['beat_ratio']:.2f})."
    )
    bests = {(m, w): found[(m, w)]["best"] for (m, w) in found}
    differ = [w for w in WORKLOADS if bests[("Qwen2.5-32B", w)] != bests[("Qwen2.5-14B", w)]]
    lines.append(
        f"5. The best static chunk differs between 14B and 32B: {verdict(bool(differ))} ("
        + "; ".join(
            f"{w}: 32B C={bests[('Qwen2.5-32B', w)]}, 14B C={bests[('Qwen2.5-14B', w)]}" for w in WORKLOADS
        )
        + ")."
    )
    pp_zero = all(v == 0 for s, v in slo.items() if s.startswith("pp4"))
    lines.append(
        f"6. At 0.2x the SLO every PP scheme has zero goodput: {verdict(pp_zero)} ("
        + "; ".join(f"{s}: {v:.2f}" for s, v in slo.items())
        + ")."
    )
    loses = [(m, w) for (m, w), f in found.items() if f["pp4@static:2048"] < f["tp4@static:2048"]]
    lines.append(
        f"7. Untuned PP (chunk 2048) can lose to TP: {verdict(bool(loses))} ("
        + ", ".join(f"{m} {w}" for m, w in loses)
        + ")."
    )
    (_, _, tc), (_, _, ec) = tpot["tpot"], tpot["e2e"]

    def vs_best(table_: dict) -> str:
        return "; ".join(
            f"{m} {w}: {gv(f, 'pp4@slack')} vs {gv(f, 'best_goodput')}"
            + (f" ({f['pp4@slack'] / f['best_goodput'] - 1:+.1%})" if f["best_goodput"] > 0 else "")
            for (m, w), f in table_.items()
        )

    lines.append(
        "8. Beyond the paper: the slack policy (docs/POLICIES.md) against the best static chunk. "
        "Steady state: "
        + vs_best(found)
        + ". The paper's protocol: "
        + vs_best(fixed)
        + f". At the best static chunk's steady-state goodput rate (32B, azure-conv) P90 TPOT "
        f"{tc:.0f} vs {ta:.0f} ms and mean E2E {ec / 1e3:.1f} vs {ea / 1e3:.1f} s."
    )
    return "\n".join(lines)


DS_WHY = (
    "DS parks the decodes of a microbatch slot that holds more than a 128-token tile, so it "
    "acts only when more requests run at once than the first tier (128 x D_p = 512 on PP=4) "
    "and the KV cache holds them; section 5 runs above that tier."
)

HEADER = """# Results: the paper's experiments in simulation

Regenerate everything on this page (tables and figures) with one command:

    python -m fastpp.native_build      # optional: the compiled simulator, about twice as fast
    FASTPP_NATIVE=1 python scripts/make_results.py --fresh    # (without the build: no FASTPP_NATIVE)

{cost} Hardware model: the
analytic profiles of `fastpp.sim.analytic` (docs/CALIBRATION.md: GEMM efficiency fitted on
measured A100/H100 operator tables, PCIe and NVLink constants, and the assumptions for
attention, sampling, host overhead 3 ms per launch and token return 5 ms per microbatch). No
constant is tuned to make a result come out. Workloads other than the Azure trace are
synthetic distributions with the paper's mean lengths (the real datasets are not available
offline). SLO: P90 TTFT <= 2 s and P90 TPOT <= 200 ms unless stated.
"""


def cost_words(wall: float, cpu: float, build: str, sweeps: SweepsInBackground) -> str:
    """The run's wall and CPU time, and what the whole page costs in CPU time."""
    cores = f"{os.cpu_count()}-core {platform.machine()} CPU"
    built = (
        "the simulator's hot path compiled (FASTPP_NATIVE=1)"
        if build == "compiled"
        else "pure Python (no compiled build)"
    )
    words = (
        f"The run that wrote this page took {wall / 60:.1f} min of wall time on a {cores} "
        f"({cpu / 60:.1f} min of CPU time, all processes), {built}"
    )
    total = len(sweeps.point_ids)
    if sweeps.num_todo == total:
        return words + f", running all {total} goodput points."
    points_cpu, unknown = sweeps.cpu_of_all_points()
    words += (
        f"; it ran {sweeps.num_todo} of the page's {total} goodput points and took the others "
        "from the cache (runs/results/)."
    )
    if not unknown:
        words += (
            f" The {total} points cost {points_cpu / 60:.0f} min of CPU time together, each as "
            "measured when it ran; a `--fresh` run adds this process's experiments to that."
        )
    return words


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("docs"))
    ap.add_argument("--cache", type=Path, default=Path("runs/results"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--fresh", action="store_true", help="delete the sweep cache first")
    ap.add_argument(
        "--rerun",
        action="append",
        default=[],
        metavar="POLICY",
        help="drop the cached rows of this chunk policy first (repeatable), e.g. after changing it",
    )
    args = ap.parse_args()
    if args.fresh and args.cache.exists():
        shutil.rmtree(args.cache)
    if args.rerun:
        print(f"dropped {drop_cached(args.cache, args.rerun)} cached rows of {', '.join(args.rerun)}")
    build = "compiled" if _native.status().startswith("on:") else "python"
    print(f"simulator build: {_native.status()}", flush=True)
    t0 = time.perf_counter()
    rep = Report(args.out)
    sweeps = SweepsInBackground(args.cache, args.workers)
    sweeps.start()
    print(
        "beat, predictor ablation, DS, replay, bursty arrivals (in this process, beside the sweeps) ...",
        flush=True,
    )
    beat = beat_section(rep)
    ablation = predictor_ablation()
    ds = ds_section(rep)
    replay_section(rep)
    bursty = bursty_goodput()
    print("goodput tables (waiting for the sweeps) ...", flush=True)
    found = goodput_section(rep, sweeps)
    tpot = tpot_at_best_static(rep, found)
    predictor_section(rep, sweeps, ablation)
    slo = slo_section(rep, sweeps)
    nvlink_section(rep, sweeps)
    async_depth_section(rep, sweeps, found)
    bursty_section(rep, bursty, found)
    paper = fixed_protocol_section(rep, sweeps, found)
    print("throughput under overload ...", flush=True)
    overload_section(rep, found)
    wall = time.perf_counter() - t0
    cpu = sum(
        u.ru_utime + u.ru_stime
        for u in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )
    text = HEADER.format(cost=cost_words(wall, cpu, build, sweeps))
    text += "\n" + findings(found, tpot, beat, slo, ds, paper) + "\n\n" + rep.text()
    (args.out / "RESULTS.md").write_text(text)
    print(f"wrote {args.out / 'RESULTS.md'} in {wall:.0f} s ({cpu:.0f} s CPU)")


if __name__ == "__main__":
    main()

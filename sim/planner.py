"""``plan_deployment``: which layout, policy and balancer serve the most requests per second
within the SLO on N GPUs, and how close each comes to its bubble-free capacity.

Scenario: "8 x H100, Qwen2.5-32B, this traffic, P90 TTFT 2 s and TPOT 200 ms: TP x PP x
replicas, which chunk policy, and how many req/s?" The planner

1. lists the layouts dp x tp x pp = N that fit memory (``plan_candidates``; the others with
   the reason), times the policy grid, times the async batch depths asked for (SGLang's
   ``--pp-async-batch-depth``; pipelined layouts only), times the queue orders asked for
   (fcfs, late_last);
2. bounds each candidate from the cost model (``plan_bound``: the rate at which the busiest
   stage, the host or the KV pool would be 100% busy) and searches the layouts in order of
   their highest bound, within a layout the dynamic policies first, then the static chunks by
   bound, each ``+ds`` candidate before its twin without delay scheduling (``search_order``);
3. searches each with the goodput search of ``fastpp goodput`` on one replica (``plan_job``),
   skipping a candidate whose bound is below the best goodput found (it cannot win),
   stopping a candidate's search as soon as it fails at a rate no higher than the best
   goodput found (after one probe when it starts there), and giving a candidate
   the row of its ``+ds`` twin when that twin's delay scheduling never moved a decode (then
   both ran the very same simulations: delay scheduling only acts by parking and restoring);
4. reports, per candidate, goodput, goodput per GPU, the share of the bound reached, the limit
   that binds at goodput and the latency at an operating point below it (``plan_result``).

Jobs run in this process, a process pool or on Ray (``plan_exec``). With ``out_dir`` every
finished job's row is appended to ``OUT/plan.jsonl`` and reused by a later plan with the same
inputs (resumable, like sweeps).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fastpp.policies import make_policies
from fastpp.policies.base import NoBalancer
from fastpp.profile import ModelShape, Profile, load_profile
from fastpp.profile_names import resolve_profile
from fastpp.sim.analytic import analytic_profile
from fastpp.sim.engine import HOST_LOOPS
from fastpp.sim.goodput import GOODPUT_METHOD
from fastpp.sim.hardware import GPUS, GpuSpec, calibration_note, resolve_gpu
from fastpp.sim.models import MODELS, resolve_model
from fastpp.sim.plan_bound import RequestLengths, capacity_bound
from fastpp.sim.plan_candidates import (
    DeploymentCandidate,
    Layout,
    LayoutExclusion,
    LayoutFit,
    PolicyGrid,
    enumerate_layouts,
    profile_layouts,
)
from fastpp.sim.plan_exec import JobRunner, make_runner
from fastpp.sim.plan_job import CandidateJob, SearchSettings
from fastpp.sim.plan_result import CandidateResult, DeploymentPlan

__all__ = [
    "CandidateResult",
    "DeploymentPlan",
    "PlanConfig",
    "plan_deployment",
    "replica_profile",
    "sample_lengths",
]
from fastpp.scheduler_config import QUEUE_ORDERS
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, check_async_batch_depth, scheduler_config
from fastpp.sim.sweep_grid import static_chunk
from fastpp.sim.sweep_table import append_row, read_rows, row_line
from fastpp.types import SLO
from fastpp.workloads import WORKLOADS, check_arrival

PLAN_JSONL = "plan.jsonl"
LENGTH_SAMPLES = 4000  # workload requests sampled for the P99 request and the bound
# version of the job rules; part of every cache key (3: the bound unprobed; 4: probes on the precision's grid)
PLAN_METHOD = 4
Progress = Callable[[int, int, str], None]  # (candidates done, candidates, last finished label)


@dataclass(frozen=True, slots=True)
class PlanConfig:
    """What to plan: the hardware, the model, the traffic, the SLO, the policy grid."""

    model: str = "Qwen2.5-32B"  # a known name, a Hugging Face config.json or model directory
    gpu: str = "A100-40GB-PCIe"  # a known name, or NAME:bf16_tflops=..,hbm_gbps=..,memory_gib=..
    num_gpus: int = 4
    workload: str = "azure-conv"
    # arrivals of the goodput searches: poisson, or gamma with this coefficient of variation
    arrival: str = "poisson"
    cv: float = 1.0
    slo: SLO = field(default_factory=SLO)
    policies: PolicyGrid = field(default_factory=PolicyGrid)  # or its --policies text
    layouts: tuple[str, ...] | None = None  # only these (Layout.key: pp4, dp2pp2, tp4, dp4)
    profiles: tuple[str, ...] = ()  # measured profiles: each fixes a layout (model, GPU unused)
    interconnect: str | None = None  # default: the GPU's
    host_loop: str = "free-slots"
    chunk_candidates: tuple[int, ...] | None = None  # what dynamic policies choose from
    data_dir: str | None = None
    settings: SearchSettings = field(default_factory=SearchSettings)
    prune: bool = True  # False: search every candidate fully (the exhaustive check)
    share_twins: bool = True  # False: search a candidate even when its +ds twin's runs are its own
    # SGLang's --pp-async-batch-depth values each pipelined candidate is tried at (pp > 1 only)
    async_depths: tuple[int, ...] = (0,)
    # the waiting queue's orders each candidate is tried with (fcfs, late_last: docs/POLICIES.md)
    queue_orders: tuple[str, ...] = ("fcfs",)

    def __post_init__(self) -> None:
        if isinstance(self.policies, str):  # the --policies spelling
            object.__setattr__(self, "policies", PolicyGrid.parse(self.policies))
        object.__setattr__(self, "profiles", tuple(self.profiles))
        if self.host_loop not in HOST_LOOPS:
            raise ValueError(f"--host-loop must be one of {', '.join(HOST_LOOPS)}, got {self.host_loop!r}")
        object.__setattr__(self, "async_depths", tuple(dict.fromkeys(self.async_depths)))
        if not self.async_depths:
            raise ValueError("async_depths (--pp-async-batch-depth) needs at least one depth, e.g. 0")
        for depth in self.async_depths:
            check_async_batch_depth(depth, self.host_loop)
        object.__setattr__(self, "queue_orders", tuple(dict.fromkeys(self.queue_orders)))
        if not self.queue_orders:
            raise ValueError("queue_orders (--queue-orders) needs at least one order, e.g. fcfs")
        for order in self.queue_orders:
            if order not in QUEUE_ORDERS:
                raise ValueError(f"--queue-orders: {order!r} is not one of {', '.join(QUEUE_ORDERS)}")
        if self.num_gpus < 1:
            raise ValueError(f"num_gpus (--gpus) must be >= 1, got {self.num_gpus}")
        if self.workload not in WORKLOADS and not self.workload.startswith("random:"):
            raise ValueError(f"unknown workload {self.workload!r}; known: {', '.join(WORKLOADS)}")
        check_arrival(self.arrival, self.cv)


@dataclass(frozen=True, slots=True)
class _Layout:
    """A fitting layout with its replica's profile and how a job should load it."""

    fit: LayoutFit
    profile: Profile
    deployment: DeploymentConfig  # the replica, policy still to set
    profile_json: str | None


def plan_deployment(
    config: PlanConfig | None = None,
    *,
    executor: str = "process",
    workers: int | None = None,
    ray_address: str | None = None,
    out_dir: Path | str | None = None,
    progress: Progress | None = None,
) -> DeploymentPlan:
    """Plan ``config`` (module docstring); ValueError names a bad model, GPU, workload,
    profile or GPU count before any search runs."""
    start = time.perf_counter()
    config = config or PlanConfig()
    workload = WorkloadConfig(
        name=config.workload, arrival=config.arrival, cv=config.cv, data_dir=config.data_dir
    )
    lengths = sample_lengths(workload)
    p99 = int(np.percentile([i + o for i, o in lengths], 99))
    stats = RequestLengths.of(lengths)
    layouts, excluded, model, gpu, source = _layouts(config, p99)
    if config.layouts is not None:
        # "dp2 x pp2" names dp2pp2; the user's own spelling is kept for the error
        given = {k.strip().lower().replace(" ", "").replace("x", ""): k.strip() for k in config.layouts}
        wanted = set(given)
        known = {lay.fit.layout.key for lay in layouts} | {e.layout.key for e in excluded}
        unknown = sorted(given[k] for k in wanted - known)
        if unknown:
            raise ValueError(
                f"--layouts: {', '.join(unknown)} is not a layout of "
                f"{config.num_gpus} GPUs; the layouts: {', '.join(sorted(known))}"
            )
        layouts = [lay for lay in layouts if lay.fit.layout.key in wanted]
        excluded = [e for e in excluded if e.layout.key in wanted]
    candidates = [
        (lay, DeploymentCandidate(lay.fit.layout, policy, depth, order))
        for lay in layouts
        for order in config.queue_orders
        for depth in (config.async_depths if lay.fit.layout.pp > 1 else (0,))
        for policy in config.policies.for_layout(lay.fit.layout)
    ]
    jobs: list[CandidateJob] = []
    unbalanced: set[tuple[Layout, str, int, str]] = set()  # candidates whose policy moves no decode
    for lay, cand in candidates:
        dep = replace(lay.deployment, policy=cand.policy, async_batch_depth=cand.async_depth)
        dep = replace(dep, queue_order=cand.queue_order)
        try:
            _, balancer = make_policies(dep.policy, scheduler_config(lay.profile, dep), lay.profile)
        except ValueError as exc:
            raise ValueError(f"{cand.label}: {exc}") from None
        if isinstance(balancer, NoBalancer):
            unbalanced.add(_twin_key(cand))
        bound = capacity_bound(lay.profile, stats, cand.max_tokens(config.chunk_candidates), cand.layout.dp)
        jobs.append(
            CandidateJob(
                _job_id(config, lay, cand, model, gpu),
                cand,
                workload,
                dep,
                bound,
                config.settings,
                profile_json=lay.profile_json,
            )
        )
    jobs = search_order(jobs)
    by_candidate = {_twin_key(j.candidate): j for j in jobs}
    twins = {  # a candidate without a balancer -> its +ds twin (same chunk policy and depth)
        j.job_id: twin
        for j in jobs
        if _twin_key(j.candidate) in unbalanced
        and (twin := by_candidate.get(_twin_key(j.candidate, "+ds"))) is not None
    }
    notes = [
        f"workload P99 request: {p99:,} tokens (prompt + output, {LENGTH_SAMPLES:,} "
        f"sampled); a layout's KV pool must hold it"
    ]
    if config.arrival != "poisson" and any(lay.fit.layout.dp > 1 for lay in layouts):
        notes.append(
            f"{config.arrival} arrivals: a dp replica is simulated at rate / dp with the same cv "
            f"({config.cv:g}), but random routing thins the bursts each replica sees, so a dp "
            "layout's goodput here is a lower estimate"
        )
    if not config.settings.require_steady:
        notes.append(
            "--no-steady: a fixed run can pass above a layout's capacity before its queue "
            "builds up (goodput above the bound), and pruning by the bound then drops "
            "candidates a steady search would rank: for quick looks only"
        )
    results = _search(jobs, twins, config, executor, workers, ray_address, out_dir, progress, notes)
    results.sort(key=lambda r: (r.status == "pruned", r.status == "beaten", r.rank_key()))
    return DeploymentPlan(
        model=model.name,
        gpu=gpu.name if gpu else "-",
        gpu_note=calibration_note(gpu) if gpu else "measured profile",
        interconnect=layouts[0].profile.interconnect if layouts else (gpu.interconnect if gpu else "-"),
        num_gpus=config.num_gpus,
        workload=config.workload
        if config.arrival == "poisson"
        else f"{config.workload} ({config.arrival} arrivals, cv {config.cv:g})",
        slo_ttft_ms=config.slo.ttft_s * 1e3,
        slo_tpot_ms=config.slo.tpot_s * 1e3,
        results=tuple(results),
        excluded=tuple(excluded),
        operating_share=config.settings.operating_share,
        precision=config.settings.precision,
        seeds=config.settings.seeds,
        wall_s=time.perf_counter() - start,
        notes=tuple(notes),
        cost_source=source,
    )


def _twin_key(cand: DeploymentCandidate, suffix: str = "") -> tuple[Layout, str, int, str]:
    return cand.layout, cand.policy + suffix, cand.async_depth, cand.queue_order


POOLING_TOLERANCE = 0.05  # layouts whose bounds differ by less than this share are "close"


def search_order(jobs: Sequence[CandidateJob]) -> list[CandidateJob]:
    """The order candidates are searched in: layouts by their highest bound, except that among
    layouts whose bounds are within ``POOLING_TOLERANCE`` of the highest of them, fewer
    replicas go first: at the same capacity one queue over all the GPUs waits less than dp
    queues of a random router's split streams (the pooling effect), so it is the likelier
    winner. Within a layout the dynamic policies (which reach the larger share of a bound when
    the chunk matters), then static chunks by bound; a ``+ds`` candidate just before its twin
    without it, whose search it may stand in for. Any order gives the same pruning verdicts (a
    candidate is pruned only when its bound is below a goodput found); a good first goodput
    makes the challenges that follow cheap. Other async batch depths of a layout follow its
    depth-0 candidates in the same order, and at each depth other queue orders follow fcfs."""
    layout_bound: dict[Layout, float] = {}
    for j in jobs:
        layout = j.candidate.layout
        layout_bound[layout] = max(layout_bound.get(layout, 0.0), j.bound.rate)
    rank: dict[Layout, int] = {}
    by_bound = sorted(layout_bound, key=lambda lay: (-layout_bound[lay], lay))
    while by_bound:
        head = layout_bound[by_bound[0]]
        close = [lay for lay in by_bound if layout_bound[lay] >= (1 - POOLING_TOLERANCE) * head]
        for lay in sorted(close, key=lambda lay: (lay.dp, -layout_bound[lay], lay)):
            rank[lay] = len(rank)
        by_bound = [lay for lay in by_bound if lay not in rank]

    def key(j: CandidateJob) -> tuple:
        chunk_part, _, balancer = j.candidate.policy.partition("+")
        return (
            rank[j.candidate.layout],
            j.candidate.async_depth,
            j.candidate.queue_order != "fcfs",
            static_chunk(chunk_part) is not None,
            -j.bound.rate,
            chunk_part,
            balancer != "ds",
            balancer,
        )

    return sorted(jobs, key=key)


def sample_lengths(workload: WorkloadConfig) -> list[tuple[int, int]]:
    """(prompt, output) lengths of ``LENGTH_SAMPLES`` requests of the workload (seed 0)."""
    sample = replace(workload, rate=None, num_requests=LENGTH_SAMPLES, duration_s=None, seed=0)
    return [(r.prompt_len, r.output_len) for r in sample.requests()]


def _layouts(
    config: PlanConfig, p99: int
) -> tuple[list[_Layout], list[LayoutExclusion], ModelShape, GpuSpec | None, str]:
    if config.profiles:
        profiles = [load_profile(resolve_profile(p)) for p in config.profiles]
        fits, excluded = profile_layouts(profiles, config.num_gpus, p99)
        by_shape = {(p.pp, p.tp): p for p in profiles}
        out = []
        for fit in fits:
            prof = by_shape[(fit.layout.pp, fit.layout.tp)]
            dep = _replica(config, fit.layout, profile_path=None)
            out.append(_Layout(fit, prof, dep, json.dumps(prof.to_dict())))
        return out, excluded, profiles[0].model, None, "measured profile(s)"
    model = resolve_model(config.model)
    gpu = resolve_gpu(config.gpu)
    fits, excluded = enumerate_layouts(model, gpu, config.num_gpus, p99)
    by_name = (
        MODELS.get(model.name) == model and GPUS.get(gpu.name) == gpu and config.interconnect is None
    )  # names: the very runs `fastpp goodput` makes
    out = []
    for fit in fits:
        lay = fit.layout
        prof = analytic_profile(
            model,
            gpu,
            lay.pp,
            lay.tp,
            interconnect=config.interconnect,
            created_at="2000-01-01T00:00:00+00:00",
        )
        dep = _replica(config, lay, model=model.name, gpu=gpu.name)
        out.append(_Layout(fit, prof, dep, None if by_name else json.dumps(prof.to_dict())))
    return out, excluded, model, gpu, "analytic"


def replica_profile(config: PlanConfig, layout: Layout) -> Profile:
    """The profile one replica of ``layout`` runs on: the measured profile of that shape, or the
    analytic one of the config's model and GPU (what the plan's searches simulated)."""
    for name in config.profiles:
        prof = load_profile(resolve_profile(name))
        if (prof.pp, prof.tp) == (layout.pp, layout.tp):
            return prof
    if config.profiles:
        raise ValueError(f"no profile given for {layout.replica_label}")
    return analytic_profile(
        resolve_model(config.model),
        resolve_gpu(config.gpu),
        layout.pp,
        layout.tp,
        interconnect=config.interconnect,
    )


def _replica(
    config: PlanConfig, layout: Layout, profile_path: str | None = None, **names: str
) -> DeploymentConfig:
    return DeploymentConfig(
        pp=layout.pp,
        tp=layout.tp,
        slo=config.slo,
        profile_path=profile_path,
        chunk_candidates=config.chunk_candidates,
        host_loop=config.host_loop,
        **names,
    )


def _job_id(
    config: PlanConfig, lay: _Layout, cand: DeploymentCandidate, model: ModelShape, gpu: GpuSpec | None
) -> str:
    key = {
        "plan_method": PLAN_METHOD,
        "goodput_method": GOODPUT_METHOD,
        "label": cand.label,
        "profile": hashlib.sha256(
            (lay.profile_json or json.dumps(lay.profile.to_dict())).encode()
        ).hexdigest(),
        "workload": config.workload,
        "data_dir": config.data_dir,
        "slo": [config.slo.ttft_s, config.slo.tpot_s],
        "host_loop": config.host_loop,
        "chunk_candidates": config.chunk_candidates,
        "settings": asdict(config.settings),
    }
    if config.arrival != "poisson":  # Poisson plans keep the keys they had before arrivals were a choice
        key["arrivals"] = [config.arrival, config.cv]
    text = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _search(
    jobs: Sequence[CandidateJob],
    twins: dict[str, CandidateJob],
    config: PlanConfig,
    executor: str,
    workers: int | None,
    ray_address: str | None,
    out_dir: Path | str | None,
    progress: Progress | None,
    notes: list[str],
) -> list[CandidateResult]:
    """Search ``jobs`` in their order, pruning on the best goodput found so far; a job with a
    twin in ``twins`` waits for it, and takes its row when the twin's balancer never moved a
    decode."""
    cached: dict[str, dict[str, Any]] = {}
    path = None
    if out_dir is not None:
        path = Path(out_dir) / PLAN_JSONL
        path.parent.mkdir(parents=True, exist_ok=True)
        rows, dropped = read_rows(_keyed(path))
        notes += dropped
        cached = {r["point_id"]: r for r in rows.values()}
    results: dict[str, CandidateResult] = {}
    rows: dict[str, dict[str, Any]] = {}
    best = 0.0
    runner: JobRunner | None = None  # started with the first job that needs a search

    def record(job: CandidateJob, row: dict[str, Any], from_cache: bool) -> None:
        nonlocal best
        result = CandidateResult.from_row(job.candidate, job.bound, row, cached=from_cache)
        results[job.job_id] = result
        rows[job.job_id] = row
        if result.goodput is not None and result.goodput > best:
            best = result.goodput
            if runner is not None and config.prune:  # an exhaustive plan searches every candidate fully
                runner.publish(best)

    def twin_row(job: CandidateJob) -> dict[str, Any] | None:
        """The twin's row as this job's, when the twin's delay scheduling never acted."""
        twin = twins.get(job.job_id) if config.share_twins else None
        row = None if twin is None else rows.get(twin.job_id)
        if twin is None or row is None or row.get("balancer_moves") != 0:
            return None
        return {
            **row,
            "job_id": job.job_id,
            "label": job.candidate.label,
            "num_probes": 0,
            "shared_with": twin.candidate.label,
        }

    def waits(job: CandidateJob) -> bool:
        twin = twins.get(job.job_id) if config.share_twins else None
        return twin is not None and twin.job_id in in_flight

    for job in jobs:  # full searches first: they set the bar the rest must clear
        row = cached.get(job.job_id)
        if row is not None and row["status"] == "searched":
            record(job, row, True)
    if len(results):
        notes.append(f"resumed: {len(results)} candidates' searches read from {path}")
    total = len(jobs)
    done = len(results)
    if progress is not None:
        progress(done, total, "")
    pending = [j for j in jobs if j.job_id not in results]
    in_flight: dict[str, CandidateJob] = {}
    fh = path.open("a") if path is not None else None
    try:
        while pending or in_flight:
            i = 0
            while i < len(pending):
                job = pending[i]
                row = cached.get(job.job_id)
                shared = twin_row(job)
                if (
                    config.prune
                    and row is not None
                    and row["status"] == "beaten"
                    and row["beaten_at"] <= best
                ):
                    record(job, row, True)
                elif config.prune and best > 0 and job.bound.rate < best:
                    results[job.job_id] = CandidateResult(
                        job.candidate, job.bound, "pruned", below=job.bound.rate
                    )
                elif shared is not None:
                    record(job, shared, False)
                    if fh is not None:
                        append_row(fh, {"point_id": job.job_id, **shared})
                elif waits(job):  # its twin's row may stand in for its search
                    i += 1
                    continue
                elif runner is None or len(in_flight) < runner.capacity:
                    if runner is None:
                        runner = make_runner(executor, workers=workers, ray_address=ray_address)
                    in_flight[job.job_id] = job
                    runner.submit(replace(job, beat=best if config.prune else 0.0))
                    pending.pop(i)
                    continue
                else:  # every worker busy: the next job in order waits for one
                    break
                pending.pop(i)
                done += 1
                if progress is not None:
                    progress(done, total, job.candidate.label)
            if in_flight and runner is not None:
                row = runner.take()
                job = in_flight.pop(row["job_id"])
                record(job, row, False)
                if fh is not None:
                    append_row(fh, {"point_id": job.job_id, **row})
                done += 1
                if progress is not None:
                    progress(done, total, job.candidate.label)
    finally:
        if runner is not None:
            runner.close()
        if fh is not None:
            fh.close()
    return [results[j.job_id] for j in jobs]


def _keyed(path: Path) -> Path:
    """The plan file, cleaned of a partial last line (an interrupted append) before reuse."""
    if path.exists() and path.stat().st_size and not path.read_bytes().endswith(b"\n"):
        rows, _ = read_rows(path)
        path.write_text("".join(row_line(r) for r in rows.values()))
    return path

"""One planner job: a candidate's goodput search, its binding limit and its operating point.

A job is what a worker process (or Ray task) runs: pure and top-level, so it ships by
reference, and its row holds seeded simulation outputs only (no wall times), so a cached row
is the row a rerun would give.

- Goodput: ``fastpp.sim.goodput.slo_goodput`` on one replica (a replica of dp under random
  routing of a Poisson stream sees rate / dp), the same search ``fastpp goodput`` runs; the
  deployment's goodput is dp times the replica's. The bracket starts from the capacity bound:
  [bound / 2, bound], or, when a goodput to beat is given, [beat, bound]. It probes only whole
  multiples of the precision (``find_goodput``'s ``grid``), so a candidate's goodput is the
  highest multiple that passes wherever its bracket started: the beat a job is given depends
  on which candidates finished before it, and so on the worker count, and the plan does not. Under the
  steady-queue rule the bound is not probed: at it the busiest resource is 100% busy and no
  queue is stationary, so it is infeasible by the goodput definition (a probe there would
  only close the bracket where it already is). When the first answer fails confirmation, the
  pass below it is confirmed only if the bisection above it confirms none
  (``find_goodput``'s ``defer_confirmation``: the same answer, often one confirmation fewer).
- Challenge: with a goodput to beat, the first probe is at that rate (per replica); if it
  fails there, the candidate cannot win (feasibility is monotone in rate) and the job stops
  after that one probe ("beaten").
- The live best: a worker may also read the best goodput the plan has found so far, while the
  job runs (``set_live_best``; the process pool publishes it). Once any probe of the search
  has failed at a rate no higher than that best (or the unprobed bound is no higher), the
  candidate cannot win either, and the job stops there ("beaten" below its lowest failed
  rate, with the probes it ran).
- Binding limit at goodput: what failed at the lowest rate above it (TTFT, TPOT, queue growth),
  or "KV capacity" when a run at that rate that fails passes with twice the KV pool.
- Operating point: latency percentiles and SLO attainment of a run at ``share`` x goodput.
- Balancer moves: the row counts the decodes the balancer parked or restored over every
  simulation the job ran. None (a ``+ds`` candidate whose delay scheduling never acted) means
  every run was the run of the same chunk policy without a balancer, decision for decision, so
  the planner gives that twin this row instead of searching it again.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fastpp.metrics import summarize
from fastpp.sim.engine import PipelineSimulation
from fastpp.sim.goodput import UNSTEADY, GoodputResult, ProbeResult, judge_records, slo_goodput
from fastpp.sim.plan_bound import CapacityBound
from fastpp.sim.plan_candidates import DeploymentCandidate
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, open_simulation
from fastpp.types import RequestRecord

OP_KEYS = (
    "median_ttft_ms",
    "p90_ttft_ms",
    "median_tpot_ms",
    "p90_tpot_ms",
    "median_e2e_latency_ms",
    "p90_e2e_latency_ms",
    "slo_attainment",
)


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """How each candidate is searched and looked at (defaults: the planner's)."""

    seeds: tuple[int, ...] = (0, 1)  # pooled at every probe, as `fastpp goodput`
    precision: float = 0.25  # bracket width on a replica's rate, req/s
    num_requests: int | None = None  # per seed per probe; None = the search's length rule
    require_steady: bool = True
    max_probes: int = 16
    operating_share: float = 0.8  # operating point = this share of the candidate's goodput
    operating_requests: int = 1000  # requests per seed of the operating-point run
    binding_requests: int = 600  # requests per seed of the KV check at the first failing rate

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ValueError("give at least one seed")
        if not self.precision > 0:
            raise ValueError(f"precision must be > 0 req/s, got {self.precision!r}")
        if not 0 < self.operating_share <= 1:
            raise ValueError(f"operating share must be in (0, 1], got {self.operating_share!r}")
        for name in ("operating_requests", "binding_requests", "max_probes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class CandidateJob:
    """Everything a worker needs for one candidate."""

    job_id: str  # the cache key (hash of everything that decides the row)
    candidate: DeploymentCandidate
    workload: WorkloadConfig
    deployment: DeploymentConfig  # one replica
    bound: CapacityBound
    settings: SearchSettings
    beat: float = 0.0  # deployment goodput to beat (0: search fully)
    profile_json: str | None = None  # a profile the worker writes and simulates (else names)


class _MoveCount:
    """The balancer counters of every simulation a job opens (``HostCounters``, kept by
    reference: they hold no records, so the runs themselves are freed as usual)."""

    def __init__(self) -> None:
        self._counters: list[Any] = []

    def __call__(self, sim: PipelineSimulation) -> None:
        self._counters.append(sim.scheduler.counters)

    @property
    def moves(self) -> int:
        """Decodes parked or restored so far, liveness restores included."""
        return sum(c.parks + c.restores + c.liveness_restores for c in self._counters)


BOUND_BINDS = "capacity (the bound)"  # the limit when only the unprobed bound failed
_live_best: Callable[[], float] | None = None


def set_live_best(read: Callable[[], float] | None) -> None:
    """Where this process's jobs read the plan's best goodput found so far (deployment req/s)
    while they run; None: only the goodput to beat the job was given."""
    global _live_best
    _live_best = read


def live_best() -> float:
    """The plan's best goodput found so far, as this process last saw it (0: none known)."""
    return 0.0 if _live_best is None else _live_best()


class _Beaten(Exception):
    """The candidate cannot win: ``rate`` (deployment req/s) failed, and is no higher than a
    goodput already found."""

    def __init__(self, probe: ProbeResult, rate: float, num_probes: int) -> None:
        super().__init__(probe.reason)
        self.probe, self.rate, self.num_probes = probe, rate, num_probes


def evaluate_candidate(job: CandidateJob) -> dict[str, Any]:
    """The job's row (``CandidateResult.from_row`` reads it back)."""
    dep = _with_profile(job.deployment, job.profile_json)
    dp, settings = job.candidate.layout.dp, job.settings
    bound = job.bound.replica_rate
    row: dict[str, Any] = {"job_id": job.job_id, "label": job.candidate.label}
    beat = job.beat / dp
    if beat > 0:
        low, high = beat, max(bound, beat * 1.25)
    elif math.isfinite(bound):
        low, high = bound / 2, bound
    else:
        low, high = 2.0, 8.0
    moves = _MoveCount()
    # at or above the bound no queue is stationary: the steady rule fails it unprobed
    high_fails = settings.require_steady and math.isfinite(bound) and high >= bound
    seen: list[ProbeResult] = []
    # the lowest known infeasible replica rate and why: the unprobed bound, or a failed probe
    fails_at: list[tuple[float, ProbeResult]] = []
    if high_fails:
        why = f"its capacity bound {bound:.4g} req/s per replica is infeasible (no queue is stationary there)"
        fails_at.append((bound, ProbeResult(bound, False, {}, why)))

    def challenge(probe: ProbeResult) -> None:
        seen.append(probe)
        if beat > 0 and len(seen) == 1 and not probe.ok:
            raise _Beaten(probe, job.beat, 1)
        if not probe.ok and (not fails_at or probe.rate < fails_at[0][0]):
            fails_at[:] = [(probe.rate, probe)]
        best = live_best()
        if fails_at and best > 0 and fails_at[0][0] * dp <= best:
            raise _Beaten(fails_at[0][1], fails_at[0][0] * dp, len(seen))

    try:
        res = slo_goodput(
            job.workload,
            dep,
            seeds=settings.seeds,
            num_requests=settings.num_requests,
            precision=settings.precision,
            low=low,
            high=high,
            max_probes=settings.max_probes,
            require_steady=settings.require_steady,
            progress=challenge,
            high_fails=high_fails,
            defer_confirmation=True,
            on_open=moves,
            grid=settings.precision,
        )
    except _Beaten as beaten:
        row.update(
            status="beaten",
            beaten_at=beaten.rate,
            num_probes=beaten.num_probes,
            reason=beaten.probe.reason,
            binding=binding_from_reason(beaten.probe.reason) if beaten.probe.metrics else BOUND_BINDS,
            balancer_moves=moves.moves,
        )
        return row
    row.update(
        status="searched",
        goodput=dp * res.rate,
        replica_goodput=res.rate,
        margin=dp * res.margin,
        attainment=res.attainment,
        num_probes=len(res.probes),
        reason=res.reason,
        notes=list(res.notes),
        criterion=res.criterion,
    )
    row.update(_binding(res, job.workload, dep, settings, moves, high if high_fails else None))
    if res.rate > 0:
        row["operating_point"] = operating_point(
            job.workload, dep, res.rate * settings.operating_share, settings, moves
        )
    row["balancer_moves"] = moves.moves
    return row


def binding_from_reason(reason: str) -> str:
    """The limit a failed probe's reason names: TTFT, TPOT, TTFT and TPOT, queue growth or KV
    capacity (rejected requests)."""
    ttft, tpot = "P90 TTFT" in reason, "P90 TPOT" in reason or "TTFT/TPOT" in reason
    if "TTFT/TPOT" in reason:
        ttft = True
    if ttft and tpot:
        return "TTFT and TPOT"
    if ttft:
        return "TTFT"
    if tpot:
        return "TPOT"
    if reason.startswith(UNSTEADY) or UNSTEADY in reason:
        return "queue growth"
    if "rejected" in reason:
        return "KV capacity"
    return "unknown"


def _binding(
    res: GoodputResult,
    workload: WorkloadConfig,
    dep: DeploymentConfig,
    settings: SearchSettings,
    on_open: Callable[[PipelineSimulation], None] | None = None,
    bound_rate: float | None = None,
) -> dict[str, Any]:
    """The limit at goodput: what the lowest failed probe above it names (TTFT, TPOT, queue
    growth), or "KV capacity" when, at that rate, a run that fails with the deployment's KV
    pool passes with twice the pool (more memory would raise goodput). ``bound_rate``: the
    unprobed capacity bound closing the bracket (the limit when no probe failed below it)."""
    failed = sorted(
        (p for p in res.probes if not p.ok and p.rate > res.rate and not p.reason.startswith("withdrawn")),
        key=lambda p: p.rate,
    )
    if not failed and bound_rate is not None and res.rate > 0:
        return {"binding": BOUND_BINDS, "binding_rate": bound_rate}
    if not failed:
        return {"binding": "none found (feasible at every probed rate)", "binding_rate": None}
    at = failed[0]
    binding = binding_from_reason(at.reason)
    if binding != "KV capacity" and kv_relieves(workload, dep, at.rate, settings, on_open):
        binding = "KV capacity"
    return {"binding": binding, "binding_rate": at.rate, "binding_reason": at.reason}


def kv_relieves(
    workload: WorkloadConfig,
    dep: DeploymentConfig,
    rate: float,
    settings: SearchSettings,
    on_open: Callable[[PipelineSimulation], None] | None = None,
) -> bool:
    """Does a run of ``binding_requests`` per seed at ``rate`` that fails the SLO pass with
    twice the KV pool? (False when it passes as it is: the short run cannot tell.)"""
    profile = dep.load_profile()
    doubled = replace(profile, kv_capacity_tokens=2 * profile.kv_capacity_tokens)
    more = _with_profile(replace(dep, pp=profile.pp, tp=profile.tp), json.dumps(doubled.to_dict()))

    def verdict(deployment: DeploymentConfig) -> bool:
        runs = [
            _run(
                replace(
                    workload, rate=rate, seed=seed, num_requests=settings.binding_requests, duration_s=None
                ),
                deployment,
                on_open,
            )
            for seed in settings.seeds
        ]
        return judge_records(runs, dep.slo, rate=rate, require_steady=settings.require_steady).ok

    return not verdict(dep) and verdict(more)


def operating_point(
    workload: WorkloadConfig,
    dep: DeploymentConfig,
    rate: float,
    settings: SearchSettings,
    on_open: Callable[[PipelineSimulation], None] | None = None,
) -> dict[str, float]:
    """Latency percentiles (ms) and SLO attainment at ``rate`` (a replica's), every seed's
    ``operating_requests`` requests pooled."""
    records = []
    for seed in settings.seeds:
        records += _run(
            replace(
                workload, rate=rate, seed=seed, num_requests=settings.operating_requests, duration_s=None
            ),
            dep,
            on_open,
        )
    summary = summarize(records, slo=dep.slo)
    return {"replica_rate": rate, **{k: float(summary[k]) for k in OP_KEYS}}


def _run(
    workload: WorkloadConfig,
    dep: DeploymentConfig,
    on_open: Callable[[PipelineSimulation], None] | None,
) -> list[RequestRecord]:
    """The records of one whole run (no per-token times); ``on_open`` sees its simulation."""
    sim = open_simulation(workload, dep, record_iterations=False, record_token_times=False)
    if on_open is not None:
        on_open(sim)
    return sim.run().records


def _with_profile(dep: DeploymentConfig, profile_json: str | None) -> DeploymentConfig:
    """``dep`` reading ``profile_json`` from a file in the temp folder (written once per
    content), so a job carries its profile to any worker."""
    if profile_json is None:
        return dep
    digest = hashlib.sha256(profile_json.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"fastpp-plan-profile-{digest}.json"
    if not path.exists():
        tmp = path.with_name(f"{path.name}.{id(profile_json)}.tmp")
        tmp.write_text(profile_json, encoding="utf-8")
        tmp.replace(path)
    return replace(dep, profile_path=str(path))

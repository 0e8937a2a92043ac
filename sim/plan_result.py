"""The planner's typed results: one ``CandidateResult`` per candidate, one ``DeploymentPlan``.

Statuses: ``searched`` (a full goodput search), ``beaten`` (failed a probe at a rate no higher
than the best goodput already found, so it cannot win: the challenge probe at that goodput, or a
probe of its search once a better goodput was found elsewhere; its goodput is below that rate),
``pruned`` (its capacity bound is below the best goodput found: no probe run). A searched or
beaten candidate may be ``shared_with`` its ``+ds`` twin: the twin's delay scheduling never
moved a decode, so the two ran the same simulations and the twin's search stands for both (no
probe of its own).
Ranking: goodput, then SLO attainment at goodput, then fewer GPUs per replica (fewer links to
go wrong), then fewer microbatches in flight (async batch depth), then fcfs before another
queue order, then the policy name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fastpp.sim.plan_bound import CapacityBound
from fastpp.sim.plan_candidates import DeploymentCandidate, LayoutExclusion

STATUSES = ("searched", "beaten", "pruned")


@dataclass(frozen=True, slots=True)
class CandidateResult:
    """A candidate's bound and, when searched, goodput, binding limit and operating point."""

    candidate: DeploymentCandidate
    bound: CapacityBound
    status: str  # searched | beaten | pruned
    goodput: float | None = None  # req/s of the deployment (dp x a replica's); None unless searched
    margin: float = math.nan  # the search's bracket width, deployment req/s
    attainment: float = math.nan  # per-request SLO attainment at goodput
    num_probes: int = 0  # goodput probes this candidate cost (0 when pruned)
    binding: str = ""  # the limit at goodput: TTFT, TPOT, KV capacity, queue growth, ...
    binding_rate: float | None = None  # replica rate of the probe that named the limit
    reason: str = ""  # the search's reason (goodput 0) or the challenge probe's failure
    below: float | None = None  # beaten / pruned: goodput is below this (deployment req/s)
    operating_point: dict[str, float] = field(default_factory=dict)  # latencies at share x goodput
    cached: bool = False  # read from the plan folder instead of computed
    shared_with: str = ""  # the +ds twin whose search this is (its balancer never acted)

    @property
    def label(self) -> str:
        return self.candidate.label

    @property
    def num_gpus(self) -> int:
        return self.candidate.layout.num_gpus

    @property
    def goodput_per_gpu(self) -> float | None:
        return None if self.goodput is None else self.goodput / self.num_gpus

    @property
    def bound_share(self) -> float | None:
        """Goodput / capacity bound (None unless searched)."""
        if self.goodput is None or not self.bound.rate > 0 or math.isinf(self.bound.rate):
            return None
        return self.goodput / self.bound.rate

    def rank_key(self) -> tuple:
        attained = -1.0 if math.isnan(self.attainment) else self.attainment
        layout = self.candidate.layout
        return (
            -(self.goodput or 0.0),
            -attained,
            layout.tp * layout.pp,
            self.candidate.async_depth,  # at a tie, fewer microbatches in flight
            self.candidate.queue_order != "fcfs",  # then first come, first served
            self.candidate.policy,
        )

    def to_dict(self) -> dict[str, Any]:
        layout = self.candidate.layout
        return {
            "label": self.label,
            "dp": layout.dp,
            "tp": layout.tp,
            "pp": layout.pp,
            "policy": self.candidate.policy,
            "async_batch_depth": self.candidate.async_depth,
            "queue_order": self.candidate.queue_order,
            "status": self.status,
            "goodput": self.goodput,
            "goodput_per_gpu": self.goodput_per_gpu,
            "margin": self.margin,
            "attainment": self.attainment,
            "bound": self.bound.rate,
            "bound_bottleneck": self.bound.bottleneck,
            "bound_replica_rates": self.bound.replica_rates,
            "bound_share": self.bound_share,
            "binding": self.binding,
            "binding_rate": self.binding_rate,
            "reason": self.reason,
            "below": self.below,
            "num_probes": self.num_probes,
            "operating_point": self.operating_point,
            "cached": self.cached,
            "shared_with": self.shared_with,
        }

    @classmethod
    def from_row(
        cls, candidate: DeploymentCandidate, bound: CapacityBound, row: dict[str, Any], cached: bool = False
    ) -> CandidateResult:
        """From an ``evaluate_candidate`` row."""
        if row["status"] == "beaten":
            return cls(
                candidate,
                bound,
                "beaten",
                num_probes=int(row["num_probes"]),
                binding=row.get("binding", ""),
                reason=row.get("reason", ""),
                below=row["beaten_at"],
                cached=cached,
                shared_with=row.get("shared_with", ""),
            )
        return cls(
            candidate,
            bound,
            "searched",
            goodput=float(row["goodput"]),
            margin=_num(row.get("margin")),
            attainment=_num(row.get("attainment")),
            num_probes=int(row["num_probes"]),
            binding=row.get("binding", ""),
            binding_rate=row.get("binding_rate"),
            reason=row.get("reason", ""),
            operating_point=dict(row.get("operating_point") or {}),
            cached=cached,
            shared_with=row.get("shared_with", ""),
        )


@dataclass(frozen=True, slots=True)
class DeploymentPlan:
    """What ``plan_deployment`` found: every candidate ranked, the layouts left out, the pick."""

    model: str
    gpu: str
    gpu_note: str  # calibrated / uncalibrated, and on what
    interconnect: str
    num_gpus: int
    workload: str
    slo_ttft_ms: float
    slo_tpot_ms: float
    results: tuple[CandidateResult, ...]  # ranked, best first (pruned ones last)
    excluded: tuple[LayoutExclusion, ...]
    operating_share: float
    precision: float
    seeds: tuple[int, ...]
    wall_s: float
    notes: tuple[str, ...] = ()
    cost_source: str = "analytic"  # analytic | measured profile(s)

    @property
    def best(self) -> CandidateResult | None:
        """The recommendation: the top searched candidate with goodput > 0 (None: no feasible
        deployment)."""
        top = [r for r in self.results if r.status == "searched" and (r.goodput or 0) > 0]
        return top[0] if top else None

    @property
    def near_best(self) -> list[CandidateResult]:
        """Other searched candidates whose goodput lies within one search step (``precision``
        per replica, times the larger replica count) of the recommendation's: this plan cannot
        tell them apart from it. Of a candidate and its ``+ds`` twin at the same goodput (the
        twin's delay scheduling never acted), only the first in rank order."""
        best = self.best
        if best is None or best.goodput is None:
            return []

        def key(r: CandidateResult) -> tuple:
            c = r.candidate
            return (c.layout, c.policy.removesuffix("+ds"), c.async_depth, c.queue_order, r.goodput)

        seen = {key(best)}
        out = []
        for r in self.results:
            if r.status != "searched" or r.goodput is None or key(r) in seen:
                continue
            seen.add(key(r))
            step = self.precision * max(best.candidate.layout.dp, r.candidate.layout.dp)
            if r.goodput >= best.goodput - step - 1e-9:
                out.append(r)
        return out

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def num_shared(self) -> int:
        """Candidates that took their ``+ds`` twin's search instead of one of their own."""
        return sum(bool(r.shared_with) for r in self.results)

    @property
    def probes_run(self) -> int:
        return sum(r.num_probes for r in self.results if not r.cached)

    @property
    def probes_saved(self) -> float:
        """Estimated probes the pruning saved: a pruned candidate would have cost a full
        search (the searched candidates' mean), a beaten one that less the probes it ran (shared
        candidates ran none and count as neither)."""
        full = [r.num_probes for r in self.results if r.status == "searched" and not r.shared_with]
        mean = sum(full) / len(full) if full else 0.0
        return self.count("pruned") * mean + sum(
            max(0.0, mean - r.num_probes) for r in self.results if r.status == "beaten" and not r.shared_with
        )

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {
            "model": self.model,
            "gpu": self.gpu,
            "gpu_note": self.gpu_note,
            "interconnect": self.interconnect,
            "num_gpus": self.num_gpus,
            "workload": self.workload,
            "slo_ttft_ms": self.slo_ttft_ms,
            "slo_tpot_ms": self.slo_tpot_ms,
            "cost_source": self.cost_source,
            "operating_share": self.operating_share,
            "precision": self.precision,
            "seeds": list(self.seeds),
            "routing": ROUTING_NOTE,
            "best": None if best is None else best.label,
            "near_best": [r.label for r in self.near_best],
            "counts": {s: self.count(s) for s in STATUSES},
            "shared_with_twin": self.num_shared,
            "probes_run": self.probes_run,
            "probes_saved_estimate": self.probes_saved,
            "wall_s": self.wall_s,
            "results": [r.to_dict() for r in self.results],
            "excluded": [
                {
                    "label": e.layout.label,
                    "dp": e.layout.dp,
                    "tp": e.layout.tp,
                    "pp": e.layout.pp,
                    "reason": e.reason,
                }
                for e in self.excluded
            ],
            "notes": list(self.notes),
        }


ROUTING_NOTE = (
    "dp replicas: each gets rate / dp (random routing of a Poisson stream), so a "
    "layout's goodput is dp x one replica's"
)


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)

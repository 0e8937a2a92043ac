"""Sweep grids: the axes a sweep crosses, and the points (and best-static targets) they expand to.

A grid is the cross product workload x model x GPU x deployment x SLO scale x policy x rate x
seed, each axis a list. ``chunks`` is shorthand for ``static:N`` policies. What every point
computes is the grid's ``metric``:

- ``simulate``: one ``run_simulation`` per (rate, seed): each seed is its own point and row.
- ``goodput``: one ``slo_goodput`` per point, all seeds pooled; there is no rate axis.
  ``steady=False`` drops the search's steady-queue rule. ``protocol`` (``fixed`` or a preset
  of ``fastpp.sim.goodput_fixed``, e.g. ``azure``) measures goodput under the paper's fixed-run
  protocol instead (``fixed_goodput``; ``num_requests`` overrides the preset's N).
- ``best-static``: goodput of every static candidate chunk (``chunks``, default 128..2048 step
  128) per (workload, model, GPU, deployment, SLO scale) group, plus one derived row naming the
  winner (the paper's PP_static). The candidates are ordinary goodput points.

An axis left as None takes the library default (WorkloadConfig, DeploymentConfig, slo_goodput);
an axis given as an empty list is an error, as is an unknown name: all of it is caught when the
grid is built, before any simulation runs.

A point's ``point_id`` is a hash of everything that decides its result (axes, metric, seeds,
request count, precision, base SLO, ``steady`` when it is off and ``protocol`` when given), so it is
stable across runs, machines and processes.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from fastpp.policies import BALANCERS, POLICIES
from fastpp.profile import load_profile
from fastpp.profile_names import resolve_profile
from fastpp.scheduler_config import DEFAULT_ADMISSION_RESERVE, check_queue_options, parse_chunk_candidates
from fastpp.sim.engine import HOST_LOOPS
from fastpp.sim.goodput import GOODPUT_METHOD, slo_goodput
from fastpp.sim.goodput_fixed import parse_protocol
from fastpp.sim.hardware import resolve_gpu
from fastpp.sim.models import get_model
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, check_async_batch_depth, parse_deployment
from fastpp.types import SLO
from fastpp.workloads import check_workload_name

METRICS = ("simulate", "goodput", "best-static")
DEFAULT_STATIC_CHUNKS: tuple[int, ...] = tuple(range(128, 2049, 128))  # tokens; best-static candidates

# The leading columns of every row, in table order (metrics follow).
AXIS_COLUMNS = (
    "point_id",
    "metric",
    "workload",
    "model",
    "gpu",
    "deploy",
    "pp",
    "tp",
    "policy",
    "chunk",
    "slo_scale",
    "slo_ttft_ms",
    "slo_tpot_ms",
    "rate",
    "seeds",
    "num_requests",
    "precision",
    "steady",
)

_DEPLOY_DEFAULT = DeploymentConfig()
_WORKLOAD_DEFAULT = WorkloadConfig()
_GOODPUT_DEFAULTS = inspect.signature(slo_goodput).parameters  # the search's own defaults


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One unit of work: a fully resolved configuration and what to compute on it."""

    metric: str  # "simulate" | "goodput" (best-static candidates are goodput points)
    workload: str  # registry name (fastpp.workloads.WORKLOADS)
    model: str  # canonical model name
    gpu: str  # canonical GPU name, or NAME:datasheet numbers
    pp: int
    tp: int
    policy: str  # policy spec, e.g. static:512 or predictive+ds
    slo_scale: float  # factor applied to ``slo``
    rate: float | None  # requests/s; simulate only (None for goodput)
    seeds: tuple[int, ...]  # simulate: exactly one; goodput: pooled per probe
    num_requests: int | None  # per seed (goodput: per probe; None = the search's length rule)
    precision: float | None  # goodput bracket width, req/s; None for simulate
    slo: SLO = field(default_factory=SLO)  # base SLO, before ``slo_scale``
    steady: bool = True  # goodput: require a stationary queue (False: the SLO test alone)
    # as `fastpp simulate`'s options; at their defaults they leave the point's id unchanged
    profile: str | None = None  # a profile file or shipped name (fixes model, GPU, pp, tp)
    host_loop: str = "free-slots"
    chunk_candidates: tuple[int, ...] | None = None
    data_dir: str | None = None
    protocol: str | None = None  # goodput under a fixed-run protocol (goodput_fixed), else steady
    admission_reserve: str = DEFAULT_ADMISSION_RESERVE  # SchedulerConfig's (fastpp/scheduler_config.py)
    retraction: str = "newest_front"
    queue_order: str = "fcfs"
    async_batch_depth: int = 0  # DeploymentConfig's: microbatches in flight beyond pp
    point_id: str = field(init=False, compare=False)  # hash of ``axes()`` (set in __post_init__)

    def __post_init__(self) -> None:
        if self.metric not in ("simulate", "goodput"):
            raise ValueError(f"metric must be 'simulate' or 'goodput' for a point, got {self.metric!r}")
        if self.metric == "simulate" and (self.rate is None or len(self.seeds) != 1):
            raise ValueError("a simulate point needs a rate and exactly one seed")
        if self.metric == "goodput" and (self.rate is not None or self.precision is None):
            raise ValueError("a goodput point takes a precision and no rate")
        if self.metric == "simulate" and not self.steady:
            raise ValueError("steady applies to goodput points only")
        if self.protocol is not None:
            _check_protocol(self.protocol, self.metric, self.steady)
        ident = self.axes(with_id=False)
        if self.steady:  # the default leaves the ids of points made before the flag unchanged
            del ident["steady"]
        for name, default in _SIMULATE_OPTIONS.items():
            value = getattr(self, name)
            if value != default:
                ident[name] = list(value) if isinstance(value, tuple) else value
        if self.metric == "goodput":  # a new goodput method must not reuse the old one's rows
            ident["goodput_method"] = GOODPUT_METHOD
        object.__setattr__(self, "point_id", _hash(ident))

    @property
    def deploy(self) -> str:
        """The parallel layout's label: pp4, tp4, pp2tp2 (single for one GPU)."""
        return self.deployment_config().label

    def axes(self, *, with_id: bool = True) -> dict[str, Any]:
        """The row's leading columns (``AXIS_COLUMNS``), JSON-ready."""
        slo = self.slo.scaled(self.slo_scale)
        row = {
            "point_id": self.point_id if with_id else None,
            "metric": self.metric,
            "workload": self.workload,
            "model": self.model,
            "gpu": self.gpu,
            "deploy": self.deploy,
            "pp": self.pp,
            "tp": self.tp,
            "policy": self.policy,
            "chunk": static_chunk(self.policy),
            "slo_scale": self.slo_scale,
            "slo_ttft_ms": slo.ttft_s * 1e3,
            "slo_tpot_ms": slo.tpot_s * 1e3,
            "rate": self.rate,
            "seeds": ",".join(map(str, self.seeds)),
            "num_requests": self.num_requests,
            "precision": self.precision,
            "steady": self.steady,
        }
        if self.protocol is not None:  # steady-state rows (and ids) as before the field
            row["protocol"] = self.protocol
        # likewise: only where not the default
        for name in ("admission_reserve", "retraction", "queue_order", "async_batch_depth"):
            if getattr(self, name) != _SIMULATE_OPTIONS[name]:
                row[name] = getattr(self, name)
        if not with_id:
            del row["point_id"]
        return row

    def workload_config(self) -> WorkloadConfig:
        """The workload this point simulates (goodput probes replace rate and seed)."""
        return replace(
            _WORKLOAD_DEFAULT,
            name=self.workload,
            rate=self.rate,
            seed=self.seeds[0],
            data_dir=self.data_dir,
            num_requests=self.num_requests or _WORKLOAD_DEFAULT.num_requests,
        )

    def deployment_config(self) -> DeploymentConfig:
        """The deployment this point simulates, its SLO scaled by ``slo_scale``."""
        return DeploymentConfig(
            model=self.model,
            gpu=self.gpu,
            pp=self.pp,
            tp=self.tp,
            policy=self.policy,
            slo=self.slo.scaled(self.slo_scale),
            profile_path=self.profile,
            host_loop=self.host_loop,
            chunk_candidates=self.chunk_candidates,
            admission_reserve=self.admission_reserve,
            retraction=self.retraction,
            queue_order=self.queue_order,
            async_batch_depth=self.async_batch_depth,
        )

    def describe(self) -> str:
        """One line for messages: ``pp2 static:512 Qwen2.5-14B/A100-40GB-PCIe ...``."""
        rate = "" if self.rate is None else f" @ {self.rate:g} req/s"
        return (
            f"{self.metric} {self.workload} {self.model}/{self.gpu} {self.deploy} "
            f"{self.policy} slo x{self.slo_scale:g}{rate} seeds {self.seeds}"
        )


@dataclass(frozen=True, slots=True)
class BestStaticTarget:
    """A best-static group: its candidate goodput points (one per static chunk, same group)."""

    candidates: tuple[SweepPoint, ...]
    point_id: str = field(init=False, compare=False)  # hash of the group and its candidates

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError("a best-static target needs at least one candidate")
        object.__setattr__(self, "point_id", _hash(self.axes(with_id=False)))

    def axes(self, *, with_id: bool = True) -> dict[str, Any]:
        """Leading columns of the winner row; policy and chunk are filled in once it is known."""
        row = self.candidates[0].axes(with_id=with_id)
        row.update(metric="best-static", policy=None, chunk=None)
        if with_id:
            row["point_id"] = self.point_id
        else:
            row["candidates"] = [c.point_id for c in self.candidates]
        return row


@dataclass(frozen=True, slots=True)
class SweepGrid:
    """The axes of a sweep (tuples; None = the library default) and what each point computes.

    Deployments look like ``pp4``, ``tp4``, ``pp2tp2``; one that names its own policy
    (``pp4@predictive``) contributes that policy only and ignores the policy axis.
    """

    workloads: tuple[str, ...] | None = None  # default: WorkloadConfig's
    models: tuple[str, ...] | None = None  # default: DeploymentConfig's
    gpus: tuple[str, ...] | None = None  # default: DeploymentConfig's
    deployments: tuple[str, ...] | None = None  # default: DeploymentConfig's pp/tp
    policies: tuple[str, ...] | None = None  # default: DeploymentConfig's (unless chunks given)
    chunks: tuple[int, ...] | None = None  # static:N policies; best-static candidates
    rates: tuple[float, ...] | None = None  # req/s, simulate only; default: WorkloadConfig's
    slo_scales: tuple[float, ...] | None = None  # factors on ``slo``; default (1.0,)
    metric: str = "simulate"  # simulate | goodput | best-static
    seeds: tuple[int, ...] | None = None  # default: WorkloadConfig's seed / slo_goodput's seeds
    num_requests: int | None = None  # per seed; default: WorkloadConfig's / the goodput length rule
    precision: float | None = None  # goodput bracket, req/s; default: slo_goodput's
    slo: SLO = field(default_factory=SLO)  # base SLO that ``slo_scales`` multiply
    steady: bool = True  # goodput searches require a stationary queue (False: SLO test alone)
    profile: str | None = None  # simulate this profile (its model, GPU, pp and tp) instead
    host_loop: str = "free-slots"  # free-slots | batch-queue | blocking-launch
    chunk_candidates: tuple[int, ...] | None = None  # what dynamic policies choose from
    data_dir: str | None = None  # folder with the real traces
    protocol: str | None = None  # goodput: a fixed-run protocol (goodput_fixed) instead of steady
    admission_reserve: str = DEFAULT_ADMISSION_RESERVE  # SchedulerConfig's admission reserve: slot | all
    retraction: str = "newest_front"  # SchedulerConfig's retraction order
    queue_order: str = "fcfs"  # SchedulerConfig's queue order: fcfs | late_last
    async_batch_depth: int = 0  # microbatches in flight beyond pp (SGLang's --pp-async-batch-depth)

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {self.metric!r}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _AXES and value is not None:
                value = tuple(value)
                object.__setattr__(self, f.name, value)
                if not value:
                    raise ValueError(f"grid axis {f.name!r} is empty: give at least one value")
                dupes = sorted({str(v) for v in value if value.count(v) > 1})
                if dupes:
                    raise ValueError(f"grid axis {f.name!r} lists {', '.join(dupes)} more than once")
        self._check_values()
        self._check_names()

    def _check_values(self) -> None:
        for name, values in (("rates", self.rates), ("slo_scales", self.slo_scales)):
            for v in values or ():
                if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                    raise ValueError(f"{name} must be positive numbers, got {v!r}")
        for v in self.chunks or ():
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"chunks must be integers >= 1 (tokens), got {v!r}")
        for v in self.seeds or ():
            if not (isinstance(v, int) and v >= 0):
                raise ValueError(f"seeds must be integers >= 0, got {v!r}")
        if self.num_requests is not None and self.num_requests < 2:
            raise ValueError(f"num_requests must be >= 2, got {self.num_requests}")
        if self.precision is not None and not self.precision > 0:
            raise ValueError(f"precision must be > 0 req/s, got {self.precision!r}")
        if self.metric != "simulate" and self.rates is not None:
            raise ValueError(
                f"rates: metric {self.metric!r} searches the rate itself; "
                "the rate axis applies to metric 'simulate' only"
            )
        if self.metric == "simulate" and self.precision is not None:
            raise ValueError("precision applies to metrics 'goodput' and 'best-static' only")
        if not isinstance(self.steady, bool):
            raise ValueError(f"steady must be true or false, got {self.steady!r}")
        if self.metric == "simulate" and not self.steady:
            raise ValueError("steady applies to metrics 'goodput' and 'best-static' only")
        if self.protocol is not None:
            kind = "simulate" if self.metric == "simulate" else "goodput"
            _check_protocol(self.protocol, kind, self.steady)
        if self.host_loop not in HOST_LOOPS:
            raise ValueError(f"host_loop must be one of {', '.join(HOST_LOOPS)}, got {self.host_loop!r}")
        check_queue_options(self.admission_reserve, self.retraction, self.queue_order)
        check_async_batch_depth(self.async_batch_depth, self.host_loop)
        if self.profile is not None and (self.models is not None or self.gpus is not None):
            raise ValueError("profile fixes the model and GPU: give no model or gpu axis with it")
        if self.metric == "best-static" and self.policies is not None:
            raise ValueError(
                "policies: best-static searches static chunks; give candidates "
                "with chunks instead of policies"
            )

    def _check_names(self) -> None:
        for name in self.workloads or ():
            check_workload_name(name)
        for name in self.models or ():
            get_model(name)
        for name in self.gpus or ():
            resolve_gpu(name)
        for spec in self.policies or ():
            check_policy_name(spec)
        for text in self.deployments or ():
            _, _, own = parse_deployment(text)
            if own is not None:
                if self.metric == "best-static":
                    raise ValueError(f"deployment {text!r} names a policy; best-static chooses it")
                check_policy_name(own)

    def expand(self) -> tuple[list[SweepPoint], list[BestStaticTarget]]:
        """Points in grid order (workload, model, GPU, deployment, SLO scale, policy, rate, seed)
        and, for best-static, one target per group. Raises ValueError on duplicate points."""
        goodput = self.metric != "simulate"
        seeds = self.seeds or (_GOODPUT_DEFAULTS["seeds"].default if goodput else (_WORKLOAD_DEFAULT.seed,))
        precision = (self.precision or _GOODPUT_DEFAULTS["precision"].default) if goodput else None
        num_requests = self.num_requests or (None if goodput else _WORKLOAD_DEFAULT.num_requests)
        if self.metric == "best-static":
            policies = tuple(f"static:{c}" for c in self.chunks or DEFAULT_STATIC_CHUNKS)
        else:
            policies = (self.policies or ()) + tuple(f"static:{c}" for c in self.chunks or ())
            policies = policies or (_DEPLOY_DEFAULT.policy,)
        # numbers as floats, so that 4 and 4.0 hash to the same point
        rates = (None,) if goodput else tuple(map(float, self.rates or (_WORKLOAD_DEFAULT.rate,)))
        precision = None if precision is None else float(precision)
        seed_sets = (tuple(seeds),) if goodput else tuple((s,) for s in seeds)
        default_deploy = f"pp{_DEPLOY_DEFAULT.pp}tp{_DEPLOY_DEFAULT.tp}"
        names = lambda model, gpu: (get_model(model).name, _gpu_name(gpu))  # noqa: E731
        models, gpus = self.models, self.gpus
        if self.profile is not None:  # the file says what it is
            prof = load_profile(resolve_profile(self.profile))
            models, gpus, default_deploy = (prof.model.name,), (prof.gpu,), f"pp{prof.pp}tp{prof.tp}"
            names = lambda model, gpu: (model, gpu)  # noqa: E731
            for deploy in self.deployments or ():  # the file fixes pp and tp, as for simulate
                pp, tp, _ = parse_deployment(deploy)
                if (pp, tp) != (prof.pp, prof.tp):
                    raise ValueError(
                        f"deployment {deploy!r}: the profile {self.profile} is for {default_deploy}"
                    )
        extra: dict[str, Any] = {
            "profile": self.profile,
            "host_loop": self.host_loop,
            "chunk_candidates": self.chunk_candidates,
            "data_dir": self.data_dir,
            "protocol": self.protocol,
            "admission_reserve": self.admission_reserve,
            "retraction": self.retraction,
            "queue_order": self.queue_order,
            "async_batch_depth": self.async_batch_depth,
        }

        points: list[SweepPoint] = []
        targets: list[BestStaticTarget] = []
        for workload in self.workloads or (_WORKLOAD_DEFAULT.name,):
            for model in models or (_DEPLOY_DEFAULT.model,):
                for gpu in gpus or (_DEPLOY_DEFAULT.gpu,):
                    for deploy in self.deployments or (default_deploy,):
                        pp, tp, own = parse_deployment(deploy)
                        for scale in self.slo_scales or (1.0,):
                            group = [
                                SweepPoint(
                                    "goodput" if goodput else "simulate",
                                    workload,
                                    *names(model, gpu),
                                    pp,
                                    tp,
                                    policy,
                                    float(scale),
                                    rate,
                                    seed_set,
                                    num_requests,
                                    precision,
                                    self.slo,
                                    self.steady,
                                    **extra,
                                )
                                for policy in ((own,) if own else policies)
                                for rate in rates
                                for seed_set in seed_sets
                            ]
                            points += group
                            if self.metric == "best-static":
                                targets.append(BestStaticTarget(tuple(group)))
        seen: dict[str, SweepPoint] = {}
        for p in points:
            if p.point_id in seen:
                raise ValueError(f"the grid lists one point twice: {p.describe()}")
            seen[p.point_id] = p
        return points, targets


# SweepPoint's simulate options and their defaults (a default stays out of the point's id).
_SIMULATE_OPTIONS = {
    "profile": None,
    "host_loop": "free-slots",
    "chunk_candidates": None,
    "data_dir": None,
    "admission_reserve": DEFAULT_ADMISSION_RESERVE,
    "retraction": "newest_front",
    "queue_order": "fcfs",
    "async_batch_depth": 0,
}

_AXES = ("workloads", "models", "gpus", "deployments", "policies", "chunks", "rates", "slo_scales", "seeds")

# Grid-file keys and the SweepGrid fields they set: the CLI's option names (``-`` or ``_``).
GRID_KEYS = {
    "workload": "workloads",
    "model": "models",
    "gpu": "gpus",
    "deploy": "deployments",
    "policy": "policies",
    "chunk": "chunks",
    "rate": "rates",
    "slo_scale": "slo_scales",
    "metric": "metric",
    "seeds": "seeds",
    "num_requests": "num_requests",
    "precision": "precision",
    "steady": "steady",
    "best_static": "best_static",
    "slo_ttft_ms": "slo_ttft_ms",
    "slo_tpot_ms": "slo_tpot_ms",
    "profile": "profile",
    "host_loop": "host_loop",
    "chunk_candidates": "chunk_candidates",
    "data_dir": "data_dir",
    "admission": "admission_reserve",
    "retraction": "retraction",
    "queue_order": "queue_order",
    "pp_async_batch_depth": "async_batch_depth",
}


def check_policy_name(spec: str) -> None:
    """Raise ValueError unless ``spec``'s chunk policy and balancer names are registered (their
    arguments are checked when the scheduler is built, see ``fastpp.sim.sweep.plan_sweep``)."""
    parts = [p.strip() for p in spec.split("+")]
    if not parts[0] or len(parts) > 2:
        raise ValueError(f"policy spec must be NAME[:ARG][+BALANCER[:ARG]], got {spec!r}")
    for part, table, kind in zip(parts, (POLICIES, BALANCERS), ("chunk policy", "balancer"), strict=False):
        name = part.partition(":")[0]
        if name not in table:
            raise ValueError(f"unknown {kind} {name!r} in policy {spec!r}; known: {', '.join(table)}")


def _check_protocol(protocol: str, metric: str, steady: bool) -> None:
    """ValueError unless ``protocol`` names a fixed-run protocol usable on this point or grid."""
    if metric == "simulate":
        raise ValueError("protocol applies to metrics 'goodput' and 'best-static' only")
    if protocol == "steady":
        raise ValueError("protocol: leave it unset for the steady-state search")
    if not steady:
        raise ValueError("protocol: fixed runs have no steady-queue rule; leave steady at true")
    parse_protocol(protocol, None)  # names the known protocols when it is none of them


def static_chunk(policy: str | None) -> int | None:
    """N for a ``static:N`` chunk policy (balancer allowed), else None."""
    if policy is None:
        return None
    name, _, arg = policy.split("+")[0].partition(":")
    return int(arg) if name.strip() == "static" and arg.strip().isdigit() else None


def grid_from_mapping(values: dict[str, Any]) -> SweepGrid:
    """A grid from CLI-named keys (``GRID_KEYS``): axes as scalars or lists, ``seeds`` as a
    count N (0..N-1) or a list, ``best_static = true`` for metric best-static, and the base SLO
    as ``slo_ttft_ms`` / ``slo_tpot_ms``. Unknown keys raise ValueError naming them."""
    values = {k.replace("-", "_"): v for k, v in values.items() if v is not None}
    unknown = sorted(set(values) - set(GRID_KEYS))
    if unknown:
        raise ValueError(f"unknown grid key(s) {', '.join(unknown)}; known: {', '.join(GRID_KEYS)}")
    for key, value in values.items():
        _check_grid_type(key, value)
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        name = GRID_KEYS[key]
        if name in _AXES and name != "seeds":
            kwargs[name] = tuple(value) if isinstance(value, list | tuple) else (value,)
        elif name not in ("best_static", "slo_ttft_ms", "slo_tpot_ms", "seeds"):
            kwargs[name] = value
    candidates = kwargs.get("chunk_candidates")
    if isinstance(candidates, str):
        kwargs["chunk_candidates"] = parse_chunk_candidates(candidates)
    elif candidates is not None:
        kwargs["chunk_candidates"] = tuple(candidates)
    if values.get("best_static"):
        if values.get("metric", "best-static") != "best-static":
            raise ValueError(f"best_static conflicts with metric {values['metric']!r}")
        kwargs["metric"] = "best-static"
    seeds = values.get("seeds")
    if isinstance(seeds, int):
        if seeds < 1:
            raise ValueError(f"seeds must be a count >= 1 or a list of seeds, got {seeds}")
        kwargs["seeds"] = tuple(range(seeds))
    elif seeds is not None:
        kwargs["seeds"] = tuple(seeds)
    base = SLO()
    kwargs["slo"] = SLO(
        values.get("slo_ttft_ms", base.ttft_s * 1e3) / 1e3, values.get("slo_tpot_ms", base.tpot_s * 1e3) / 1e3
    )
    return SweepGrid(**kwargs)


# What each grid key holds, for the type check of a grid file's values (the CLI's are typed).
_STRING_KEYS = (
    "workload",
    "model",
    "gpu",
    "deploy",
    "policy",
    "metric",
    "profile",
    "host_loop",
    "data_dir",
    "admission",
    "retraction",
    "queue_order",
)
_NUMBER_KEYS = ("rate", "slo_scale", "precision", "slo_ttft_ms", "slo_tpot_ms")
_INTEGER_KEYS = ("chunk", "seeds", "num_requests", "pp_async_batch_depth")
_BOOL_KEYS = ("steady", "best_static")
_LIST_KEYS = ("workload", "model", "gpu", "deploy", "policy", "chunk", "rate", "slo_scale", "seeds")


def _is_kind(value: Any, key: str) -> bool:
    if key in _STRING_KEYS:
        return isinstance(value, str)
    if key in _BOOL_KEYS:
        return isinstance(value, bool)
    if isinstance(value, bool):  # TOML's true is no number
        return False
    if key in _INTEGER_KEYS:
        return isinstance(value, int)
    return isinstance(value, int | float)


def _check_grid_type(key: str, value: Any) -> None:
    """Raise ValueError naming ``key`` when a grid file gives it a value of the wrong type (a
    string for a number, a table, a float count): the checks after it compare numbers."""
    if key == "chunk_candidates":  # "START:STOP:STEP" / "a,b,c", or a list of integers
        ok = isinstance(value, str) or (
            isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        )
        kind = "a string such as '128:2048:128' or a list of integers"
    else:
        items = value if key in _LIST_KEYS and isinstance(value, list) else [value]
        ok = all(_is_kind(v, key) for v in items)
        kind = next(
            name
            for keys, name in (
                (_STRING_KEYS, "a string"),
                (_BOOL_KEYS, "true or false"),
                (_INTEGER_KEYS, "an integer"),
                (_NUMBER_KEYS, "a number"),
            )
            if key in keys
        )
        if key in _LIST_KEYS:
            kind += " or a list of them"
    if not ok:
        raise ValueError(f"grid key {key!r}: expected {kind}, got {type(value).__name__} {value!r}")


def load_grid_file(path: Path) -> dict[str, Any]:
    """The key/value pairs of a grid TOML file (top level, CLI option names as keys); ValueError
    naming the file when it cannot be read or is not TOML."""
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"grid file {path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"grid file {path}: not UTF-8 text, not a TOML file ({exc.reason})") from None
    except FileNotFoundError:
        raise ValueError(f"grid file {path}: no such file") from None
    except OSError as exc:
        raise ValueError(f"grid file {path}: cannot read it ({exc.strerror or exc})") from None


def _gpu_name(text: str) -> str:
    """A known GPU's canonical name; a GPU given by its datasheet numbers as given (the numbers
    are what the point simulates, and they are part of its key)."""
    return text.strip() if ":" in text else resolve_gpu(text).name


def _hash(key: dict[str, Any]) -> str:
    text = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]

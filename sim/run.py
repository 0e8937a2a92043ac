"""One-call simulation: build the workload, the deployment's profile, the scheduler and the
policies from a flat config, run the SimPy model, summarize. The CLI and sweeps call this."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from numbers import Integral

from fastpp.metrics import pipeline_fields, summarize
from fastpp.policies import make_policies
from fastpp.profile import Profile, load_profile
from fastpp.profile_names import resolve_profile
from fastpp.run_setup import RunSetup
from fastpp.scheduler import Scheduler
from fastpp.scheduler_config import (
    DEFAULT_ADMISSION_RESERVE,
    DEFAULT_CANDIDATES,
    MAX_CHUNK_CANDIDATES,
    SchedulerConfig,
    check_queue_options,
)
from fastpp.sim.engine import HOST_LOOPS, PipelineSimulation, ProgressFn, SimResult
from fastpp.sim.limits import check_workload_extent
from fastpp.sim.steady import check_steady_state
from fastpp.types import SLO, Request
from fastpp.workloads import check_arrival, make_requests, replay_requests

MAX_ASYNC_BATCH_DEPTH = 8  # extra microbatches in flight: more only adds TPOT
_DEPLOYMENT = re.compile(r"^(?:pp(?P<pp>\d+))?(?:tp(?P<tp>\d+))?$")

# What `fastpp simulate` compares when no deployment is named: TP=4 and PP=4 at SGLang's default
# chunk, PP=4 with the best static chunk for this workload (512, found by
# benchmarks/policy_goodput.py), and PP=4 with the predictive chunk policy. The paper's points:
# untuned PP can lose to TP on PCIe, tuned PP beats it, the predictive policy cuts TPOT further.
DEFAULT_COMPARISON: tuple[str, ...] = ("tp4", "pp4", "pp4@static:512", "pp4@predictive")


def parse_deployment(text: str) -> tuple[int, int, str | None]:
    """``pp4`` -> (4, 1, None), ``tp4`` -> (1, 4, None), ``pp2tp2@static:512`` -> (2, 2,
    "static:512"): parallel degrees and an optional policy spec for this deployment only."""
    shape, _, policy = text.strip().partition("@")
    m = _DEPLOYMENT.match(shape.lower())
    if not m or not (m["pp"] or m["tp"]):
        raise ValueError(f"deployment must look like pp4, tp4, pp2tp2 or pp4@static:512, got {text!r}")
    pp, tp = int(m["pp"] or 1), int(m["tp"] or 1)
    if pp < 1 or tp < 1:
        raise ValueError(f"deployment {text!r}: pp and tp must be >= 1")
    return pp, tp, policy or None


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """Where requests come from: a named length distribution with synthetic arrivals, or a
    replayed trace (``replay`` set)."""

    name: str = "azure-conv"
    rate: float | None = 4.0  # requests per second; None = all at t=0
    num_requests: int | None = 1000
    duration_s: float | None = None  # alternative to num_requests
    arrival: str = "poisson"  # poisson | gamma
    cv: float = 1.0  # gamma arrivals' coefficient of variation
    replay: str | None = None  # trace name (azure-conv, azure-code) or CSV path
    replay_start_s: float = 0.0
    replay_window_s: float | None = None
    replay_speed: float = 1.0
    seed: int = 0
    data_dir: str | None = None

    def __post_init__(self) -> None:
        if self.replay is None and self.num_requests is None and self.duration_s is None:
            raise ValueError("give num_requests or duration_s (or a trace to replay)")
        if self.num_requests is not None and self.duration_s is not None:
            raise ValueError("give num_requests or duration_s, not both")
        if self.seed < 0:  # numpy's generator refuses it later without naming the option
            raise ValueError(f"seed (--seed) must be >= 0, got {self.seed}")
        if self.replay is None:  # refused now, not at the first run, naming the field
            check_workload_extent(self.rate, self.num_requests, self.duration_s)
            check_arrival(self.arrival, self.cv)

    def requests(self) -> list[Request]:
        if self.replay is not None:
            return replay_requests(
                self.replay,
                start_s=self.replay_start_s,
                window_s=self.replay_window_s,
                speed=self.replay_speed,
                data_dir=self.data_dir,
            )
        return make_requests(
            self.name,
            seed=self.seed,
            rate=self.rate,
            num_requests=self.num_requests,
            duration_s=self.duration_s,
            arrival=self.arrival,
            cv=self.cv,
            data_dir=self.data_dir,
        )

    def describe(self) -> str:
        if self.replay is not None:
            window = "" if self.replay_window_s is None else f", {self.replay_window_s:g} s window"
            return f"replay of {self.replay} from {self.replay_start_s:g} s{window} at {self.replay_speed:g}x"
        extent = (
            f"{self.num_requests} requests" if self.num_requests is not None else f"{self.duration_s:g} s"
        )
        arrival = f"gamma (cv {self.cv:g})" if self.arrival == "gamma" else self.arrival
        rate = "all at t=0" if self.rate is None else f"{arrival} {self.rate:g} req/s"
        return f"{self.name}, {rate}, {extent}, seed {self.seed}"


@dataclass(frozen=True, slots=True)
class DeploymentConfig:
    """What serves: a profile file, or the analytic model of a named GPU and model."""

    model: str = "Qwen2.5-32B"
    gpu: str = "A100-40GB-PCIe"
    pp: int = 4
    tp: int = 1
    profile_path: str | None = None  # overrides model/gpu/pp/tp when set (runs report the file's)
    policy: str = "static:2048"
    slo: SLO = field(default_factory=SLO)
    max_context: int | None = None  # default: the model's context length
    page_size: int | None = None  # default: the profile's
    chunk_candidates: tuple[int, ...] | None = None  # what dynamic policies pick from; default 128..2048
    host_loop: str = "free-slots"  # or batch-queue (vLLM), blocking-launch (sim/engine.py HOST_LOOPS)
    # SchedulerConfig's admission reserve ("slot" | "all") and retraction order
    # ("newest_front" | "fewest_output_back"): fastpp/scheduler_config.py says what each does
    admission_reserve: str = DEFAULT_ADMISSION_RESERVE
    retraction: str = "newest_front"
    queue_order: str = "fcfs"  # SchedulerConfig's: "fcfs" | "late_last"
    # Microbatches in flight beyond one per stage (SGLang's --pp-async-batch-depth): the
    # scheduler runs pp + depth slots, so a slot's next microbatch can wait at stage 0 while its
    # tokens come back; needs pp > 1 and the free-slots or blocking-launch host loop.
    async_batch_depth: int = 0

    def __post_init__(self) -> None:
        for name in ("pp", "tp"):  # a str from a config file would fail later, far from its cause
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        check_async_batch_depth(self.async_batch_depth, self.host_loop)
        check_queue_options(
            self.admission_reserve,
            self.retraction,
            self.queue_order,
            admission_name="admission reserve (--admission)",
            retraction_name="retraction (--retraction)",
            queue_order_name="queue order (--queue-order)",
        )
        if self.chunk_candidates is not None and len(self.chunk_candidates) > MAX_CHUNK_CANDIDATES:
            raise ValueError(
                f"chunk_candidates (--chunk-candidates): {len(self.chunk_candidates):,} "
                f"values, at most {MAX_CHUNK_CANDIDATES:,}"
            )

    @property
    def label(self) -> str:
        parts = [f"pp{self.pp}" if self.pp > 1 else "", f"tp{self.tp}" if self.tp > 1 else ""]
        return "".join(parts) or "single"

    @property
    def run_id(self) -> str:
        """File-name-safe id of deployment and policy: ``pp4-static-512``."""
        return re.sub(r"[^A-Za-z0-9.]+", "-", f"{self.label}-{self.policy}").strip("-")

    def load_profile(self) -> Profile:
        if self.profile_path is not None:  # a file, or the name of a shipped profile
            return load_profile(resolve_profile(self.profile_path))
        from fastpp.sim.analytic import analytic_profile

        return analytic_profile(self.model, self.gpu, self.pp, self.tp)

    def with_parallel(self, pp: int, tp: int, policy: str | None = None) -> DeploymentConfig:
        return replace(self, pp=pp, tp=tp, policy=policy or self.policy)


def deployments_for(base: DeploymentConfig, specs: Sequence[str] | None) -> list[DeploymentConfig]:
    """The deployments ``specs`` (``-d``) name, each on ``base``.

    Without a profile file: ``specs`` or, when none, ``DEFAULT_COMPARISON``. With one, the file
    fixes pp and tp: no specs means ``base`` itself, and specs may only name policies on the
    file's shape (``pp2@greedy`` for a pp2 file); another shape raises naming both."""
    if base.profile_path is None:
        specs = specs or DEFAULT_COMPARISON
        return _distinct(specs, [base.with_parallel(*parse_deployment(d)) for d in specs])
    if not specs:
        return [base]
    shape = base.load_profile()
    out = []
    for d in specs:
        pp, tp, policy = parse_deployment(d)
        if (pp, tp) != (shape.pp, shape.tp):
            raise ValueError(f"-d {d}: the profile {base.profile_path} is for pp{shape.pp}tp{shape.tp}")
        out.append(base.with_parallel(pp, tp, policy))
    return _distinct(specs, out)


def _distinct(specs: Sequence[str], deployments: list[DeploymentConfig]) -> list[DeploymentConfig]:
    """``deployments``, refusing one that repeats an earlier one (its rows and run folder would
    be the earlier one's twice over)."""
    first: dict[DeploymentConfig, str] = {}
    for spec, dep in zip(specs, deployments, strict=True):
        if dep in first:
            raise ValueError(f"-d {spec} names the same deployment as -d {first[dep]}; give each once")
        first[dep] = spec
    return deployments


def check_deployment(deployment: DeploymentConfig) -> None:
    """Raise ValueError now (not after a long search) if the deployment's profile cannot be
    built or its policy spec does not name policies it can run."""
    if deployment.host_loop not in HOST_LOOPS:
        raise ValueError(f"host loop must be one of {', '.join(HOST_LOOPS)}, got {deployment.host_loop!r}")
    build_scheduler(deployment.load_profile(), deployment)


@dataclass(slots=True)
class SimulationRun:
    deployment: DeploymentConfig
    profile: Profile
    result: SimResult
    summary: dict


def build_scheduler(
    profile: Profile, deployment: DeploymentConfig, *, record_token_times: bool = True
) -> Scheduler:
    """A scheduler sized by the profile, with the deployment's policies (clock set by the sim);
    ``record_token_times=False``: its records keep no per-token times (fastpp.types)."""
    config = scheduler_config(profile, deployment)
    chunk_policy, balancer = make_policies(deployment.policy, config, profile)
    return Scheduler(config, lambda: 0.0, chunk_policy, balancer, record_token_times=record_token_times)


def check_async_batch_depth(depth: int, host_loop: str) -> None:
    """``ValueError`` naming --pp-async-batch-depth unless ``depth`` is an integer in
    [0, MAX_ASYNC_BATCH_DEPTH] that ``host_loop`` can run (vLLM's loop keeps pp batches)."""
    if isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= MAX_ASYNC_BATCH_DEPTH:
        raise ValueError(
            f"async batch depth (--pp-async-batch-depth) must be an integer in "
            f"[0, {MAX_ASYNC_BATCH_DEPTH}], got {depth!r}"
        )
    if depth and host_loop == "batch-queue":
        raise ValueError(
            "async batch depth (--pp-async-batch-depth) is SGLang's; vLLM's engine-core loop "
            "(--host-loop batch-queue) keeps one batch per stage in flight"
        )


def scheduler_config(profile: Profile, deployment: DeploymentConfig) -> SchedulerConfig:
    """The scheduler configuration the deployment runs under on the profile's hardware: one
    microbatch slot per stage, plus the deployment's async batch depth."""
    if deployment.async_batch_depth and profile.pp == 1:
        raise ValueError(
            f"async batch depth (--pp-async-batch-depth) {deployment.async_batch_depth} needs "
            "pp > 1; this deployment has one stage"
        )
    return SchedulerConfig(
        num_slots=profile.pp + deployment.async_batch_depth,
        kv_capacity_tokens=profile.kv_capacity_tokens,
        page_size=deployment.page_size or profile.page_size,
        max_context=deployment.max_context or profile.model.max_context,
        slo=deployment.slo,
        token_step=profile.token_step,
        chunk_candidates=deployment.chunk_candidates or DEFAULT_CANDIDATES,
        admission_reserve=deployment.admission_reserve,
        retraction=deployment.retraction,
        queue_order=deployment.queue_order,
    )


def open_simulation(
    workload: WorkloadConfig,
    deployment: DeploymentConfig,
    *,
    requests: list[Request] | None = None,
    record_iterations: bool = True,
    max_time_s: float | None = None,
    noise_cv: float = 0.0,
    record_token_times: bool = True,
) -> PipelineSimulation:
    """The simulation of ``workload`` on ``deployment``, built and not yet run: ``run()`` it
    whole, or ``run_until_ended(n)`` to look at its first n requests and go on from there.
    ``record_token_times=False`` keeps no per-token times in its records (no ITL; TTFT and
    TPOT unchanged): a goodput probe's runs, which hold tens of millions of tokens."""
    return _build(
        workload, deployment, requests, record_iterations, max_time_s, noise_cv, record_token_times
    )[0]


def _build(
    workload: WorkloadConfig,
    deployment: DeploymentConfig,
    requests: list[Request] | None,
    record_iterations: bool,
    max_time_s: float | None,
    noise_cv: float,
    record_token_times: bool = True,
) -> tuple[PipelineSimulation, DeploymentConfig]:
    """The simulation, and the deployment as its profile splits it (a profile file says its
    own pp and tp)."""
    reqs = workload.requests() if requests is None else requests
    profile = deployment.load_profile()
    if deployment.profile_path is not None:
        deployment = replace(deployment, pp=profile.pp, tp=profile.tp)
    scheduler = build_scheduler(profile, deployment, record_token_times=record_token_times)
    sim = PipelineSimulation(
        profile,
        scheduler,
        reqs,
        record_iterations=record_iterations,
        max_time_s=max_time_s,
        noise_cv=noise_cv,
        noise_seed=workload.seed,
        host_loop=deployment.host_loop,
    )
    return sim, deployment


def run_simulation(
    workload: WorkloadConfig,
    deployment: DeploymentConfig,
    *,
    requests: list[Request] | None = None,
    record_iterations: bool = True,
    max_time_s: float | None = None,
    progress: ProgressFn | None = None,
    noise_cv: float = 0.0,
) -> SimulationRun:
    """Simulate ``workload`` on ``deployment``; ``requests`` overrides the generated ones."""
    sim, deployment = _build(workload, deployment, requests, record_iterations, max_time_s, noise_cv)
    profile, scheduler = sim.profile, sim.scheduler
    result = sim.run(progress)
    summary = summarize(
        result.records,
        slo=deployment.slo,
        backend=f"fastpp-sim {deployment.label}",
        request_rate=workload.rate if workload.replay is None else None,
    )
    summary.update(
        deployment=deployment.label,
        model=profile.model.name,
        gpu=profile.gpu,
        interconnect=profile.interconnect,
        pp=profile.pp,
        tp=profile.tp,
        policy=deployment.policy,
        host_loop=deployment.host_loop,
        admission_reserve=deployment.admission_reserve,
        retraction=deployment.retraction,
        queue_order=deployment.queue_order,
        async_batch_depth=deployment.async_batch_depth,
        workload=workload.describe(),
        kv_capacity_tokens=profile.kv_capacity_tokens,
        num_microbatches=result.num_microbatches,
        **pipeline_fields(result.stage_busy_s, result.start_at, result.end_at),
        num_decode_sitouts=result.num_decode_sitouts,
        sim_end_s=result.end_at,
        sim_wall_s=round(result.wall_s, 3),
        notes=result.notes,
        setup=RunSetup(
            engine="fastpp-sim",
            device=profile.gpu,
            pp=profile.pp,
            tp=profile.tp,
            policy=deployment.policy,
            scheduler=scheduler.config,
            model=profile.model,
            layers_per_stage=tuple(s.num_layers for s in profile.stages),
        ).to_dict(),
    )
    if workload.replay is None:  # (a trace's own rate changes: its queue may grow for that)
        steady = check_steady_state([result.records], deployment.slo)
        summary.update(
            queue_steady=steady.is_stationary,
            median_ttft_q2_ms=steady.early_ms,
            median_ttft_q4_ms=steady.late_ms,
        )
    return SimulationRun(deployment, profile, result, summary)

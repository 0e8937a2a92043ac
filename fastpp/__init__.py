"""FastPP: pipeline-parallel LLM serving policies, simulator and backends.

The public API is exactly the names in ``__all__`` (docs/API.md says what "stable" means for
them; CHANGELOG.md announces every change). Modules and names not listed here are internal:
importable, but free to change between releases.

Use the policies in a scheduler of your own::

    from fastpp import make_chunk_policy, make_balancer, load_profile
    chunk = make_chunk_policy("predictive", profile=load_profile("my_gpu.json"))
    balancer = make_balancer("ds")
    budget = chunk.choose(view)            # view: your PolicyView over your scheduler's state
    plan = balancer.plan(view, view.slot)  # which decodes of that slot to park / restore
    chunk.observe(record)                  # an IterationRecord per stage per microbatch

or ask the simulator what-if questions::

    from fastpp import DeploymentConfig, WorkloadConfig, run_simulation
    run = run_simulation(WorkloadConfig(rate=4.0, num_requests=500),
                         DeploymentConfig(pp=4, policy="predictive"))
    run.summary["p90_ttft_ms"]
"""

from typing import TYPE_CHECKING, Any

# first: a compiled build of the hot modules, when one exists for these sources (fastpp/_native.py)
import fastpp._native  # noqa: F401, I001
from fastpp._version import __version__
from fastpp.iteration_log import IterationLog
from fastpp.metrics import summarize
from fastpp.plan import BalancePlan, MicroBatchPlan, RequestEnd, SchedulerStats, StepOutput
from fastpp.policies import make_balancer, make_chunk_policy, make_policies
from fastpp.policies.base import ChunkPolicy, DecodeBalancer, NoBalancer, StaticChunkPolicy
from fastpp.policies.delay import DelayConfig, DelayScheduler
from fastpp.policies.greedy import GreedyChunkPolicy, GreedyConfig
from fastpp.policies.predictive import PredictiveChunkPolicy, PredictiveConfig
from fastpp.policies.upstream import UpstreamChunkConfig, UpstreamChunkPolicy
from fastpp.predictor import ALPPredictor, LatencyPredictor, TokensOnlyPredictor
from fastpp.profile import Profile, load_profile
from fastpp.scheduler import Scheduler
from fastpp.scheduler_config import SchedulerConfig
from fastpp.types import SLO, FinishReason, IterationRecord, Request, RequestRecord
from fastpp.view import PolicyView, RequestView

# The simulator lives in fastpp.sim (a layer above this core, which must not import it at load
# time): its entry points are public names here, imported on first use.
_SIMULATOR = {
    "run_simulation": "run_simulation",
    "WorkloadConfig": "WorkloadConfig",
    "DeploymentConfig": "DeploymentConfig",
    "SimulationRun": "SimulationRun",
}

# The deployment planner (fastpp.sim.planner), likewise imported on first use.
_PLANNER = ("plan_deployment", "PlanConfig", "DeploymentPlan", "CandidateResult")

if TYPE_CHECKING:
    from fastpp.sim.planner import CandidateResult, DeploymentPlan, PlanConfig, plan_deployment
    from fastpp.sim.run import DeploymentConfig, SimulationRun, WorkloadConfig, run_simulation


def __getattr__(name: str) -> Any:
    if name in _SIMULATOR:
        from fastpp.sim import run

        value = globals()[name] = getattr(run, _SIMULATOR[name])  # imported once
        return value
    if name in _PLANNER:
        from fastpp.sim import planner

        value = globals()[name] = getattr(planner, name)
        return value
    raise AttributeError(f"module 'fastpp' has no attribute {name!r}")


__all__ = [
    "__version__",
    # policies: the two protocols, the view they read, building them, the classes and configs
    "ChunkPolicy",
    "DecodeBalancer",
    "PolicyView",
    "RequestView",
    "BalancePlan",
    "make_chunk_policy",
    "make_balancer",
    "make_policies",
    "StaticChunkPolicy",
    "GreedyChunkPolicy",
    "GreedyConfig",
    "PredictiveChunkPolicy",
    "PredictiveConfig",
    "UpstreamChunkPolicy",
    "UpstreamChunkConfig",
    "DelayScheduler",
    "DelayConfig",
    "NoBalancer",
    # the latency predictor (scikit-learn style fit / predict / partial_fit)
    "ALPPredictor",
    "TokensOnlyPredictor",
    "LatencyPredictor",
    # records, objectives, profiles
    "IterationRecord",
    "IterationLog",
    "Request",
    "RequestRecord",
    "FinishReason",
    "SLO",
    "Profile",
    "load_profile",
    "summarize",
    # our scheduler and its executor contract
    "Scheduler",
    "SchedulerConfig",
    "MicroBatchPlan",
    "StepOutput",
    "RequestEnd",
    "SchedulerStats",
    # the simulator
    "run_simulation",
    "WorkloadConfig",
    "DeploymentConfig",
    "SimulationRun",
    # the deployment planner
    "plan_deployment",
    "PlanConfig",
    "DeploymentPlan",
    "CandidateResult",
]

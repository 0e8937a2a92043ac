"""Goodput under the paper's protocol: fixed runs of N prompts per rate over a rate grid.

The paper's benchmark (reference ``bench_serving.py --multi --request-rate-range``) sends N
prompts with Poisson arrivals at each rate of a grid and records the P90s; goodput is the highest
grid rate up to which every rate meets P90 TTFT and P90 TPOT. Each rate here is one fixed run of
``num_requests`` requests per seed (records of all seeds pooled, failures counted as infinite
TTFT), judged by the P90s alone: no steady-queue rule and no lengthening, so a run that ends
before its queue or KV cache has filled may pass a rate that a longer run would not sustain
(docs/GOODPUT.md, "Which one to use").

Search: the grid rates are run in ascending order until one fails; the answer is the last rate
that passed. With ``precision`` below the grid step, the bracket [last pass, first fail] is then
bisected with the same fixed runs down to ``precision`` req/s. Presets (``PRESETS``) hold the
paper's settings: Azure conversation, 400 prompts; CNN-Reversed, 1,000 prompts; rates 1..11.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from fastpp.sim.goodput import GoodputResult, ProbeResult, _seed_rates, judge_records
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, open_simulation


@dataclass(frozen=True, slots=True)
class FixedProtocol:
    """N prompts per rate, a grid of rates (req/s, ascending), judged on the P90s."""

    num_requests: int = 1000
    rates: tuple[float, ...] = tuple(float(r) for r in range(1, 12))

    def __post_init__(self) -> None:
        if self.num_requests < 2:
            raise ValueError(f"num_requests must be >= 2, got {self.num_requests}")
        if not self.rates or any(not r > 0 for r in self.rates):
            raise ValueError(f"rates must be positive, got {self.rates}")
        if list(self.rates) != sorted(set(self.rates)):
            raise ValueError(f"rates must be strictly ascending, got {self.rates}")


PRESETS: dict[str, FixedProtocol] = {
    "azure": FixedProtocol(num_requests=400),  # reference README: --num-prompt 400, rates 1..
    "cnn-reversed": FixedProtocol(num_requests=1000),  # reference README: 1,000 prompts
}


def parse_protocol(name: str, num_requests: int | None) -> FixedProtocol | None:
    """``steady`` -> None (the steady-state search); ``fixed`` (N from ``num_requests``,
    default 1,000) or a preset name -> its FixedProtocol (``num_requests`` overrides the
    preset's N). ValueError naming the known protocols otherwise."""
    if name == "steady":
        return None
    if name == "fixed":
        return FixedProtocol(1000 if num_requests is None else num_requests)
    preset = PRESETS.get(name)
    if preset is None:
        known = ", ".join(["steady", "fixed", *PRESETS])
        raise ValueError(f"unknown goodput protocol {name!r}; known: {known}")
    return preset if num_requests is None else replace(preset, num_requests=num_requests)


def fixed_goodput(
    workload: WorkloadConfig,
    deployment: DeploymentConfig,
    protocol: FixedProtocol,
    *,
    seeds: Sequence[int] = (0,),
    precision: float | None = None,
    progress: Callable[[ProbeResult], None] | None = None,
) -> GoodputResult:
    """Goodput of ``deployment`` on ``workload`` under ``protocol`` (module docstring)."""
    if workload.replay is not None:
        raise ValueError("goodput needs synthetic arrivals at a chosen rate, not a replayed trace")
    if not seeds:
        raise ValueError("give at least one seed")
    if precision is not None and not precision > 0:
        raise ValueError(f"precision must be > 0 req/s, got {precision!r}")
    slo, n = deployment.slo, protocol.num_requests
    probes: list[ProbeResult] = []

    def probe(rate: float) -> bool:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            runs = [
                open_simulation(
                    replace(workload, rate=rate, seed=seed, num_requests=n, duration_s=None),
                    deployment,
                    record_iterations=False,
                    record_token_times=False,
                )
                .run()
                .records
                for seed in seeds
            ]
        finally:
            if was_enabled:
                gc.enable()
        whole = judge_records(runs, slo, rate=rate, require_steady=False)
        result = replace(
            whole,
            metrics={**whole.metrics, "requests_per_seed": float(n)},
            seed_ok=tuple(judge_records([r], slo, rate=rate, require_steady=False).ok for r in runs),
        )
        probes.append(result)
        if progress is not None:
            progress(result)
        return result.ok

    lo, hi = 0.0, math.inf
    for rate in protocol.rates:
        if not probe(rate):
            hi = rate
            break
        lo = rate
    notes: list[str] = []
    if math.isinf(hi):
        notes.append(f"every grid rate passed: goodput is at least {lo:g} req/s")
    elif precision is not None:
        floor = lo if lo > 0 else hi / 16
        if lo == 0.0 and probe(floor):
            lo = floor
        if lo > 0:
            while hi - lo >= precision:
                mid = (lo + hi) / 2
                if probe(mid):
                    lo = mid
                else:
                    hi = mid
    reason = ""
    if lo == 0.0:
        first = min(probes, key=lambda p: p.rate)
        reason = f"even {first.rate:g} req/s fails: {first.reason}"
    words = (
        f"P90 TTFT <= {slo.ttft_s * 1e3:g} ms and P90 TPOT <= {slo.tpot_s * 1e3:g} ms on "
        f"fixed runs of {n} requests per rate, grid {protocol.rates[0]:g}.."
        f"{protocol.rates[-1]:g}; seeds {tuple(seeds)} pooled"
    )
    return GoodputResult(
        lo, hi - lo, tuple(probes), reason, tuple(notes), words, tuple(seeds), _seed_rates(probes, len(seeds))
    )

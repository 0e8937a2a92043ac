"""What the launcher tells the plugin, through environment variables SGLang's processes inherit.

SGLang starts its scheduler processes itself; the only channel from ``fastpp serve --backend
sglang`` (or a user's own ``python -m sglang.launch_server``) into them is the environment.
``PluginSettings.to_env`` writes it, ``PluginSettings.from_env`` reads it back in each scheduler
process. Without ``FASTPP_SGLANG_POLICY`` the plugin stays inert (``from_env`` returns None), so
installing fastpp into an SGLang environment changes nothing by itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastpp.scheduler_config import check_queue_order, parse_chunk_candidates
from fastpp.types import SLO

ENV_POLICY = "FASTPP_SGLANG_POLICY"
ENV_PROFILE = "FASTPP_SGLANG_PROFILE"
ENV_RECORD_DIR = "FASTPP_SGLANG_RECORD_DIR"
ENV_SLO = "FASTPP_SGLANG_SLO_MS"  # "TTFT,TPOT" in milliseconds
ENV_CANDIDATES = "FASTPP_SGLANG_CHUNK_CANDIDATES"
ENV_FAULT = "FASTPP_SGLANG_INJECT_FAULT"
ENV_FAULT_EVERY = "FASTPP_SGLANG_FAULT_EVERY"
ENV_TOKEN_STEP = "FASTPP_SGLANG_TOKEN_STEP"
ENV_EPOCH = "FASTPP_SGLANG_EPOCH"  # wall-clock origin (time.time()) of the run's clock, all ranks
ENV_QUEUE_ORDER = "FASTPP_SGLANG_QUEUE_ORDER"  # SchedulerConfig.queue_order: fcfs | late_last

FAULT_TARGETS = ("chunk", "balancer")


@dataclass(frozen=True, slots=True)
class PluginSettings:
    """The plugin's configuration in one scheduler process.

    ``inject_fault`` names policy methods the plugin makes raise on every ``fault_every``-th call
    (``chunk``: ``ChunkPolicy.choose``; ``balancer``: ``DecodeBalancer.plan``). It exists so tests
    can prove that a failing policy falls back and the server keeps serving; nobody sets it
    otherwise.
    """

    policy: str
    profile: str | None = None
    record_dir: str | None = None
    slo: SLO = SLO()
    chunk_candidates: tuple[int, ...] | None = None  # None: derived from the chunk ceiling
    token_step: int | None = None  # tile step in tokens; None: the profile's (0 without one)
    epoch: float = 0.0  # records and the policies' clock read time.time() - epoch
    # "fcfs" (SGLang's own order) or "late_last": rank 0 puts SGLang's waiting queue in
    # fastpp.waiting_queue.late_last_order before each decision, the other ranks apply its order
    queue_order: str = "fcfs"
    inject_fault: tuple[str, ...] = ()
    fault_every: int = 1

    def __post_init__(self) -> None:
        if not self.policy.strip():
            raise ValueError(f"{ENV_POLICY} must name a policy spec, got {self.policy!r}")
        if self.token_step is not None and self.token_step < 0:
            raise ValueError(f"{ENV_TOKEN_STEP} must be >= 0 tokens, got {self.token_step}")
        if self.fault_every < 1:
            raise ValueError(f"{ENV_FAULT_EVERY} must be >= 1, got {self.fault_every}")
        check_queue_order(self.queue_order, ENV_QUEUE_ORDER)
        bad = [f for f in self.inject_fault if f not in FAULT_TARGETS]
        if bad:
            raise ValueError(f"{ENV_FAULT}: unknown target(s) {bad}; known: {', '.join(FAULT_TARGETS)}")

    def to_env(self) -> dict[str, str]:
        env = {
            ENV_POLICY: self.policy,
            ENV_SLO: f"{self.slo.ttft_s * 1e3:g},{self.slo.tpot_s * 1e3:g}",
            ENV_EPOCH: repr(self.epoch),
        }
        if self.token_step is not None:
            env[ENV_TOKEN_STEP] = str(self.token_step)
        if self.queue_order != "fcfs":
            env[ENV_QUEUE_ORDER] = self.queue_order
        if self.profile:
            env[ENV_PROFILE] = self.profile
        if self.record_dir:
            env[ENV_RECORD_DIR] = self.record_dir
        if self.chunk_candidates:
            env[ENV_CANDIDATES] = ",".join(str(c) for c in self.chunk_candidates)
        if self.inject_fault:
            env[ENV_FAULT] = ",".join(self.inject_fault)
            env[ENV_FAULT_EVERY] = str(self.fault_every)
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PluginSettings | None:
        """The settings in ``environ`` (default ``os.environ``), or None when no policy is set."""
        env = os.environ if environ is None else environ
        policy = env.get(ENV_POLICY, "").strip()
        if not policy:
            return None
        slo = SLO()
        if env.get(ENV_SLO):
            try:
                ttft_ms, tpot_ms = (float(x) for x in env[ENV_SLO].split(","))
            except ValueError:
                raise ValueError(f"{ENV_SLO} must be 'TTFT_MS,TPOT_MS', got {env[ENV_SLO]!r}") from None
            slo = SLO(ttft_ms / 1e3, tpot_ms / 1e3)
        candidates = parse_chunk_candidates(env[ENV_CANDIDATES]) if env.get(ENV_CANDIDATES) else None
        faults = tuple(x.strip() for x in env.get(ENV_FAULT, "").split(",") if x.strip())
        return cls(
            policy=policy,
            profile=env.get(ENV_PROFILE) or None,
            record_dir=env.get(ENV_RECORD_DIR) or None,
            slo=slo,
            chunk_candidates=candidates,
            token_step=_int(env, ENV_TOKEN_STEP),
            epoch=_float(env, ENV_EPOCH) or 0.0,
            queue_order=env.get(ENV_QUEUE_ORDER, "").strip() or "fcfs",
            inject_fault=faults,
            fault_every=_int(env, ENV_FAULT_EVERY) or 1,
        )


def _int(env: Mapping[str, str], name: str) -> int | None:
    return _number(env, name, int, "an integer")


def _float(env: Mapping[str, str], name: str) -> float | None:
    return _number(env, name, float, "a number")


def _number(env: Mapping[str, str], name: str, convert: type, kind: str) -> Any:
    """``env[name]`` converted, None when unset or empty; the error names the variable."""
    if not env.get(name):
        return None
    try:
        return convert(env[name])
    except ValueError:
        raise ValueError(f"{name} must be {kind}, got {env[name]!r}") from None

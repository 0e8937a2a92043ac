"""What ``fastpp serve --backend vllm`` tells the scheduler inside vLLM's engine-core process.

vLLM builds the scheduler itself (``--scheduler-cls``), so it cannot take our arguments. The
launcher puts one JSON object in the environment variable ``FASTPP_VLLM_SCHEDULER``; vLLM's
API server hands its environment down to the engine core, where ``FastPPScheduler`` reads it.
Without the variable the scheduler runs ``static`` (fastpp's one default static chunk,
``DEFAULT_STATIC_CHUNK``, at most vLLM's ``max_num_batched_tokens``) and no balancer: stock
vLLM's scheduling under that budget (see docs/engines/vllm.md).
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Any

from fastpp.policies import make_policies
from fastpp.profile import Profile
from fastpp.scheduler_config import (
    DEFAULT_CANDIDATES,
    SchedulerConfig,
    check_queue_order,
    parse_chunk_candidates,
    static_chunk,
)
from fastpp.types import SLO

ENV_VAR = "FASTPP_VLLM_SCHEDULER"
# Folder the workers write their per-stage times to (set by the launcher; read by the plugin).
STAGE_TIMES_ENV_VAR = "FASTPP_VLLM_STAGE_TIMES_DIR"


@dataclass(frozen=True, slots=True)
class VllmSchedulerSettings:
    """The policy side of one vLLM deployment. Times in seconds, sizes in tokens."""

    # A spec as `fastpp policies` lists them (chunk policy [+ balancer]), or ``py:MODULE:FUNC``:
    # FUNC(config: SchedulerConfig, profile: Profile | None) -> (chunk policy, balancer), for
    # policies of your own (MODULE must import in vLLM's environment too).
    policy: str = "static"
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.2
    # What dynamic chunk policies pick from; None = 128..2048 step 128 capped at vLLM's
    # max_num_batched_tokens. Stored as the text the user gave (START:STOP:STEP or a list).
    chunk_candidates: str | None = None
    # the static chunk and fallback; None = DEFAULT_STATIC_CHUNK, as in every executor (at most
    # vLLM's max_num_batched_tokens either way)
    default_chunk: int | None = None
    token_step: int = 0  # tile step in tokens for the decode balancer; 0 = unknown (it assumes 128)
    profile: str | None = None  # profile JSON, for policies that predict latency
    record_dir: str | None = None  # where the run folder is written (see recorder.py)
    # SchedulerConfig.queue_order: "fcfs" (vLLM's own order) or "late_last" (vLLM's FCFS queue
    # reordered before each step, fastpp.waiting_queue.late_last_order)
    queue_order: str = "fcfs"

    def __post_init__(self) -> None:
        if not self.policy.strip():
            raise ValueError("policy must be a non-empty spec such as static:2048 or greedy+ds")
        SLO(self.slo_ttft_s, self.slo_tpot_s)  # validates both
        if self.chunk_candidates is not None:
            parse_chunk_candidates(self.chunk_candidates)
        if self.default_chunk is not None and self.default_chunk < 1:
            raise ValueError(f"default_chunk must be >= 1 token, got {self.default_chunk}")
        if self.token_step < 0:
            raise ValueError(f"token_step must be >= 0, got {self.token_step}")
        check_queue_order(self.queue_order)

    def build_policies(
        self, config: SchedulerConfig, profile: Profile | None = None
    ) -> tuple[object, object]:
        """The (chunk policy, balancer) pair ``policy`` names."""
        if not self.policy.startswith("py:"):
            return make_policies(self.policy, config, profile)
        _, _, target = self.policy.partition(":")
        module_name, _, func_name = target.partition(":")
        if not module_name or not func_name:
            raise ValueError(f"policy {self.policy!r}: expected py:MODULE:FUNCTION")
        try:
            factory = getattr(importlib.import_module(module_name), func_name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"policy {self.policy!r}: cannot import it: {exc}") from None
        return factory(config, profile)

    @property
    def slo(self) -> SLO:
        return SLO(self.slo_ttft_s, self.slo_tpot_s)

    def to_env(self) -> dict[str, str]:
        """The environment entry that carries these settings to the scheduler."""
        return {ENV_VAR: json.dumps(asdict(self), sort_keys=True)}

    @classmethod
    def from_json(cls, text: str) -> VllmSchedulerSettings:
        try:
            data: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ENV_VAR} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{ENV_VAR} must hold a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"{ENV_VAR}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**data)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> VllmSchedulerSettings:
        """The settings the launcher passed; the defaults (stock behaviour) when none were."""
        text = (os.environ if environ is None else environ).get(ENV_VAR)
        return cls() if not text else cls.from_json(text)

    def scheduler_config(
        self,
        *,
        num_slots: int,
        max_budget: int,
        kv_total_tokens: int,
        page_size: int,
        max_context: int,
        max_running: int | None = None,
    ) -> SchedulerConfig:
        """Our SchedulerConfig for one vLLM deployment: its limits as the policies see them.
        ``max_budget`` is vLLM's max_num_batched_tokens: no candidate or default above it."""
        if self.chunk_candidates:
            candidates = tuple(c for c in parse_chunk_candidates(self.chunk_candidates) if c <= max_budget)
            if not candidates:
                raise ValueError(
                    f"chunk candidates {self.chunk_candidates!r}: none is <= vLLM's "
                    f"max_num_batched_tokens ({max_budget})"
                )
        else:
            candidates = tuple(c for c in DEFAULT_CANDIDATES if c <= max_budget) or (max_budget,)
        return SchedulerConfig(
            num_slots=num_slots,
            kv_capacity_tokens=kv_total_tokens,
            page_size=page_size,
            max_context=max_context,
            chunk_candidates=candidates,
            default_chunk=static_chunk(self.default_chunk, limit=max_budget),
            max_running_requests=max_running,
            token_step=self.token_step,
            slo=self.slo,
            queue_order=self.queue_order,
        )

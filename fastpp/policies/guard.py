"""Calling policies so that their failures never reach the engine.

Every executor that runs our policies (our Scheduler, the SGLang plugin, the vLLM scheduler)
calls them through its ``PolicyHost`` (fastpp/policy_host.py), which owns one
``GuardedPolicies``: a policy that raises, returns a value that is not a positive int, or plans
an invalid balance is logged once per kind of failure and replaced, for that decision, by the
static fallback chunk or by no rebalancing. Serving goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastpp.plan import NO_BALANCE, BalancePlan
from fastpp.policies.base import ChunkPolicy, DecodeBalancer
from fastpp.types import IterationRecord

if TYPE_CHECKING:
    from fastpp.view import PolicyView

log = logging.getLogger("fastpp.policies")

FALLBACK_REASON = "fallback: policy error"


class GuardedPolicies:
    """One scheduler's chunk policy and decode balancer, called with their errors contained.

    ``errors`` holds one key per kind of failure seen ("chunk policy: ValueError", ...);
    ``num_fallbacks`` counts the decisions that fell back, by policy ("chunk policy",
    "balancer", "chunk policy.observe", ...).
    """

    __slots__ = ("chunk_policy", "balancer", "fallback_chunk", "errors", "num_fallbacks", "num_failures")

    def __init__(self, chunk_policy: ChunkPolicy, balancer: DecodeBalancer, fallback_chunk: int) -> None:
        self.chunk_policy = chunk_policy
        self.balancer = balancer
        self.fallback_chunk = fallback_chunk
        self.errors: set[str] = set()
        self.num_fallbacks: dict[str, int] = {}
        self.num_failures = 0  # decisions and observations that fell back, all policies together

    def choose(self, view: PolicyView) -> tuple[int, str]:
        """(C, reason) from the chunk policy; (fallback chunk, FALLBACK_REASON) if it fails."""
        policy = self.chunk_policy
        try:
            budget = policy.choose(view)
            if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
                raise ValueError(f"chunk policy returned {budget!r}, not a positive int")
            return budget, policy.last_reason
        except Exception as exc:
            self.failed("chunk policy", exc)
            return self.fallback_chunk, FALLBACK_REASON

    def balance(
        self, view: PolicyView, slot: int, check: Callable[[BalancePlan, int], None] | None = None
    ) -> BalancePlan:
        """The balancer's plan for ``slot``, validated by ``check`` (which raises ValueError for
        a plan the executor cannot apply); ``NO_BALANCE`` if either fails."""
        try:
            plan = self.balancer.plan(view, slot)
            if not plan.is_noop and check is not None:
                check(plan, slot)
            return plan
        except Exception as exc:
            self.failed("balancer", exc)
            return NO_BALANCE

    @property
    def observes(self) -> bool:
        """Whether either policy uses stage records (a policy without an ``observes``
        attribute is assumed to)."""
        return getattr(self.chunk_policy, "observes", True) or getattr(self.balancer, "observes", True)

    def observe(self, rec: IterationRecord) -> None:
        """Forward a stage-iteration record to both policies (once per stage and microbatch:
        written out rather than looped, it is on the simulator's hot path)."""
        try:
            self.chunk_policy.observe(rec)
        except Exception as exc:
            self.failed("chunk policy.observe", exc)
        try:
            self.balancer.observe(rec)
        except Exception as exc:
            self.failed("balancer.observe", exc)

    def failed(self, which: str, exc: Exception) -> None:
        self.num_fallbacks[which] = self.num_fallbacks.get(which, 0) + 1
        self.num_failures += 1
        key = f"{which}: {type(exc).__name__}"
        if key not in self.errors:  # log once per kind of failure
            self.errors.add(key)
            log.error("%s raised %r; using the static fallback for this decision", which, exc)

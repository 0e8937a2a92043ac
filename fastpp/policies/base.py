"""The two policy protocols (DESIGN.md section 4) and the trivial implementations.

Policies read time only from ``view.now`` and are deterministic given their inputs: SGLang runs
one scheduler replica per PP rank and all replicas must agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from fastpp.plan import NO_BALANCE, BalancePlan
from fastpp.types import IterationRecord

if TYPE_CHECKING:
    from fastpp.view import SchedulerView


@runtime_checkable
class ChunkPolicy(Protocol):
    """Chooses C, the whole token budget (decodes included) of the next microbatch."""

    def choose(self, view: SchedulerView) -> int: ...

    def observe(self, rec: IterationRecord) -> None: ...


@runtime_checkable
class DecodeBalancer(Protocol):
    """Decides which decodes of the launching slot are parked and which parked ones return."""

    def plan(self, view: SchedulerView, slot: int) -> BalancePlan: ...

    def observe(self, rec: IterationRecord) -> None: ...


@dataclass(slots=True)
class StaticChunkPolicy:
    """A fixed chunk size: SGLang's ``--chunked-prefill-size`` (default 2048)."""

    chunk: int = 2048
    last_reason: str = "static"

    def __post_init__(self) -> None:
        if self.chunk < 1:
            raise ValueError(f"static chunk must be >= 1 token, got {self.chunk}")

    def choose(self, view: SchedulerView) -> int:
        return self.chunk

    def observe(self, rec: IterationRecord) -> None:
        return None


@dataclass(slots=True)
class NoBalancer:
    """Upstream behaviour: a request decodes in the slot where its prefill ended, never moved."""

    def plan(self, view: SchedulerView, slot: int) -> BalancePlan:
        return NO_BALANCE

    def observe(self, rec: IterationRecord) -> None:
        return None

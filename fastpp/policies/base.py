"""The two policy protocols and the trivial implementations.

A policy reads the state only through the ``PolicyView`` it is given (fastpp/view.py), reads
time only from ``view.now``, and is deterministic given its inputs and the records it observed:
SGLang runs one scheduler replica per PP rank and all replicas must agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

from fastpp.plan import NO_BALANCE, BalancePlan
from fastpp.types import IterationRecord

if TYPE_CHECKING:
    from fastpp.view import PolicyView


@runtime_checkable
class ChunkPolicy(Protocol):
    """Chooses C, the whole token budget (decodes included) of the next microbatch.

    ``choose`` returns a positive int; ``last_reason`` then says why (logs, timelines, the
    plan's ``reason``). ``observe`` gets every stage-iteration record of every microbatch,
    those of one microbatch before its tokens are folded in. A policy whose ``observe`` ignores
    its records says so with a class attribute ``observes = False`` (absent: assumed True): an
    executor may then skip building the records for it.
    """

    last_reason: str

    def choose(self, view: PolicyView) -> int: ...

    def observe(self, rec: IterationRecord) -> None: ...


@runtime_checkable
class DecodeBalancer(Protocol):
    """Decides which decodes of the launching slot are parked and which parked ones return.

    ``plan`` may park only decodes of ``slot`` (the slot about to launch; the others may be in
    flight) and restore only parked requests; the scheduler checks and otherwise ignores the plan.
    ``observes`` as for ChunkPolicy.
    """

    def plan(self, view: PolicyView, slot: int) -> BalancePlan: ...

    def observe(self, rec: IterationRecord) -> None: ...


@dataclass(slots=True)
class StaticChunkPolicy:
    """A fixed chunk size: SGLang's ``--chunked-prefill-size`` (default 2048)."""

    chunk: int = 2048
    last_reason: str = "static"
    observes: ClassVar[bool] = False  # observe() ignores its records

    def __post_init__(self) -> None:
        if self.chunk < 1:
            raise ValueError(f"static chunk must be >= 1 token, got {self.chunk}")

    def choose(self, view: PolicyView) -> int:
        return self.chunk

    def observe(self, rec: IterationRecord) -> None:
        return None


@dataclass(slots=True)
class NoBalancer:
    """Upstream behaviour: a request decodes in the slot where its prefill ended, never moved."""

    observes: ClassVar[bool] = False  # observe() ignores its records

    def plan(self, view: PolicyView, slot: int) -> BalancePlan:
        return NO_BALANCE

    def observe(self, rec: IterationRecord) -> None:
        return None

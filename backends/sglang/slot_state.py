"""``SGLangSlots``: the policy host's ``SlotState`` (fastpp/policy_host.py) over SGLang 0.5.23.

SGLang keeps one running ``ScheduleBatch`` per microbatch slot (``Scheduler.running_mbs``); our
balancer's parked requests are kept here, out of every batch, with their KV. This class only
translates: our integer request ids <-> SGLang's ``Req`` objects and rids, parking and
restoring through ``batch_ops`` (or the ``park`` / ``restore`` functions given, for tests), and
which slots are in flight. Every decision is the host's.

The launching slot is special: while SGLang forms microbatch k, ``running_mbs[k]`` still holds
the batch from before this step's merge of the finished prefill; ``begin`` hands this class the
merged batch (``live_batch``) about to be scheduled, and restoring into an empty batch replaces
it (``live_batch`` is then the batch SGLang must go on with).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastpp.plan import BalancePlan


@dataclass(slots=True)
class ParkedRequest:
    """A decode our balancer took out of its microbatch: its KV stays allocated."""

    req: Any  # SGLang's Req
    parked_at: float


def live_reqs(sched: Any, batch: Any) -> list[Any]:
    """The decodes of a running batch: neither finished nor the request still being chunked."""
    chunked = sched.chunked_req
    return [r for r in batch.reqs if not r.finished() and r is not chunked]


class SGLangSlots:
    """SlotState of one SGLang scheduler (module docstring). ``identity(req)`` is our
    (request id, arrival time) of an SGLang ``Req``; ``rid_of`` maps our ids back to rids."""

    def __init__(
        self,
        identity: Callable[[Any], tuple[int, float]],
        rid_of: dict[int, str],
        park: Callable[[Any, list[Any]], None] | None = None,
        restore: Callable[[Any, Any, list[Any]], Any] | None = None,
    ) -> None:
        if park is None or restore is None:
            from fastpp.backends.sglang import batch_ops

            park, restore = park or batch_ops.park, restore or batch_ops.restore
        self._identity = identity
        self._rid_of = rid_of
        self._park, self._restore = park, restore
        self.parked: dict[str, ParkedRequest] = {}  # by rid, longest parked first
        self.sched: Any = None
        self.slot = 0
        self.live_batch: Any = None

    def begin(self, sched: Any, slot: int, live_batch: Any) -> None:
        """The step that forms microbatch ``slot`` from ``live_batch`` starts."""
        self.sched, self.slot, self.live_batch = sched, slot, live_batch

    def batch_of(self, slot: int) -> Any:
        return (
            self.live_batch
            if slot == self.slot and self.live_batch is not None
            else self.sched.running_mbs[slot]
        )

    def running_reqs(self, slot: int) -> list[Any]:
        return live_reqs(self.sched, self.batch_of(slot))

    # -- SlotState
    def running_ids(self, slot: int) -> list[int]:
        return [self._identity(r)[0] for r in self.running_reqs(slot)]

    def num_running(self, slot: int) -> int:
        return len(self.running_reqs(slot))

    def num_parked(self) -> int:
        return len(self.parked)

    def parked_ids(self) -> list[int]:
        return [self._identity(p.req)[0] for p in self.parked.values()]

    def is_parked(self, req_id: int) -> bool:
        return self._rid_of.get(req_id) in self.parked

    def apply(self, plan: BalancePlan, slot: int, now: float) -> None:
        assert slot == self.slot, "SGLang changes the membership of the launching slot only"
        self.apply_rids(self.rids(plan.park_ids), self.rids(plan.restore_ids), now)

    def pick(self, slot: int, budget: int) -> list[Any]:
        """SGLang runs every unparked decode of the slot, whatever C is (a prefill
        microbatch carries none without --enable-mixed-chunk)."""
        return self.running_reqs(slot)

    def any_in_flight(self) -> bool:
        """Every other slot with a batch is in flight while slot k is formed: event_loop_pp
        processes microbatch k+1's result only after launching k (scheduler_pp_mixin.py)."""
        mbs = self.sched.mbs
        return any(mbs[s] is not None for s in range(len(mbs)) if s != self.slot)

    # -- translation
    def rids(self, req_ids: tuple[int, ...]) -> tuple[str, ...]:
        return tuple(self._rid_of[i] for i in req_ids)

    def apply_rids(self, park_rids: tuple[str, ...], restore_rids: tuple[str, ...], now: float) -> None:
        """Park and restore by SGLang rid (rank 0's decision, applied on every rank)."""
        batch = self.live_batch
        if park_rids:
            by_rid = {r.rid: r for r in batch.reqs}
            reqs = [by_rid[rid] for rid in park_rids]
            self._park(batch, reqs)
            for r in reqs:
                self.parked[r.rid] = ParkedRequest(r, now)
        if restore_rids:
            reqs = []
            for rid in restore_rids:
                p = self.parked.pop(rid)
                if not p.req.finished():
                    reqs.append(p.req)
            self.live_batch = self._restore(self.sched, batch, reqs)

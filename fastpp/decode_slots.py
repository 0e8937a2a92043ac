"""The D_p running decode sets of a pipeline, their ALP aggregates, and the parked set: the
``SlotState`` (fastpp/policy_host.py) of our Scheduler and of the vLLM backend."""

from __future__ import annotations

from collections.abc import Callable

from fastpp.live_request import LiveRequest
from fastpp.plan import BalancePlan


class DecodeSlots:
    """Which slot each decoding request belongs to, and which are parked (held back).

    Invariants, kept by the methods here (other objects only read ``running``, ``ctx_sum`` and
    ``parked``): a request is in at most one running list or in ``parked``, never both;
    ``ctx_sum[s]`` is the sum of ``ctx_len`` over ``running[s]`` (parked ones excluded);
    ``r.slot`` is the index of the list holding ``r``, -1 otherwise. Each running list is in
    join order (the request that joined that slot longest ago first: new decodes and restored
    requests join at the tail; nothing reorders a list). ``parked`` is in parking order
    (longest parked first).
    """

    __slots__ = ("running", "ctx_sum", "parked", "_cursor", "any_in_flight")

    def __init__(self, num_slots: int, any_in_flight: Callable[[], bool] = lambda: False) -> None:
        self.running: list[list[LiveRequest]] = [[] for _ in range(num_slots)]
        self.ctx_sum: list[int] = [0] * num_slots
        self.parked: dict[int, LiveRequest] = {}
        self._cursor = [0] * num_slots  # where the next partial pick of a slot starts
        # the executor's answer to "is any microbatch that computes something in flight?"
        self.any_in_flight = any_in_flight

    # -- SlotState (fastpp.policy_host): what the host reads
    def running_ids(self, slot: int) -> list[int]:
        return [r.req_id for r in self.running[slot]]

    def num_running(self, slot: int) -> int:
        return len(self.running[slot])

    def num_parked(self) -> int:
        return len(self.parked)

    def parked_ids(self) -> list[int]:
        return list(self.parked)

    def is_parked(self, req_id: int) -> bool:
        return req_id in self.parked

    def join(self, r: LiveRequest, slot: int) -> None:
        r.slot = slot
        self.running[slot].append(r)
        self.ctx_sum[slot] += r.ctx_len

    def leave(self, r: LiveRequest) -> None:
        """Take ``r`` out of its slot or the parked set (no-op when it is in neither)."""
        if r.slot >= 0:
            self.running[r.slot].remove(r)
            self.ctx_sum[r.slot] -= r.ctx_len
            r.slot = -1
        elif r.parked_at is not None:
            del self.parked[r.req_id]
            r.parked_at = None

    def pick(self, slot: int, budget: int) -> list[LiveRequest]:
        """The decodes of ``slot`` that run in a microbatch of ``budget`` tokens: all of them
        when they fit, else ``budget`` of them, round-robin over the join order, so those left
        out this round go first next round (a sit-out never reorders the list)."""
        run = self.running[slot]
        n = len(run)
        if n <= budget:
            return list(run)
        start = self._cursor[slot] % n
        self._cursor[slot] = (start + budget) % n
        end = start + budget
        return run[start:end] if end <= n else run[start:] + run[: end - n]

    def decoded(self, slot: int, num_decodes: int) -> None:
        """``num_decodes`` requests running in ``slot`` each fed one token: the caller grew
        their ``ctx_len`` by one (in its own per-token loop); the slot's sum follows here.
        Those that end with it leave afterwards (``leave`` takes the grown context off)."""
        self.ctx_sum[slot] += num_decodes

    def apply(self, plan: BalancePlan, slot: int, now: float) -> None:
        """Park and restore as a checked ``plan`` says (fastpp.policy_host.check_balance);
        restored requests join ``slot``. (The host counts the parks in the records.)"""
        park = set(plan.park_ids)
        if park:
            keep = []
            for r in self.running[slot]:
                if r.req_id in park:
                    r.parked_at = now
                    r.slot = -1
                    self.ctx_sum[slot] -= r.ctx_len
                    self.parked[r.req_id] = r
                else:
                    keep.append(r)
            self.running[slot] = keep
        for rid in plan.restore_ids:
            self._unpark(self.parked[rid], slot)

    def _unpark(self, r: LiveRequest, slot: int) -> None:
        del self.parked[r.req_id]
        r.parked_at = None
        self.join(r, slot)

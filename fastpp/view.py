"""The policy interface: what a ChunkPolicy or DecodeBalancer may read, as Protocols, and
``SchedulerView``, our Scheduler's implementation of it.

Any scheduler can run our policies by implementing :class:`PolicyView` over its own state (the
SGLang and vLLM backends do; tests/test_policy_conformance.py runs every registered policy
against a minimal implementation written from this file alone). Policies must read nothing
else: no scheduler attributes, no engine objects, no wall clock (time comes from ``now``).

Order guarantees, true of every implementation:

* ``iter_waiting`` is the order requests will be admitted in: FCFS (arrival order, except that
  a retracted request goes to the front: it was admitted before anyone waiting; or, with
  ``SchedulerConfig.retraction="fewest_output_back"``, to the back). With
  ``SchedulerConfig.queue_order="late_last"`` (our scheduler only) a request that has waited
  past the SLO TTFT without its first token comes after the others until it has waited 10 x
  the SLO TTFT (fastpp/waiting_queue.py). The partly prefilled request is not in it; it is
  ``chunked``.
* ``iter_running(slot)`` is join order: the request that joined that slot longest ago first.
  A request joins a slot when its last prefill chunk returns there or when it is restored from
  the parked set; nothing else reorders a slot (a decode that sits out a round keeps its place).
* ``iter_parked`` is parking order: longest parked first.

The view is a facade, not a copy: values are live. Policies must treat it and the requests it
yields as read-only, and must not keep a request object past the call that got it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from fastpp.live_request import LiveRequest
from fastpp.types import SLO

if TYPE_CHECKING:
    from fastpp.decode_slots import DecodeSlots
    from fastpp.kv_pool import KVPool
    from fastpp.scheduler_config import SchedulerConfig
    from fastpp.signals import Signals
    from fastpp.waiting_queue import WaitingQueue

Sample = tuple[float, float]  # (time in seconds, value), as the signal histories hold them


@runtime_checkable
class RequestView(Protocol):
    """The read-only fields of one request a policy may use. Times in seconds on the view's
    clock; lengths in tokens."""

    @property
    def req_id(self) -> int: ...

    @property
    def arrived_at(self) -> float: ...

    @property
    def prompt_len(self) -> int: ...

    @property
    def num_computed(self) -> int:
        """Tokens of its current prefill already scheduled: L_past of its next chunk."""
        ...

    @property
    def remaining_prefill(self) -> int:
        """Tokens its current prefill still has to compute (0 while decoding). After a
        retraction the prefill covers the prompt plus the tokens generated before it."""
        ...

    @property
    def ctx_len(self) -> int:
        """While decoding: L_dec, the tokens its next decode step attends to (the fed one
        included)."""
        ...

    @property
    def num_generated(self) -> int: ...

    @property
    def parked_at(self) -> float | None:
        """When the decode balancer parked it; None unless parked."""
        ...


@runtime_checkable
class PolicyView(Protocol):
    """Everything a policy may read at a decision. See the module docstring for the order
    guarantees; ``slot`` is the slot about to launch."""

    # -- clock and deployment
    @property
    def now(self) -> float:
        """Seconds on the scheduler's clock (virtual in simulation, wall time in engines)."""
        ...

    @property
    def num_slots(self) -> int:
        """D_p: microbatch slots, one per pipeline stage (1 for TP)."""
        ...

    @property
    def slot(self) -> int:
        """The slot about to launch."""
        ...

    @property
    def slo(self) -> SLO: ...

    @property
    def chunk_candidates(self) -> tuple[int, ...]:
        """The chunk budgets a dynamic policy picks from, strictly ascending."""
        ...

    @property
    def default_chunk(self) -> int:
        """The static chunk (also the fallback when a policy fails)."""
        ...

    @property
    def token_step(self) -> int:
        """The hardware's tile step in tokens (128 on A100/H100); 0 when none is known."""
        ...

    # -- memory
    @property
    def kv_total_tokens(self) -> int: ...

    @property
    def kv_free_tokens(self) -> int:
        """KV tokens not reserved by any request (parked requests keep theirs)."""
        ...

    # -- the waiting queue
    @property
    def num_waiting(self) -> int:
        """Requests in ``iter_waiting`` (the chunked request excluded)."""
        ...

    @property
    def waiting_prefill_tokens(self) -> int:
        """Prefill tokens still to schedule: the waiting requests plus the chunked one."""
        ...

    @property
    def waiting_arrival_sum(self) -> float:
        """Sum of ``arrived_at`` over ``iter_waiting``: mean waits without walking the queue."""
        ...

    @property
    def chunked(self) -> RequestView | None:
        """The request whose prefill started and continues in the next microbatch."""
        ...

    def iter_waiting(self) -> Iterator[RequestView]:
        """Waiting requests in admission order (FCFS unless the queue order is late_last)."""
        ...

    def iter_waiting_newest_first(self) -> Iterator[RequestView]:
        """Waiting requests, latest arrivals first (a policy can stop early)."""
        ...

    # -- running decodes and parked requests
    def num_running(self, slot: int) -> int: ...

    def sum_decode_ctx(self, slot: int) -> int:
        """Sum of L_dec over the slot's running decodes (parked ones excluded)."""
        ...

    def iter_running(self, slot: int) -> Iterator[RequestView]:
        """The slot's running decodes in join order."""
        ...

    def is_in_flight(self, slot: int) -> bool:
        """True while a microbatch of ``slot`` is in the pipeline."""
        ...

    @property
    def num_parked(self) -> int: ...

    def iter_parked(self) -> Iterator[RequestView]:
        """Parked requests, longest parked first."""
        ...

    # -- recent signals: (time, value) samples, newest last (see fastpp.signals.Signals)
    @property
    def recent_ttft(self) -> Sequence[Sample]:
        """(first-token time, TTFT seconds) of recent first tokens."""
        ...

    @property
    def recent_token_gap(self) -> Sequence[Sample]:
        """(return time, seconds since that slot's previous return) per returning decode
        microbatch."""
        ...

    @property
    def recent_arrivals(self) -> Sequence[tuple[float, int]]:
        """(arrival time, prompt tokens) of recent arrivals."""
        ...

    @property
    def num_arrivals(self) -> int:
        """Arrivals so far: a policy that keeps its own window ingests only the new ones."""
        ...


class DeploymentFields:
    """The deployment part of a :class:`PolicyView`, read from a ``SchedulerConfig``: every view
    (ours, and the engine backends') derives from this and sets ``_config``."""

    __slots__ = ()
    _config: SchedulerConfig

    @property
    def num_slots(self) -> int:
        return self._config.num_slots

    @property
    def slo(self) -> SLO:
        return self._config.slo

    @property
    def chunk_candidates(self) -> tuple[int, ...]:
        return self._config.chunk_candidates

    @property
    def default_chunk(self) -> int:
        return self._config.default_chunk

    @property
    def token_step(self) -> int:
        return self._config.token_step


class SchedulerView(DeploymentFields):
    """Our Scheduler's :class:`PolicyView`: a facade over its queue, slots, KV pool and signals."""

    __slots__ = ("_config", "_queue", "_slots", "_kv", "_signals", "_in_flight", "now", "slot")

    def __init__(
        self,
        config: SchedulerConfig,
        queue: WaitingQueue,
        slots: DecodeSlots,
        kv: KVPool,
        signals: Signals,
        in_flight: list,
    ) -> None:
        self._config = config
        self._queue = queue
        self._slots = slots
        self._kv = kv
        self._signals = signals
        self._in_flight = in_flight  # the scheduler's list, mutated in place
        self.now = 0.0  # set by the scheduler before each decision
        self.slot = 0

    # -- memory
    @property
    def kv_total_tokens(self) -> int:
        return self._kv.capacity

    @property
    def kv_free_tokens(self) -> int:
        return self._kv.free

    # -- the waiting queue
    @property
    def num_waiting(self) -> int:
        return len(self._queue)

    @property
    def waiting_prefill_tokens(self) -> int:
        return self._queue.prefill_tokens

    @property
    def waiting_arrival_sum(self) -> float:
        return self._queue.arrival_sum

    @property
    def chunked(self) -> LiveRequest | None:
        return self._queue.chunked

    def iter_waiting(self) -> Iterator[LiveRequest]:
        return iter(self._queue)

    def iter_waiting_newest_first(self) -> Iterator[LiveRequest]:
        return self._queue.newest_first()

    # -- running decodes and parked requests
    def num_running(self, slot: int) -> int:
        return len(self._slots.running[slot])

    def sum_decode_ctx(self, slot: int) -> int:
        return self._slots.ctx_sum[slot]

    def iter_running(self, slot: int) -> Iterator[LiveRequest]:
        return iter(self._slots.running[slot])

    def is_in_flight(self, slot: int) -> bool:
        return self._in_flight[slot] is not None

    @property
    def num_parked(self) -> int:
        return len(self._slots.parked)

    def iter_parked(self) -> Iterator[LiveRequest]:
        return iter(self._slots.parked.values())

    # -- recent signals
    @property
    def recent_ttft(self) -> Sequence[Sample]:
        return self._signals.ttft

    @property
    def recent_token_gap(self) -> Sequence[Sample]:
        return self._signals.token_gap

    @property
    def recent_arrivals(self) -> Sequence[tuple[float, int]]:
        return self._signals.arrivals

    @property
    def num_arrivals(self) -> int:
        return self._signals.num_arrivals

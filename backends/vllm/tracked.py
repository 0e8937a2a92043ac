"""Our record of one vLLM request: its slot, parking and RequestRecord, and the ``RequestView``
(fastpp/view.py) policies read, over the engine's own token counters.

vLLM keeps the counters (``num_computed_tokens``, ``num_tokens`` = prompt + outputs,
``num_output_tokens``); we keep only what vLLM has no notion of: the slot a decode belongs to,
when it was parked, and its context length as our ``DecodeSlots`` sums it. ``engine`` is the
vLLM ``Request`` (duck-typed here: the adapter and its tests need no vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastpp.types import RequestRecord


@dataclass(slots=True, eq=False)
class TrackedRequest:
    """One request from arrival to its end. Policies see it as a ``RequestView``.

    Phases: prefill while ``slot == -1`` and not parked (``remaining_prefill`` from vLLM's
    counters); decode while in a slot's running list or parked. ``ctx_len`` (L_dec) is set when
    the last prefill chunk returns and grows by one per returned decode step (``DecodeSlots``
    keeps per-slot sums of it, so it is stored, not derived).
    """

    rec: RequestRecord
    engine: Any  # vllm.v1.request.Request
    req_id: int = field(init=False)
    prompt_len: int = field(init=False)
    arrived_at: float = field(init=False)
    ctx_len: int = 0
    slot: int = -1  # decode slot, -1 while prefilling or parked
    parked_at: float | None = None
    ended: bool = False

    def __post_init__(self) -> None:
        self.req_id = self.rec.req_id
        self.prompt_len = self.rec.prompt_len
        self.arrived_at = self.rec.arrived_at

    @property
    def engine_id(self) -> str:
        return self.engine.request_id

    @property
    def is_decoding(self) -> bool:
        """In a slot or parked: its prefill has returned."""
        return self.slot >= 0 or self.parked_at is not None

    @property
    def num_computed(self) -> int:
        """Tokens of the current prefill already scheduled (vLLM advances it at schedule time)."""
        return 0 if self.is_decoding else self.engine.num_computed_tokens

    @property
    def remaining_prefill(self) -> int:
        """Tokens the current prefill still has to schedule. After a preemption vLLM recomputes
        the prompt and the outputs so far, so this is measured against ``num_tokens``."""
        if self.is_decoding:
            return 0
        return max(0, self.engine.num_tokens - self.engine.num_computed_tokens)

    @property
    def num_generated(self) -> int:
        return self.rec.num_generated

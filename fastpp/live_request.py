"""Per-request scheduling state, expressed as integer token counters (no phase flags).

A request alternates between two phases, both derived from counters:

* prefill: ``num_computed < fill_len``. ``fill_len`` is the prompt length, or, after a
  retraction freed its KV, the prompt plus the tokens generated so far (recomputed).
* decode: ``num_computed == fill_len`` and it sits in a slot's running set. Its KV holds
  ``ctx_len = prompt_len + num_generated - 1`` tokens (the newest token has no KV yet); a
  decode step writes that token's KV and samples the next one.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastpp.types import RequestRecord


@dataclass(slots=True, eq=False)
class LiveRequest:
    """Mutable state of an admitted request; owned by the Scheduler, read by policies."""

    rec: RequestRecord
    target_len: int  # tokens to generate: output_len capped by the context limit
    fill_len: int  # tokens the current prefill phase must compute
    num_computed: int = 0  # tokens of the current prefill phase already scheduled
    kv_tokens: int = 0  # KV reserved for it, in tokens (a multiple of the page size)
    slot: int = -1  # decode slot, -1 while waiting / prefilling
    admit_seq: int = -1  # admission order; larger = newer (retraction victims first)
    parked_at: float | None = None  # set while the decode balancer holds it back
    in_flight: bool = False  # part of a microbatch that has not returned yet
    aborted: bool = False

    @property
    def req_id(self) -> int:
        return self.rec.req_id

    @property
    def arrived_at(self) -> float:
        return self.rec.arrived_at

    @property
    def prompt_len(self) -> int:
        return self.rec.prompt_len

    @property
    def num_generated(self) -> int:
        return self.rec.num_generated

    @property
    def remaining_prefill(self) -> int:
        return self.fill_len - self.num_computed

    @property
    def ctx_len(self) -> int:
        """Tokens attended by its next decode step (L_dec): KV so far plus the token fed."""
        return self.rec.prompt_len + self.rec.num_generated

    @property
    def remaining_output(self) -> int:
        return self.target_len - self.rec.num_generated

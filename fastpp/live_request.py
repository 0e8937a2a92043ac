"""Per-request scheduling state, expressed as integer token counters (no phase flags).

A request alternates between two phases, both derived from counters:

* prefill: ``num_computed < fill_len``. ``fill_len`` is the prompt length, or, after a
  retraction freed its KV, the prompt plus the tokens generated so far (recomputed).
* decode: ``num_computed == fill_len`` and it sits in a slot's running set. Its KV holds
  ``ctx_len - 1`` tokens (the newest token has no KV yet); a decode step feeds that token,
  writes its KV and samples the next one.

Policies see these objects through ``fastpp.view.RequestView`` (read-only fields).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastpp.types import RequestRecord, pickle_by_constructor


@dataclass(slots=True, eq=False)
class LiveRequest:
    """Mutable state of an admitted request; owned by the Scheduler, read by policies."""

    rec: RequestRecord
    target_len: int  # tokens to generate: output_len capped by the context limit and the KV pool
    fill_len: int  # tokens the current prefill phase must compute
    req_id: int = field(init=False)  # copies of rec's, read on hot paths
    prompt_len: int = field(init=False)
    arrived_at: float = field(init=False)
    token_times: list[float] = field(init=False)  # rec.token_times itself (appended per token)
    ctx_len: int = 0  # L_dec while decoding: KV so far + the token fed (prompt + generated)
    num_computed: int = 0  # tokens of the current prefill phase already scheduled
    kv_tokens: int = 0  # KV reserved for it, in tokens (a multiple of the page size)
    slot: int = -1  # decode slot, -1 while waiting / prefilling / parked
    admit_seq: int = -1  # admission order; larger = newer (retraction victims first)
    parked_at: float | None = None  # set while the decode balancer holds it back
    in_flight: bool = False  # a prefill chunk of it has not returned yet
    aborted: bool = False

    # Written out (as fastpp/plan.py's value types): one per admitted request.
    def __init__(
        self,
        rec: RequestRecord,
        target_len: int,
        fill_len: int,
        ctx_len: int = 0,
        num_computed: int = 0,
        kv_tokens: int = 0,
        slot: int = -1,
        admit_seq: int = -1,
        parked_at: float | None = None,
        in_flight: bool = False,
        aborted: bool = False,
    ) -> None:
        self.rec = rec
        self.target_len = target_len
        self.fill_len = fill_len
        self.req_id = rec.req_id
        self.prompt_len = rec.prompt_len
        self.arrived_at = rec.arrived_at
        self.token_times = rec.token_times
        self.ctx_len = ctx_len
        self.num_computed = num_computed
        self.kv_tokens = kv_tokens
        self.slot = slot
        self.admit_seq = admit_seq
        self.parked_at = parked_at
        self.in_flight = in_flight
        self.aborted = aborted

    @property
    def num_generated(self) -> int:
        return self.rec.num_generated

    @property
    def remaining_prefill(self) -> int:
        return self.fill_len - self.num_computed

    @property
    def remaining_output(self) -> int:
        return self.target_len - self.rec.num_generated


pickle_by_constructor(LiveRequest)

"""Carrying rank 0's decisions to the other PP ranks, and their stage timings back to rank 0.

Every PP rank of SGLang runs its own scheduler on replicated state and must form identical
microbatches (the next stage receives hidden states shaped by the previous stage's batch). Our
policies read wall-clock signals that differ by rank, so only PP rank 0 runs them; each decision
(``Decision``) travels to ranks 1..P-1, which apply it instead of deciding. Rank 0 forms
microbatch k before any later rank can (they need its hidden states), so a later rank waits for
nothing it would not wait for anyway.

Stage records travel the other way: each rank sends the record of every microbatch it ran to
rank 0, which receives them (blocking) when it processes that microbatch's result: by then the
last stage has finished the microbatch, so every earlier stage has too and its record is sent.
(Polling instead does not work: a gloo ``irecv``'s ``is_completed()`` stays False until
``wait()``.)

Transport: point-to-point messages on SGLang's own gloo group (``world_group.cpu_group``) with
tags of our own, so they never match SGLang's untagged messages on the same pairs. Sends are
asynchronous; receives block.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

from fastpp.types import ITERATION_FIELDS, IterationRecord

DECISION_TAG = 0x46505001  # "FPP" + 1
RECORD_TAG = 0x46505002
# every numeric field of a stage record; the chunk policy's reason is known on rank 0 already
_RECORD_FIELDS = tuple(f for f in ITERATION_FIELDS if f != "reason")
_TIME_FIELDS = ("started_at", "finished_at")


@dataclass(frozen=True, slots=True)
class Decision:
    """What PP rank 0 decided for one scheduling step; every rank applies exactly this.

    ``seq`` counts decisions (one per ``get_new_batch_prefill`` call, which every rank makes at
    the same step); ``digest`` summarises rank 0's replicated state at that point so a rank can
    tell that its own state diverged. ``chunk`` None leaves SGLang's own chunk size in place.
    Requests are named by SGLang's request id (``Req.rid``), identical on all ranks.
    """

    seq: int
    slot: int
    chunk: int | None
    reason: str
    park: tuple[str, ...]
    restore: tuple[str, ...]
    digest: str
    fallback: str = ""  # which policy failed and fell back this step, "" when none
    # the waiting queue's new order (rids) when rank 0 reordered it (queue order late_last)
    order: tuple[str, ...] = ()


class DecisionChannel:
    """Rank 0 -> ranks 1..P-1 (decisions) and ranks 1..P-1 -> rank 0 (stage records).

    ``peers`` are the world ranks of the other PP ranks' schedulers (same TP rank).
    """

    def __init__(self, group: Any, my_world_rank: int, leader_world_rank: int, peers: list[int]) -> None:
        import torch
        import torch.distributed as dist

        self._torch = torch
        self._dist = dist
        self._group = group
        self._me = my_world_rank
        self._leader = leader_world_rank
        self._peers = peers
        self._pending: list[Any] = []  # (work, tensor) of async sends not yet waited for

    @property
    def is_leader(self) -> bool:
        return self._me == self._leader

    # -- decisions --------------------------------------------------------------------------
    def send_decision(self, decision: Decision) -> None:
        payload = pickle.dumps(decision)
        size = self._torch.tensor([len(payload)], dtype=self._torch.long)
        data = self._torch.frombuffer(bytearray(payload), dtype=self._torch.uint8)
        for peer in self._peers:
            self._isend(size, peer, DECISION_TAG)
            self._isend(data, peer, DECISION_TAG)
        self._prune()

    def recv_decision(self) -> Decision:
        size = self._torch.zeros(1, dtype=self._torch.long)
        self._dist.recv(size, src=self._leader, group=self._group, tag=DECISION_TAG)
        data = self._torch.empty(int(size.item()), dtype=self._torch.uint8)
        self._dist.recv(data, src=self._leader, group=self._group, tag=DECISION_TAG)
        return pickle.loads(data.numpy().tobytes())

    # -- stage records ----------------------------------------------------------------------
    def send_record(self, rec: IterationRecord) -> None:
        values = [float(getattr(rec, f)) for f in _RECORD_FIELDS]
        self._isend(self._torch.tensor(values, dtype=self._torch.float64), self._leader, RECORD_TAG)
        self._prune()

    def recv_records(self) -> list[IterationRecord]:
        """One record from each other rank, in rank order (leader only; blocks until sent)."""
        out = []
        for peer in self._peers:
            buf = self._torch.empty(len(_RECORD_FIELDS), dtype=self._torch.float64)
            self._dist.recv(buf, src=peer, group=self._group, tag=RECORD_TAG)
            out.append(_decode_record(buf))
        return out

    # -- plumbing ---------------------------------------------------------------------------
    def _isend(self, tensor: Any, dst: int, tag: int) -> None:
        work = self._dist.isend(tensor, dst=dst, group=self._group, tag=tag)
        self._pending.append((work, tensor))  # keep the tensor alive until the send completes

    def _prune(self) -> None:
        # a gloo send's work reports completion only once waited for; its peer receives every
        # message within a loop round, so waiting on all but the newest few never stalls long
        while len(self._pending) > 64:
            work, _ = self._pending.pop(0)
            work.wait()


def _decode_record(buf: Any) -> IterationRecord:
    values = buf.tolist()
    kwargs: dict[str, Any] = {}
    for name, value in zip(_RECORD_FIELDS, values, strict=True):
        kwargs[name] = value if name in _TIME_FIELDS else int(value)
    return IterationRecord(**kwargs)

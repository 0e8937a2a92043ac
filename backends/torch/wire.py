"""Point-to-point messages between stage processes over torch.distributed (gloo, 127.0.0.1).

A message is a header ``int64[3] = (kind, payload bytes, hidden rows)``, a pickled payload (plain
Python data: lists, tuples, ints) and, for a microbatch, the hidden states ``[rows, D]``. Each of
the two directions has its own tags, so stage 0 can send microbatches from one thread while
another receives results from the last stage. Sends are asynchronous; a link keeps the tensors
of its pending sends alive and waits for them before it reuses the channel.

The peers are our own processes, so pickle is acceptable here: nothing from the network is ever
unpickled (the HTTP server validates requests into plain fields first).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

KIND_BATCH = 1  # stage s -> s+1: a microbatch's metadata and hidden states
KIND_RESULT = 2  # last stage -> stage 0: sampled tokens and stage timings
KIND_STOP = 3  # shut down; travels the pipeline and comes back to stage 0 as a RESULT-direction STOP
KIND_PING = 4  # nothing to do; travels like STOP, so an idle pipeline's receives do not time out


@dataclass(frozen=True, slots=True)
class Tags:
    header: int
    payload: int
    hidden: int


FORWARD = Tags(1, 2, 3)  # stage s -> s+1
BACKWARD = Tags(4, 5, 6)  # last stage -> stage 0


class Channel:
    """One direction to one peer: asynchronous sends, blocking receives."""

    def __init__(
        self, peer: int, tags: Tags, hidden_size: int = 0, dtype: torch.dtype = torch.float32
    ) -> None:
        self.peer = peer
        self.tags = tags
        self.hidden_size = hidden_size
        self.dtype = dtype
        self._pending: list[tuple[Any, tuple[torch.Tensor, ...]]] = []

    def send(self, kind: int, payload: Any, hidden: torch.Tensor | None = None) -> None:
        self.flush()
        data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        body = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        rows = 0 if hidden is None else hidden.shape[0]
        header = torch.tensor([kind, len(data), rows], dtype=torch.int64)
        keep: list[torch.Tensor] = [header, body]
        works = [
            dist.isend(header, self.peer, tag=self.tags.header),
            dist.isend(body, self.peer, tag=self.tags.payload),
        ]
        if rows:
            assert hidden is not None
            hidden = hidden.contiguous()
            keep.append(hidden)
            works.append(dist.isend(hidden, self.peer, tag=self.tags.hidden))
        self._pending.extend((w, tuple(keep)) for w in works)

    def flush(self) -> None:
        """Wait until every earlier send has been delivered."""
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()

    def recv(self) -> tuple[int, Any, torch.Tensor | None]:
        header = torch.empty(3, dtype=torch.int64)
        dist.recv(header, self.peer, tag=self.tags.header)
        kind, nbytes, rows = (int(x) for x in header)
        body = torch.empty(nbytes, dtype=torch.uint8)
        dist.recv(body, self.peer, tag=self.tags.payload)
        payload = pickle.loads(body.numpy().tobytes())
        hidden = None
        if rows:
            hidden = torch.empty(rows, self.hidden_size, dtype=self.dtype)
            dist.recv(hidden, self.peer, tag=self.tags.hidden)
        return kind, payload, hidden

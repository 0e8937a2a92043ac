"""A small stand-in for vLLM's V1 scheduler and engine-core loop, for testing the vLLM adapter
without vLLM (tests/test_vllm_adapter.py). It copies only the behaviour the adapter relies on:

* ``schedule``: RUNNING first, in order, skipping held requests and requests whose tokens are
  all in flight; then WAITING, FCFS, admitted while KV blocks last; every request's
  ``num_computed_tokens`` advances at schedule time; the budget counts decode tokens;
* the return: each request whose scheduled tokens reached ``num_tokens`` gets one token; it
  finishes at ``max_tokens``;
* the engine loop: a FIFO batch queue of ``pp`` steps; schedule while the queue is not full and
  the step ran something, else pop the oldest and fold it in (v1/engine/core.py:698-812).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum


class Status(Enum):
    WAITING = "WAITING"
    RUNNING = "RUNNING"
    PREEMPTED = "PREEMPTED"
    FINISHED_LENGTH_CAPPED = "FINISHED_LENGTH_CAPPED"
    FINISHED_ABORTED = "FINISHED_ABORTED"


@dataclass(eq=False)
class FakeRequest:
    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    arrival_time: float = 0.0
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    status: Status = Status.WAITING

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens


@dataclass
class FakeOutput:
    num_scheduled_tokens: dict[str, int]
    # requests whose scheduled tokens reach num_tokens: they sample (vLLM decides this at
    # schedule time; a later chunk scheduled meanwhile must not make an earlier one sample)
    samples: frozenset[str] = frozenset()


@dataclass
class FakeVllm:
    """EngineQueues for the adapter, and the scheduling / return rules above."""

    kv_blocks: int = 64
    block_size: int = 16
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    used_blocks: dict = field(default_factory=dict)

    # EngineQueues
    def engine_waiting(self):
        return iter(self.waiting)

    def engine_running(self):
        return self.running

    def kv_total_tokens(self) -> int:
        return self.kv_blocks * self.block_size

    def kv_free_tokens(self) -> int:
        return (self.kv_blocks - sum(self.used_blocks.values())) * self.block_size

    def _blocks(self, r: FakeRequest, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def schedule(self, budget: int, held: frozenset[str] = frozenset()) -> FakeOutput:
        out: dict[str, int] = {}
        for r in self.running:
            if budget <= 0:
                break
            if r.request_id in held:
                continue
            n = min(r.num_tokens - r.num_computed_tokens, budget)
            if n <= 0:
                continue  # in flight
            out[r.request_id] = n
            budget -= n
        while budget > 0 and self.waiting:
            r = self.waiting[0]
            need = self._blocks(r, r.num_tokens + 1)
            if need > self.kv_blocks - sum(self.used_blocks.values()):
                break
            self.waiting.popleft()
            self.used_blocks[r.request_id] = need
            r.status = Status.RUNNING
            self.running.append(r)
            n = min(r.num_tokens - r.num_computed_tokens, budget)
            out[r.request_id] = n
            budget -= n
        by_id = {r.request_id: r for r in self.running}
        samples = set()
        for rid, n in out.items():
            r = by_id[rid]
            r.num_computed_tokens += n
            if r.num_computed_tokens >= r.num_tokens:
                samples.add(rid)
        return FakeOutput(out, frozenset(samples))

    def update(self, output: FakeOutput, requests: dict[str, FakeRequest]) -> None:
        for rid, _n in output.num_scheduled_tokens.items():
            r = requests[rid]
            if r.status is not Status.RUNNING or rid not in output.samples:
                continue  # finished meanwhile, or a partial prefill chunk
            r.num_output_tokens += 1
            if r.num_output_tokens >= r.max_tokens:
                r.status = Status.FINISHED_LENGTH_CAPPED
                self.running.remove(r)
                del self.used_blocks[rid]

    def preempt(self, r: FakeRequest) -> None:
        self.running.remove(r)
        del self.used_blocks[r.request_id]
        r.status = Status.PREEMPTED
        r.num_computed_tokens = 0
        self.waiting.appendleft(r)


class FakeEngineLoop:
    """vLLM's step_with_batch_queue around a FakeVllm and an adapter, steps counted."""

    def __init__(self, engine: FakeVllm, adapter, pp: int) -> None:
        self.engine = engine
        self.adapter = adapter
        self.pp = pp
        self.queue: deque = deque()
        self.requests: dict[str, FakeRequest] = {}

    def add(self, r: FakeRequest) -> None:
        self.requests[r.request_id] = r
        self.engine.waiting.append(r)
        self.adapter.arrive(r)

    def has_requests(self) -> bool:
        return bool(self.engine.waiting or self.engine.running)

    def step(self) -> None:
        if self.has_requests():
            self.adapter.order_waiting(self.engine.waiting)  # as FastPPScheduler (late_last only)
            decision = self.adapter.begin_step()
            out = self.engine.schedule(decision.budget, decision.held_ids)
            self.adapter.launched(decision, out, out.num_scheduled_tokens)
            self.queue.appendleft(out)
            executed = bool(out.num_scheduled_tokens)
            if len(self.queue) < self.pp and executed:
                return
        elif not self.queue:
            return
        out = self.queue.pop()
        self.engine.update(out, self.requests)
        self.adapter.returned(out)

    def run(self, max_steps: int = 10_000) -> int:
        for i in range(max_steps):
            if not self.has_requests() and not self.queue:
                return i
            self.step()
        raise AssertionError(f"not done after {max_steps} steps")

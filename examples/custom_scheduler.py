"""A scheduler of your own, driving FastPP's policies through the public API only.

It never imports fastpp's Scheduler: it keeps its own queue, slots and KV counter, shows them to
the policies as a ``PolicyView``, asks a ChunkPolicy for each microbatch's token budget and a
DecodeBalancer which decodes ride in it, runs the microbatch on a toy cost model of a 2-stage
pipeline, and feeds each stage's IterationRecord back. Run: ``python examples/custom_scheduler.py``.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from fastpp import SLO, IterationRecord, PolicyView, make_balancer, make_chunk_policy

STAGES, KV_TOKENS, CANDIDATES = 2, 60_000, (32, 64, 128, 256, 512)


@dataclass
class Req:  # the RequestView fields, plus what this scheduler needs
    req_id: int
    arrived_at: float
    prompt_len: int
    output_len: int
    num_computed: int = 0
    num_generated: int = 0
    parked_at: float | None = None
    first_token_at: float | None = None

    @property
    def remaining_prefill(self) -> int:
        return self.prompt_len - self.num_computed

    @property
    def ctx_len(self) -> int:
        return self.prompt_len + self.num_generated


class ToyView:  # a PolicyView over this scheduler's own state
    num_slots, slo, chunk_candidates, default_chunk, token_step = STAGES, SLO(1.0, 0.1), CANDIDATES, 256, 16
    kv_total_tokens = KV_TOKENS

    def __init__(self) -> None:
        self.now, self.slot, self.chunked = 0.0, 0, None
        self.waiting: deque[Req] = deque()
        self.running: list[list[Req]] = [[] for _ in range(STAGES)]
        self.parked: list[Req] = []
        self.recent_ttft, self.recent_token_gap, self.recent_arrivals = deque(), deque(), deque()
        self.num_arrivals = 0

    kv_free_tokens = property(lambda v: KV_TOKENS - sum(r.ctx_len for r in v.admitted()))
    num_waiting = property(lambda v: len(v.waiting))
    waiting_prefill_tokens = property(lambda v: sum(r.remaining_prefill for r in v.prefilling()))
    waiting_arrival_sum = property(lambda v: sum(r.arrived_at for r in v.waiting))
    num_parked = property(lambda v: len(v.parked))

    def admitted(self) -> list[Req]:
        chunked = [self.chunked] if self.chunked else []
        return [r for run in self.running for r in run] + self.parked + chunked

    def prefilling(self) -> list[Req]:
        return list(self.waiting) + ([self.chunked] if self.chunked else [])

    def iter_waiting(self):
        return iter(self.waiting)

    def iter_waiting_newest_first(self):
        return reversed(self.waiting)

    def num_running(self, slot: int) -> int:
        return len(self.running[slot])

    def sum_decode_ctx(self, slot: int) -> int:
        return sum(r.ctx_len for r in self.running[slot])

    def iter_running(self, slot: int):
        return iter(self.running[slot])

    def is_in_flight(self, slot: int) -> bool:
        return False  # this toy runs one microbatch at a time

    def iter_parked(self):
        return iter(self.parked)


def serve(num_requests: int = 200, seed: int = 0) -> dict[str, float]:
    rng, view = random.Random(seed), ToyView()
    chunk_policy, balancer = make_chunk_policy("greedy"), make_balancer("ds")
    assert isinstance(view, PolicyView)
    arrivals = deque(
        Req(i, i * 0.02, rng.randint(20, 400), rng.randint(10, 120)) for i in range(num_requests)
    )
    done: list[Req] = []
    budgets: set[int] = set()
    last_return = [0.0] * STAGES
    mb_id = turn = 0
    while arrivals or view.admitted() or view.waiting:
        while arrivals and arrivals[0].arrived_at <= view.now:  # admit what has arrived
            r = arrivals.popleft()
            view.waiting.append(r)
            view.recent_arrivals.append((r.arrived_at, r.prompt_len))
            view.num_arrivals += 1
        slot = view.slot = turn % STAGES
        turn += 1
        plan = balancer.plan(view, slot)  # park some of this slot's decodes, restore parked ones
        park = set(plan.park_ids)
        for r in [r for r in view.running[slot] if r.req_id in park]:
            view.running[slot].remove(r), view.parked.append(r)
            r.parked_at = view.now
        for r in [r for r in view.parked if r.req_id in plan.restore_ids]:
            view.parked.remove(r), view.running[slot].append(r)
            r.parked_at = None
        budget = chunk_policy.choose(view)  # C: the whole token budget, decodes included
        budgets.add(budget)
        decodes = view.running[slot][:budget]
        room, chunks = budget - len(decodes), []
        fits = lambda: view.waiting and view.kv_free_tokens > view.waiting[0].prompt_len  # noqa: E731
        while room > 0 and (view.chunked or fits()):
            r = view.chunked or view.waiting.popleft()
            n = min(room, r.remaining_prefill)
            chunks.append((r, r.num_computed, n))
            r.num_computed += n
            room -= n
            view.chunked = r if r.remaining_prefill else None
        if not decodes and not chunks:
            if not any(view.running) and view.parked:  # never idle with requests held back
                for r in view.parked:
                    r.parked_at = None
                view.running[slot], view.parked = view.parked, []
            elif not any(view.running):
                view.now = max(view.now, arrivals[0].arrived_at) if arrivals else view.now
            continue
        tokens = len(decodes) + sum(n for _, _, n in chunks)
        features = (
            sum(p * n for _, p, n in chunks),
            sum(n * n for _, _, n in chunks),
            sum(r.ctx_len for r in decodes),
        )  # the ALP features: L_past*L_pre, L_pre^2, L_dec
        stage_s = 0.004 + 2e-5 * tokens + 1e-9 * features[1] + 2e-9 * features[2]  # the toy cost model
        for stage in range(STAGES):  # the stages run it one after another; each reports a record
            start = view.now + stage * stage_s
            chunk_policy.observe(
                IterationRecord(
                    mb_id,
                    stage,
                    slot,
                    start,
                    start + stage_s,
                    tokens,
                    tokens - len(decodes),
                    len(decodes),
                    *features,
                    budget,
                )
            )
        view.now += STAGES * stage_s
        if decodes:
            view.recent_token_gap.append((view.now, view.now - last_return[slot]))
        last_return[slot] = view.now
        finished = [r for r, _, _ in chunks if not r.remaining_prefill]
        for r in decodes + finished:  # one new token each
            r.num_generated += 1
            if r.first_token_at is None:
                r.first_token_at = view.now
                view.recent_ttft.append((view.now, view.now - r.arrived_at))
            if r.num_generated >= r.output_len:
                done.append(r)
                if r in view.running[slot]:
                    view.running[slot].remove(r)
            elif r in finished:
                view.running[slot].append(r)
        mb_id += 1
    ttft = sorted(r.first_token_at - r.arrived_at for r in done)
    return {
        "requests": len(done),
        "microbatches": mb_id,
        "p90_ttft_s": round(ttft[int(0.9 * len(ttft))], 3),
        "parks": balancer.num_parks,
        "chunk_budgets": sorted(budgets),
    }


if __name__ == "__main__":
    print(serve())

"""Engine-neutral pipeline-parallel scheduler: FCFS queue, D_p microbatch slots, chunked
prefill, KV accounting and retraction. Executors drive it with two calls:

    plan = scheduler.schedule(slot)      # form the microbatch of a free slot (or None)
    scheduler.update(plan)               # fold in its sampled tokens when it returns

Every slot owns a running decode set. A request decodes in the slot where its last prefill
chunk ran (SGLang's PP behaviour) until it finishes, is retracted, or a DecodeBalancer parks it
and later restores it into another slot. The clock is injected: the simulator passes virtual
time, real engines wall time; nothing here reads the system clock.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable

from fastpp.decode_slots import DecodeSlots
from fastpp.kv_pool import KVPool
from fastpp.live_request import LiveRequest
from fastpp.plan import MicroBatchPlan, PrefillChunk
from fastpp.policies.base import ChunkPolicy, DecodeBalancer, NoBalancer, StaticChunkPolicy
from fastpp.scheduler_config import SchedulerConfig, Signals
from fastpp.types import FinishReason, IterationRecord, Request, RequestRecord
from fastpp.view import SchedulerView

log = logging.getLogger(__name__)


class Scheduler:
    """Owns every request from arrival to its single end (finished, rejected or aborted)."""

    def __init__(
        self,
        config: SchedulerConfig,
        clock: Callable[[], float],
        chunk_policy: ChunkPolicy | None = None,
        balancer: DecodeBalancer | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.chunk_policy: ChunkPolicy = chunk_policy or StaticChunkPolicy(config.default_chunk)
        self.balancer: DecodeBalancer = balancer or NoBalancer()
        self.kv = KVPool(config.kv_capacity_tokens, config.page_size)
        self.view = SchedulerView(self)
        self.signals = Signals()

        n = config.num_slots
        self.waiting: deque[LiveRequest] = deque()
        self.chunked: LiveRequest | None = None
        self.slots = DecodeSlots(n)
        # aliases of the slot structures (same objects), read on hot paths and by the view
        self.running = self.slots.running
        self.slot_ctx_sum = self.slots.ctx_sum  # sum of ctx_len over running[slot]
        self.parked = self.slots.parked
        self.in_flight: list[MicroBatchPlan | None] = [None] * n
        self._inflight_decodes: list[list[LiveRequest]] = [[] for _ in range(n)]
        self.live: dict[int, LiveRequest] = {}  # every admitted, unfinished request by id
        self.records: dict[int, RequestRecord] = {}
        self.pending_prefill_tokens = 0  # sum of remaining_prefill over waiting + chunked
        self.waiting_arrival_sum = 0.0  # sum of arrived_at over the waiting queue
        self.remaining_decode_tokens = 0  # sum of remaining_output over admitted requests
        self.launching_slot = 0
        self.now = 0.0
        self._next_mb_id = 0
        self._next_admit_seq = 0
        self._last_return_at: list[float | None] = [None] * n
        self._policy_errors: set[str] = set()
        # counters
        self.num_retractions = 0
        self.num_decode_sitouts = 0  # decodes left out of a microbatch because C was too small

    # ------------------------------------------------------------------ arrivals / aborts
    def add_request(self, req: Request) -> RequestRecord:
        """Queue a request (FCFS), or reject it at once with a reason if it can never run."""
        self.now = self.clock()
        if req.req_id in self.records:
            raise ValueError(f"duplicate request id {req.req_id}")
        rec = RequestRecord(req.req_id, req.arrived_at, req.prompt_len, req.output_len)
        self.records[req.req_id] = rec
        self.signals.arrivals.append((req.arrived_at, req.prompt_len))
        self.signals.num_arrivals += 1
        cfg = self.config
        if req.prompt_len >= cfg.max_context:
            return self._reject(
                rec, f"prompt of {req.prompt_len} tokens exceeds the context limit {cfg.max_context}"
            )
        if self.kv.round_up(req.prompt_len + 1) > self.kv.capacity:
            return self._reject(
                rec, f"prompt of {req.prompt_len} tokens exceeds the KV pool of {self.kv.capacity}"
            )
        target = min(req.output_len, cfg.max_context - req.prompt_len)
        live = LiveRequest(rec, target_len=target, fill_len=req.prompt_len)
        self.live[req.req_id] = live
        self.waiting.append(live)
        self.waiting_arrival_sum += live.arrived_at
        self.pending_prefill_tokens += live.fill_len
        return rec

    def abort(self, req_id: int, reason: str = "aborted by client") -> bool:
        """End a request early and free its KV. Returns False if it already ended."""
        live = self.live.get(req_id)
        if live is None or live.aborted:
            return False
        self.now = self.clock()
        live.aborted = True
        if live is self.chunked:  # schedule no more of its chunks
            self.chunked = None
            self.pending_prefill_tokens -= live.remaining_prefill
        if live.in_flight or (live.slot >= 0 and live in self._inflight_decodes[live.slot]):
            return True  # its microbatch still uses the KV; update() frees it
        self._detach(live)
        self._end(live, FinishReason.ABORTED, reason)
        return True

    # ------------------------------------------------------------------ scheduling
    def schedule(self, slot: int) -> MicroBatchPlan | None:
        """Form the next microbatch of ``slot``, or None when it has nothing to run.

        Token model: C (the policy's budget) counts every token of the microbatch. The slot's
        decodes go first, one token each; what is left of C goes to the continuing chunked
        request, then to new requests in FCFS order while their prompt fits in free KV.
        Each request's counters (num_computed, kv_tokens) advance here, at schedule time.
        """
        assert self.in_flight[slot] is None, f"slot {slot} already has a microbatch in flight"
        self.now = self.clock()
        self.launching_slot = slot
        self._apply_balance(slot)
        budget, reason = self._choose_chunk()
        decodes = self._pick_decodes(slot, budget)
        decodes = self._reserve_decode_kv(slot, decodes)
        prefill = self._pick_prefill(budget - len(decodes))
        if not decodes and not prefill:
            if self.parked and not any(self.in_flight):
                # liveness: parking must never leave the pipeline idle with requests held back
                self.slots.restore_longest_parked(slot, budget)
                decodes = self._reserve_decode_kv(slot, self._pick_decodes(slot, budget))
            if not decodes:
                return None
        return self._launch(slot, budget, reason, decodes, prefill)

    def _apply_balance(self, slot: int) -> None:
        if not self.running[slot] and not self.parked:
            return
        try:
            plan = self.balancer.plan(self.view, slot)
            if plan.is_noop:
                return
            self.slots.check(plan, slot)
        except Exception as exc:  # a policy must never take the engine down
            self._policy_failed("balancer", exc)
            return
        self.slots.apply(plan, slot, self.now)

    def _choose_chunk(self) -> tuple[int, str]:
        try:
            budget = self.chunk_policy.choose(self.view)
            if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
                raise ValueError(f"chunk policy returned {budget!r}, not a positive int")
            return budget, getattr(self.chunk_policy, "last_reason", "")
        except Exception as exc:
            self._policy_failed("chunk policy", exc)
            return self.config.default_chunk, "fallback: policy error"

    def _policy_failed(self, which: str, exc: Exception) -> None:
        key = f"{which}: {type(exc).__name__}"
        if key not in self._policy_errors:  # log once per kind of failure
            self._policy_errors.add(key)
            log.error("%s raised %r; using the static fallback for this decision", which, exc)

    def _pick_decodes(self, slot: int, budget: int) -> list[LiveRequest]:
        run = self.running[slot]
        if len(run) <= budget:
            return list(run)
        # C below the decode count: the oldest C decode now; the rest sit out one round and
        # move to the front so they go first next time.
        self.num_decode_sitouts += len(run) - budget
        picked, rest = run[:budget], run[budget:]
        self.running[slot] = rest + picked
        return picked

    def _reserve_decode_kv(self, slot: int, decodes: list[LiveRequest]) -> list[LiveRequest]:
        """Allocate the KV each decode step writes; retract the newest requests if it can't.

        The pool is charged here; each request's own ``kv_tokens`` grows in ``_launch``.
        """
        kv = self.kv
        need = self._decode_kv_need(decodes)
        while need > kv.free and decodes:
            victim = max(self.running[slot], key=_admit_order)
            if victim in decodes:
                decodes = [r for r in decodes if r is not victim]
                need -= self._decode_kv_need([victim])
            self._retract(victim)
        kv.alloc(need)
        return decodes

    def _decode_kv_need(self, decodes: list[LiveRequest]) -> int:
        if self.kv.page_size == 1:
            return len(decodes)  # one token each, one token per page
        round_up = self.kv.round_up
        return sum(max(0, round_up(r.ctx_len) - r.kv_tokens) for r in decodes)

    def _retract(self, r: LiveRequest) -> None:
        """Free a running request's KV and queue it again at the front (recomputed later)."""
        self.slots.leave(r)
        self.kv.release(r.kv_tokens)
        r.kv_tokens = 0
        self.remaining_decode_tokens -= r.remaining_output
        fill = r.prompt_len + r.num_generated
        if self.kv.round_up(fill + 1) > self.kv.capacity:
            # recomputed, it could never take another step: it would block the queue's head forever
            self._end(r, FinishReason.LENGTH, f"stopped after {r.num_generated} tokens: its context of "
                      f"{fill} tokens no longer fits the KV pool of {self.kv.capacity}")
            return
        r.fill_len = fill
        r.num_computed = 0
        r.rec.num_retractions += 1
        self.num_retractions += 1
        self.waiting.appendleft(r)
        self.waiting_arrival_sum += r.arrived_at
        self.pending_prefill_tokens += r.fill_len

    def _pick_prefill(self, budget: int) -> list[tuple[LiveRequest, int, int]]:
        """Up to ``budget`` prompt tokens as (request, L_past, L_pre)."""
        chunks: list[tuple[LiveRequest, int, int]] = []
        if budget <= 0:
            return chunks
        if self.chunked is not None:
            r = self.chunked
            n = min(r.remaining_prefill, budget)
            chunks.append((r, r.num_computed, n))
            budget -= n
            if n == r.remaining_prefill:
                self.chunked = None
        cap = self.config.max_running_requests
        while budget > 0 and self.waiting and self.chunked is None:
            r = self.waiting[0]
            if cap is not None and len(self.live) - len(self.waiting) >= cap:
                break
            need = self.kv.round_up(r.fill_len)
            reserve = int(self.config.new_token_ratio * self.remaining_decode_tokens)
            if need > self.kv.free - reserve and (need > self.kv.free or self._has_admitted()):
                break  # FCFS: the head waits for memory, nobody overtakes it
            self.waiting.popleft()
            self.waiting_arrival_sum -= r.arrived_at
            self.kv.alloc(need)
            r.kv_tokens = need
            r.admit_seq = self._next_admit_seq
            self._next_admit_seq += 1
            self.remaining_decode_tokens += r.remaining_output
            n = min(r.fill_len, budget)
            chunks.append((r, 0, n))
            budget -= n
            if n < r.fill_len:
                self.chunked = r
        return chunks

    def _has_admitted(self) -> bool:
        return len(self.live) > len(self.waiting)

    def _launch(
        self,
        slot: int,
        budget: int,
        reason: str,
        decodes: list[LiveRequest],
        prefill: list[tuple[LiveRequest, int, int]],
    ) -> MicroBatchPlan:
        now = self.now
        chunks = []
        sum_past_x_pre = sum_pre_sq = num_prefill = num_done = 0
        for r, past, n in prefill:
            r.num_computed += n
            r.in_flight = True
            self.pending_prefill_tokens -= n
            if r.rec.scheduled_at is None:
                r.rec.scheduled_at = now
            done = r.num_computed == r.fill_len
            num_done += done
            chunks.append(PrefillChunk(r.req_id, past, n, done))
            sum_past_x_pre += past * n
            sum_pre_sq += n * n
            num_prefill += n
        if self.kv.page_size == 1:
            for r in decodes:
                r.kv_tokens += 1
        else:
            round_up = self.kv.round_up
            for r in decodes:
                r.kv_tokens = max(r.kv_tokens, round_up(r.ctx_len))
        dec_ctx = [r.ctx_len for r in decodes]
        self._inflight_decodes[slot] = decodes
        plan = MicroBatchPlan(
            mb_id=self._next_mb_id,
            slot=slot,
            scheduled_at=now,
            chunk_budget=budget,
            decode_req_ids=tuple([r.req_id for r in decodes]),
            decode_ctx=tuple(dec_ctx),
            prefill=tuple(chunks),
            num_tokens=len(decodes) + num_prefill,
            num_prefill_tokens=num_prefill,
            num_sampled=len(decodes) + num_done,
            sum_past_x_pre=sum_past_x_pre,
            sum_pre_sq=sum_pre_sq,
            sum_dec_ctx=sum(dec_ctx),
            reason=reason,
        )
        self._next_mb_id += 1
        self.in_flight[slot] = plan
        return plan

    # ------------------------------------------------------------------ results
    def update(self, plan: MicroBatchPlan, stopped: Iterable[int] = ()) -> None:
        """Fold in a returned microbatch: every sampled position produced one token now.

        ``stopped`` names requests whose new token was a stop token (real backends).
        """
        assert self.in_flight[plan.slot] is plan, "update() for a plan that is not in flight"
        self.in_flight[plan.slot] = None
        now = self.now = self.clock()
        stop_ids = set(stopped) if stopped else ()
        live = self.live
        slot = plan.slot
        last = self._last_return_at[slot]
        if plan.decode_req_ids and last is not None:
            self.signals.token_gap.append((now, now - last))
        self._last_return_at[slot] = now
        decodes = self._inflight_decodes[slot]
        self._inflight_decodes[slot] = []
        stayed = 0
        for r in decodes:
            if r.aborted:
                self._detach(r)
                self._end(r, FinishReason.ABORTED, "aborted by client")
                continue
            rec = r.rec
            n = rec.num_generated = rec.num_generated + 1
            rec.token_times.append(now)
            if n >= r.target_len or (stop_ids and r.req_id in stop_ids):
                self.remaining_decode_tokens -= 1
                self._finish(r, FinishReason.STOP if r.req_id in stop_ids else FinishReason.LENGTH)
                continue
            r.ctx_len += 1
            stayed += 1
        self.remaining_decode_tokens -= stayed
        self.slot_ctx_sum[slot] += stayed
        for c in plan.prefill:
            r = live.get(c.req_id)
            if r is None:
                continue
            # chunks return in order: still in flight if a later chunk was scheduled
            r.in_flight = r.num_computed > c.num_computed + c.num_tokens
            if r.aborted:
                if not r.in_flight:
                    self._detach(r)
                    self._end(r, FinishReason.ABORTED, "aborted by client")
                continue
            if not c.completes:
                continue
            rec = r.rec
            rec.num_generated += 1
            rec.token_times.append(now)
            r.ctx_len = r.prompt_len + rec.num_generated
            self.remaining_decode_tokens -= 1
            if rec.first_token_at is None:
                rec.first_token_at = now
                self.signals.ttft.append((now, now - rec.arrived_at))
            if rec.num_generated >= r.target_len or c.req_id in stop_ids:
                reason = FinishReason.STOP if c.req_id in stop_ids else FinishReason.LENGTH
                self._finish(r, reason)
            else:
                self.slots.join(r, slot)

    def observe(self, rec: IterationRecord) -> None:
        """Forward an executor's stage-iteration record to the policies (errors contained)."""
        for name, target in (("chunk policy", self.chunk_policy), ("balancer", self.balancer)):
            try:
                target.observe(rec)
            except Exception as exc:
                self._policy_failed(f"{name}.observe", exc)

    # ------------------------------------------------------------------ state helpers
    def _detach(self, r: LiveRequest) -> None:
        """Take ``r`` out of whichever structure holds it and free its KV."""
        if r.slot >= 0:
            self.slots.leave(r)
        elif r.req_id in self.parked:
            del self.parked[r.req_id]
        elif r is self.chunked:
            self.chunked = None
            self.pending_prefill_tokens -= r.remaining_prefill
        else:
            try:
                self.waiting.remove(r)
                self.waiting_arrival_sum -= r.arrived_at
                self.pending_prefill_tokens -= r.remaining_prefill
            except ValueError:
                pass  # between prefill completion and joining a slot
        if r.kv_tokens:
            self.kv.release(r.kv_tokens)
            r.kv_tokens = 0
            self.remaining_decode_tokens -= r.remaining_output

    def _finish(self, r: LiveRequest, reason: FinishReason) -> None:
        rec = r.rec
        self._detach(r)
        self._end(r, reason, "")
        if rec.num_generated >= 2 and rec.first_token_at is not None:
            tpot = (rec.token_times[-1] - rec.first_token_at) / (rec.num_generated - 1)
            self.signals.tpot.append((self.now, tpot))

    def _end(self, r: LiveRequest, reason: FinishReason, detail: str) -> None:
        r.rec.finish_reason = reason
        r.rec.finished_at = self.now
        r.rec.detail = detail
        del self.live[r.req_id]

    def _reject(self, rec: RequestRecord, why: str) -> RequestRecord:
        rec.finish_reason = FinishReason.REJECTED
        rec.finished_at = self.now
        rec.detail = why
        return rec

    # ------------------------------------------------------------------ queries
    @property
    def has_work(self) -> bool:
        """True while any admitted or waiting request has not ended."""
        return bool(self.live)

    @property
    def num_microbatches(self) -> int:
        """Microbatches launched so far."""
        return self._next_mb_id

    @property
    def num_in_flight(self) -> int:
        return sum(p is not None for p in self.in_flight)

    def forget(self, req_id: int) -> RequestRecord:
        """Drop an ended request's record and return it (a long-running server calls this so
        ``records`` does not grow without bound). ``ValueError`` if the request has not ended."""
        rec = self.records.get(req_id)
        if rec is None or not rec.is_finished or req_id in self.live:
            raise ValueError(f"request {req_id} is unknown or has not ended")
        return self.records.pop(req_id)

    def abort_all(self, reason: str) -> None:
        """End every unfinished request (e.g. the run's time limit was reached)."""
        for rid in list(self.live):
            r = self.live[rid]
            r.in_flight = False
            self._detach(r)
            self._end(r, FinishReason.ABORTED, reason)
        self.in_flight = [None] * self.config.num_slots
        self._inflight_decodes = [[] for _ in range(self.config.num_slots)]


def _admit_order(r: LiveRequest) -> int:
    return r.admit_seq

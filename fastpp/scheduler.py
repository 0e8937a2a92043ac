"""Engine-neutral pipeline-parallel scheduler: the waiting queue (FCFS, or late-last:
SchedulerConfig.queue_order), D_p microbatch slots, chunked prefill, KV accounting and
retraction. Executors drive it through the contract of ``fastpp.plan`` (docs/ARCHITECTURE.md,
"The executor contract")::

    plan = scheduler.schedule(slot)      # form the microbatch of a free slot (or None)
    out = scheduler.update(plan)         # fold in its sampled tokens when it returns

Every slot owns a running decode set. A request decodes in the slot where its last prefill
chunk ran (SGLang's PP behaviour) until it finishes, is retracted, or a DecodeBalancer parks it
and later restores it into another slot. The clock is injected: the simulator passes virtual
time, real engines wall time; nothing here reads the system clock.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from fastpp._mypyc import mypyc_attr
from fastpp.decode_slots import DecodeSlots
from fastpp.kv_ledger import KVLedger
from fastpp.live_request import LiveRequest
from fastpp.plan import NO_OUTPUT, MicroBatchPlan, PrefillChunk, RequestEnd, SchedulerStats, StepOutput
from fastpp.policies.base import ChunkPolicy, DecodeBalancer, NoBalancer, StaticChunkPolicy
from fastpp.policy_host import BatchFeatures, HostCounters, PolicyHost
from fastpp.policy_host_records import RequestLog
from fastpp.scheduler_config import SchedulerConfig, late_thresholds
from fastpp.types import FinishReason, IterationRecord, Request, RequestRecord
from fastpp.view import SchedulerView
from fastpp.waiting_queue import WaitingQueue


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassable when compiled (fastpp/_mypyc.py)
class Scheduler:
    """Owns every request from arrival to its single end (finished, rejected or aborted)."""

    def __init__(
        self,
        config: SchedulerConfig,
        clock: Callable[[], float],
        chunk_policy: ChunkPolicy | None = None,
        balancer: DecodeBalancer | None = None,
        *,
        record_token_times: bool = True,
    ) -> None:
        self.config = config
        # False: records keep no per-token times (no ITL), only what TTFT and TPOT need
        # (RequestRecord.tpot_s); a goodput probe's records, judged and dropped, need no more
        self.record_token_times = record_token_times
        self.clock = clock
        n = config.num_slots
        self._kv = KVLedger(config.kv_capacity_tokens, config.page_size)
        self._queue = WaitingQueue(*late_thresholds(config))
        self._in_flight: list[MicroBatchPlan | None] = [None] * n
        self._slots = DecodeSlots(n, self._any_in_flight)
        # the policies, their failure counts, the signals, the records and the decision step:
        # the same PolicyHost every executor uses (fastpp/policy_host.py)
        self.host = PolicyHost(
            config,
            chunk_policy or StaticChunkPolicy(config.default_chunk),
            balancer or NoBalancer(),
            self._slots,
            keep_token_times=record_token_times,
        )
        self.policies = self.host.policies
        self._signals = self.host.signals
        self._log = self.host.records
        self._inflight_decodes: list[list[LiveRequest]] = [[] for _ in range(n)]
        self.view = SchedulerView(
            config, self._queue, self._slots, self._kv.pool, self._signals, self._in_flight
        )
        self.host.view = self.view
        self._live: dict[int, LiveRequest] = {}  # every admitted or waiting, unended request by id
        self._records = self._log.by_id  # until forget(): every request ever added
        self._retracted: list[int] = []  # since the last plan
        self._aborting: set[int] = set()  # aborted while in flight: they end when it returns
        self._next_mb_id = 0
        self._next_admit_seq = 0
        self._num_ended = 0
        self._num_retractions = 0

    def _any_in_flight(self) -> bool:
        return any(self._in_flight)

    # ------------------------------------------------------------------ arrivals / aborts
    def add_request(self, req: Request) -> RequestRecord:
        """Queue a request (FCFS) and return its record, which the scheduler keeps up to date.
        A request that can never run comes back ended at once (``rejected``, with the reason)."""
        now = self.clock()
        rec = self.host.arrive(req.req_id, req.arrived_at, req.prompt_len, req.output_len)
        cfg, kv = self.config, self._kv.pool
        if req.prompt_len >= cfg.max_context:
            return self._reject(
                rec, now, f"prompt of {req.prompt_len} tokens exceeds the context limit {cfg.max_context}"
            )
        if kv.round_up(req.prompt_len + 1) > kv.capacity:
            return self._reject(
                rec, now, f"prompt of {req.prompt_len} tokens exceeds the KV pool of {kv.capacity}"
            )
        # Prompt + output must fit the context, and the KV of all but the last token must fit
        # the pool: else a retracted request could never be admitted again.
        target = min(req.output_len, cfg.max_context - req.prompt_len, kv.capacity - req.prompt_len + 1)
        live = LiveRequest(rec, target_len=target, fill_len=req.prompt_len)
        self._live[req.req_id] = live
        self._queue.push(live)
        return rec

    def abort(self, req_id: int, reason: str = "aborted by client") -> RequestEnd | None:
        """End a request early and free its KV. Returns its end if it ended now; None if it
        ends when its in-flight microbatch returns (that ``update`` reports it) or if it had
        already ended or is unknown."""
        live = self._live.get(req_id)
        if live is None or live.aborted:
            return None
        now = self.clock()
        live.aborted = True
        self._queue.remove(live)  # schedule no more of its chunks
        if live.in_flight or (live.slot >= 0 and live in self._inflight_decodes[live.slot]):
            self._aborting.add(req_id)
            return None  # its microbatch still uses the KV; update() frees it
        self._detach(live)
        return self._end(live, now, FinishReason.ABORTED, reason)

    def abort_all(self, reason: str) -> list[RequestEnd]:
        """End every unfinished request (e.g. the run's time limit was reached); in-flight
        microbatches are forgotten: their ``update`` must not be called."""
        now = self.clock()
        ends = []
        for r in list(self._live.values()):
            r.in_flight = False
            self._detach(r)
            ends.append(self._end(r, now, FinishReason.ABORTED, reason))
        for slot in range(self.config.num_slots):
            self._in_flight[slot] = None
            self._inflight_decodes[slot] = []
        self._aborting.clear()
        return ends

    # ------------------------------------------------------------------ scheduling
    def schedule(self, slot: int) -> MicroBatchPlan | None:
        """Form the next microbatch of the free ``slot``, or None when it has nothing to run.

        Token model: C (the policy's budget) counts every token of the microbatch. The slot's
        decodes go first, one token each; what is left of C goes to the continuing chunked
        request, then to new requests in queue order (SchedulerConfig.queue_order) while their
        prompt fits in free KV.
        Each request's counters (num_computed, kv_tokens) advance here, at schedule time.
        The decision itself (balance, liveness, C, the decodes that ride) is the host's
        ``begin_step``, as in every executor.
        """
        assert self._in_flight[slot] is None, f"slot {slot} already has a microbatch in flight"
        view = self.view
        now = view.now = self.clock()
        view.slot = slot
        decision = self.host.begin_step(slot, now)
        budget = decision.budget
        decodes = self._reserve_decode_kv(slot, decision.decodes)  # (a list of its own)
        prefill = self._pick_prefill(budget - len(decodes))
        if not decodes and not prefill:
            return None
        return self._launch(slot, now, budget, decision.reason, decodes, prefill)

    def _reserve_decode_kv(self, slot: int, decodes: list[LiveRequest]) -> list[LiveRequest]:
        """Allocate the KV each decode step writes; retract the newest requests if it can't.

        The pool is charged here; each request's own ``kv_tokens`` grows in ``_launch``.
        """
        ledger = self._kv
        need = ledger.decode_need(decodes)
        while need > ledger.pool.free and decodes:
            victim = max(self._slots.running[slot], key=self._victim_order)
            if victim in decodes:
                decodes = [r for r in decodes if r is not victim]
                need -= ledger.decode_need([victim])
            self._retract(victim)
        ledger.pool.alloc(need)
        return decodes

    def _retract(self, r: LiveRequest) -> None:
        """Free a running request's KV and queue it again at the front (recomputed later).
        Its context always fits the pool again: ``add_request`` caps prompt + output there."""
        self._slots.leave(r)
        self._kv.release(r)
        r.fill_len = r.prompt_len + r.num_generated
        r.num_computed = 0
        RequestLog.retracted(r.rec)
        self._num_retractions += 1
        self._retracted.append(r.req_id)
        if self.config.retraction == "newest_front":
            self._queue.push_front(r)
        else:  # "fewest_output_back", as the reference
            self._queue.push(r)

    def _victim_order(self, r: LiveRequest) -> tuple[int, ...]:
        """Retraction order (SchedulerConfig.retraction): the largest key is retracted first."""
        if self.config.retraction == "newest_front":
            return (r.admit_seq,)
        return (-r.rec.num_generated, r.prompt_len, r.admit_seq)

    def _pick_prefill(self, budget: int) -> list[tuple[LiveRequest, int, int]]:
        """Up to ``budget`` prompt tokens as (request, L_past, L_pre); admits from the queue."""
        chunks: list[tuple[LiveRequest, int, int]] = []
        if budget <= 0:
            return chunks
        queue, ledger = self._queue, self._kv
        queue.defer_late(self.view.now)
        kv = ledger.pool
        r = queue.chunked
        if r is not None:
            n = min(r.remaining_prefill, budget)
            chunks.append((r, r.num_computed, n))
            queue.advance(r, n)
            budget -= n
        cfg = self.config
        cap = cfg.max_running_requests
        every = cfg.admission_reserve == "all"  # every admitted request's remaining output
        if not every:  # "slot": the launching slot's running decodes only, as the reference
            reserve = int(
                cfg.new_token_ratio * sum(d.remaining_output for d in self._slots.running[self.view.slot])
            )
        while budget > 0 and queue.chunked is None and (r := queue.head) is not None:
            if cap is not None and len(self._live) - len(queue) >= cap:
                break
            need = kv.round_up(r.fill_len)
            if every:
                reserve = ledger.admission_reserve(cfg.new_token_ratio)
            if need > kv.free - reserve and (need > kv.free or self._has_admitted()):
                break  # the head waits for memory, nobody overtakes it
            queue.pop_head()
            ledger.admit(r, need)
            r.admit_seq = self._next_admit_seq
            self._next_admit_seq += 1
            n = min(r.fill_len, budget)
            chunks.append((r, 0, n))
            queue.advance(r, n)
            budget -= n
        return chunks

    def _has_admitted(self) -> bool:
        return len(self._live) > len(self._queue)

    def _launch(
        self,
        slot: int,
        now: float,
        budget: int,
        reason: str,
        decodes: list[LiveRequest],
        prefill: list[tuple[LiveRequest, int, int]],
    ) -> MicroBatchPlan:
        chunks = []
        spans = []
        scheduled = RequestLog.scheduled
        for r, past, n in prefill:
            r.in_flight = True
            scheduled(r.rec, now)
            done = r.num_computed == r.fill_len
            chunks.append(PrefillChunk(r.req_id, past, n, done))
            spans.append((past, n, done))
        self._kv.grow(decodes)
        dec_ctx = tuple([r.ctx_len for r in decodes])
        f = BatchFeatures.of(dec_ctx, spans)
        self._inflight_decodes[slot] = decodes
        plan = MicroBatchPlan(
            mb_id=self._next_mb_id,
            slot=slot,
            scheduled_at=now,
            chunk_budget=budget,
            decode_req_ids=tuple([r.req_id for r in decodes]),
            decode_ctx=dec_ctx,
            prefill=tuple(chunks),
            num_tokens=f.num_tokens,
            num_prefill_tokens=f.num_prefill_tokens,
            num_sampled=f.num_sampled,
            sum_past_x_pre=f.sum_past_x_pre,
            sum_pre_sq=f.sum_pre_sq,
            sum_dec_ctx=f.sum_dec_ctx,
            reason=reason,
            kv_frees=self._kv.take_frees(),
            kv_allocs=self._kv.take_allocs(),
            retracted_ids=self._take_retracted(),
        )
        self._next_mb_id += 1
        self._in_flight[slot] = plan
        return plan

    def _take_retracted(self) -> tuple[int, ...]:
        if not self._retracted:
            return ()
        out = tuple(self._retracted)
        self._retracted.clear()
        return out

    def drain_kv_frees(self) -> tuple[int, ...]:
        """KV released since the last plan, for an executor that frees it before the next plan
        (an idle engine, or one that stops); otherwise the next plan's ``kv_frees`` carries it."""
        return self._kv.take_frees()

    # ------------------------------------------------------------------ results
    def update(self, plan: MicroBatchPlan, stop_ids: Collection[int] = ()) -> StepOutput:
        """Fold in a returned microbatch: every sampled position produced one token now.

        ``stop_ids`` names requests whose new token was a stop token (real backends). Returns
        the requests that ended with it and those whose token is to be discarded.
        """
        slot = plan.slot
        assert self._in_flight[slot] is plan, "update() for a plan that is not in flight"
        self._in_flight[slot] = None
        now = self.view.now = self.clock()
        self.host.returned(slot, now, bool(plan.decode_req_ids))
        ended: list[RequestEnd] = []
        discarded: list[int] = []
        decodes = self._inflight_decodes[slot]
        self._inflight_decodes[slot] = []
        if self._aborting:  # rare: requests aborted while this microbatch was in flight
            decodes = self._end_aborted_decodes(decodes, now, ended, discarded)
        # decode: every decode fed one token (its context grew) and sampled one more; those
        # that end leave their slot after their context grew (DecodeSlots.decoded). A decode's
        # token is RequestLog.took's rule for one token past the first, written out: this loop
        # runs once per generated token.
        self._slots.decoded(slot, len(decodes))
        keep_times = self.record_token_times
        for r in decodes:
            r.ctx_len += 1
            if keep_times:
                r.token_times.append(now)
            rec = r.rec
            n = rec.num_generated = rec.num_generated + 1
            if n >= r.target_len or (stop_ids and r.req_id in stop_ids):
                ended.append(self._finish(r, now, stop_ids))
        num_tokens = len(decodes)
        live = self._live
        for c in plan.prefill:
            found = live.get(c.req_id)
            if found is None:
                continue
            r = found
            # chunks return in order: still in flight if a later chunk was scheduled
            r.in_flight = r.num_computed > c.num_computed + c.num_tokens
            if r.aborted:
                if not r.in_flight:
                    self._detach(r)
                    ended.append(self._end(r, now, FinishReason.ABORTED, "aborted by client"))
                    if c.completes:
                        discarded.append(r.req_id)
                continue
            if not c.completes:
                continue
            rec = r.rec
            self._log.took(rec, rec.num_generated + 1, now)
            num_tokens += 1
            r.ctx_len = r.prompt_len + rec.num_generated
            if rec.num_generated >= r.target_len or c.req_id in stop_ids:
                ended.append(self._finish(r, now, stop_ids))
            else:
                self._slots.join(r, slot)
        self._kv.output_backlog -= num_tokens  # each token was one less its request may write
        if not ended:
            return NO_OUTPUT
        return StepOutput(tuple(ended), frozenset(discarded))

    def _end_aborted_decodes(
        self, decodes: list[LiveRequest], now: float, ended: list[RequestEnd], discarded: list[int]
    ) -> list[LiveRequest]:
        """End the aborted ones among a returned microbatch's decodes (their token is dropped)
        and return the others."""
        kept = []
        for r in decodes:
            if r.aborted:
                self._detach(r)
                ended.append(self._end(r, now, FinishReason.ABORTED, "aborted by client"))
                discarded.append(r.req_id)
            else:
                kept.append(r)
        return kept

    def observe(self, rec: IterationRecord) -> None:
        """Forward an executor's stage-iteration record to the policies (errors contained)."""
        self.host.observe(rec)

    @property
    def observes_iterations(self) -> bool:
        """Whether the policies use stage-iteration records (``observe``); an executor that
        keeps no records of its own may skip building them when they do not."""
        return self.host.observes

    @property
    def chunk_policy(self) -> ChunkPolicy:
        return self.policies.chunk_policy

    @chunk_policy.setter
    def chunk_policy(self, policy: ChunkPolicy) -> None:
        self.policies.chunk_policy = policy

    @property
    def balancer(self) -> DecodeBalancer:
        return self.policies.balancer

    @property
    def counters(self) -> HostCounters:
        """The policy host's decision counts, live (steps, parks, restores, liveness, sit-outs)."""
        return self.host.counters

    # ------------------------------------------------------------------ state helpers
    def _detach(self, r: LiveRequest) -> None:
        """Take ``r`` out of whichever structure holds it and free its KV."""
        if r.slot >= 0 or r.parked_at is not None:
            self._slots.leave(r)
        else:
            self._queue.remove(r)  # False between prefill completion and joining a slot
        if r.kv_tokens:
            self._kv.release(r)

    def _finish(self, r: LiveRequest, now: float, stop_ids: Collection[int]) -> RequestEnd:
        self._detach(r)
        if r.req_id in stop_ids:
            return self._end(r, now, FinishReason.STOP, "")
        rec = r.rec
        detail = (
            ""
            if r.target_len == rec.output_len
            else (
                f"output capped at {r.target_len} tokens: prompt + output must fit the context of "
                f"{self.config.max_context} and the KV pool of {self._kv.pool.capacity} tokens"
            )
        )
        return self._end(r, now, FinishReason.LENGTH, detail)

    def _end(self, r: LiveRequest, now: float, reason: FinishReason, detail: str) -> RequestEnd:
        rec = r.rec
        RequestLog.end(rec, now, reason, detail)
        del self._live[r.req_id]
        self._aborting.discard(r.req_id)
        self._num_ended += 1
        return RequestEnd(r.req_id, reason, detail, rec)

    def _reject(self, rec: RequestRecord, now: float, why: str) -> RequestRecord:
        RequestLog.end(rec, now, FinishReason.REJECTED, why)
        self._num_ended += 1
        return rec

    # ------------------------------------------------------------------ queries
    @property
    def has_work(self) -> bool:
        """True while any admitted or waiting request has not ended."""
        return bool(self._live)

    def is_slot_free(self, slot: int) -> bool:
        """True when ``slot`` has no microbatch in flight (``schedule(slot)`` may be called)."""
        return self._in_flight[slot] is None

    @property
    def num_microbatches(self) -> int:
        """Microbatches launched so far."""
        return self._next_mb_id

    @property
    def num_ended(self) -> int:
        """Requests that ended so far (finished, aborted or rejected)."""
        return self._num_ended

    def stats(self) -> SchedulerStats:
        """A copy of the scheduler's counts (cheap: O(D_p))."""
        queued = len(self._queue)
        return SchedulerStats(
            num_waiting=queued,
            num_admitted=len(self._live) - queued,
            num_parked=len(self._slots.parked),
            num_in_flight=sum(p is not None for p in self._in_flight),
            kv_used_tokens=self._kv.pool.used,
            kv_capacity_tokens=self._kv.pool.capacity,
            num_arrived=self._signals.num_arrivals,
            num_ended=self._num_ended,
            num_microbatches=self._next_mb_id,
            num_retractions=self._num_retractions,
            num_decode_sitouts=self.host.counters.decode_sitouts,
        )

    def forget(self, req_id: int) -> RequestRecord:
        """Drop an ended request's record and return it (a long-running server calls this so
        the scheduler does not grow without bound). ``ValueError`` if it has not ended."""
        rec = self._records.get(req_id)
        if rec is None or not rec.is_finished or req_id in self._live:
            raise ValueError(f"request {req_id} is unknown or has not ended")
        return self._records.pop(req_id)

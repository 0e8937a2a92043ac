"""Our policies inside one SGLang 0.5.23 scheduler process (one per PP rank): SGLang's side of
the policy host (fastpp/policy_host.py; level 2 of fastpp/policy_host_contract.py). The host
decides; this module translates SGLang's objects and calls into the host's terms and back.

The plugin (``plugin.py``) routes these SGLang methods here:

* ``Scheduler.get_new_batch_prefill`` -> ``form``: SGLang calls it once per PP-loop step (from
  ``get_next_batch_to_run``, after merging the slot's finished prefill into its running batch
  and before deciding between prefill and decode). PP rank 0 runs the host's ``begin_step``
  for the slot over ``SGLangSlots`` (slot_state.py: park / restore applied to SGLang's running
  batch, the liveness rule, C) and sends the decision to the other ranks, which apply the same
  park / restore sets. C becomes SGLang's ``chunked_prefill_size`` for this one call (the value
  ``PrefillAdder`` receives), then the configured value is put back. Under queue order
  late_last rank 0 first puts the waiting queue in that order and the decision carries it.
* ``PrefillAdder.__init__`` -> ``adder_created``: reads back the chunk budget SGLang's adder got.
* ``Scheduler._pp_launch_batch`` -> ``launch``: times this rank's stage of the microbatch,
  reads the batch's contents from SGLang's objects, and makes the stage's IterationRecord (rank
  0 feeds it to the policies; other ranks send it to rank 0).
* ``Scheduler._pp_process_batch_result`` -> ``before_result`` (rank 0 takes in the other
  stages' records of the returning microbatch) and ``result``: tokens as they come back (rank 0:
  TTFT, token gaps, request records).
* ``SchedulerOutputStreamer.stream_output`` -> ``streaming``: finished requests are recorded
  before SGLang replies to their clients.
* ``Scheduler._add_request_to_queue`` -> ``enqueued``: arrivals (rank 0).
* with a record directory, the methods of ``host_timing.PHASES`` -> ``phase_begin`` /
  ``phase_end``: each PP-loop step's phases, timed on every rank.

Meaning of C: the whole token budget of the microbatch, decodes included (fastpp's meaning).
SGLang 0.5.23's ``chunked_prefill_size`` already has that meaning with ``--enable-mixed-chunk``
(``PrefillAdder`` subtracts the running decodes from it); without it a prefill microbatch
carries no decodes at all, so all of C goes to prefill and the microbatch still holds at most C
tokens. A decode-only microbatch runs all of the slot's unparked decodes whatever C is.

A policy that raises is logged once per kind of failure and replaced for that step by the
static fallback (C = the static chunk, fitted to SGLang's ceiling; no balancing); the server
keeps serving.
"""

from __future__ import annotations

import logging
import time
import zlib
from itertools import count
from typing import Any

from fastpp.backends.sglang.batch_ops import batch_contents
from fastpp.backends.sglang.channel import Decision, DecisionChannel
from fastpp.backends.sglang.engine_facts import finish_reason_of, run_setup
from fastpp.backends.sglang.faults import _Faulty
from fastpp.backends.sglang.host_timing import STEP_START, LoopStepTimer
from fastpp.backends.sglang.recorder import RecordWriter
from fastpp.backends.sglang.settings import PluginSettings
from fastpp.backends.sglang.slot_state import SGLangSlots, live_reqs
from fastpp.backends.sglang.view import SGLangView
from fastpp.iteration_log import make_record
from fastpp.policy_host import PolicyHost
from fastpp.policy_host_records import RequestLog
from fastpp.scheduler_config import DEFAULT_CANDIDATES, SchedulerConfig, late_thresholds, static_chunk
from fastpp.types import IterationRecord, RequestRecord
from fastpp.waiting_queue import late_last_reorder

log = logging.getLogger("fastpp.sglang")


class UnsupportedDeployment(RuntimeError):
    """The SGLang deployment uses a feature the adapter does not handle."""


class SGLangAdapter:
    """Per-process state of the plugin; set up at the scheduler's first PP-loop step."""

    def __init__(self, settings: PluginSettings, clock: Any = None) -> None:
        self.settings = settings
        self.clock = clock or (lambda: time.time() - settings.epoch)
        self.ready = False
        self.disabled = ""  # why the adapter stays out of the way ("" while active)
        self.num_decisions = 0
        self.num_launches = 0
        self.num_divergences = 0
        self.num_reorders = 0  # steps whose waiting queue was put in late_last order
        self._ids: dict[str, tuple[int, float]] = {}  # rid -> (our id, arrival time)
        self._rid_of: dict[int, str] = {}
        self.slots = SGLangSlots(self._identity, self._rid_of)
        self.parked = self.slots.parked  # by rid, longest parked first
        self._next_id = count()
        self._live: dict[str, RequestRecord] = {}  # rank 0: unfinished requests by rid
        self._adder_budget: int | None = None
        self._slot_budget: dict[int, tuple[int | None, str, int | None]] = {}
        self._awaiting_records = 0  # leader: launched microbatches whose peers' records are due
        self.timer: LoopStepTimer | None = None  # with a record dir: the PP loop's phase timings

    # ------------------------------------------------------------------ setup
    def _setup(self, sched: Any) -> None:
        par = _parallel()
        self.pp_rank, self.pp_size = par.pp_rank, par.pp_size
        problems = []
        if par.tp_size != 1:
            problems.append(f"tp_size={par.tp_size} (decisions are carried between PP ranks of TP size 1)")
        if not sched.spec_algorithm.is_none():
            problems.append("speculative decoding")
        if getattr(sched, "disaggregation_mode", None) is not None and str(sched.disaggregation_mode) not in (
            "DisaggregationMode.NULL",
            "null",
        ):
            problems.append(f"disaggregation mode {sched.disaggregation_mode}")
        if getattr(sched, "enable_hisparse", False):
            problems.append("hisparse")
        if problems:
            raise UnsupportedDeployment("fastpp's SGLang adapter does not support " + ", ".join(problems))
        ceiling = sched.chunked_prefill_size
        self.ceiling = int(ceiling) if ceiling else None
        self.page_size = int(sched.page_size)
        profile = None
        if self.settings.profile:
            from fastpp.profile import load_profile

            profile = load_profile(self.settings.profile)
        top = self.ceiling or int(sched.max_prefill_tokens)
        candidates = (
            self.settings.chunk_candidates or tuple(c for c in DEFAULT_CANDIDATES if c <= top) or (top,)
        )
        token_step = (
            self.settings.token_step
            if self.settings.token_step is not None
            else (profile.token_step if profile is not None else 0)
        )
        self.config = SchedulerConfig(
            num_slots=sched.pp_loop_size,
            kv_capacity_tokens=int(sched.max_total_num_tokens),
            page_size=self.page_size,
            max_context=int(sched.model_config.context_len),
            chunk_candidates=tuple(candidates),
            default_chunk=static_chunk(limit=top),
            token_step=token_step,
            slo=self.settings.slo,
            queue_order=self.settings.queue_order,
        )
        self._late_after, self._late_max_wait = late_thresholds(self.config)
        from fastpp.policies import make_policies

        chunk_policy, balancer = make_policies(self.settings.policy, self.config, profile)
        if "chunk" in self.settings.inject_fault:
            chunk_policy = _Faulty(chunk_policy, "choose", self.settings.fault_every)
        if "balancer" in self.settings.inject_fault:
            balancer = _Faulty(balancer, "plan", self.settings.fault_every)
        self.host = PolicyHost(self.config, chunk_policy, balancer, self.slots, fit_budget=self._fit)
        self.policies = self.host.policies
        self.signals = self.host.signals
        self.view = self.host.view = SGLangView(
            sched, self.config, self.signals, self.clock, self._identity, self.slots
        )
        self.is_leader = self.pp_rank == 0
        world = par.pp_rank * par.tp_size + par.tp_rank
        peers = [r * par.tp_size + par.tp_rank for r in range(par.pp_size) if r != par.pp_rank]
        self.channel = DecisionChannel(
            sched.world_group.cpu_group, world, par.tp_rank, peers if self.is_leader else []
        )
        record_dir = self.settings.record_dir
        self.records = RecordWriter(record_dir, self.pp_rank) if record_dir else None
        if self.records is not None:
            self.timer = LoopStepTimer(self.clock, self.records.host, self.pp_rank)
        if self.records is not None and self.is_leader:
            setup = run_setup(sched, self.settings.policy, self.config, self.pp_size)
            if setup is not None:
                self.records.setup(setup.to_dict())
        self.ready = True
        log.info(
            "fastpp policy %r active on PP rank %d/%d: %d microbatch slots, chunk ceiling %s, candidates %s",
            self.settings.policy,
            self.pp_rank,
            self.pp_size,
            self.config.num_slots,
            self.ceiling,
            candidates,
        )

    def _ensure_ready(self, sched: Any) -> bool:
        if self.ready:
            return True
        if self.disabled or not hasattr(sched, "running_mbs"):
            return False  # not the PP event loop (pp 1), or set-up failed
        try:
            self._setup(sched)
        except UnsupportedDeployment as exc:
            # every rank sees the same deployment, so every rank stays out of the way alike
            self.disabled = str(exc)
            log.error("%s; serving without fastpp's policies", exc)
            return False
        return True

    # ------------------------------------------------------------------ identities
    def _identity(self, req: Any) -> tuple[int, float]:
        ident = self._ids.get(req.rid)
        if ident is None:
            ident = self._register(req)
        return ident

    def _register(self, req: Any) -> tuple[int, float]:
        now = self.clock()
        req_id = next(self._next_id)
        ident = self._ids[req.rid] = (req_id, now)
        self._rid_of[req_id] = req.rid
        max_new = getattr(getattr(req, "sampling_params", None), "max_new_tokens", None) or 1
        self._live[req.rid] = self.host.arrive(req_id, now, len(req.origin_input_ids), int(max_new))
        return ident

    def enqueued(self, sched: Any, req: Any, is_retracted: bool = False) -> None:
        if not self._ensure_ready(sched) or not self.is_leader:
            return
        if is_retracted:
            rec = self._live.get(req.rid)
            if rec is not None:
                RequestLog.retracted(rec)
            return
        if req.rid not in self._ids:
            self._register(req)

    # ------------------------------------------------------------------ forming a microbatch
    def form(self, sched: Any, original: Any, running_batch: Any) -> Any:
        if not self._ensure_ready(sched):
            return original(sched, running_batch)
        slot = _slot_of(sched)
        if slot is None or self._nothing_to_decide(sched, running_batch):
            # decided from replicated state, so every rank skips the same steps: an idle loop
            # spins through here without messages or policy calls
            if slot is not None:
                self._slot_budget[slot] = (None, "idle", None)
            return original(sched, running_batch)
        self.num_decisions += 1
        if self.is_leader:
            running_batch, decision = self._decide(sched, slot, running_batch)
            self.channel.send_decision(decision)
        else:
            decision = self.channel.recv_decision()
            self._check_agreement(sched, slot, running_batch, decision)
            if decision.order:
                self._apply_order(sched, decision.order)
            self.slots.begin(sched, slot, running_batch)
            self.slots.apply_rids(decision.park, decision.restore, self.clock())
            running_batch = self.slots.live_batch
        self._adder_budget = None
        configured = sched.chunked_prefill_size
        if decision.chunk is not None and configured is not None:
            sched.chunked_prefill_size = decision.chunk
        try:
            plan = original(sched, running_batch)
        finally:
            sched.chunked_prefill_size = configured
        self._slot_budget[slot] = (decision.chunk, decision.reason, self._adder_budget)
        if self.records is not None and self.is_leader:
            self.records.decision(
                {
                    "seq": decision.seq,
                    "slot": slot,
                    "at": self.view.now,
                    "chunk": decision.chunk,
                    "reason": decision.reason,
                    "park": list(decision.park),
                    "restore": list(decision.restore),
                    "fallback": decision.fallback,
                    "reordered": bool(decision.order),
                    "adder_chunk_budget": self._adder_budget,
                    "num_parked": len(self.parked),
                }
            )
        return plan

    def _nothing_to_decide(self, sched: Any, running_batch: Any) -> bool:
        """Nothing waits, is chunked, parked or decoding here: SGLang's loop is idle (it spins
        through this step without a decision on every rank alike)."""
        return not (
            sched.waiting_queue
            or sched.chunked_req is not None
            or self.parked
            or live_reqs(sched, running_batch)
        )

    def adder_created(self, rem_chunk_tokens: int | None) -> None:
        self._adder_budget = rem_chunk_tokens

    def _decide(self, sched: Any, slot: int, running_batch: Any) -> tuple[Any, Decision]:
        """Rank 0: the host's decision for this step over SGLang's state, applied to it, and the
        same decision in SGLang's terms (rids) for the other ranks."""
        digest = state_digest(sched, slot, running_batch, self.parked)
        now = self.clock()
        order = self._late_last(sched, now)
        self.slots.begin(sched, slot, running_batch)
        self.view.begin(now, slot)
        d = self.host.begin_step(slot, now)
        chunk, reason = d.budget, d.reason
        if self.ceiling is None:
            chunk, reason = None, "sglang: chunking disabled"
        decision = Decision(
            seq=self.num_decisions,
            slot=slot,
            chunk=chunk,
            reason=reason,
            park=self.slots.rids(d.park_ids),
            restore=self.slots.rids(d.restore_ids),
            digest=digest,
            fallback=d.fallback,
            order=order,
        )
        return self.slots.live_batch, decision

    # ------------------------------------------------------------------ queue order
    def _late_last(self, sched: Any, now: float) -> tuple[str, ...]:
        """Rank 0, queue order late_last: SGLang admits from the head of its waiting queue
        (schedule policy fcfs), so before each decision the queue is put in
        ``late_last_order``, the order our own scheduler admits in: a request that has waited
        the SLO TTFT (since rank 0 first saw it) without a first token goes behind those that
        can still meet theirs; a retracted request that had one never is late. The new order
        (rids) when a request moved, else (); the policies then see the queue in that order.
        Under "fcfs" the queue is left as it is."""
        waiting = sched.waiting_queue
        order = late_last_reorder(
            waiting,
            now,
            self._late_after,
            self._late_max_wait,
            lambda r: self._identity(r)[1],
            lambda r: bool(r.output_ids),
        )
        if order is None:
            return ()
        waiting[:] = order
        self.num_reorders += 1
        return tuple(r.rid for r in order)

    def _apply_order(self, sched: Any, order: tuple[str, ...]) -> None:
        """A follower: rank 0's reordering of the same waiting queue (the digest checked that
        the queues agree); a queue that does not hold exactly those rids is a divergence."""
        by_rid = {r.rid: r for r in sched.waiting_queue}
        if len(by_rid) != len(order) or not all(rid in by_rid for rid in order):
            self.num_divergences += 1
            log.error("PP rank %d cannot apply rank 0's queue order: its waiting queue differs", self.pp_rank)
            return
        sched.waiting_queue[:] = [by_rid[rid] for rid in order]
        self.num_reorders += 1

    def _fit(self, chunk: int, reason: str) -> tuple[int, str]:
        """C within what SGLang allocated at start-up and on the page grid."""
        if self.ceiling is None:
            return chunk, reason
        fitted = min(chunk, self.ceiling) // self.page_size * self.page_size
        fitted = max(fitted, self.page_size)
        if fitted != chunk:
            reason = f"{reason} (fitted {chunk}->{fitted})"
        return fitted, reason

    def _check_agreement(self, sched: Any, slot: int, running_batch: Any, decision: Decision) -> None:
        """A follower's check that rank 0 decided for the same step on the same state."""
        problems = []
        if decision.seq != self.num_decisions or decision.slot != slot:
            problems.append(
                f"step {self.num_decisions} slot {slot} got rank 0's step {decision.seq} slot {decision.slot}"
            )
        mine = state_digest(sched, slot, running_batch, self.parked)
        if mine != decision.digest:
            problems.append(f"state digest {mine} != rank 0's {decision.digest}")
        if problems:
            self.num_divergences += 1
            log.error("PP rank %d diverged from rank 0: %s", self.pp_rank, "; ".join(problems))
            if self.records is not None:
                self.records.batch({"divergence": problems, "seq": self.num_decisions})

    @property
    def fallbacks(self) -> dict[str, int]:
        """Decisions that fell back to the static chunk / no balancing, by policy."""
        return self.policies.num_fallbacks

    # ------------------------------------------------------------------ launching a microbatch
    def launch(self, sched: Any, original: Any, mb_id: int, cur_batch: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.ready:
            return original(sched, mb_id, cur_batch, *args, **kwargs)
        contents, features = batch_contents(cur_batch)
        started = self.clock()
        out = original(sched, mb_id, cur_batch, *args, **kwargs)
        finished = self.clock()
        seq = self.num_launches
        self.num_launches += 1
        chunk, reason, adder_budget = self._slot_budget.get(mb_id, (None, "", None))
        head = self.host.launched(seq, mb_id, features, chunk or 0, reason)
        if self.records is not None:
            entry = {
                "rank": self.pp_rank,
                "mb": seq,
                "slot": mb_id,
                "decision": self.num_decisions,
                "chunk": chunk,
                "adder_chunk_budget": adder_budget,
                "parked": sorted(self.parked),
                **contents,
            }
            self.records.batch(entry)
        if self.is_leader:
            for rid, _, _ in contents["chunks"]:
                live = self._live.get(rid)
                if live is not None:
                    RequestLog.scheduled(live, started)
            for rec in self.host.stage_records(head, [(self.pp_rank, started, finished)]):
                self._record(rec)
            self._awaiting_records += 1
        else:
            self.channel.send_record(make_record(head, self.pp_rank, started, finished))
        return out

    def _record(self, rec: IterationRecord) -> None:
        if self.records is not None:
            self.records.iteration(rec)

    # ------------------------------------------------------------------ loop timings
    def phase_begin(self, sched: Any, phase: str) -> None:
        if self.timer is not None:
            self.timer.begin(phase, _slot_of(sched) if phase == STEP_START else None)

    def phase_end(self, phase: str) -> None:
        if self.timer is not None:
            self.timer.end(phase)

    # ------------------------------------------------------------------ results
    def before_result(self, batch: Any) -> None:
        """The other stages' records of this returning microbatch, taken in before SGLang streams
        its tokens (so a client that stops the server on its last reply finds every record); they
        ran it before the last stage returned, so this does not wait on anything running."""
        if not self.ready or not self.is_leader or batch is None or not self._awaiting_records:
            return
        self._awaiting_records -= 1
        for rec in self.channel.recv_records():
            self.host.observe(rec)
            self._record(rec)

    def result(self, sched: Any, batch: Any) -> None:
        if not self.ready or not self.is_leader or batch is None:
            return
        # (the stages' records of this microbatch came in before_result, the BEFORE hook: taking
        # them here again would wait on a microbatch the last stage has not run yet)
        now = self.clock()
        slot = next((k for k, b in enumerate(sched.mbs) if b is batch), None)
        mode = batch.forward_mode
        decoded = bool(mode is not None and mode.is_decode()) or bool(getattr(batch, "decoding_reqs", None))
        self._note_tokens(batch.reqs, now)
        if slot is not None:
            self.host.returned(slot, now, decoded)

    def streaming(self, reqs: list[Any]) -> None:
        """SGLang is about to send these requests' outputs to the client: a request finished here
        is recorded now, before its response can arrive (a client that stops the server on its
        last response must find every record)."""
        if self.ready and self.is_leader:
            finished = [r for r in reqs if r.finished()]
            if finished:
                self._note_tokens(finished, self.clock())

    def _note_tokens(self, reqs: list[Any], now: float) -> None:
        for req in reqs:
            rec = self._live.get(req.rid)
            if rec is None:
                continue
            self.host.records.took(rec, len(req.output_ids), now)
            if req.finished():
                self._finish(req, rec, now)

    def _finish(self, req: Any, rec: RequestRecord, now: float) -> None:
        del self._live[req.rid]  # (never parked: a parked request is in no batch, so cannot finish)
        RequestLog.end(rec, now, *finish_reason_of(getattr(req, "finished_reason", None)))
        self.host.records.forget(rec.req_id)
        if self.records is not None:
            self.records.request(rec)
        ident = self._ids.pop(req.rid, None)
        if ident is not None:
            self._rid_of.pop(ident[0], None)


# ---------------------------------------------------------------------- helpers
def _parallel() -> Any:
    from sglang.srt.runtime_context import get_parallel

    return get_parallel()


def _slot_of(sched: Any) -> int | None:
    """The microbatch slot being formed: event_loop_pp sets ``running_batch`` to
    ``running_mbs[mb_id]`` for the step (scheduler_pp_mixin.py)."""
    current = sched.running_batch
    return next((k for k, b in enumerate(sched.running_mbs) if b is current), None)


def state_digest(sched: Any, slot: int, running_batch: Any, parked: dict) -> str:
    """A checksum of the replicated state a decision depends on: the queue, the chunked
    request's progress, the slot's decodes and the parked set, by request id."""
    chunked = sched.chunked_req
    parts = [
        str(slot),
        ",".join(r.rid for r in sched.waiting_queue),
        "" if chunked is None else f"{chunked.rid}:{chunked.prefix_len}",
        ",".join(r.rid for r in live_reqs(sched, running_batch)),
        ",".join(parked),
    ]
    return f"{zlib.crc32('|'.join(parts).encode()):08x}"

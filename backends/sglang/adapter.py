"""Our policies inside one SGLang 0.5.23 scheduler process (one per PP rank).

The plugin (``plugin.py``) routes these SGLang methods here:

* ``Scheduler.get_new_batch_prefill`` -> ``form``: SGLang calls it once per PP-loop step (from
  ``get_next_batch_to_run``, after merging the slot's finished prefill into its running batch
  and before deciding between prefill and decode). PP rank 0 plans the slot's decode membership
  (DecodeBalancer: park / restore), applies it, then chooses C (ChunkPolicy) and sends the
  decision to the other ranks, which apply the same decision. C becomes SGLang's
  ``chunked_prefill_size`` for this one call (the value ``PrefillAdder`` receives), then the
  configured value is put back.
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
static fallback (C = the configured chunk size, no balancing); the server keeps serving.
"""

from __future__ import annotations

import logging
import time
import zlib
from itertools import count
from typing import Any

from fastpp.backends.sglang.batch_ops import batch_contents, park, restore
from fastpp.backends.sglang.channel import Decision, DecisionChannel
from fastpp.backends.sglang.host_timing import STEP_START, LoopStepTimer
from fastpp.backends.sglang.recorder import RecordWriter
from fastpp.backends.sglang.settings import PluginSettings
from fastpp.backends.sglang.view import ParkedRequest, SGLangView
from fastpp.plan import BalancePlan
from fastpp.policies.guard import FALLBACK_REASON, GuardedPolicies
from fastpp.profile import DTYPE_BYTES, ModelShape
from fastpp.run_setup import RunSetup
from fastpp.scheduler_config import DEFAULT_CANDIDATES, SchedulerConfig
from fastpp.signals import Signals
from fastpp.types import FinishReason, IterationRecord, RequestRecord

log = logging.getLogger("fastpp.sglang")


class UnsupportedDeployment(RuntimeError):
    """The SGLang deployment uses a feature the adapter does not handle."""


class PolicyFault(RuntimeError):
    """Raised on purpose by a policy wrapped for fault injection (tests)."""


class _Faulty:
    """Wraps a policy so every ``every``-th call of ``method`` raises (FASTPP_SGLANG_INJECT_FAULT)."""

    def __init__(self, inner: Any, method: str, every: int) -> None:
        self._inner, self._method, self._every = inner, method, every
        self._calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name != self._method:
            return attr

        def maybe_fail(*args: Any, **kwargs: Any) -> Any:
            self._calls += 1
            if self._calls % self._every == 0:
                raise PolicyFault(f"injected fault in {type(self._inner).__name__}.{name}")
            return attr(*args, **kwargs)
        return maybe_fail


class SGLangAdapter:
    """Per-process state of the plugin; set up at the scheduler's first PP-loop step."""

    def __init__(self, settings: PluginSettings, clock: Any = None) -> None:
        self.settings = settings
        self.clock = clock or (lambda: time.time() - settings.epoch)
        self.ready = False
        self.disabled = ""  # why the adapter stays out of the way ("" while active)
        self.parked: dict[str, ParkedRequest] = {}
        self.signals = Signals()
        self.num_decisions = 0
        self.num_launches = 0
        self.num_divergences = 0
        self._ids: dict[str, tuple[int, float]] = {}  # rid -> (our id, arrival time)
        self._rid_of: dict[int, str] = {}
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
        if getattr(sched, "disaggregation_mode", None) is not None and str(sched.disaggregation_mode) \
                not in ("DisaggregationMode.NULL", "null"):
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
        candidates = self.settings.chunk_candidates or tuple(c for c in DEFAULT_CANDIDATES if c <= top) \
            or (top,)
        token_step = self.settings.token_step if self.settings.token_step is not None \
            else (profile.token_step if profile is not None else 0)
        self.config = SchedulerConfig(
            num_slots=sched.pp_loop_size, kv_capacity_tokens=int(sched.max_total_num_tokens),
            page_size=self.page_size, max_context=int(sched.model_config.context_len),
            chunk_candidates=tuple(candidates), default_chunk=top, token_step=token_step,
            slo=self.settings.slo)
        from fastpp.policies import make_policies

        chunk_policy, balancer = make_policies(self.settings.policy, self.config, profile)
        if "chunk" in self.settings.inject_fault:
            chunk_policy = _Faulty(chunk_policy, "choose", self.settings.fault_every)
        if "balancer" in self.settings.inject_fault:
            balancer = _Faulty(balancer, "plan", self.settings.fault_every)
        self.policies = GuardedPolicies(chunk_policy, balancer, top)
        self.view = SGLangView(sched, self.config, self.signals, self.clock, self._identity, self.parked)
        self.is_leader = self.pp_rank == 0
        world = par.pp_rank * par.tp_size + par.tp_rank
        peers = [r * par.tp_size + par.tp_rank for r in range(par.pp_size) if r != par.pp_rank]
        self.channel = DecisionChannel(sched.world_group.cpu_group, world, par.tp_rank,
                                       peers if self.is_leader else [])
        record_dir = self.settings.record_dir
        self.records = RecordWriter(record_dir, self.pp_rank) if record_dir else None
        if self.records is not None:
            self.timer = LoopStepTimer(self.clock, self.records.host, self.pp_rank)
        if self.records is not None and self.is_leader:
            setup = run_setup(sched, self.settings.policy, self.config, self.pp_size)
            if setup is not None:
                self.records.setup(setup.to_dict())
        self.ready = True
        log.info("fastpp policy %r active on PP rank %d/%d: %d microbatch slots, chunk ceiling %s, "
                 "candidates %s", self.settings.policy, self.pp_rank, self.pp_size, self.config.num_slots,
                 self.ceiling, candidates)

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
        prompt = len(req.origin_input_ids)
        self.signals.on_arrival(now, prompt)
        max_new = getattr(getattr(req, "sampling_params", None), "max_new_tokens", None) or 1
        self._live[req.rid] = RequestRecord(req_id, now, prompt, int(max_new))
        return ident

    def enqueued(self, sched: Any, req: Any, is_retracted: bool = False) -> None:
        if not self._ensure_ready(sched) or not self.is_leader:
            return
        if is_retracted:
            rec = self._live.get(req.rid)
            if rec is not None:
                rec.num_retractions += 1
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
            running_batch = self._apply_balance(sched, slot, running_batch, decision.park, decision.restore)
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
            self.records.decision({
                "seq": decision.seq, "slot": slot, "at": self.view.now, "chunk": decision.chunk,
                "reason": decision.reason, "park": list(decision.park), "restore": list(decision.restore),
                "fallback": decision.fallback, "adder_chunk_budget": self._adder_budget,
                "num_parked": len(self.parked)})
        return plan

    def _nothing_to_decide(self, sched: Any, running_batch: Any) -> bool:
        return not (sched.waiting_queue or sched.chunked_req is not None or self.parked
                    or _live_reqs(sched, running_batch))

    def adder_created(self, rem_chunk_tokens: int | None) -> None:
        self._adder_budget = rem_chunk_tokens

    def _decide(self, sched: Any, slot: int, running_batch: Any) -> tuple[Any, Decision]:
        view = self.view
        view.begin(slot, running_batch)
        digest = state_digest(sched, slot, running_batch, self.parked)
        fallback = []
        park_rids: tuple[str, ...] = ()
        restore_rids: tuple[str, ...] = ()
        if self.parked and self._pipeline_would_idle(sched, slot, running_batch):
            # liveness: parking must never leave the pipeline idle with requests held back
            restore_rids = tuple(self.parked)
        elif self.parked or _live_reqs(sched, running_batch):
            failures = self.policies.num_fallbacks.get("balancer", 0)
            plan = self.policies.balance(view, slot, lambda p, _: self._rids(sched, p, running_batch))
            if self.policies.num_fallbacks.get("balancer", 0) > failures:
                fallback.append("balancer")
            park_rids, restore_rids = self._rids(sched, plan, running_batch)
        running_batch = self._apply_balance(sched, slot, running_batch, park_rids, restore_rids)
        view.begin(slot, running_batch)
        chunk, reason = None, "sglang: chunking disabled"
        if self.ceiling is not None:
            chunk, reason = self.policies.choose(view)
            if reason == FALLBACK_REASON:
                fallback.append("chunk")
            chunk, reason = self._fit(chunk, reason)
        decision = Decision(seq=self.num_decisions, slot=slot, chunk=chunk, reason=reason,
                            park=park_rids, restore=restore_rids, digest=digest, fallback=",".join(fallback))
        return running_batch, decision

    def _fit(self, chunk: int, reason: str) -> tuple[int, str]:
        """C within what SGLang allocated at start-up and on the page grid."""
        fitted = min(chunk, self.ceiling) // self.page_size * self.page_size
        fitted = max(fitted, self.page_size)
        if fitted != chunk:
            reason = f"{reason} (fitted {chunk}->{fitted})"
        return fitted, reason

    def _rids(self, sched: Any, plan: BalancePlan, running_batch: Any) -> tuple[tuple, tuple]:
        """SGLang's request ids of a balance plan; ValueError for a plan naming requests it may
        not move (the guard then falls back to no balancing)."""
        if plan.is_noop:
            return (), ()
        running = {r.rid for r in _live_reqs(sched, running_batch)}
        park_rids, restore_rids = [], []
        for rid_int in plan.park_ids:
            rid = self._rid_of.get(rid_int)
            if rid not in running:
                raise ValueError(f"balancer parks request {rid_int}, not a decode of this slot")
            park_rids.append(rid)
        for rid_int in plan.restore_ids:
            rid = self._rid_of.get(rid_int)
            if rid not in self.parked:
                raise ValueError(f"balancer restores request {rid_int}, which is not parked")
            restore_rids.append(rid)
        if len(set(park_rids)) != len(park_rids) or set(park_rids) & set(restore_rids):
            raise ValueError("balancer plan repeats a request")
        return tuple(park_rids), tuple(restore_rids)

    def _pipeline_would_idle(self, sched: Any, slot: int, running_batch: Any) -> bool:
        if sched.waiting_queue or sched.chunked_req is not None or _live_reqs(sched, running_batch):
            return False
        return not any(sched.mbs[s] is not None for s in range(len(sched.mbs)) if s != slot)

    def _apply_balance(self, sched: Any, slot: int, running_batch: Any, park_rids: tuple,
                       restore_rids: tuple) -> Any:
        if park_rids:
            by_rid = {r.rid: r for r in running_batch.reqs}
            reqs = [by_rid[rid] for rid in park_rids]
            park(running_batch, reqs)
            now = self.clock()
            for r in reqs:
                self.parked[r.rid] = ParkedRequest(r, now)
                rec = self._live.get(r.rid)
                if rec is not None:
                    rec.num_parked += 1
        if restore_rids:
            reqs = []
            for rid in restore_rids:
                p = self.parked.pop(rid)
                if not p.req.finished():
                    reqs.append(p.req)
            running_batch = restore(sched, running_batch, reqs)
        return running_batch

    def _check_agreement(self, sched: Any, slot: int, running_batch: Any, decision: Decision) -> None:
        """A follower's check that rank 0 decided for the same step on the same state."""
        problems = []
        if decision.seq != self.num_decisions or decision.slot != slot:
            problems.append(f"step {self.num_decisions} slot {slot} got rank 0's step {decision.seq} "
                            f"slot {decision.slot}")
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
        contents = batch_contents(cur_batch)
        started = self.clock()
        out = original(sched, mb_id, cur_batch, *args, **kwargs)
        finished = self.clock()
        seq = self.num_launches
        self.num_launches += 1
        chunk, reason, adder_budget = self._slot_budget.get(mb_id, (None, "", None))
        rec = IterationRecord(
            mb_id=seq, stage=self.pp_rank, slot=mb_id, started_at=started, finished_at=finished,
            num_tokens=contents["num_tokens"], num_prefill_tokens=contents["num_prefill_tokens"],
            num_decode_reqs=len(contents["decodes"]), sum_past_x_pre=contents["sum_past_x_pre"],
            sum_pre_sq=contents["sum_pre_sq"], sum_dec_ctx=contents["sum_dec_ctx"],
            chunk_budget=chunk or 0, reason=reason, num_sampled=contents["num_sampled"])
        if self.records is not None:
            entry = {"rank": self.pp_rank, "mb": seq, "slot": mb_id, "decision": self.num_decisions,
                     "chunk": chunk, "adder_chunk_budget": adder_budget,
                     "parked": sorted(self.parked), **contents}
            self.records.batch(entry)
        if self.is_leader:
            for rid, _, _ in contents["chunks"]:
                live = self._live.get(rid)
                if live is not None and live.scheduled_at is None:
                    live.scheduled_at = started
            self._observe(rec)
            self._awaiting_records += 1
        else:
            self.channel.send_record(rec)
        return out

    def _observe(self, rec: IterationRecord) -> None:
        if self.records is not None:
            self.records.iteration(rec)
        self.policies.observe(rec)

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
            self._observe(rec)

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
            self.signals.on_return(slot, now, decoded)

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
            n = len(req.output_ids)
            if n > rec.num_generated:
                if rec.first_token_at is None:
                    rec.first_token_at = now
                    self.signals.on_first_token(now, now - rec.arrived_at)
                rec.token_times.extend([now] * (n - rec.num_generated))
                rec.num_generated = n
            if req.finished():
                self._finish(req, rec, now)

    def _finish(self, req: Any, rec: RequestRecord, now: float) -> None:
        del self._live[req.rid]  # (never parked: a parked request is in no batch, so cannot finish)
        rec.finished_at = now
        reason = getattr(req, "finished_reason", None)
        name = type(reason).__name__.upper() if reason is not None else ""
        rec.finish_reason = FinishReason.LENGTH if "LENGTH" in name else \
            FinishReason.ABORTED if "ABORT" in name else FinishReason.STOP
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


def _live_reqs(sched: Any, batch: Any) -> list[Any]:
    chunked = sched.chunked_req
    return [r for r in batch.reqs if not r.finished() and r is not chunked]


def state_digest(sched: Any, slot: int, running_batch: Any, parked: dict) -> str:
    """A checksum of the replicated state a decision depends on: the queue, the chunked
    request's progress, the slot's decodes and the parked set, by request id."""
    chunked = sched.chunked_req
    parts = [str(slot), ",".join(r.rid for r in sched.waiting_queue),
             "" if chunked is None else f"{chunked.rid}:{chunked.prefix_len}",
             ",".join(r.rid for r in _live_reqs(sched, running_batch)), ",".join(parked)]
    return f"{zlib.crc32('|'.join(parts).encode()):08x}"


def run_setup(sched: Any, policy: str, config: SchedulerConfig, pp_size: int) -> RunSetup | None:
    """What the recorded run ran on (fastpp.run_setup, for ``fastpp profile --from-records``):
    the model's shape from SGLang's HF config, layers per stage as SGLang places them. None (and a
    warning) if SGLang's objects do not have what is read here: records must never stop serving."""
    try:
        import sglang
        from sglang.srt.distributed.utils import get_pp_indices

        mc = sched.model_config
        dtype = str(mc.dtype).removeprefix("torch.")
        name = str(getattr(sched.server_args, "served_model_name", None) or sched.server_args.model_path)
        model = ModelShape.from_hf_config(mc.hf_config.to_dict(), name=name.rstrip("/").split("/")[-1],
                                          dtype_bytes=DTYPE_BYTES.get(dtype))
        spans = (get_pp_indices(model.num_layers, r, pp_size) for r in range(pp_size))
        layers = tuple(b - a for a, b in spans)
        device = str(getattr(sched, "device", "") or sched.server_args.device)
        return RunSetup(engine=f"sglang {sglang.__version__}",
                        device="CPU" if device == "cpu" else device.upper(), pp=pp_size, tp=1, policy=policy,
                        scheduler=config, model=model, layers_per_stage=layers, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 (any SGLang-side surprise: serve on, without the setup)
        log.warning("fastpp: the run's setup is not recorded (%s: %s)", type(exc).__name__, exc)
        return None

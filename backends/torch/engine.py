"""The CPU pipeline-parallel engine: the shared Scheduler driving P stage processes.

Threads of the engine's process (which is also stage 0's)::

    callers (HTTP server) --submit/abort--> inbox <--results-- receiver thread <-- last stage
                                              |
                                     engine thread: Scheduler.schedule -> stage 0 forward ->
                                     send to stage 1; on a result: Scheduler.update, events out

The engine thread is the only one that touches the Scheduler, the policies and stage 0's cache;
other threads read :attr:`PipelineEngine.snapshot`, which it publishes after each pass. It drives
the Scheduler through the executor contract (fastpp.plan) and the PipelineDriver the simulator
uses: the same slot order, the same IterationRecords (one per stage and microbatch, measured
here), the same observe-before-update order. Up to D_p = P microbatches are in flight, one per
slot. Callers get :class:`EngineEvent` callbacks (from the engine thread) with each request's new
tokens and, once, its finish reason.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from fastpp.backends.torch.engine_config import EngineConfig, EngineDeadError
from fastpp.backends.torch.engine_state import ActiveRequest, EngineCounters, EngineEvent, EngineSnapshot
from fastpp.backends.torch.layout import BatchLayout
from fastpp.backends.torch.sampling import SamplingParams
from fastpp.backends.torch.stage_group import StageGroup, watch_progress
from fastpp.backends.torch.stage_liveness import PING_INTERVAL_S, Liveness
from fastpp.backends.torch.stage_procs import StageProcesses
from fastpp.backends.torch.stage_runtime import (
    StageRunner,
    StageSpec,
    brief_error,
    last_stage_result,
    make_meta,
    run_or_fail,
)
from fastpp.backends.torch.weights import ModelWeights
from fastpp.backends.torch.weights_source import WeightsSource
from fastpp.backends.torch.wire import BACKWARD, FORWARD, KIND_BATCH, KIND_PING, KIND_STOP, Channel
from fastpp.pipeline import PipelineDriver
from fastpp.plan import MicroBatchPlan, RequestEnd
from fastpp.policies import make_policies
from fastpp.policies.base import ChunkPolicy, DecodeBalancer
from fastpp.scheduler import Scheduler
from fastpp.scheduler_config import SchedulerConfig
from fastpp.types import FinishReason, IterationRecord, Request, RequestRecord

log = logging.getLogger(__name__)

# length ends the engine keeps for a late stop-string relabel (the caller asks within moments of
# the last event; the bound only keeps callers that never ask from growing the table)
MAX_RELABELLABLE = 4096

__all__ = ["EngineConfig", "EngineDeadError", "PipelineEngine"]


def stage_cores(config: EngineConfig) -> tuple[int, ...]:
    """With ``pin_cores``, stage r's core: the r-th of the cores this process may run on."""
    if not config.pin_cores:
        return ()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < config.num_stages:
        raise ValueError(
            f"pin_cores needs a core per stage: {config.num_stages} stages, "
            f"{len(cores)} core(s) available ({cores})"
        )
    return tuple(cores[: config.num_stages])


class PipelineEngine:
    """Serve generation requests on ``config.num_stages`` CPU stages. ``start()``, then ``submit``."""

    def __init__(
        self,
        source: WeightsSource,
        config: EngineConfig,
        weights: ModelWeights | None = None,
        chunk_policy: ChunkPolicy | None = None,
        balancer: DecodeBalancer | None = None,
    ) -> None:
        """``weights``: stage 0's tensors if already loaded; ``chunk_policy`` / ``balancer``:
        objects to use instead of those ``config.policy`` names (tests inject their own)."""
        self.source = source
        self.config = config
        self.model_config = source.config() if weights is None else weights.config
        if config.num_stages > self.model_config.num_layers:
            raise ValueError(
                f"num_stages {config.num_stages} exceeds the model's {self.model_config.num_layers} layers"
            )
        self._weights = weights  # stage 0's (loaded in start() when None)
        self.spec = StageSpec(
            source,
            config.num_stages,
            config.kv_blocks,
            config.block_size,
            config.dtype,
            config.threads,
            seed=config.seed,
            cores=stage_cores(config),
            stage_timeout_s=config.stage_timeout_s,
        )
        self.scheduler_config = SchedulerConfig(
            num_slots=config.num_stages,
            kv_capacity_tokens=config.kv_blocks * config.block_size,
            page_size=config.block_size,
            max_context=self.model_config.max_context,
            chunk_candidates=config.chunk_candidates,  # (static: SchedulerConfig's one default)
            max_running_requests=config.max_running_requests,
            new_token_ratio=config.new_token_ratio,
            queue_order=config.queue_order,
            admission_reserve=config.admission_reserve,
            token_step=config.profile.token_step if config.profile is not None else 0,
            slo=config.slo,
        )
        if chunk_policy is None or balancer is None:
            named_chunk, named_balancer = make_policies(config.policy, self.scheduler_config, config.profile)
            chunk_policy = chunk_policy or named_chunk
            balancer = balancer or named_balancer
        self._epoch = time.perf_counter()
        self.scheduler = Scheduler(self.scheduler_config, self._clock, chunk_policy, balancer)
        self._driver = PipelineDriver(self.scheduler, config.num_stages, record_iterations=config.record)
        self.counters = EngineCounters(config.num_stages)
        self.error: str | None = None
        self.final_free_blocks: list[int] | None = None  # per stage, reported at shutdown
        # with config.record: every ended request's record, in order of ending
        self.recorded_requests: list[RequestRecord] = []
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._ids = itertools.count()
        self._active: dict[int, ActiveRequest] = {}
        self._inflight: dict[int, tuple[MicroBatchPlan, tuple[int, ...]]] = {}
        # KV the scheduler released: stage 0 frees it at once, the other stages with the next
        # microbatch (its plan's kv_frees hold only what schedule() itself released)
        self._frees_for_next: list[int] = []
        # requests ended through an abort that are to be reported otherwise: req id -> (the
        # event's finish reason, the record's, detail); a stop string, or a failure of its own
        self._end_as: dict[int, tuple[str, FinishReason, str]] = {}
        # requests with text stops that ended by length, newest last: req id -> its record; a
        # stop string in their last token's text relabels them ``stop``
        self._length_ends: OrderedDict[int, RequestRecord] = OrderedDict()
        self._submitted = 0
        self._lock = threading.Lock()
        self._procs: StageProcesses | None = None
        self._stages: StageGroup | None = None
        self._liveness = Liveness(config.num_stages)
        self._launched_at: dict[int, float] = {}  # microbatch in flight -> time.monotonic() of launch
        self._last_sent = 0.0  # time.monotonic() of the last message to stage 1
        self._failure_reported = False
        self._stage0: StageRunner | None = None
        self._to_next: Channel | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._closing = False  # shutdown asked: abort everything, then stop the stages
        self._failure_callbacks: list[Callable[[str], None]] = []
        self._generator = torch.Generator().manual_seed(config.seed)
        self.snapshot = self._snapshot()

    def _clock(self) -> float:
        return time.perf_counter() - self._epoch

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> PipelineEngine:
        """Spawn stages 1..P-1, load stage 0, connect the pipeline, start the engine thread and
        the watchdog. Whatever stops it half-way (an error, a stop signal) ends the stages."""
        try:
            self._start()
        except BaseException:
            if self._stages is not None:
                self._stages.close(0.0, clean=False)
            raise
        return self

    def _start(self) -> None:
        cfg = self.config
        torch.set_num_threads(cfg.threads)
        if cfg.num_stages > 1:
            self._stages = StageGroup.spawn(self.spec, self._liveness, cfg.load_timeout_s)
            self.spec, self._procs = self._stages.spec, self._stages.procs
        log.info("loading stage 0 (%s)", self.source.served_name)
        weights = self._weights if self._weights is not None else self.source.load(self.spec.torch_dtype)
        self._stage0 = StageRunner(self.spec, 0, weights)
        self._weights = None  # stage 0 keeps only its own tensors
        if self._stages is not None:
            assert self._procs is not None
            self._stages.connect()
            d = self.model_config.hidden_size
            self._to_next = Channel(1, FORWARD, d, self.spec.torch_dtype)
            from_last = Channel(cfg.num_stages - 1, BACKWARD)
            threading.Thread(
                target=self._receive, args=(from_last,), name="fastpp-receiver", daemon=True
            ).start()
            self._procs.watch(lambda msg: self._inbox.put(("dead", msg)))
        self._thread = threading.Thread(target=self._run, name="fastpp-engine", daemon=True)
        self._thread.start()
        watch_progress(
            self._liveness,
            cfg.stage_timeout_s,
            cfg.num_stages,
            self._stopped,
            lambda: min(list(self._launched_at.values()), default=None),
            self.stall,
        )
        log.info(
            "engine started: %s on %d stage(s), %d KV blocks of %d tokens, policy %s",
            self.source.served_name,
            cfg.num_stages,
            cfg.kv_blocks,
            cfg.block_size,
            cfg.policy,
        )

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Abort what is running, stop every stage, and wait for them. Safe to call twice."""
        if self._thread is not None and self._thread.is_alive():
            self._closing = True
            self._inbox.put(("stop",))
            self._thread.join(timeout_s)
        if self._stages is not None:
            self._stages.close(timeout_s if self.error is None else 1.0, clean=self.error is None)

    def kill_stages(self) -> None:
        """SIGKILL the stage processes now (any thread; the server's exit without cleanup): the
        engine ends quietly, without reporting a failure."""
        with self._lock:
            self._failure_reported = True
        self.error = self.error or "the stage processes were killed (exit without cleanup)"
        if self._procs is not None:
            self._procs.terminate()

    def abort_all(self, reason: str) -> None:
        """End every request now (any thread): each gets ``aborted`` with ``reason`` as detail."""
        self._inbox.put(("abort_all", reason))

    def stall(self, message: str) -> None:
        """The pipeline stopped making progress (any thread; the watchdog calls it): fail the
        engine with ``message``, and kill the stage processes, so that no thread stays blocked on
        them and every open request ends with ``message``."""
        if self.error is not None or self._stopped.is_set():
            return
        self.error = message
        log.error("engine stopped: %s", message)
        self._report_failure(message)
        if self._procs is not None:
            self._procs.kill()  # the watcher and the receiver see it; the engine thread fails
        else:
            self._inbox.put(("dead", message))

    def on_failure(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(message)`` (from an engine thread) if a stage dies or the engine fails."""
        self._failure_callbacks.append(callback)

    def __enter__(self) -> PipelineEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ requests (any thread)
    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams, on_event: Callable[[EngineEvent], None]
    ) -> int:
        """Queue a request and return its id; ``ValueError`` says why a request can never run."""
        if self.error is not None or self._stopped.is_set() or self._closing:
            raise EngineDeadError(self.error or "engine is shut down")
        self.check_prompt(prompt_ids)
        with self._lock:
            self._submitted += 1
            rid = next(self._ids)
            self._inbox.put(("add", rid, list(prompt_ids), params, on_event))
            stranded = self._stopped.is_set() and self.error is not None
        if stranded:  # the engine failed and stopped while this was queued: nobody drains it
            self._fail_queued(self.error or "engine is shut down")
        return rid

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
        """``ValueError`` naming the problem if ``prompt_ids`` can never be served."""
        n = len(prompt_ids)
        if n == 0:
            raise ValueError("prompt is empty")
        limit = self.model_config.max_context
        if n >= limit:  # before the scan below: a long list is refused at the cost of len()
            raise ValueError(
                f"prompt of {n} tokens does not fit the context of {limit} tokens "
                "(prompt + at least one output token)"
            )
        vocab = self.model_config.vocab_size
        bad = next((t for t in prompt_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary 0..{vocab - 1}")
        cfg = self.scheduler_config  # read-only config: safe from any thread
        page = cfg.page_size
        if -(-(n + 1) // page) * page > cfg.kv_capacity_tokens:
            raise ValueError(
                f"prompt of {n} tokens does not fit the KV cache of {cfg.kv_capacity_tokens} tokens"
            )

    def abort(self, req_id: int) -> None:
        """End ``req_id`` early and free its KV (no-op if it already ended)."""
        self._inbox.put(("abort", req_id))

    def stop(self, req_id: int) -> None:
        """End ``req_id`` as finished by a stop string the caller found in its text: as ``abort``,
        but counted and recorded as ``stop``. A request submitted with ``text_stops`` that already
        ended by length (the stop string in its last token) is relabelled ``stop``; any other
        request that already ended is left as it ended."""
        self._inbox.put(("stop_string", req_id))

    def output_room(self, prompt_len: int) -> int:
        """The most output tokens a prompt of ``prompt_len`` tokens can get: prompt + output must
        fit the context, and the KV of all but the last token the pool (the scheduler caps a
        longer ``max_tokens`` to this; callers refuse it first)."""
        cfg = self.scheduler_config
        return min(cfg.max_context - prompt_len, cfg.kv_capacity_tokens - prompt_len + 1)

    @property
    def num_unfinished(self) -> int:
        """Requests submitted and not yet ended."""
        return self._submitted - self.snapshot.counters.num_ended

    @property
    def num_received(self) -> int:
        """Requests submitted so far."""
        return self._submitted

    @property
    def num_queued(self) -> int:
        """Requests submitted and not yet admitted (waiting for KV or a chunk budget)."""
        return max(0, self.num_unfinished - self.snapshot.stats.num_admitted)

    @property
    def is_alive(self) -> bool:
        return self.error is None and self._thread is not None and self._thread.is_alive()

    @property
    def recorded_iterations(self) -> list[IterationRecord]:
        """With ``config.record``: every stage iteration so far, in order of return."""
        return self._driver.iterations

    @property
    def stage_busy_s(self) -> list[float]:
        """Compute seconds per stage so far (the bubble fraction's numerator)."""
        return list(self._driver.stage_busy_s)

    # ------------------------------------------------------------------ engine thread
    def _snapshot(self) -> EngineSnapshot:
        free = self._stage0.cache.num_free_blocks if self._stage0 is not None else self.config.kv_blocks
        return EngineSnapshot(
            self.scheduler.stats(), self.counters.copy(), tuple(self._driver.stage_busy_s), free
        )

    def _receive(self, channel: Channel) -> None:
        try:
            while True:
                kind, payload, _ = channel.recv()
                if kind == KIND_PING:
                    continue
                self._inbox.put(("stopped", payload) if kind == KIND_STOP else ("result", payload))
                if kind == KIND_STOP:
                    return
        except Exception as exc:  # a stage died: its neighbours' sockets closed
            if not self._stopped.is_set() and not self._closing:
                dead = self._procs.deaths(wait_s=2.0) if self._procs is not None else ""
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                self._inbox.put(("dead", dead or f"lost the last stage: {first_line}"))

    def _run(self) -> None:
        try:
            self.spec.pin(0)  # this thread computes stage 0
            self._loop()
        except Exception as exc:  # the traceback goes to the log, never to a client
            if self.error is None:
                log.error("engine thread failed:\n%s", traceback.format_exc())
            else:  # the stages were killed on purpose (stall): the pipeline's sockets broke
                log.debug("engine thread ended by the failure:\n%s", traceback.format_exc())
            self._fail(f"engine thread failed: {brief_error(exc)}")
        finally:
            if self.error is not None:
                self._fail_queued(self.error)
            self.snapshot = self._snapshot()
            with self._lock:  # a submit queues and checks under the lock: before this or after
                self._stopped.set()
            if self.error is not None:  # one that queued before the set, after the drain above
                self._fail_queued(self.error)

    def _loop(self) -> None:
        stop_sent = False
        while True:
            idle = not self._inflight and not self.scheduler.has_work
            wait = PING_INTERVAL_S if self._to_next is not None else None
            try:
                item = self._inbox.get(timeout=wait if idle else 1.0)
            except queue.Empty:
                item = None
            while item is not None:
                kind = item[0]
                if kind == "dead":
                    self._fail(item[1])
                    return
                if kind == "stopped":
                    self.final_free_blocks = item[1]["free_blocks"]
                    return
                if kind == "stop":
                    self._closing = True
                    for rid in list(self._active):
                        self._abort(rid, "engine shut down")
                elif kind == "abort_all":
                    for rid in list(self._active):  # in flight, it ends on return: keep the reason
                        self._end_as.setdefault(rid, ("aborted", FinishReason.ABORTED, item[1]))
                        self._abort(rid, item[1])
                else:
                    self._handle(item)
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    item = None
            self._free_released_kv()
            if self._closing:
                if not self._inflight and not stop_sent:
                    stop_sent = True
                    self._send_stop()
                    if self._to_next is None:
                        return
            else:
                while (plan := self._driver.next_plan()) is not None:
                    self._launch(plan)
                self._ping_if_quiet()
            self.snapshot = self._snapshot()

    def _ping_if_quiet(self) -> None:
        """Send a ping down the pipeline if nothing went to stage 1 for PING_INTERVAL_S: every
        receive in the pipeline then waits less than the collective timeout."""
        if self._to_next is not None and time.monotonic() - self._last_sent >= PING_INTERVAL_S:
            self._to_next.send(KIND_PING, {})
            self._last_sent = time.monotonic()

    def _handle(self, item: tuple) -> None:
        kind = item[0]
        if kind == "add":
            _, rid, prompt, params, on_event = item
            eos = self.config.eos_token_id
            stops = set(params.stop_token_ids)
            if eos is not None and not params.ignore_eos:
                stops.add(eos)
            self._active[rid] = ActiveRequest(rid, prompt, len(prompt), params, frozenset(stops), on_event)
            self.counters.prompt_tokens += len(prompt)
            rec = self.scheduler.add_request(Request(rid, self._clock(), len(prompt), params.max_tokens))
            if rec.finish_reason is not None:  # rejected at once
                self._ended(RequestEnd(rid, rec.finish_reason, rec.detail, rec))
            elif self._closing:
                self._abort(rid, "engine shut down")
        elif kind == "abort":
            if item[1] in self._active:
                self._abort(item[1], "aborted by client")
        elif kind == "stop_string":
            if item[1] in self._active:
                self._end_as[item[1]] = ("stop", FinishReason.STOP, "stop string")
                self._abort(item[1], "stop string")
            elif item[1] in self._length_ends:
                self._relabel_as_stop(item[1])
        elif kind == "result":
            self._complete(item[1])
        else:
            raise RuntimeError(f"unknown engine message {kind!r}")

    def _abort(self, rid: int, reason: str) -> None:
        end = self.scheduler.abort(rid, reason)
        if end is not None:  # else it ends when its microbatch returns
            self._ended(end)

    def _free_released_kv(self) -> None:
        """Free on stage 0 the KV of requests that ended or were retracted since the last plan
        (so an idle engine holds none); the other stages free it with the next microbatch."""
        assert self._stage0 is not None
        frees = self.scheduler.drain_kv_frees()
        if frees:
            self._stage0.apply_kv(list(frees), [])
            self._frees_for_next.extend(frees)

    def _launch(self, plan: MicroBatchPlan) -> None:
        assert self._stage0 is not None
        layout = BatchLayout.from_plan(plan)
        ids: list[int] = []
        rows: list[tuple] = []
        for s in layout.seqs:
            a = self._active[s.req_id]
            if len(a.tokens) < s.context_len:
                raise RuntimeError(
                    f"request {s.req_id}: microbatch needs {s.context_len} tokens, engine has {len(a.tokens)}"
                )
            ids.extend(a.tokens[s.num_cached_tokens : s.context_len])
            if s.samples:
                rows.append(a.params.row(len(a.tokens) - a.prompt_len))
        allocs = plan.kv_reservations(self.config.block_size)
        frees, self._frees_for_next = self._frees_for_next + list(plan.kv_frees), []
        meta = make_meta(plan.mb_id, layout, frees, allocs, rows, [])
        inputs = torch.tensor(ids, dtype=torch.int64)
        self._launched_at[plan.mb_id] = time.monotonic()
        with self._liveness.step(0):
            out = run_or_fail(self._stage0, meta, inputs)
        self._inflight[plan.mb_id] = (plan, layout.sample_req_ids)
        if self._to_next is None:  # a single stage: it is also the last
            self._inbox.put(("result", last_stage_result(meta, out, self._generator)))
        else:
            if meta.get("failed") is not None:  # the next stage expects hidden states of this shape
                out = torch.zeros(len(ids), self.model_config.hidden_size, dtype=self.spec.torch_dtype)
            self._to_next.send(KIND_BATCH, meta, out)
            self._last_sent = time.monotonic()

    def _complete(self, result: dict) -> None:
        plan, sample_ids = self._inflight.pop(result["mb"])
        self._launched_at.pop(result["mb"], None)
        tokens = result["tokens"]
        failed = self._fail_requests(plan, sample_ids, result)
        active = self._active
        stopped = [
            rid
            for rid, tok in zip(sample_ids, tokens, strict=True)
            if rid not in failed and tok in active[rid].stop_ids
        ]
        for rank, t0, t1 in result["times"]:  # every stage's record before the return
            self._driver.stage_finished(plan, rank, t0 - self._epoch, t1 - self._epoch)
        out = self._driver.returned(plan, stopped)
        new = 0
        for rid, tok in zip(sample_ids, tokens, strict=True):
            if rid in out.discarded_ids:
                continue
            a = self._active[rid]
            a.tokens.append(tok)
            a.unsent.append(tok)
            new += 1
        self.counters.generated_tokens += new
        self.counters.microbatches += 1
        budgets = self.counters.chunk_budgets
        budgets[plan.chunk_budget] = budgets.get(plan.chunk_budget, 0) + 1
        for end in out.finished:
            self._ended(end)
        for rid in sample_ids:
            a = self._active.get(rid)
            if a is not None and a.unsent:
                a.on_event(EngineEvent(rid, tuple(a.unsent)))
                a.unsent.clear()

    def _fail_requests(self, plan: MicroBatchPlan, sample_ids: tuple[int, ...], result: dict) -> set[int]:
        """End with an error the requests a stage could not compute (the whole microbatch,
        ``result["failed"]``) or sample (``result["errors"]``, by row); the rest go on. Their
        tokens are discarded when the microbatch is folded in. Returns their ids."""
        if result.get("failed") is not None:
            why = {rid: result["failed"] for rid in (*plan.decode_req_ids, *(c.req_id for c in plan.prefill))}
        else:
            why = {sample_ids[row]: message for row, message in (result.get("errors") or {}).items()}
        for rid, message in why.items():
            if rid in self._active:
                log.error("request %d failed: %s", rid, message)
                self._end_as[rid] = ("error", FinishReason.ABORTED, message)
                self._abort(rid, message)
        return set(why)

    def _ended(self, end: RequestEnd) -> None:
        """Send a request's last event (its unsent tokens and why it ended), exactly once."""
        a = self._active.pop(end.req_id)
        reason, detail = str(end.reason), end.detail
        override = self._end_as.pop(end.req_id, None)
        if override is not None:  # a stop string or its own failure, ended through an abort
            reason, end.record.finish_reason, detail = override
            end.record.detail = f"error: {detail}" if reason == "error" else detail
        self.counters.count_end(reason, end.record)
        if reason == "length" and a.params.text_stops:
            self._length_ends[end.req_id] = end.record
            while len(self._length_ends) > MAX_RELABELLABLE:
                self._length_ends.popitem(last=False)
        a.on_event(EngineEvent(end.req_id, tuple(a.unsent), reason, detail))
        self.scheduler.forget(end.req_id)  # the scheduler keeps no record of ended requests
        if self.config.record:
            self.recorded_requests.append(end.record)

    def _relabel_as_stop(self, rid: int) -> None:
        """A request counted and recorded as ended by length ended by a stop string instead."""
        rec = self._length_ends.pop(rid)
        self.counters.relabel_end("length", "stop")
        rec.finish_reason, rec.detail = FinishReason.STOP, "stop string"

    def _send_stop(self) -> None:
        assert self._stage0 is not None
        self._free_released_kv()
        frees, self._frees_for_next = self._frees_for_next, []
        free_blocks = [self._stage0.cache.num_free_blocks]
        if self._to_next is None:
            self.final_free_blocks = free_blocks
            return
        self._to_next.send(KIND_STOP, {"frees": frees, "free_blocks": free_blocks})

    def _fail(self, message: str) -> None:
        if self.error is not None:  # the watchdog named the cause first (stall)
            message = self.error
        else:
            self.error = message
            log.error("engine stopped: %s", message)
        records = self._end_all_records(message)
        for rid, a in list(self._active.items()):
            a.on_event(EngineEvent(rid, (), "error", message))
            self.counters.count_end("error", None)
            rec = records.get(rid)
            if self.config.record and rec is not None:  # in the recording with why it ended
                self.recorded_requests.append(rec)
        self._active.clear()
        self._end_as.clear()
        self._fail_queued(message)
        self._report_failure(message)

    def _fail_queued(self, message: str) -> None:
        """End with an error the requests submitted but not yet taken from the inbox, each
        recorded (when recording) as the scheduler records the ones it held: aborted, with
        ``error: <message>`` as the detail, so every received request has its record."""
        first_line = (message.strip().splitlines() or [""])[0]
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item[0] == "add":
                _, rid, prompt, params, on_event = item
                on_event(EngineEvent(rid, (), "error", message))
                self.counters.count_end("error", None)
                if self.config.record:
                    now = self._clock()
                    rec = RequestRecord(rid, now, len(prompt), params.max_tokens)
                    rec.finished_at, rec.finish_reason = now, FinishReason.ABORTED
                    rec.detail = f"error: {first_line}"
                    self.recorded_requests.append(rec)

    def _report_failure(self, message: str) -> None:
        """Tell the failure callbacks, once, whichever thread finds the failure first."""
        with self._lock:
            if self._failure_reported:
                return
            self._failure_reported = True
        for cb in self._failure_callbacks:
            try:
                cb(message)
            except Exception:
                log.exception("failure callback raised")

    def _end_all_records(self, message: str) -> dict[int, RequestRecord]:
        """End every unfinished request in the scheduler (the engine failed under them) and
        return their records, ended ``aborted`` with ``error: <message>`` as the detail; none
        if the scheduler itself is what failed."""
        try:
            first_line = (message.strip().splitlines() or [""])[0]
            ends = self.scheduler.abort_all(f"error: {first_line}")
        except Exception:
            log.exception("could not end the scheduler's requests")
            return {}
        return {end.req_id: end.record for end in ends}

"""``FastPPScheduler``: vLLM 0.32's V1 ``Scheduler`` steered by our chunk policy and balancer.

    vllm serve DIR -pp 2 --scheduler-cls fastpp.backends.vllm.scheduler.FastPPScheduler

(``fastpp serve --backend vllm`` builds that command and the environment it needs.) vLLM keeps
its own admission, KV allocation, preemption and prefill packing; before each ``schedule()`` the
adapter (adapter.py) decides the step's token budget and which decodes ride, and we apply the
decision through two knobs of vLLM's own loop, restored right after the call:

* the budget: ``max_num_scheduled_tokens`` (vLLM's ``token_budget``, decode tokens included;
  scheduler.py:611 and the assert at :1405), set to min(C, max_num_batched_tokens);
* the decodes held out of this step (other slots' decodes, parked ones, sit-outs): their
  ``next_decode_eligible_step`` is set past this step, which makes vLLM's running loop skip
  them (scheduler.py:680) while they stay in its running list with their KV, in their place,
  and remain preemption candidates exactly as in stock vLLM.

With ``--queue-order late_last`` the FCFS ``waiting`` deque is also put in our scheduler's
late_last order before each step (``Adapter.order_waiting``); vLLM then admits from its head.

Settings come from the environment (settings.py); without them this class schedules what stock
vLLM schedules. Subclass of ``Scheduler``, not ``AsyncScheduler``: vLLM's CPU platform and its
V1 model runner with PP run without async scheduling anyway (docs/engines/vllm.md).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from pathlib import Path

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from fastpp.backends.vllm.adapter import Adapter, WallClock, finish_reason_of
from fastpp.backends.vllm.recorder import RunRecorder
from fastpp.backends.vllm.settings import STAGE_TIMES_ENV_VAR, VllmSchedulerSettings
from fastpp.backends.vllm.stage_times import FASTPP_MB_ATTR, StageTimesReader
from fastpp.profile import DTYPE_BYTES, ModelShape, ProfileError, load_profile
from fastpp.run_setup import RunSetup
from fastpp.scheduler_config import SchedulerConfig
from fastpp.types import FinishReason

log = logging.getLogger("fastpp.vllm")


class FastPPScheduler(Scheduler):
    """vLLM's scheduler with our policies deciding each step (module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _log_like_vllm()
        settings = VllmSchedulerSettings.from_env()
        num_stages = self.parallel_config.pipeline_parallel_size
        max_budget = self.max_num_scheduled_tokens
        config = settings.scheduler_config(
            num_slots=num_stages,
            max_budget=max_budget,
            kv_total_tokens=self.kv_total_tokens(),
            page_size=self.block_size,
            max_context=self.max_model_len,
            max_running=self.max_num_running_reqs,
        )
        if config.queue_order == "late_last" and not isinstance(self.waiting, deque):
            raise ValueError(
                "queue order late_last reorders vLLM's FCFS queue: it needs --scheduling-policy fcfs"
            )
        profile = load_profile(settings.profile) if settings.profile else None
        chunk_policy, balancer = settings.build_policies(config, profile)
        recorder = None
        if settings.record_dir:
            recorder = RunRecorder(
                settings.record_dir,
                config.slo,
                num_stages,
                backend="vllm",
                setup=self._run_setup(settings.policy, config),
            )
        stage_dir = os.environ.get(STAGE_TIMES_ENV_VAR)
        stage_times = StageTimesReader(stage_dir, num_stages) if stage_dir else None
        if stage_times is not None:
            stage_times.clear()
        self.fastpp = Adapter(
            config,
            chunk_policy,
            balancer,
            self,
            WallClock(time.time()),
            max_budget=max_budget,
            recorder=recorder,
            stage_times=stage_times,
        )
        self._fastpp_recorder = recorder
        log.info(
            "fastpp scheduler: policy %s, %d slot(s), budget <= %d tokens, candidates %s, SLO %s, "
            "record dir %s, stage times %s",
            settings.policy,
            num_stages,
            max_budget,
            config.chunk_candidates,
            config.slo,
            settings.record_dir,
            stage_dir,
        )

    def _run_setup(self, policy: str, config: SchedulerConfig) -> RunSetup:
        """What the recorded run ran on (fastpp.run_setup): the model's shape from its HF config,
        layers per stage as vLLM places them, the device."""
        import vllm
        from vllm.distributed.utils import get_pp_indices
        from vllm.platforms import current_platform

        mc = self.vllm_config.model_config
        pp = self.parallel_config.pipeline_parallel_size
        dtype = str(mc.dtype).removeprefix("torch.")
        model = layers = None
        try:
            model = ModelShape.from_hf_config(
                mc.hf_config.to_dict(), name=Path(str(mc.model)).name, dtype_bytes=DTYPE_BYTES.get(dtype)
            )
            layers = tuple(b - a for a, b in (get_pp_indices(model.num_layers, r, pp) for r in range(pp)))
        except (ProfileError, ValueError, KeyError, TypeError) as exc:  # records without the shape
            log.warning("fastpp: the model's shape is not recorded (%s)", exc)
        device_type = str(getattr(current_platform, "device_type", "") or "")
        device = "CPU" if device_type == "cpu" else (device_type.upper() or "unknown")
        return RunSetup(
            engine=f"vllm {vllm.__version__}",
            device=device,
            pp=pp,
            tp=self.parallel_config.tensor_parallel_size,
            policy=policy,
            scheduler=config,
            model=model,
            layers_per_stage=layers,
            dtype=dtype,
        )

    # ---------------------------------------------------------------- EngineQueues (adapter)
    def engine_waiting(self):
        yield from self.kv_holding_waiting
        yield from self.waiting

    def engine_running(self) -> list[Request]:
        return self.running

    def kv_total_tokens(self) -> int:
        return self.cache_config.num_gpu_blocks * self.block_size

    def kv_free_tokens(self) -> int:
        return self.kv_cache_manager.block_pool.get_num_free_blocks() * self.block_size

    # ---------------------------------------------------------------- vLLM's scheduler calls
    def add_request(self, request: Request) -> None:
        is_new = request.request_id not in self.requests
        super().add_request(request)
        if is_new:  # not the next chunk of a streaming-input session
            self.fastpp.arrive(request)

    def schedule(self, throttle_prefills: bool = False):
        self.fastpp.order_waiting(self.waiting)  # queue order late_last; under fcfs a no-op
        decision = self.fastpp.begin_step()
        held = [r for eid in decision.held_ids if (r := self.requests.get(eid)) is not None]
        saved = [r.next_decode_eligible_step for r in held]
        skip_until = self.current_step + 2  # schedule() increments current_step first
        for r in held:
            r.next_decode_eligible_step = skip_until
        full_budget = self.max_num_scheduled_tokens
        self.max_num_scheduled_tokens = decision.budget
        try:
            output = super().schedule(throttle_prefills)
        finally:
            self.max_num_scheduled_tokens = full_budget
            for r, value in zip(held, saved, strict=True):
                r.next_decode_eligible_step = value
        setattr(output, FASTPP_MB_ATTR, decision.seq)  # travels to the workers (stage times)
        self.fastpp.launched(decision, output, output.num_scheduled_tokens)
        return output

    def update_from_output(self, scheduler_output, model_runner_output):
        started = self.fastpp.clock()
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        self.fastpp.returned(scheduler_output, started)
        return outputs

    def _preempt_request(self, request: Request, timestamp: float, drop_stale_output: bool = False) -> None:
        super()._preempt_request(request, timestamp, drop_stale_output=drop_stale_output)
        self.fastpp.preempted(request.request_id)

    def finish_requests(self, request_ids, finished_status: RequestStatus) -> list[Request]:
        finished = super().finish_requests(request_ids, finished_status)
        for request in finished:
            reason, detail = finish_reason_of(request) or (FinishReason.ABORTED, "")
            self.fastpp.ended(request.request_id, reason, detail)
        return finished

    def shutdown(self) -> None:
        super().shutdown()
        if self._fastpp_recorder is not None:
            unfinished = [t.rec for t in self.fastpp.tracked.values()]
            self._fastpp_recorder.close(unfinished)
        log.info(
            "fastpp scheduler counters: %s, %s, policy failures %d",
            self.fastpp.counters,
            self.fastpp.host.counters,
            self.fastpp.policies.num_failures,
        )


def _log_like_vllm() -> None:
    """fastpp's loggers in the engine core print through vLLM's handlers (its format, its
    stream); vLLM configures only its own logger tree."""
    ours = logging.getLogger("fastpp")
    if ours.handlers:
        return
    for handler in logging.getLogger("vllm").handlers:
        ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    ours.propagate = False

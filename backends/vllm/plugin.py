"""fastpp's ``vllm.general_plugins`` entry point (pyproject: ``fastpp = ...plugin:register``).

vLLM calls ``register()`` in its API server, its engine core and every worker, before the
worker class is built. Two patches, each small and each applied once:

* CPU, pipeline-parallel, eager mode: a later stage reads its incoming activations through a
  buffer (``intermediate_tensors``) that only the compile warm-up allocates, so with
  ``--enforce-eager`` the first request crashes stage 2 (``assert self.intermediate_tensors is
  not None``, v1/worker/gpu_model_runner.py:3174; the warm-up is skipped in
  v1/worker/cpu_worker.py:190-202 and cpu_model_runner.py:84-86). We allocate it right after the
  model loads, with the same call and size the warm-up uses. Harmless when the warm-up runs (it
  allocates only when the buffer is missing). Off with ``FASTPP_VLLM_EAGER_PP_FIX=0``.
* Stage timing, only when ``FASTPP_VLLM_STAGE_TIMES_DIR`` is set (``fastpp serve --backend
  vllm`` sets it): each worker of TP rank 0 appends the times of every step that carries a
  fastpp microbatch id (stage_times.py). Steps of a stock scheduler carry none and are not timed.

Stock vLLM in the same environment gets the first patch too (it is a fix, not a policy).
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("fastpp.vllm")

_applied: set[str] = set()


def register() -> None:
    """The entry point vLLM calls; never raises (a failed patch is logged and skipped)."""
    if os.environ.get("FASTPP_VLLM_EAGER_PP_FIX", "1") != "0":
        _once("eager_pp_fix", _patch_cpu_eager_pp)
    from fastpp.backends.vllm.settings import STAGE_TIMES_ENV_VAR

    folder = os.environ.get(STAGE_TIMES_ENV_VAR)
    if folder:
        _once("stage_times", lambda: _patch_stage_timing(folder))


def _once(name: str, patch) -> None:
    if name in _applied:
        return
    _applied.add(name)
    try:
        patch()
    except Exception as exc:  # a plugin must never stop vLLM from starting
        log.warning("fastpp plugin: %s not applied: %r", name, exc)


def _patch_cpu_eager_pp() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    load_model = CPUModelRunner.load_model

    def load_model_with_pp_buffer(self, *args, **kwargs):
        load_model(self, *args, **kwargs)
        from vllm.distributed.parallel_state import get_pp_group

        if not get_pp_group().is_first_rank and self.intermediate_tensors is None:
            self.intermediate_tensors = self.model.make_empty_intermediate_tensors(
                batch_size=self.max_num_tokens, dtype=self.model_config.dtype, device=self.device
            )

    CPUModelRunner.load_model = load_model_with_pp_buffer


def _patch_stage_timing(folder: str) -> None:
    from vllm.v1.worker.gpu_worker import Worker

    from fastpp.backends.vllm.stage_times import FASTPP_MB_ATTR, StageTimesWriter

    execute_model, sample_tokens = Worker.execute_model, Worker.sample_tokens
    state: dict = {"writer": None, "pending": None}

    def writer():
        # Built at first use: the process groups exist only once the worker is initialized.
        if state["writer"] is None:
            from vllm.distributed.parallel_state import get_pp_group, get_tp_group

            pp = get_pp_group()
            timed = get_tp_group().rank_in_group == 0
            state["writer"] = (
                StageTimesWriter(folder, pp.rank_in_group) if timed else False,
                pp.is_last_rank,
            )
        return state["writer"]

    def timed_execute_model(self, scheduler_output):
        t0 = time.time()
        out = execute_model(self, scheduler_output)
        mb_id = getattr(scheduler_output, FASTPP_MB_ATTR, None)
        if mb_id is not None and scheduler_output.total_num_scheduled_tokens > 0:
            w, is_last = writer()
            if w:
                if is_last and out is None:
                    state["pending"] = (mb_id, t0)  # its time ends when sampling ends
                else:
                    w.write(mb_id, t0, time.time())
        return out

    def timed_sample_tokens(self, grammar_output):
        out = sample_tokens(self, grammar_output)
        pending, state["pending"] = state["pending"], None
        if pending is not None:
            w, _ = writer()
            w.write(pending[0], pending[1], time.time())
        return out

    Worker.execute_model = timed_execute_model
    Worker.sample_tokens = timed_sample_tokens

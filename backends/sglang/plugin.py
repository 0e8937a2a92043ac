"""SGLang's entry point into fastpp (group ``sglang.srt.plugins``, name ``fastpp``).

SGLang 0.5.23 calls ``register`` through ``load_plugins()`` in every process it starts (the
scheduler of each PP rank among them) before building its ``Scheduler``. Without
``FASTPP_SGLANG_POLICY`` in the environment it does nothing. With it, it registers hooks (no
SGLang file is edited) that route SGLang's PP loop through ``SGLangAdapter``:

========================================================  ======  ===========================
target (sglang.srt.managers.…)                            type    adapter method
========================================================  ======  ===========================
scheduler.Scheduler.get_new_batch_prefill                 AROUND  form (balance, choose C)
schedule_policy.PrefillAdder.__init__                     AROUND  adder_created (read back C)
scheduler.Scheduler._pp_launch_batch                      AROUND  launch (stage time, record)
scheduler.Scheduler._pp_process_batch_result              BEFORE  before_result (stage records)
scheduler.Scheduler._pp_process_batch_result              AFTER   result (tokens, signals)
scheduler_components.output_streamer.                     BEFORE  streaming (finished requests
SchedulerOutputStreamer.stream_output                             recorded before the reply)
scheduler.Scheduler._add_request_to_queue                 AFTER   enqueued (arrivals)
scheduler.Scheduler.collect_inflight_reqs                 AFTER   parked requests count as in flight
scheduler.Scheduler.<each method of host_timing.PHASES>   BEFORE  phase_begin (with a record dir:
scheduler.Scheduler.<each method of host_timing.PHASES>   AFTER   phase_end    the loop's timings)
========================================================  ======  ===========================
"""

from __future__ import annotations

import logging
from typing import Any

from fastpp.backends.sglang.settings import PluginSettings

log = logging.getLogger("fastpp.sglang")

_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
_ADDER = "sglang.srt.managers.schedule_policy.PrefillAdder"
_STREAMER = "sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer"
_REM_CHUNK_TOKENS_POS = 6  # PrefillAdder.__init__(page_size, tree_cache, allocator, running_batch,
#                            new_token_ratio, rem_input_tokens, rem_chunk_tokens, ...) in 0.5.23

adapter: Any = None  # this process's SGLangAdapter once registered (for inspection)


def register() -> None:
    """Install the hooks when a policy is configured (see the module doc)."""
    global adapter
    if adapter is not None:
        return
    try:
        settings = PluginSettings.from_env()
    except ValueError as exc:
        log.error("fastpp plugin not active: %s", exc)
        return
    if settings is None:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from fastpp.backends.sglang.adapter import SGLangAdapter

    adapter = a = SGLangAdapter(settings)

    def form(original: Any, sched: Any, *args: Any, **kwargs: Any) -> Any:
        running_batch = kwargs.pop("running_batch") if "running_batch" in kwargs else args[0]
        return a.form(sched, original, running_batch)

    def adder_init(original: Any, adder: Any, *args: Any, **kwargs: Any) -> None:
        original(adder, *args, **kwargs)
        if "rem_chunk_tokens" in kwargs:
            budget = kwargs["rem_chunk_tokens"]
        else:
            budget = args[_REM_CHUNK_TOKENS_POS] if len(args) > _REM_CHUNK_TOKENS_POS else None
        a.adder_created(budget)

    def launch(original: Any, sched: Any, *args: Any, **kwargs: Any) -> Any:
        return a.launch(sched, original, *args, **kwargs)

    def before_result(sched: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        a.before_result(batch)

    def result(ret: Any, sched: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
        a.result(sched, batch)

    def streaming(streamer: Any, reqs: Any, *args: Any, **kwargs: Any) -> None:
        a.streaming(reqs)

    def enqueued(ret: Any, sched: Any, req: Any, is_retracted: bool = False) -> None:
        a.enqueued(sched, req, is_retracted)

    def inflight(ret: Any, sched: Any) -> Any:
        # parked requests are SGLang's too: aborts, idle checks and leak checks must see them
        return ret | {p.req for p in a.parked.values()} if a.parked else ret

    if settings.record_dir:
        # registered first, so they wrap SGLang's methods innermost: the phases exclude our hooks
        from fastpp.backends.sglang.host_timing import PHASES

        for phase, method in PHASES:
            HookRegistry.register(f"{_SCHEDULER}.{method}", _phase_begin(a, phase), HookType.BEFORE)
            HookRegistry.register(f"{_SCHEDULER}.{method}", _phase_end(a, phase), HookType.AFTER)
    HookRegistry.register(f"{_SCHEDULER}.get_new_batch_prefill", form, HookType.AROUND)
    HookRegistry.register(f"{_ADDER}.__init__", adder_init, HookType.AROUND)
    HookRegistry.register(f"{_SCHEDULER}._pp_launch_batch", launch, HookType.AROUND)
    HookRegistry.register(f"{_SCHEDULER}._pp_process_batch_result", before_result, HookType.BEFORE)
    HookRegistry.register(f"{_SCHEDULER}._pp_process_batch_result", result, HookType.AFTER)
    HookRegistry.register(f"{_STREAMER}.stream_output", streaming, HookType.BEFORE)
    HookRegistry.register(f"{_SCHEDULER}._add_request_to_queue", enqueued, HookType.AFTER)
    HookRegistry.register(f"{_SCHEDULER}.collect_inflight_reqs", inflight, HookType.AFTER)
    log.info("fastpp plugin registered: policy %r", settings.policy)


def _phase_begin(a: Any, phase: str) -> Any:
    def hook(sched: Any, *args: Any, **kwargs: Any) -> None:
        a.phase_begin(sched, phase)

    return hook


def _phase_end(a: Any, phase: str) -> Any:
    def hook(ret: Any, sched: Any, *args: Any, **kwargs: Any) -> None:
        a.phase_end(phase)

    return hook

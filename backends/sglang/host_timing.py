"""Where each step of SGLang's PP loop spends its time, on one rank (recorded with --record-dir).

``event_loop_pp`` (``managers/scheduler_pp_mixin.py:104``, docs/engines/sglang.md section 1)
runs the same phases in the same order at every step of every rank. The plugin times each phase
with a BEFORE and an AFTER hook on the method that implements it (``PHASES``) and writes one line
per step that launched a microbatch or processed a returned one to ``host_rank{r}.jsonl``::

    {"rank": 0, "step": 41, "slot": 1, "ingest": [t0, t1], "schedule": [t0, t1],
     "recv_activations": [t0, t1], "launch": [t0, t1], "exchange_outputs": [t0, t1],
     "process_result": [t0, t1], "send_activations": [t0, t1]}

Instants are on the run's clock (the iterations' clock: ``time.time()`` minus the run's epoch).
A phase the step did not run is absent. ``slot`` is the microbatch slot the step launched (or
would have launched); the step processes the result of slot ``(slot + 1) % pp_loop_size``.
Idle steps (nothing launched, nothing returned) are not written: an idle loop spins. A step is
written when the next one starts (SGLang stops its ranks with signals, so the step in progress
when a rank is killed is lost; the loop idles after the last request, so no served step is).

``benchmarks/sglang_host_side.py`` turns the files into the host-side figures of
docs/engines/sglang.md section 6.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# (phase, Scheduler method), in the order event_loop_pp runs them within one step
PHASES: tuple[tuple[str, str], ...] = (
    ("ingest", "ingest_requests"),  # rank 0: tokenizer socket; later ranks: blocking relay receive
    ("schedule", "get_next_batch_to_run"),  # merge the finished prefill, form prefill or decode
    ("recv_activations", "_pp_recv_proxy_tensors"),  # blocking: the previous stage's hidden states
    ("launch", "_pp_launch_batch"),  # run_batch: the stage's forward (synchronous on CPU)
    ("exchange_outputs", "_pp_commit_send_output_work_and_preprocess_output_tensors"),
    ("process_result", "_pp_process_batch_result"),  # tokens in, finishes, KV frees, streaming
    ("send_activations", "_pp_send_proxy_to_next_stage"),
)
STEP_START = "ingest"  # the first phase of every step
WRITTEN_IF = ("launch", "process_result")  # a step with neither is idle


class LoopStepTimer:
    """Collects one rank's phase intervals step by step; ``write`` gets each finished step."""

    def __init__(self, clock: Callable[[], float], write: Callable[[dict], None], rank: int) -> None:
        self.clock = clock
        self.write = write
        self.rank = rank
        self.step = 0
        self._current: dict[str, Any] = {}
        self._open: dict[str, float] = {}

    def begin(self, phase: str, slot: int | None = None) -> None:
        if phase == STEP_START:
            self._flush()
            if slot is not None:
                self._current["slot"] = slot
        self._open[phase] = self.clock()

    def end(self, phase: str) -> None:
        started = self._open.pop(phase, None)
        if started is not None and phase not in self._current:  # the first call in the step
            self._current[phase] = [started, self.clock()]

    def _flush(self) -> None:
        cur = self._current
        if not cur and not self._open:
            return  # no step in progress (the timer's first call)
        if any(p in cur for p in WRITTEN_IF):
            self.write({"rank": self.rank, "step": self.step, **cur})
        self.step += 1
        self._current = {}
        self._open.clear()

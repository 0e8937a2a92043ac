"""Plain data of the engine: a request it serves, the events callers get, its counters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fastpp.backends.torch.sampling import SamplingParams
from fastpp.types import RequestRecord


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """New output tokens of one request and, on its last event only, why it ended.

    ``finish_reason`` is None while it runs, then one of ``length``, ``stop`` (a stop token),
    ``aborted``, ``rejected`` or ``error`` (the engine failed; ``detail`` says how).
    """

    req_id: int
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    detail: str = ""


@dataclass(slots=True)
class ActiveRequest:
    """What the engine keeps per request besides the scheduler's counters."""

    req_id: int
    tokens: list[int]  # prompt then generated tokens: the input of every microbatch it is in
    prompt_len: int
    params: SamplingParams
    stop_ids: frozenset[int]
    on_event: Callable[[EngineEvent], None]
    kv_tokens: int = 0  # tokens reserved for it on the stages (the scheduler's page-rounded count)
    retractions: int = 0  # retractions already turned into frees
    unsent: list[int] = field(default_factory=list)  # sampled, not yet passed to on_event


@dataclass(slots=True)
class EngineCounters:
    """Monotonic counters and sums for /metrics (written by the engine thread only)."""

    num_stages: int
    prompt_tokens: int = 0
    generated_tokens: int = 0
    microbatches: int = 0
    ended: dict[str, int] = field(default_factory=dict)  # finish reason -> requests
    ttft_s: list[float] = field(default_factory=list)  # of completed requests, for histograms
    tpot_s: list[float] = field(default_factory=list)
    stage_busy_s: list[float] = field(default_factory=list)
    chunk_budgets: dict[int, int] = field(default_factory=dict)  # C the policy chose -> microbatches

    def __post_init__(self) -> None:
        if not self.stage_busy_s:
            self.stage_busy_s = [0.0] * self.num_stages

    def count_end(self, reason: str, rec: RequestRecord) -> None:
        self.ended[reason] = self.ended.get(reason, 0) + 1
        if rec.ttft_s is not None:
            self.ttft_s.append(rec.ttft_s)
        if rec.tpot_s is not None:
            self.tpot_s.append(rec.tpot_s)

"""Core value types shared by the scheduler, the executors and the metrics.

Units: every time in this module is in seconds (suffix ``_at`` for instants on the run's
clock, ``_s`` for durations). Token counts are plain ints.
"""

from __future__ import annotations

import copyreg
import math
from dataclasses import dataclass, field, fields
from enum import StrEnum

import numpy as np

from fastpp._mypyc import mypyc_attr


def constructor_reduce(obj: object) -> tuple[type, tuple[object, ...]]:
    """A dataclass as its constructor call (the fields ``__init__`` takes), for pickle and copy."""
    return type(obj), tuple(getattr(obj, f.name) for f in fields(obj) if f.init)  # type: ignore[arg-type]


def pickle_by_constructor(*classes: type) -> None:
    """Pickle (and copy) these dataclasses as their constructor call. Compiled by mypyc
    (fastpp/_native.py), pickle's default fails on two kinds: a frozen one refuses its
    field-by-field restore, and one whose ``__init__`` is written out (compiled to native code)
    is created by calling that ``__init__`` without arguments. The sweep's worker processes and
    the engines ship these objects."""
    for cls in classes:
        copyreg.pickle(cls, constructor_reduce)


class FinishReason(StrEnum):
    """How a request left the system. Every request ends with exactly one of these."""

    LENGTH = "length"  # generated its requested number of tokens (or hit the context limit)
    STOP = "stop"  # the model emitted a stop token (real backends only)
    ABORTED = "aborted"  # the client went away / the run was cut short
    REJECTED = "rejected"  # never admitted: see RequestRecord.detail for why


_COMPLETED = (FinishReason.LENGTH, FinishReason.STOP)


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassable when compiled (fastpp/_mypyc.py)
@dataclass(frozen=True, slots=True)
class Request:
    """One inference request as the workload produced it.

    ``output_len`` is the number of tokens to generate (``max_tokens`` with ``ignore_eos``),
    the convention of ``sglang.benchmark.serving`` and of the paper's experiments.
    """

    req_id: int
    arrived_at: float
    prompt_len: int
    output_len: int

    # Written out (as MicroBatchPlan's, fastpp/plan.py): one per request of every probe.
    def __init__(self, req_id: int, arrived_at: float, prompt_len: int, output_len: int) -> None:
        object.__setattr__(self, "req_id", req_id)
        object.__setattr__(self, "arrived_at", arrived_at)
        object.__setattr__(self, "prompt_len", prompt_len)
        object.__setattr__(self, "output_len", output_len)
        self.__post_init__()

    def __post_init__(self) -> None:
        if not (isinstance(self.arrived_at, int | float) and math.isfinite(self.arrived_at)):
            raise ValueError(f"request {self.req_id}: arrived_at must be finite, got {self.arrived_at!r}")
        if self.arrived_at < 0:
            raise ValueError(f"request {self.req_id}: arrived_at must be >= 0, got {self.arrived_at}")
        if self.prompt_len < 1:
            raise ValueError(f"request {self.req_id}: prompt_len must be >= 1, got {self.prompt_len}")
        if self.output_len < 1:
            raise ValueError(f"request {self.req_id}: output_len must be >= 1, got {self.output_len}")


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassable when compiled (fastpp/_mypyc.py)
@dataclass(frozen=True, slots=True)
class SLO:
    """Latency objectives: P90 TTFT and P90 TPOT (PAPER.md section 1). Seconds."""

    ttft_s: float = 2.0
    tpot_s: float = 0.2

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"SLO {name} must be a positive number of seconds, got {value!r}")

    def scaled(self, factor: float) -> SLO:
        """The same SLO tightened or loosened by ``factor`` (the paper scales down to 0.2)."""
        if not factor > 0:
            raise ValueError(f"SLO scale factor must be > 0, got {factor!r}")
        return SLO(self.ttft_s * factor, self.tpot_s * factor)


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassable when compiled (fastpp/_mypyc.py)
@dataclass(slots=True)
class RequestRecord:
    """What happened to one request; written by the scheduler, read by metrics.

    ``token_times`` holds the time each output token became available (first token included),
    so TTFT, TPOT and ITL are all derived from it; a scheduler built with
    ``record_token_times=False`` leaves it empty (no ITL), and TPOT then comes from
    ``finished_at``, the time of a completed request's last token. Times are on the run's clock.
    """

    req_id: int
    arrived_at: float
    prompt_len: int
    output_len: int  # tokens requested
    num_generated: int = 0
    scheduled_at: float | None = None  # first time any of its prompt entered a microbatch
    first_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: FinishReason | None = None
    detail: str = ""  # why it was rejected / aborted, or "" when it finished normally
    num_retractions: int = 0  # times its KV was freed under memory pressure and recomputed
    num_parked: int = 0  # times the decode balancer deferred it
    token_times: list[float] = field(default_factory=list)

    # Written out (as IterationRecord's): one per request. ``token_times=None`` stands for the
    # field's default, a new empty list.
    def __init__(
        self,
        req_id: int,
        arrived_at: float,
        prompt_len: int,
        output_len: int,
        num_generated: int = 0,
        scheduled_at: float | None = None,
        first_token_at: float | None = None,
        finished_at: float | None = None,
        finish_reason: FinishReason | None = None,
        detail: str = "",
        num_retractions: int = 0,
        num_parked: int = 0,
        token_times: list[float] | None = None,
    ) -> None:
        self.req_id = req_id
        self.arrived_at = arrived_at
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.num_generated = num_generated
        self.scheduled_at = scheduled_at
        self.first_token_at = first_token_at
        self.finished_at = finished_at
        self.finish_reason = finish_reason
        self.detail = detail
        self.num_retractions = num_retractions
        self.num_parked = num_parked
        self.token_times = [] if token_times is None else token_times

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrived_at

    @property
    def tpot_s(self) -> float | None:
        """(last - first) / (n - 1); undefined (None) for fewer than two output tokens. The
        last token's time is ``token_times[-1]``, or, with no token times kept, a completed
        request's ``finished_at`` (the same instant); None when neither is known."""
        if self.num_generated < 2 or self.first_token_at is None:
            return None
        if self.token_times:
            last = self.token_times[-1]
        elif self.finished_at is not None and self.finish_reason in _COMPLETED:
            last = self.finished_at
        else:
            return None
        return (last - self.first_token_at) / (self.num_generated - 1)

    @property
    def e2e_s(self) -> float | None:
        if self.finished_at is None or self.finish_reason not in _COMPLETED:
            return None
        return self.finished_at - self.arrived_at

    @property
    def queueing_s(self) -> float | None:
        return None if self.scheduled_at is None else self.scheduled_at - self.arrived_at

    def to_dict(self, itl_ms: list[float] | None = None) -> dict:
        """A JSON-ready dict; token times become inter-token gaps in ms (rounded to 4 decimals)
        to keep files small. ``itl_ms`` passes those gaps in when computed already (a writer
        computes every record's in one numpy pass)."""
        if itl_ms is None:
            itl_ms = np.round(np.diff(np.asarray(self.token_times)) * 1e3, 4).tolist()
        return {
            "req_id": self.req_id,
            "arrived_at": self.arrived_at,
            "prompt_len": self.prompt_len,
            "output_len": self.output_len,
            "num_generated": self.num_generated,
            "scheduled_at": self.scheduled_at,
            "first_token_at": self.first_token_at,
            "finished_at": self.finished_at,
            "finish_reason": None if self.finish_reason is None else str(self.finish_reason),
            "detail": self.detail,
            "num_retractions": self.num_retractions,
            "num_parked": self.num_parked,
            "itl_ms": itl_ms,
        }


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassable when compiled (fastpp/_mypyc.py)
@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ is slow on this hot path
class IterationRecord:
    """One microbatch on one stage: the unit the predictor learns from and timelines show.

    The ALP features are those of PAPER.md 3.2: ``sum_past_x_pre`` = sum L_past * L_pre and
    ``sum_pre_sq`` = sum L_pre^2 over the prefill chunks, ``sum_dec_ctx`` = sum L_dec over
    the decode requests (their context length before this step).
    """

    mb_id: int  # microbatch sequence number, unique within a run
    stage: int  # 0 .. num_stages-1; a TP deployment has the single stage 0
    slot: int  # microbatch slot 0 .. D_p-1
    started_at: float
    finished_at: float
    num_tokens: int  # prefill tokens + decode tokens
    num_prefill_tokens: int
    num_decode_reqs: int
    sum_past_x_pre: int
    sum_pre_sq: int
    sum_dec_ctx: int
    chunk_budget: int  # C the chunk policy chose for this microbatch
    reason: str = ""  # the chunk policy's stated reason for C
    # tokens sampled (decodes + prefill chunks that complete their prompt): the LM head's rows;
    # -1 = not known (files written before this field existed)
    num_sampled: int = -1

    # Written out, not generated: compiled (fastpp/_native.py) this __init__ is native code,
    # several times faster than the one dataclasses writes (one record per stage and microbatch
    # a policy observes); tests/test_plan_types.py checks it takes the fields, in order, with
    # their defaults.
    def __init__(
        self,
        mb_id: int,
        stage: int,
        slot: int,
        started_at: float,
        finished_at: float,
        num_tokens: int,
        num_prefill_tokens: int,
        num_decode_reqs: int,
        sum_past_x_pre: int,
        sum_pre_sq: int,
        sum_dec_ctx: int,
        chunk_budget: int,
        reason: str = "",
        num_sampled: int = -1,
    ) -> None:
        self.mb_id = mb_id
        self.stage = stage
        self.slot = slot
        self.started_at = started_at
        self.finished_at = finished_at
        self.num_tokens = num_tokens
        self.num_prefill_tokens = num_prefill_tokens
        self.num_decode_reqs = num_decode_reqs
        self.sum_past_x_pre = sum_past_x_pre
        self.sum_pre_sq = sum_pre_sq
        self.sum_dec_ctx = sum_dec_ctx
        self.chunk_budget = chunk_budget
        self.reason = reason
        self.num_sampled = num_sampled

    @property
    def duration_s(self) -> float:
        return self.finished_at - self.started_at

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in ITERATION_FIELDS}


pickle_by_constructor(Request, SLO, RequestRecord, IterationRecord)

# IterationRecord's field names in order: file columns, to_dict keys (``__slots__`` would do in
# Python, but a class compiled by mypyc has none: fastpp/_native.py)
ITERATION_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(IterationRecord))

"""Scheduler configuration: validated, read-only after construction."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import inf

from fastpp.types import SLO

DEFAULT_CANDIDATES: tuple[int, ...] = tuple(range(128, 2049, 128))
# What ``static`` (no :N) runs, and every policy's fallback chunk, in every executor: the one
# source of the default. An engine with a batch limit of its own (vLLM's
# max_num_batched_tokens, SGLang's --chunked-prefill-size) runs at most that (``static_chunk``).
DEFAULT_STATIC_CHUNK = 2048


def static_chunk(chunk: int | None = None, *, limit: int | None = None) -> int:
    """The static chunk an executor runs: ``chunk`` if the user set one, else
    DEFAULT_STATIC_CHUNK; never above the engine's own ``limit`` (tokens per batch)."""
    value = DEFAULT_STATIC_CHUNK if chunk is None else chunk
    return value if limit is None else min(value, limit)


ADMISSION_RESERVES = ("all", "slot")
# The default admission reserve: "slot", as the reference. It admits more than "all" and retracts
# more under KV pressure; docs/RESULTS.md section 8 compares the two.
DEFAULT_ADMISSION_RESERVE = "slot"
RETRACTIONS = ("newest_front", "fewest_output_back")
QUEUE_ORDERS = ("fcfs", "late_last")
# late_last: a request late for its first token (waited over the SLO TTFT) waits behind the ones
# that can still meet theirs, until it has waited this many x SLO TTFT: then it goes first again.
LATE_REQUEUE_SLO_RATIO = 10.0
MAX_CHUNK_CANDIDATES = 4096  # a policy looks at each candidate: more is memory and time, no use


def check_queue_options(
    admission_reserve: str,
    retraction: str,
    queue_order: str = "fcfs",
    *,
    admission_name: str = "admission_reserve",
    retraction_name: str = "retraction",
    queue_order_name: str = "queue_order",
) -> None:
    """``ValueError`` naming the option (as the caller calls it) unless ``admission_reserve``
    is one of ADMISSION_RESERVES, ``retraction`` one of RETRACTIONS and ``queue_order`` one of
    QUEUE_ORDERS."""
    if admission_reserve not in ADMISSION_RESERVES:
        raise ValueError(
            f"{admission_name} must be one of {', '.join(ADMISSION_RESERVES)}, got {admission_reserve!r}"
        )
    if retraction not in RETRACTIONS:
        raise ValueError(f"{retraction_name} must be one of {', '.join(RETRACTIONS)}, got {retraction!r}")
    check_queue_order(queue_order, queue_order_name)


def check_queue_order(queue_order: str, name: str = "queue_order") -> None:
    """``ValueError`` naming the option (as the caller calls it) unless ``queue_order`` is one
    of QUEUE_ORDERS."""
    if queue_order not in QUEUE_ORDERS:
        raise ValueError(f"{name} must be one of {', '.join(QUEUE_ORDERS)}, got {queue_order!r}")


def parse_chunk_candidates(text: str) -> tuple[int, ...]:
    """``START:STOP:STEP`` (STOP included) or a comma list ``64,128,256``; ``ValueError`` otherwise."""
    try:
        if ":" in text:
            start, stop, step = (int(x) for x in text.split(":"))
            span = range(start, stop + 1, step) if step > 0 else range(0)
            if len(span) > MAX_CHUNK_CANDIDATES:  # refused before it is built
                raise OverflowError
            values = tuple(span)
        else:
            values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(
            f"chunk candidates {text!r}: expected START:STOP:STEP or a comma list of integers"
        ) from None
    except OverflowError:
        raise ValueError(f"chunk candidates {text!r}: more than {MAX_CHUNK_CANDIDATES:,} values") from None
    if len(values) > MAX_CHUNK_CANDIDATES:
        raise ValueError(f"chunk candidates {text!r}: more than {MAX_CHUNK_CANDIDATES:,} values")
    if not values or any(v < 1 for v in values) or list(values) != sorted(set(values)):
        raise ValueError(f"chunk candidates {text!r}: need positive, strictly ascending values")
    return values


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """How one engine-neutral PP scheduler behaves. Read-only after construction."""

    num_slots: int  # D_p: microbatch slots (= pipeline stages; 1 for TP)
    kv_capacity_tokens: int  # KV pool size in tokens (the smallest stage's)
    page_size: int = 1  # KV allocation unit in tokens (SGLang's default is 1)
    max_context: int = 32768  # model context: a longer prompt is rejected
    chunk_candidates: tuple[int, ...] = DEFAULT_CANDIDATES  # what dynamic policies pick from
    default_chunk: int = DEFAULT_STATIC_CHUNK  # the static chunk; also the fallback when a policy raises
    # Share of the running requests' remaining output tokens kept free when admitting a new
    # request (SGLang's new_token_ratio at its floor of 0.1): fewer retractions later.
    new_token_ratio: float = 0.1
    max_running_requests: int | None = None  # cap on admitted requests, None = KV-bound only
    # Whose remaining output the admission reserve counts: "slot" (the default) = only the
    # launching slot's running decodes, as the reference's PrefillAdder (more admissions, more
    # retractions under KV pressure); "all" = every admitted request (running in any slot, in
    # flight or parked): fewer admissions, fewer retractions.
    admission_reserve: str = DEFAULT_ADMISSION_RESERVE
    # Which running request a KV shortage retracts, and where it waits again:
    # "newest_front" = the slot's most recently admitted request, to the front of the queue;
    # "fewest_output_back" = the one with the fewest generated tokens (ties: longest prompt), to
    # the back of the queue, as the reference (SGLang's retract_decode) does.
    retraction: str = "newest_front"
    token_step: int = 128  # hardware tile step in tokens (from the profile); 0 = none known
    slo: SLO = field(default_factory=SLO)
    # Which waiting request is admitted next: "fcfs" = arrival order (retracted ones first);
    # "late_last" = a request that has waited longer than the SLO TTFT without its first token
    # (it has missed its TTFT whatever happens next) steps behind the ones that can still meet
    # theirs, until it has waited LATE_REQUEUE_SLO_RATIO x SLO TTFT (so none starves).
    queue_order: str = "fcfs"

    def __post_init__(self) -> None:
        if self.num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {self.num_slots}")
        if self.kv_capacity_tokens < 1:
            raise ValueError(f"kv_capacity_tokens must be >= 1, got {self.kv_capacity_tokens}")
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.max_context < 2:
            raise ValueError(f"max_context must be >= 2, got {self.max_context}")
        if not self.chunk_candidates or any(c < 1 for c in self.chunk_candidates):
            raise ValueError(f"chunk_candidates must be positive, got {self.chunk_candidates}")
        if list(self.chunk_candidates) != sorted(set(self.chunk_candidates)):
            raise ValueError(f"chunk_candidates must be strictly ascending: {self.chunk_candidates}")
        if self.token_step < 0:
            raise ValueError(f"token_step must be >= 0, got {self.token_step}")
        if self.default_chunk < 1:
            raise ValueError(f"default_chunk must be >= 1, got {self.default_chunk}")
        if not 0.0 <= self.new_token_ratio <= 1.0:
            raise ValueError(f"new_token_ratio must be in [0, 1], got {self.new_token_ratio}")
        check_queue_options(self.admission_reserve, self.retraction, self.queue_order)
        if self.max_running_requests is not None and self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")


def late_thresholds(config: SchedulerConfig) -> tuple[float, float]:
    """(wait after which a request is late, wait after which it goes first again) of the
    configuration's queue order, in seconds; (inf, inf) under "fcfs"."""
    if config.queue_order != "late_last":
        return inf, inf
    ttft = config.slo.ttft_s
    return ttft, LATE_REQUEUE_SLO_RATIO * ttft

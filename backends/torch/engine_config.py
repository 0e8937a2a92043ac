"""How the CPU pipeline engine runs: its configuration and its one error type."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastpp.profile import Profile
from fastpp.scheduler_config import ADMISSION_RESERVES, DEFAULT_ADMISSION_RESERVE, check_queue_order
from fastpp.types import SLO

CPU_CHUNK_CANDIDATES: tuple[int, ...] = tuple(range(32, 1025, 32))


class EngineDeadError(RuntimeError):
    """The engine stopped (a stage died or it was shut down); it takes no more requests."""


@dataclass(frozen=True)
class EngineConfig:
    """How to run the engine. ``ValueError`` on an impossible setting (names the field)."""

    num_stages: int = 2
    kv_blocks: int = 1024  # per stage; every stage holds the same requests
    block_size: int = 16  # tokens per KV block = the scheduler's page size
    policy: str = "static:256"  # chunk policy [+ balancer], as ``fastpp policies`` lists them
    slo: SLO = field(default_factory=SLO)
    profile: Profile | None = None  # needed by predictive policies
    chunk_candidates: tuple[int, ...] = CPU_CHUNK_CANDIDATES
    max_running_requests: int | None = None
    new_token_ratio: float = 0.1  # share of running requests' remaining output kept free at admission
    queue_order: str = "fcfs"  # SchedulerConfig.queue_order: fcfs | late_last
    admission_reserve: str = DEFAULT_ADMISSION_RESERVE  # SchedulerConfig.admission_reserve: slot | all
    dtype: str = "float32"
    threads: int = 1  # intra-op threads per stage
    # each stage's computing thread on a core of its own (stage r on the r-th core this process
    # may use; stage 0's is the engine thread), so the stages do not migrate between cores
    pin_cores: bool = False
    seed: int = 0
    eos_token_id: int | None = None  # the tokenizer's; ends a request unless it sets ignore_eos
    record: bool = False  # keep every ended request's record and every IterationRecord (memory grows)
    load_timeout_s: float = 600.0
    # a stage that stops beating or computes one microbatch this long is declared stalled: the
    # engine fails (every open request ends with an error naming the stage)
    stage_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("num_stages", "kv_blocks", "block_size", "threads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not self.stage_timeout_s > 0:
            raise ValueError(f"stage_timeout_s must be > 0, got {self.stage_timeout_s!r}")
        check_queue_order(self.queue_order)
        if self.admission_reserve not in ADMISSION_RESERVES:
            known = ", ".join(ADMISSION_RESERVES)
            raise ValueError(f"admission_reserve must be one of {known}, got {self.admission_reserve!r}")

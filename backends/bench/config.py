"""What ``fastpp bench`` sends and where: the server, the endpoint, the workload and the limits.

Units: seconds (``*_s``) for times, milliseconds only where a flag says ``ms`` (the SLO flags,
as sglang's ``--goodput``). This module does no I/O and does not import httpx, so the CLI can
validate options before the optional dependency is needed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from fastpp.types import SLO, Request
from fastpp.uniform_lengths import UniformLengths
from fastpp.workloads import (
    ARRIVALS,
    DEFAULT_WORKLOAD,
    WORKLOADS,
    make_requests,
    replay_requests,
)

DEFAULT_NUM_PROMPTS = 1000  # sglang.benchmark.serving's --num-prompts default
_GOODPUT_ITEM = re.compile(r"^(\w+):([0-9.eE+-]+)$")


class Backend(StrEnum):
    """Which OpenAI-compatible endpoint the requests go to."""

    OPENAI = "openai"  # POST /v1/completions with a text prompt
    OPENAI_CHAT = "openai-chat"  # POST /v1/chat/completions with one user message

    @property
    def path(self) -> str:
        return "/v1/completions" if self is Backend.OPENAI else "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """One benchmark run against an OpenAI-compatible server. Read-only after construction.

    Requests come from a registered length distribution (``workload``) with Poisson or gamma
    arrivals at ``request_rate`` (inf: all at t=0), or from a replayed trace (``replay`` set, its
    own timestamps). Every request asks for exactly its workload ``output_len`` tokens
    (``max_tokens`` with ``ignore_eos``).
    """

    base_url: str = "http://127.0.0.1:8000"  # `fastpp serve`'s default port; no trailing slash kept
    backend: Backend = Backend.OPENAI
    model: str | None = None  # None: the first id GET /v1/models lists
    workload: str = DEFAULT_WORKLOAD  # a fastpp.workloads.WORKLOADS name (lengths only)
    num_prompts: int | None = None  # None: DEFAULT_NUM_PROMPTS, or the whole replay window
    request_rate: float = math.inf  # requests/s; inf sends everything at t=0 (sglang's default)
    arrival: str = "poisson"  # poisson | gamma
    cv: float = 1.0  # gamma arrivals' coefficient of variation
    replay: str | None = None  # azure-conv, azure-code or an Azure-format CSV path
    replay_start_s: float = 0.0
    replay_window_s: float | None = None
    replay_speed: float = 1.0  # 0.9 replays at 0.9x the trace's rate
    data_dir: str | None = None  # folder with the real traces (fastpp.workloads.resolve_data_dir)
    seed: int = 0  # same default as `fastpp simulate`, so both see the same requests
    max_concurrency: int | None = None  # None: no client-side limit on requests in flight
    timeout_s: float = 300.0  # per request, from send to the end of its stream
    slo: SLO | None = None  # adds the SLO section (attainment) to the summary
    tag: str | None = None  # sglang's --tag: a free label written into the JSONL record

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))
        try:
            object.__setattr__(self, "backend", Backend(self.backend))
        except ValueError:
            known = ", ".join(b.value for b in Backend)
            raise ValueError(f"backend must be one of {known}, got {self.backend!r}") from None
        if self.num_prompts is not None and self.num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {self.num_prompts}")
        if math.isnan(self.request_rate) or self.request_rate <= 0:
            raise ValueError(f"request_rate must be > 0 (inf: all at once), got {self.request_rate}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {', '.join(ARRIVALS)}, got {self.arrival!r}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {self.timeout_s}")
        if self.replay is not None:
            # a trace brings its own arrival times: a rate or arrival process would be ignored
            if math.isfinite(self.request_rate) or self.arrival != "poisson" or self.cv != 1.0:
                raise ValueError("request_rate, arrival and cv do not apply to a replay; use replay_speed")
        elif self.workload.startswith("random:"):
            UniformLengths.parse(self.workload)  # raises naming the bad part
        elif self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; known: {', '.join(WORKLOADS)}")

    @property
    def dataset_name(self) -> str:
        """The JSONL ``dataset_name``: ``random`` for ``random:IN:OUT[:RATIO]`` (sglang's name; the
        numbers go to ``random_lengths``), another workload's name, or ``replay:<trace>``."""
        if self.replay is not None:
            return f"replay:{self.replay}"
        return "random" if self.workload.startswith("random:") else self.workload

    @property
    def random_lengths(self) -> UniformLengths | None:
        """The uniform length distribution of a ``random:`` workload (None for any other)."""
        if self.replay is None and self.workload.startswith("random:"):
            return UniformLengths.parse(self.workload)
        return None

    @property
    def traffic_rate(self) -> float | None:
        """The summary's ``request_rate``: the configured rate (inf too), None for a replay."""
        return None if self.replay is not None else self.request_rate

    def requests(self) -> list[Request]:
        """The run's requests in arrival order (seconds from the bench start), deterministic."""
        if self.replay is not None:
            reqs = replay_requests(
                self.replay, start_s=self.replay_start_s, window_s=self.replay_window_s,
                speed=self.replay_speed, data_dir=self.data_dir,
            )
            return reqs if self.num_prompts is None else reqs[: self.num_prompts]
        return make_requests(
            self.workload, seed=self.seed,
            rate=None if math.isinf(self.request_rate) else self.request_rate,
            num_requests=self.num_prompts or DEFAULT_NUM_PROMPTS,
            arrival=self.arrival, cv=self.cv, data_dir=self.data_dir,
        )


def parse_goodput(items: Sequence[str]) -> SLO:
    """An SLO from sglang's ``--goodput`` items, ``KEY:MS`` with KEY ttft or tpot.

    Items may also hold several pairs separated by spaces or commas ("ttft:500,tpot:50"). A
    missing key takes the ``SLO`` dataclass default. sglang's ``e2el`` has no counterpart in
    FastPP's SLO and is rejected, as is any other key.
    """
    values_ms: dict[str, float] = {}
    for item in (p for raw in items for p in re.split(r"[\s,]+", raw.strip()) if p):
        match = _GOODPUT_ITEM.match(item)
        if match is None:
            raise ValueError(f"goodput items look like ttft:500 or tpot:50 (ms), got {item!r}")
        key, value = match.group(1).lower(), float(match.group(2))
        if key not in ("ttft", "tpot"):
            raise ValueError(f"goodput key must be ttft or tpot, got {key!r}")
        values_ms[key] = value
    if not values_ms:
        raise ValueError("goodput needs at least one of ttft:MS and tpot:MS")
    return make_slo(values_ms.get("ttft"), values_ms.get("tpot"))


def make_slo(ttft_ms: float | None, tpot_ms: float | None) -> SLO | None:
    """An SLO from milliseconds; None when neither is given, a missing one takes SLO's default."""
    if ttft_ms is None and tpot_ms is None:
        return None
    default = SLO()
    return SLO(
        default.ttft_s if ttft_ms is None else ttft_ms / 1e3,
        default.tpot_s if tpot_ms is None else tpot_ms / 1e3,
    )

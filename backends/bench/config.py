"""What ``fastpp bench`` sends and where: the server, the endpoint, the workload and the limits.

Units: seconds (``*_s``) for times, milliseconds only where a flag says ``ms`` (the SLO flags,
as sglang's ``--goodput``). This module does no I/O and does not import httpx, so the CLI can
validate options before the optional dependency is needed.

Two SLO views, both optional: ``goodput`` is sglang's (per request: a request is good when it
succeeded and met every given objective of ttft, tpot and e2el, in ms), ``slo`` is FastPP's
(TTFT and TPOT; adds the P90 verdict and per-request attainment of ``fastpp simulate``). Giving
one derives the other where it can (ttft/tpot pairs), so a run reports both.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from fastpp.types import SLO, Request
from fastpp.uniform_lengths import UniformLengths
from fastpp.workloads import (
    ARRIVALS,
    DEFAULT_WORKLOAD,
    check_workload_name,
    make_requests,
    replay_requests,
)

DEFAULT_NUM_PROMPTS = 1000  # sglang.benchmark.serving's --num-prompts default
GOODPUT_KEYS = ("ttft", "tpot", "e2el")  # sglang's --goodput metrics
_GOODPUT_ITEM = re.compile(r"^(\w+):(\S+)$")
# body fields the bench itself must own: it sends one text and reads an SSE stream
_RESERVED_BODY_KEYS = ("stream", "prompt", "messages")


class Backend(StrEnum):
    """Which OpenAI-compatible endpoint the requests go to."""

    OPENAI = "openai"  # POST /v1/completions with a text prompt
    OPENAI_CHAT = "openai-chat"  # POST /v1/chat/completions with one user message

    @property
    def path(self) -> str:
        return "/v1/completions" if self is Backend.OPENAI else "/v1/chat/completions"


def _check_host_and_port(url: str) -> None:
    """Raise ValueError naming ``url`` when it has no host or its port is not 1..65535 (the
    HTTP client would fail with a bare OverflowError or InvalidURL)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # an out-of-range or non-numeric port, a broken IPv6 address
        raise ValueError(f"base_url {url!r}: {exc}") from None
    if not parts.hostname:
        raise ValueError(f"base_url {url!r} names no host")
    if port == 0:
        raise ValueError(f"base_url {url!r}: port must be in 1..65535, got 0")


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """One benchmark run against an OpenAI-compatible server. Read-only after construction.

    Requests come from a registered length distribution (``workload``) with Poisson or gamma
    arrivals at ``request_rate`` (inf: all at t=0; else the first at t=0, as sglang sends it,
    then the drawn gaps), or from a replayed trace (``replay`` set, its own timestamps and
    lengths). Every request asks for exactly its workload ``output_len`` tokens (``max_tokens``
    with ``ignore_eos``).
    """

    # `fastpp serve`'s default port; kept without a trailing slash or /v1 (the OpenAI clients'
    # form: the bench adds /v1/... itself)
    base_url: str = "http://127.0.0.1:8000"
    backend: Backend = Backend.OPENAI
    model: str | None = None  # None: the first id GET /v1/models lists
    # a fastpp.workloads.WORKLOADS name or random:IN:OUT[:RATIO] (lengths only); None:
    # DEFAULT_WORKLOAD, and stays None for a replay (the trace brings its own lengths)
    workload: str | None = None
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
    slo: SLO | None = None  # adds FastPP's SLO section (P90 verdict, attainment) to the summary
    goodput: tuple[tuple[str, float], ...] = ()  # sglang's --goodput: (ttft|tpot|e2el, ms) pairs
    tag: str | None = None  # sglang's --tag: a free label written into the JSONL record
    warmup_requests: int = 1  # sglang's --warmup-requests: untimed requests before the run (0: none)
    tokenizer: str | None = None  # a tokenizer.json or a model folder holding one: exact token counts
    extra_request_body: Mapping[str, Any] | None = None  # merged into every request body (overrides)

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        _check_host_and_port(self.base_url)
        object.__setattr__(self, "base_url", server_root(self.base_url))
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
        if self.warmup_requests < 0:
            raise ValueError(f"warmup_requests must be >= 0, got {self.warmup_requests}")
        self._check_slos()
        if self.extra_request_body is not None:
            if not isinstance(self.extra_request_body, Mapping):
                raise ValueError(
                    f"extra_request_body must be a JSON object, got {type(self.extra_request_body).__name__}"
                )
            reserved = [k for k in _RESERVED_BODY_KEYS if k in self.extra_request_body]
            if reserved:
                raise ValueError(
                    f"extra_request_body cannot set {', '.join(reserved)}: the bench "
                    "sends the workload's text and reads a stream"
                )
            object.__setattr__(self, "extra_request_body", dict(self.extra_request_body))
        if self.replay is not None:
            self._check_replay()
        elif self.replay_start_s != 0.0 or self.replay_window_s is not None or self.replay_speed != 1.0:
            raise ValueError(
                "replay_start_s, replay_window_s and replay_speed (--replay-start, --replay-window, "
                "--replay-speed) apply to a replay (--replay) only"
            )
        else:
            object.__setattr__(self, "workload", check_workload_name(self.workload or DEFAULT_WORKLOAD))

    def _check_replay(self) -> None:
        """A trace brings its own arrival times and lengths: refuse what would be ignored."""
        if math.isfinite(self.request_rate) or self.arrival != "poisson" or self.cv != 1.0:
            raise ValueError(
                "request_rate, arrival and cv (-r/--request-rate, --arrival, --cv) do not apply to "
                "a replay (--replay); use replay_speed (--replay-speed)"
            )
        if self.workload is not None:
            raise ValueError(
                f"workload (-w/--workload) {self.workload!r} does not apply to a replay (--replay "
                f"{self.replay}): the trace brings its own lengths; give one of the two"
            )

    def _check_slos(self) -> None:
        """Validate ``goodput`` and derive it from ``slo`` or the other way round."""
        goodput = tuple((str(k), float(v)) for k, v in self.goodput)
        for key, ms in goodput:
            if key not in GOODPUT_KEYS:
                raise ValueError(f"goodput key must be one of {', '.join(GOODPUT_KEYS)}, got {key!r}")
            if not (math.isfinite(ms) and ms > 0):
                raise ValueError(f"goodput {key} must be a positive number of ms, got {ms:g}")
        if not goodput and self.slo is not None:
            goodput = (("ttft", self.slo.ttft_s * 1e3), ("tpot", self.slo.tpot_s * 1e3))
        object.__setattr__(self, "goodput", goodput)
        if self.slo is None:
            object.__setattr__(self, "slo", slo_from_goodput(goodput))

    @property
    def goodput_slos_ms(self) -> dict[str, float]:
        """sglang's ``goodput_slos_ms``: the given objectives, in the order given."""
        return dict(self.goodput)

    @property
    def dataset_name(self) -> str:
        """The JSONL ``dataset_name``: ``random`` for ``random:IN:OUT[:RATIO]`` (sglang's name; the
        numbers go to ``random_lengths``), another workload's name, or ``replay:<trace>``."""
        if self.workload is None:
            return f"replay:{self.replay}"
        return "random" if self.workload.startswith("random:") else self.workload

    @property
    def random_lengths(self) -> UniformLengths | None:
        """The uniform length distribution of a ``random:`` workload (None for any other)."""
        if self.workload is not None and self.workload.startswith("random:"):
            return UniformLengths.parse(self.workload)
        return None

    @property
    def traffic_rate(self) -> float | None:
        """The summary's ``request_rate``: the configured rate (inf too), None for a replay."""
        return None if self.replay is not None else self.request_rate

    def requests(self) -> list[Request]:
        """The run's requests in arrival order (seconds from the bench start), deterministic.

        A drawn schedule is shifted so its first request goes at t=0 (sglang's bench_serving
        sends the first at once, then sleeps each gap; ``make_requests`` starts with a gap, as
        the simulator wants it): the gaps and the lengths stay those of ``fastpp simulate``.
        """
        if self.replay is not None:
            reqs = replay_requests(
                self.replay,
                start_s=self.replay_start_s,
                window_s=self.replay_window_s,
                speed=self.replay_speed,
                data_dir=self.data_dir,
            )
            return reqs if self.num_prompts is None else reqs[: self.num_prompts]
        assert self.workload is not None  # __post_init__ set it where there is no replay
        reqs = make_requests(
            self.workload,
            seed=self.seed,
            rate=None if math.isinf(self.request_rate) else self.request_rate,
            num_requests=self.num_prompts or DEFAULT_NUM_PROMPTS,
            arrival=self.arrival,
            cv=self.cv,
            data_dir=self.data_dir,
        )
        return starting_at_zero(reqs)


def starting_at_zero(reqs: list[Request]) -> list[Request]:
    """``reqs`` (in arrival order) shifted so the first arrives at t=0; the gaps are kept."""
    if not reqs or reqs[0].arrived_at == 0.0:
        return reqs
    t0 = reqs[0].arrived_at
    return [dataclasses.replace(r, arrived_at=r.arrived_at - t0) for r in reqs]


def server_root(url: str) -> str:
    """``url`` without trailing slashes and one trailing ``/v1``: OpenAI clients are given
    ``http://host:port/v1``, the bench adds ``/v1/completions`` (and ``/server_info``) itself."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/").removesuffix("/v1").rstrip("/")
    return urlunsplit(parts._replace(path=path))


def parse_goodput(items: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """sglang's ``--goodput`` items, ``KEY:MS`` with KEY ttft, tpot or e2el, as (key, ms) pairs.

    Items may also hold several pairs separated by spaces or commas ("ttft:500,tpot:50"); a key
    given twice keeps its last value (as sglang's ``dict(args.goodput)``). ValueError names the
    bad item.
    """
    values_ms: dict[str, float] = {}
    for item in (p for raw in items for p in re.split(r"[\s,]+", raw.strip()) if p):
        match = _GOODPUT_ITEM.match(item)
        if match is None:
            raise ValueError(f"goodput items look like ttft:500, tpot:50 or e2el:2000 (ms), got {item!r}")
        key = match.group(1).lower()
        if key not in GOODPUT_KEYS:
            raise ValueError(f"goodput key must be one of {', '.join(GOODPUT_KEYS)}, got {key!r} in {item!r}")
        try:
            value = float(match.group(2))
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"goodput {key} must be a positive number of ms, got {item!r}")
        values_ms[key] = value
    if not values_ms:
        raise ValueError("goodput needs at least one of ttft:MS, tpot:MS and e2el:MS")
    return tuple(values_ms.items())


def slo_from_goodput(goodput: Sequence[tuple[str, float]]) -> SLO | None:
    """FastPP's SLO from sglang's pairs: their ttft and tpot (a missing one takes ``SLO``'s
    default); None when neither is given (e2el alone has no FastPP counterpart)."""
    ms = dict(goodput)
    return make_slo(ms.get("ttft"), ms.get("tpot"))


def make_slo(ttft_ms: float | None, tpot_ms: float | None) -> SLO | None:
    """An SLO from milliseconds; None when neither is given, a missing one takes SLO's default."""
    if ttft_ms is None and tpot_ms is None:
        return None
    default = SLO()
    return SLO(
        default.ttft_s if ttft_ms is None else ttft_ms / 1e3,
        default.tpot_s if tpot_ms is None else tpot_ms / 1e3,
    )

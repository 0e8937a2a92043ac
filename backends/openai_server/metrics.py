"""/metrics: the engine's state and counters as Prometheus metrics, through ``prometheus_client``.

Each app gets its own ``CollectorRegistry`` (never the process-global one), holding one collector
that reads the engine when scraped. ``read_engine`` is the only code that looks inside the
engine: everything else works on the :class:`EngineSnapshot` it returns. The library does the
exposition: number formatting, label escaping, ``_total`` suffixes of counters, content
negotiation (Prometheus text or OpenMetrics).

Every family is shown twice: as ``fastpp_*`` and under vLLM's current name (``vllm:*``, labels
``model_name`` and ``engine``), so vLLM dashboards and alerts work unchanged. Latency histograms
(TTFT, ITL, TPOT, E2E, queue time) have buckets from 1 ms (``engine_state``'s bounds).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

PREFIX = "fastpp"
VLLM_PREFIX = "vllm:"
# fastpp name -> vLLM's (vllm/v1/metrics/loggers.py); fastpp-only families have none
VLLM_NAMES = {
    "num_requests_running": "num_requests_running",
    "num_requests_waiting": "num_requests_waiting",
    "kv_cache_usage_ratio": "kv_cache_usage_perc",  # vLLM's "perc" is a 0-1 ratio too
    "prompt_tokens": "prompt_tokens",
    "generation_tokens": "generation_tokens",
    "num_retractions": "num_preemptions",
    "request_success": "request_success",
    "time_to_first_token_seconds": "time_to_first_token_seconds",
    "inter_token_latency_seconds": "inter_token_latency_seconds",
    "time_per_output_token_seconds": "request_time_per_output_token_seconds",
    "e2e_request_latency_seconds": "e2e_request_latency_seconds",
    "request_queue_time_seconds": "request_queue_time_seconds",
}
_VLLM_REASONS = {"aborted": "abort"}  # our finish reason -> vLLM's finished_reason label


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    bounds: tuple[float, ...]  # upper bounds; a last +Inf bucket follows
    counts: tuple[int, ...]  # per bucket, not cumulative, len(bounds) + 1
    total: float


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """What /metrics shows of the engine at one moment (this module's own view, whatever the
    engine's internals: only ``read_engine`` knows them)."""

    running: int  # admitted (holding KV), parked ones included
    waiting: int  # submitted, not admitted yet
    parked: int
    kv_usage_ratio: float
    kv_blocks: int  # per stage
    kv_blocks_free: int  # on stage 0
    received: int
    prompt_tokens: int
    generation_tokens: int
    microbatches: int
    retractions: int
    ended: dict[str, int]  # finish reason -> requests
    chunk_budgets: dict[int, int]  # chunk budget C -> microbatches
    stage_busy_s: tuple[float, ...]
    ttft: HistogramSnapshot
    tpot: HistogramSnapshot
    itl: HistogramSnapshot
    e2e: HistogramSnapshot
    queue: HistogramSnapshot


def _hist(h: Any) -> HistogramSnapshot:
    return HistogramSnapshot(tuple(h.bounds), tuple(h.counts), float(h.total))


def read_engine(engine: Any) -> EngineSnapshot:
    """The one adapter from a ``PipelineEngine`` to /metrics: reads only the snapshot the engine
    thread published (never the live scheduler), and the engine's thread-safe counts."""
    snap = engine.snapshot
    stats, c = snap.stats, snap.counters
    return EngineSnapshot(
        running=stats.num_admitted,
        waiting=engine.num_queued,
        parked=stats.num_parked,
        kv_usage_ratio=stats.kv_used_tokens / stats.kv_capacity_tokens,
        kv_blocks=engine.config.kv_blocks,
        kv_blocks_free=snap.stage0_free_blocks,
        received=engine.num_received,
        prompt_tokens=c.prompt_tokens,
        generation_tokens=c.generated_tokens,
        microbatches=c.microbatches,
        retractions=stats.num_retractions,
        ended=dict(c.ended),
        chunk_budgets=dict(c.chunk_budgets),
        stage_busy_s=tuple(snap.stage_busy_s),
        ttft=_hist(c.ttft),
        tpot=_hist(c.tpot),
        itl=_hist(c.itl),
        e2e=_hist(c.e2e),
        queue=_hist(c.queue),
    )


class ServerCollector(Collector):
    """Collects the engine snapshot and the HTTP status counts on every scrape."""

    def __init__(self, engine: Any, model_name: str, http_counts: dict[int, int]) -> None:
        self.engine = engine
        self.model_name = model_name
        self.http_counts = http_counts  # status -> responses of the /v1 endpoints (the app updates it)

    def describe(self) -> list[Metric]:
        return []  # nothing to check at registration (and the engine may not be started yet)

    def collect(self) -> Iterator[Metric]:
        s = read_engine(self.engine)
        model = self.model_name

        def gauge(name: str, doc: str, value: float) -> Iterator[GaugeMetricFamily]:
            for full, labels, values in _names(name, model):
                g = GaugeMetricFamily(full, doc, labels=labels)
                g.add_metric(values, value)
                yield g

        def counter(
            name: str, doc: str, samples: list[tuple[list[str], float]], extra: tuple[str, ...] = ()
        ) -> Iterator[CounterMetricFamily]:
            for full, labels, values in _names(name, model):
                m = CounterMetricFamily(full, doc, labels=[*labels, *extra])
                for more, v in samples:
                    if full.startswith(VLLM_PREFIX) and name == "request_success":
                        more = [_VLLM_REASONS.get(more[0], more[0])]
                    m.add_metric([*values, *more], v)
                yield m

        def histogram(name: str, doc: str, h: HistogramSnapshot) -> Iterator[HistogramMetricFamily]:
            cumulative, running = [], 0
            for bound, count in zip((*map(float, h.bounds), float("inf")), h.counts, strict=True):
                running += count
                cumulative.append((_le(bound), running))
            for full, labels, values in _names(name, model):
                m = HistogramMetricFamily(full, doc, labels=labels)
                m.add_metric(values, cumulative, h.total)
                yield m

        yield from gauge(
            "num_requests_running", "Requests admitted (holding KV), parked included.", s.running
        )
        yield from gauge("num_requests_waiting", "Requests queued and not admitted yet.", s.waiting)
        yield from gauge("num_requests_parked", "Decode requests the balancer holds back.", s.parked)
        yield from gauge("kv_cache_usage_ratio", "Share of KV reserved.", s.kv_usage_ratio)
        yield from gauge("kv_blocks_capacity", "KV blocks per stage.", s.kv_blocks)
        yield from gauge("kv_blocks_free", "Free KV blocks on stage 0.", s.kv_blocks_free)
        yield from counter("requests_received", "Requests passed to the engine.", [([], s.received)])
        yield from counter("prompt_tokens", "Prompt tokens of admitted requests.", [([], s.prompt_tokens)])
        yield from counter("generation_tokens", "Output tokens generated.", [([], s.generation_tokens)])
        yield from counter("microbatches", "Microbatches completed.", [([], s.microbatches)])
        yield from counter("num_retractions", "KV freed and recomputed.", [([], s.retractions)])
        yield from counter(
            "request_success",
            "Requests ended, by finish reason.",
            [([k], v) for k, v in sorted(s.ended.items())],
            ("finished_reason",),
        )
        yield from counter(
            "chunk_budget_microbatches",
            "Microbatches by the chunk budget C chosen.",
            [([str(k)], v) for k, v in sorted(s.chunk_budgets.items())],
            ("chunk_budget",),
        )
        yield from counter(
            "stage_busy_seconds",
            "Compute time per pipeline stage.",
            [([str(i)], v) for i, v in enumerate(s.stage_busy_s)],
            ("stage",),
        )
        http_doc = "HTTP responses of the /v1 endpoints, by status (errors included)."
        yield from counter(
            "http_responses",
            http_doc,
            [([str(k)], v) for k, v in sorted(self.http_counts.items())],
            ("code",),
        )
        yield from histogram("time_to_first_token_seconds", "TTFT of completed requests.", s.ttft)
        yield from histogram("time_per_output_token_seconds", "TPOT of completed requests.", s.tpot)
        yield from histogram("inter_token_latency_seconds", "Gaps between consecutive output tokens.", s.itl)
        yield from histogram("e2e_request_latency_seconds", "Arrival to last token of ended requests.", s.e2e)
        yield from histogram("request_queue_time_seconds", "Arrival to first scheduled microbatch.", s.queue)


def _names(name: str, model: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """(family name, label names, label values) of one metric: ours, then vLLM's if it has one."""
    yield f"{PREFIX}_{name}", ["model_name"], [model]
    if name in VLLM_NAMES:
        yield f"{VLLM_PREFIX}{VLLM_NAMES[name]}", ["model_name", "engine"], [model, "0"]


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def make_registry(engine: Any, model_name: str, http_counts: dict[int, int]) -> CollectorRegistry:
    """A fresh registry holding the server's collector (one per app: tests run several apps)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServerCollector(engine, model_name, http_counts))
    return registry


def render(registry: CollectorRegistry, accept: str | None = None) -> tuple[bytes, str]:
    """The page and its content type, in the format the ``Accept`` header asks for."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type

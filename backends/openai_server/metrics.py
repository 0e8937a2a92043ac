"""/metrics: the engine's state and counters as Prometheus metrics, through ``prometheus_client``.

Each app gets its own ``CollectorRegistry`` (never the process-global one), holding one collector
that reads the engine when scraped. ``read_engine`` is the only code that looks inside the
engine: everything else works on the :class:`EngineSnapshot` it returns. The library does the
exposition: number formatting, label escaping, ``_total`` suffixes of counters, content
negotiation (Prometheus text or OpenMetrics).
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
        lab = ["model_name"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=lab)
            g.add_metric([model], value)
            return g

        def counter(name: str, doc: str, samples: list[tuple[list[str], float]],
                    extra: tuple[str, ...] = ()) -> CounterMetricFamily:
            m = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=[*lab, *extra])
            for values, v in samples:
                m.add_metric([model, *values], v)
            return m

        def histogram(name: str, doc: str, h: HistogramSnapshot) -> HistogramMetricFamily:
            m = HistogramMetricFamily(f"{PREFIX}_{name}", doc, labels=lab)
            cumulative, running = [], 0
            for bound, count in zip((*map(float, h.bounds), float("inf")), h.counts, strict=True):
                running += count
                cumulative.append((_le(bound), running))
            m.add_metric([model], cumulative, h.total)
            return m

        yield gauge("num_requests_running", "Requests admitted (holding KV), parked included.", s.running)
        yield gauge("num_requests_waiting", "Requests queued and not admitted yet.", s.waiting)
        yield gauge("num_requests_parked", "Decode requests the balancer holds back.", s.parked)
        yield gauge("kv_cache_usage_ratio", "Share of KV reserved.", s.kv_usage_ratio)
        yield gauge("kv_blocks_capacity", "KV blocks per stage.", s.kv_blocks)
        yield gauge("kv_blocks_free", "Free KV blocks on stage 0.", s.kv_blocks_free)
        yield counter("requests_received", "Requests passed to the engine.", [([], s.received)])
        yield counter("prompt_tokens", "Prompt tokens of admitted requests.", [([], s.prompt_tokens)])
        yield counter("generation_tokens", "Output tokens generated.", [([], s.generation_tokens)])
        yield counter("microbatches", "Microbatches completed.", [([], s.microbatches)])
        yield counter("num_retractions", "KV freed and recomputed.", [([], s.retractions)])
        yield counter("request_success", "Requests ended, by finish reason.",
                      [([k], v) for k, v in sorted(s.ended.items())], ("finished_reason",))
        yield counter("chunk_budget_microbatches", "Microbatches by the chunk budget C chosen.",
                      [([str(k)], v) for k, v in sorted(s.chunk_budgets.items())], ("chunk_budget",))
        yield counter("stage_busy_seconds", "Compute time per pipeline stage.",
                      [([str(i)], v) for i, v in enumerate(s.stage_busy_s)], ("stage",))
        yield counter("http_responses", "HTTP responses of the /v1 endpoints, by status (errors included).",
                      [([str(k)], v) for k, v in sorted(self.http_counts.items())], ("code",))
        yield histogram("time_to_first_token_seconds", "TTFT of completed requests.", s.ttft)
        yield histogram("time_per_output_token_seconds", "TPOT of completed requests.", s.tpot)


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

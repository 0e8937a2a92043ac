"""Prometheus text exposition (format 0.0.4) of the engine's state and counters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastpp.backends.torch.engine_state import Histogram


def _labels(labels: dict[str, Any]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


class Exposition:
    """Accumulates metric families, then ``text()``."""

    def __init__(self, prefix: str, common: dict[str, str]) -> None:
        self.prefix = prefix
        self.common = common
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_: str,
               samples: Sequence[tuple[dict[str, Any], float]]) -> None:
        full = f"{self.prefix}_{name}"
        self.lines += [f"# HELP {full} {help_}", f"# TYPE {full} {kind}"]
        self.lines += [f"{full}{_labels({**self.common, **lab})} {value:g}" for lab, value in samples]

    def one(self, name: str, kind: str, help_: str, value: float) -> None:
        self.family(name, kind, help_, [({}, value)])

    def histogram(self, name: str, help_: str, hist: Histogram) -> None:
        full = f"{self.prefix}_{name}"
        self.lines += [f"# HELP {full} {help_}", f"# TYPE {full} histogram"]
        running = 0
        for bound, count in zip((*hist.bounds, "+Inf"), hist.counts, strict=True):
            running += count
            le = bound if isinstance(bound, str) else f"{bound:g}"
            self.lines.append(f"{full}_bucket{_labels({**self.common, 'le': le})} {running}")
        self.lines.append(f"{full}_sum{_labels(self.common)} {hist.total:g}")
        self.lines.append(f"{full}_count{_labels(self.common)} {hist.n}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render(engine: Any, model_name: str, http_counts: dict[int, int]) -> str:
    """The /metrics page for a ``PipelineEngine``, from the snapshot its engine thread published
    (never from the live scheduler: only the engine thread touches that)."""
    snap = engine.snapshot
    stats, c = snap.stats, snap.counters
    cfg = engine.config
    e = Exposition("fastpp", {"model_name": model_name})
    e.one("num_requests_running", "gauge", "Requests admitted (holding KV), parked ones included.",
          stats.num_admitted)
    e.one("num_requests_waiting", "gauge", "Requests queued and not admitted yet.", engine.num_queued)
    e.one("num_requests_parked", "gauge", "Decode requests the balancer holds back.", stats.num_parked)
    e.one("kv_cache_usage_ratio", "gauge", "Share of KV reserved.",
          stats.kv_used_tokens / stats.kv_capacity_tokens)
    e.one("kv_blocks_total", "gauge", "KV blocks per stage.", cfg.kv_blocks)
    e.one("kv_blocks_free", "gauge", "Free KV blocks on stage 0.", snap.stage0_free_blocks)
    e.one("requests_received_total", "counter", "Requests passed to the engine.", engine.num_received)
    e.one("prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", c.prompt_tokens)
    e.one("generation_tokens_total", "counter", "Output tokens generated.", c.generated_tokens)
    e.one("microbatches_total", "counter", "Microbatches completed.", c.microbatches)
    e.one("num_retractions_total", "counter", "KV freed and recomputed.", stats.num_retractions)
    e.family("request_success_total", "counter", "Requests ended, by finish reason.",
             [({"finished_reason": k}, v) for k, v in sorted(c.ended.items())])
    e.family("chunk_budget_microbatches_total", "counter", "Microbatches by the chunk budget C chosen.",
             [({"chunk_budget": k}, v) for k, v in sorted(c.chunk_budgets.items())])
    e.family("stage_busy_seconds_total", "counter", "Compute time per pipeline stage.",
             [({"stage": i}, s) for i, s in enumerate(snap.stage_busy_s)])
    e.family("http_responses_total", "counter", "HTTP responses of the generation endpoints, by status.",
             [({"code": k}, v) for k, v in sorted(http_counts.items())])
    e.histogram("time_to_first_token_seconds", "TTFT of completed requests.", c.ttft)
    e.histogram("time_per_output_token_seconds", "TPOT of completed requests.", c.tpot)
    return e.text()

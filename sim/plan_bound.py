"""The bubble-free capacity bound of a deployment: the arrival rate at which its busiest
resource would be 100% busy, from the same cost model the simulator runs.

Scenario: the planner ranks dozens of layouts and policies; a full goodput search costs seconds
to minutes each. An upper bound on goodput that costs microseconds lets it search the likely
winners first, start each bracket near the answer, and skip a candidate whose bound is below a
goodput already found (it cannot win).

Work per request on each resource is bounded from below, so the rate is bounded from above:

- every stage (a pipeline stage, or the one TP group when pp = 1): each of the request's
  I + O - 1 tokens (its prompt, then one token per decode step after the first) costs at
  least the cheapest per-token cost of a microbatch of at most ``max_tokens`` tokens (the
  policy's largest chunk: linear work, fixed costs, all-reduces, embedding); its prompt's
  attention at least I^2 x min(a_sq, a_past / 2) however it is chunked; its decodes read
  at least I + j - 1 cached tokens at step j; the last stage samples O tokens at the cheapest
  per-sample LM head cost;
- the host: one launch overhead per microbatch, at least (I + O - 1) / max_tokens microbatches;
- the KV pool (Little's law): between two of its tokens a request holds at least I + j - 1
  KV tokens for at least one pass of a one-token microbatch through every stage, and the pool
  holds ``kv_capacity_tokens``.

Rates are per replica; ``dp`` replicas under random routing of a Poisson stream each see
rate / dp, so the deployment's bound is dp times a replica's. Bubbles, SLOs and queueing are
ignored: that is what makes it an upper bound (goodput <= bound), and what the share of the
bound a policy reaches measures. Units: requests per second, seconds, tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fastpp.profile import LinearTable, Profile

HOST = "host loop"
KV_POOL = "KV pool"


@dataclass(frozen=True, slots=True)
class RequestLengths:
    """Mean per-request length statistics of a workload sample (tokens)."""

    tokens: float  # E[I + O - 1]: tokens a request puts through every stage
    prompt_sq: float  # E[I^2]
    decode_ctx: float  # E[sum_{j=1}^{O-1} (I + j - 1)]: cached tokens its decodes read
    sampled: float  # E[O]: tokens the LM head samples for it
    num_requests: int

    @classmethod
    def of(cls, lengths: Sequence[tuple[int, int]]) -> RequestLengths:
        """From (prompt_len, output_len) pairs."""
        if not lengths:
            raise ValueError("need at least one request's lengths")
        i = np.array([p for p, _ in lengths], float)
        o = np.array([max(1, q) for _, q in lengths], float)
        steps = o - 1
        return cls(
            tokens=float(np.mean(i + steps)),
            prompt_sq=float(np.mean(i * i)),
            decode_ctx=float(np.mean(steps * i + steps * (steps - 1) / 2)),
            sampled=float(np.mean(o)),
            num_requests=len(lengths),
        )


@dataclass(frozen=True, slots=True)
class CapacityBound:
    """The bound and the rate at which each resource alone would be 100% busy."""

    rate: float  # req/s of the whole deployment (dp x a replica's)
    dp: int
    bottleneck: str  # the resource with the lowest rate: "stage 2", "TP group", "GPU", ...
    replica_rates: dict[str, float]  # resource -> req/s of one replica at 100% busy

    @property
    def replica_rate(self) -> float:
        return self.rate / self.dp

    def describe(self) -> str:
        return f"{self.rate:.3g} req/s ({self.bottleneck} 100% busy)"


def capacity_bound(profile: Profile, lengths: RequestLengths, max_tokens: int, dp: int = 1) -> CapacityBound:
    """The bound of ``dp`` replicas of ``profile`` when no microbatch exceeds ``max_tokens``."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if dp < 1:
        raise ValueError(f"dp must be >= 1, got {dp}")
    rates: dict[str, float] = {}
    for s, stage in enumerate(profile.stages):
        per_token = min(stage.time_s(m, 0, 0, 0, 0) / m for m in range(1, max_tokens + 1))
        work = (
            per_token * lengths.tokens
            + lengths.prompt_sq * min(stage.attn_pre_sq_s, stage.attn_past_x_pre_s / 2)
            + stage.attn_dec_ctx_s * lengths.decode_ctx
        )
        if stage.lm_head is not None:
            work += _cheapest_per_unit(stage.lm_head, max_tokens) * lengths.sampled
        rates[_stage_name(profile, s)] = _rate(work)
    rates[HOST] = _rate(profile.host_overhead_s * lengths.tokens / max_tokens)
    one_pass = sum(stage.time_s(1, 1, 0, 0, 0) for stage in profile.stages) + (
        profile.pp - 1
    ) * profile.link.time_s(profile.activation_bytes_per_token)
    rates[KV_POOL] = _rate(one_pass * lengths.decode_ctx / profile.kv_capacity_tokens)
    bottleneck = min(rates, key=rates.__getitem__)
    return CapacityBound(dp * rates[bottleneck], dp, bottleneck, rates)


def _stage_name(profile: Profile, s: int) -> str:
    if profile.pp > 1:
        return f"stage {s}"
    return "TP group" if profile.tp > 1 else "GPU"


def _cheapest_per_unit(table: LinearTable, limit: int) -> float:
    top = min(limit, table.tokens[-1])
    return min(table.at(k) / k for k in range(1, top + 1))


def _rate(work_s: float) -> float:
    return math.inf if work_s <= 0 else 1.0 / work_s

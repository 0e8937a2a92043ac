"""Chunk policies and decode balancers, looked up by name in one table.

A policy spec names a chunk policy with an optional argument and optional balancer, joined by
``+``: ``static:2048``, ``static`` (the configured default chunk), ``predictive+ds``. Builders
get a ``PolicyContext``: the scheduler config and, where the executor has one, the deployment's
profile (policies that predict latency need it). From Python, ``make_chunk_policy`` and
``make_balancer`` build one policy by name, or from its typed config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from fastpp.policies.base import ChunkPolicy, DecodeBalancer, NoBalancer, StaticChunkPolicy
from fastpp.policies.delay import BalanceMode, DelayConfig, DelayScheduler
from fastpp.policies.greedy import GreedyChunkPolicy, GreedyConfig, Statistic
from fastpp.policies.predictive import PredictiveChunkPolicy, PredictiveConfig
from fastpp.policies.rules import efficient_tile_index
from fastpp.policies.slack import SlackConfig, SlackPolicy
from fastpp.policies.upstream import UpstreamChunkConfig, UpstreamChunkPolicy, build_upstream
from fastpp.profile import Profile
from fastpp.scheduler_config import DEFAULT_STATIC_CHUNK, SchedulerConfig

__all__ = [
    "ChunkPolicy",
    "DecodeBalancer",
    "NoBalancer",
    "StaticChunkPolicy",
    "POLICIES",
    "BALANCERS",
    "SlackConfig",
    "SlackPolicy",
    "PolicyInfo",
    "PolicyContext",
    "make_policies",
    "make_chunk_policy",
    "make_balancer",
]


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy builder may use: the scheduler's config and the deployment's profile."""

    config: SchedulerConfig
    profile: Profile | None = None

    def require_profile(self, who: str) -> Profile:
        if self.profile is None:
            raise ValueError(f"policy {who!r} predicts latency and needs the deployment's profile")
        return self.profile


@dataclass(frozen=True, slots=True)
class PolicyInfo:
    """One entry of the registry: how to build it and what it is, for ``fastpp policies``."""

    build: Callable[[str | None, PolicyContext], object]
    summary: str
    argument: str = ""  # what ``name:ARG`` means, "" if it takes none


def _static(arg: str | None, ctx: PolicyContext) -> StaticChunkPolicy:
    if arg is None:
        return StaticChunkPolicy(ctx.config.default_chunk)
    try:
        chunk = int(arg)
    except ValueError:
        raise ValueError(f"static chunk must be an integer number of tokens, got {arg!r}") from None
    return StaticChunkPolicy(chunk)


def _predictive(arg: str | None, ctx: PolicyContext) -> object:
    from fastpp.predictor import ALPPredictor, TokensOnlyPredictor

    profile = ctx.require_profile("predictive")
    kinds: dict[str, type[ALPPredictor] | type[TokensOnlyPredictor]] = {
        "alp": ALPPredictor,
        "tokens": TokensOnlyPredictor,
    }
    if (arg or "alp") not in kinds:
        raise ValueError(f"predictive predictor must be one of {', '.join(kinds)}, got {arg!r}")
    policy = PredictiveChunkPolicy.from_profile(profile)
    policy.predictor = kinds[arg or "alp"].from_profile(profile)
    return policy


def _greedy(arg: str | None, ctx: PolicyContext) -> GreedyChunkPolicy:
    if arg != "tile":
        # the user's text as given: GreedyConfig coerces it to a Statistic, or names the choices
        return GreedyChunkPolicy(GreedyConfig(statistic=cast(Statistic, arg or "mean")))
    from fastpp.predictor import ALPPredictor

    predict = ALPPredictor.from_profile(ctx.require_profile("greedy:tile")).predict_one
    cands = ctx.config.chunk_candidates
    tolerance = PredictiveConfig().tile_tolerance  # the same efficient tile as predictive's floor
    tile = cands[efficient_tile_index(cands, lambda c: predict(c, 0, 0, 0), tolerance)]
    return GreedyChunkPolicy(GreedyConfig(tile_floor=tile))


POLICIES: dict[str, PolicyInfo] = {
    "static": PolicyInfo(
        _static,
        "fixed chunk size (SGLang --chunked-prefill-size)",
        f"tokens (default {DEFAULT_STATIC_CHUNK} in every executor)",
    ),
    "greedy": PolicyInfo(
        _greedy,
        "the paper's feedback controller (docs/POLICIES.md)",
        "statistic: mean | p90; or tile (mean, at least the efficient tile while prompts wait)",
    ),
    "predictive": PolicyInfo(
        _predictive, "ALP predictor + smallest feasible chunk (docs/POLICIES.md)", "predictor: alp | tokens"
    ),
    "upstream": PolicyInfo(
        build_upstream, "SGLang 0.5.23 --enable-dynamic-chunking baseline", "static chunk tokens"
    ),
    "slack": PolicyInfo(
        lambda arg, ctx: SlackPolicy.from_profile(ctx.require_profile("slack")),
        "chunk budget and decode membership against per-request SLO slack (docs/POLICIES.md)",
    ),
}

BALANCERS: dict[str, PolicyInfo] = {
    "none": PolicyInfo(lambda arg, ctx: NoBalancer(), "never move decodes between microbatches"),
    "ds": PolicyInfo(
        # the user's text as given: DelayConfig coerces it to a BalanceMode, or names the choices
        lambda arg, ctx: DelayScheduler(DelayConfig(mode=cast(BalanceMode, arg or "auto"))),
        "delay scheduling: park decodes just above a tile boundary (docs/POLICIES.md)",
        "mode: auto | tpot_first | e2e_first",
    ),
}


def make_policies(
    spec: str, config: SchedulerConfig, profile: Profile | None = None
) -> tuple[ChunkPolicy, DecodeBalancer]:
    """Build the (chunk policy, balancer) pair a spec like ``static:2048`` names."""
    ctx = PolicyContext(config, profile)
    parts = [p.strip() for p in spec.split("+")]
    if not parts[0]:
        raise ValueError(f"empty policy spec {spec!r}")
    chunk_policy = _build(POLICIES, "chunk policy", parts[0], ctx)
    if len(parts) > 1:
        balancer = _build(BALANCERS, "balancer", parts[1], ctx)
    elif isinstance(chunk_policy, DecodeBalancer):  # one policy deciding both (slack)
        balancer = chunk_policy
    else:
        balancer = NoBalancer()
    if len(parts) > 2:
        raise ValueError(f"policy spec {spec!r} has more than one '+'")
    return chunk_policy, balancer  # type: ignore[return-value]


def _build(table: dict[str, PolicyInfo], kind: str, part: str, ctx: PolicyContext) -> object:
    name, _, arg = part.partition(":")
    info = table.get(name)
    if info is None:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(table)}")
    if arg and not info.argument:
        raise ValueError(f"{kind} {name!r} takes no argument, got {arg!r}")
    return info.build(arg or None, ctx)


def _context(profile: Profile | None, default_chunk: int) -> PolicyContext:
    """What the registry's builders read, for a policy built outside any scheduler."""
    if profile is None:
        return PolicyContext(SchedulerConfig(num_slots=1, kv_capacity_tokens=1, default_chunk=default_chunk))
    return PolicyContext(
        SchedulerConfig(
            num_slots=profile.pp,
            kv_capacity_tokens=profile.kv_capacity_tokens,
            page_size=profile.page_size,
            max_context=profile.model.max_context,
            default_chunk=default_chunk,
            token_step=profile.token_step,
        ),
        profile,
    )


def make_chunk_policy(
    spec: str = "static",
    *,
    profile: Profile | None = None,
    config: GreedyConfig | PredictiveConfig | UpstreamChunkConfig | None = None,
    default_chunk: int = DEFAULT_STATIC_CHUNK,
) -> ChunkPolicy:
    """One chunk policy, by name or from its typed config.

    ``spec`` is a name as ``fastpp policies`` lists them, with its optional argument:
    ``static`` (``default_chunk`` tokens) or ``static:512``, ``greedy`` / ``greedy:p90``,
    ``predictive`` / ``predictive:tokens``, ``upstream`` / ``upstream:2048``. ``predictive`` and
    ``upstream`` predict latency and need the deployment's ``profile``. Give ``config`` (a
    ``GreedyConfig``, ``PredictiveConfig`` or ``UpstreamChunkConfig``) instead of an argument to
    set every knob. The SLO and the chunk candidates are not arguments: a policy reads them
    from the view of whichever scheduler runs it. Raises ValueError naming a bad name,
    argument or config.
    """
    name, _, arg = spec.partition(":")
    if config is None:
        return _build(POLICIES, "chunk policy", spec, _context(profile, default_chunk))  # type: ignore[return-value]
    if arg:
        raise ValueError(f"give {spec!r}'s argument or a config, not both")
    typed: dict[str, type] = {
        "greedy": GreedyConfig,
        "predictive": PredictiveConfig,
        "upstream": UpstreamChunkConfig,
    }
    if name not in typed:
        raise ValueError(f"chunk policy {name!r} takes no config; typed configs exist for {', '.join(typed)}")
    if not isinstance(config, typed[name]):
        raise ValueError(f"chunk policy {name!r} takes a {typed[name].__name__}, got {type(config).__name__}")
    if name == "greedy":
        return GreedyChunkPolicy(config)  # type: ignore[arg-type]
    ctx = _context(profile, default_chunk)
    if name == "predictive":
        return PredictiveChunkPolicy.from_profile(ctx.require_profile(name), config)  # type: ignore[arg-type]
    return UpstreamChunkPolicy.from_profile(config, ctx.require_profile(name))  # type: ignore[arg-type]


def make_balancer(spec: str = "ds", *, config: DelayConfig | None = None) -> DecodeBalancer:
    """One decode balancer: ``none``, ``ds`` (delay scheduling) or ``ds:MODE``; or ``ds`` with a
    ``DelayConfig`` for every knob. Raises ValueError naming a bad name, argument or config."""
    name, _, arg = spec.partition(":")
    if config is None:
        return _build(BALANCERS, "balancer", spec, _context(None, DEFAULT_STATIC_CHUNK))  # type: ignore[return-value]
    if name != "ds" or arg:
        raise ValueError(f"a DelayConfig goes with 'ds' and no argument, got {spec!r}")
    if not isinstance(config, DelayConfig):
        raise ValueError(f"balancer 'ds' takes a DelayConfig, got {type(config).__name__}")
    return DelayScheduler(config)

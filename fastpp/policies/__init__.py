"""Chunk policies and decode balancers, looked up by name in one table.

A policy spec names a chunk policy with an optional argument and optional balancer, joined by
``+``: ``static:2048``, ``static`` (the configured default chunk).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fastpp.policies.base import ChunkPolicy, DecodeBalancer, NoBalancer, StaticChunkPolicy
from fastpp.scheduler_config import SchedulerConfig

__all__ = [
    "ChunkPolicy", "DecodeBalancer", "NoBalancer", "StaticChunkPolicy", "POLICIES", "BALANCERS",
    "PolicyInfo", "make_policies",
]


@dataclass(frozen=True, slots=True)
class PolicyInfo:
    """One entry of the registry: how to build it and what it is, for ``fastpp policies``."""

    build: Callable[[str | None, SchedulerConfig], object]
    summary: str
    argument: str = ""  # what ``name:ARG`` means, "" if it takes none


def _static(arg: str | None, cfg: SchedulerConfig) -> StaticChunkPolicy:
    if arg is None:
        return StaticChunkPolicy(cfg.default_chunk)
    try:
        chunk = int(arg)
    except ValueError:
        raise ValueError(f"static chunk must be an integer number of tokens, got {arg!r}") from None
    return StaticChunkPolicy(chunk)


POLICIES: dict[str, PolicyInfo] = {
    "static": PolicyInfo(_static, "fixed chunk size (SGLang --chunked-prefill-size)", "tokens"),
}

BALANCERS: dict[str, PolicyInfo] = {
    "none": PolicyInfo(lambda arg, cfg: NoBalancer(), "never move decodes between microbatches"),
}


def make_policies(spec: str, config: SchedulerConfig) -> tuple[ChunkPolicy, DecodeBalancer]:
    """Build the (chunk policy, balancer) pair a spec like ``static:2048`` names."""
    parts = [p.strip() for p in spec.split("+")]
    if not parts[0]:
        raise ValueError(f"empty policy spec {spec!r}")
    chunk_policy = _build(POLICIES, "chunk policy", parts[0], config)
    balancer = _build(BALANCERS, "balancer", parts[1], config) if len(parts) > 1 else NoBalancer()
    if len(parts) > 2:
        raise ValueError(f"policy spec {spec!r} has more than one '+'")
    return chunk_policy, balancer  # type: ignore[return-value]


def _build(table: dict[str, PolicyInfo], kind: str, part: str, config: SchedulerConfig) -> object:
    name, _, arg = part.partition(":")
    info = table.get(name)
    if info is None:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(table)}")
    if arg and not info.argument:
        raise ValueError(f"{kind} {name!r} takes no argument, got {arg!r}")
    return info.build(arg or None, config)

"""The planner's candidates: every parallel layout of N GPUs that fits memory, times policies.

A layout is dp x tp x pp = N: ``dp`` identical replicas, each a pipeline of ``pp`` stages of
``tp`` GPUs. tp and pp are powers of two; pp is at most the model's layer count; tp divides the
attention heads, the KV heads and the MLP width. A layout fits when every stage's GPU holds its
weights, the runtime reserve and the activation headroom (the share of memory the engine keeps
out of its static pool, 1 - mem_fraction) with room left for a KV pool that holds at least the
workload's P99 request (prompt + output). Each excluded layout says why.

Policies per layout: static chunks from a grid, greedy, predictive and slack, each with and
without delay scheduling (``+ds``) when pp > 1 (with one stage there is no other microbatch to
park a decode behind); on request, each of those again at other async batch depths when pp > 1
(``async_depths``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fastpp.profile import ModelShape, Profile
from fastpp.scheduler_config import DEFAULT_CANDIDATES
from fastpp.sim.analytic import kv_capacity_per_stage, pp_layer_split
from fastpp.sim.hardware import GpuSpec
from fastpp.sim.sweep_grid import check_policy_name, static_chunk

GIB = 1024**3
# Every multiple of 128 up to 1024, then 1536 and 2048 (tokens): the best static chunk is often
# between the powers of two (384 for Qwen2.5-32B on azure-conv, docs/RESULTS.md), and a plan that
# skipped it would credit a dynamic policy with what a tuned static chunk also serves.
DEFAULT_STATIC_GRID: tuple[int, ...] = (*range(128, 1025, 128), 1536, 2048)
DYNAMIC_POLICIES: tuple[str, ...] = ("greedy", "predictive", "slack")
MEM_FRACTION = 0.9  # the analytic profiles' static pool share (fastpp.sim.analytic)


@dataclass(frozen=True, slots=True, order=True)
class Layout:
    """dp replicas of a pp-stage pipeline of tp-GPU groups."""

    dp: int
    tp: int
    pp: int

    @property
    def num_gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def replica_label(self) -> str:
        """The replica's deployment label as ``-d`` spells it: pp4, tp2, pp2tp2, single."""
        parts = [f"pp{self.pp}" if self.pp > 1 else "", f"tp{self.tp}" if self.tp > 1 else ""]
        return "".join(parts) or "single"

    @property
    def key(self) -> str:
        """Compact spelling for ``--layouts``: pp4, dp2pp2, dp4 (dp4 x single), pp2tp2."""
        replica = "" if self.replica_label == "single" and self.dp > 1 else self.replica_label
        return (f"dp{self.dp}" if self.dp > 1 else "") + replica

    @property
    def label(self) -> str:
        """``dp2 x pp2`` or ``pp4``."""
        return f"dp{self.dp} x {self.replica_label}" if self.dp > 1 else self.replica_label


@dataclass(frozen=True, slots=True)
class LayoutFit:
    """A layout that fits, with its replica's KV pool."""

    layout: Layout
    kv_capacity_tokens: int


@dataclass(frozen=True, slots=True)
class LayoutExclusion:
    """A layout left out, and why."""

    layout: Layout
    reason: str


@dataclass(frozen=True, slots=True)
class DeploymentCandidate:
    """One layout with one policy spec (``static:512``, ``predictive+ds``), its async batch
    depth (SGLang's ``--pp-async-batch-depth``: microbatches in flight beyond one per stage) and
    its queue order (``fcfs``, or ``late_last``: docs/POLICIES.md)."""

    layout: Layout
    policy: str
    async_depth: int = 0
    queue_order: str = "fcfs"

    @property
    def label(self) -> str:
        depth = f" async{self.async_depth}" if self.async_depth else ""
        order = f" {self.queue_order}" if self.queue_order != "fcfs" else ""
        return f"{self.layout.label} {self.policy}{depth}{order}"

    def max_tokens(self, chunk_candidates: Sequence[int] | None = None) -> int:
        """The most tokens one microbatch can hold under this policy (its chunk ceiling)."""
        chunk = static_chunk(self.policy)
        if chunk is not None:
            return chunk
        return max(chunk_candidates or DEFAULT_CANDIDATES)


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def powers_of_two(limit: int) -> list[int]:
    return [1 << k for k in range(int(math.log2(limit)) + 1)] if limit >= 1 else []


def enumerate_layouts(
    model: ModelShape, gpu: GpuSpec, num_gpus: int, min_kv_tokens: int
) -> tuple[list[LayoutFit], list[LayoutExclusion]]:
    """Every dp x tp x pp = ``num_gpus`` (tp, pp powers of two), split into those that fit
    (analytic memory model) and those excluded with a reason. ``min_kv_tokens``: the KV pool
    a replica needs at least (the workload's P99 request)."""
    if not is_power_of_two(num_gpus):
        raise ValueError(f"--gpus must be a power of two (1, 2, 4, 8, ...), got {num_gpus}")
    fits, excluded = [], []
    for tp in powers_of_two(num_gpus):
        for pp in powers_of_two(num_gpus // tp):
            layout = Layout(num_gpus // (tp * pp), tp, pp)
            reason = shape_problem(model, tp, pp)
            if reason is None:
                kv, reason = memory_fit(model, gpu, tp, pp, min_kv_tokens)
            if reason is None:
                fits.append(LayoutFit(layout, kv))
            else:
                excluded.append(LayoutExclusion(layout, reason))
    return fits, excluded


def profile_layouts(
    profiles: Sequence[Profile], num_gpus: int, min_kv_tokens: int
) -> tuple[list[LayoutFit], list[LayoutExclusion]]:
    """The layouts measured profiles fix (each its own pp x tp, dp filling ``num_gpus``)."""
    if not is_power_of_two(num_gpus):
        raise ValueError(f"--gpus must be a power of two (1, 2, 4, 8, ...), got {num_gpus}")
    fits, excluded = [], []
    for prof in profiles:
        per_replica = prof.pp * prof.tp
        if num_gpus % per_replica:
            raise ValueError(
                f"profile {prof.name} needs {per_replica} devices per replica, "
                f"which does not divide --gpus {num_gpus}"
            )
        layout = Layout(num_gpus // per_replica, prof.tp, prof.pp)
        if prof.kv_capacity_tokens < min_kv_tokens:
            excluded.append(LayoutExclusion(layout, _kv_short(prof.kv_capacity_tokens, min_kv_tokens)))
        else:
            fits.append(LayoutFit(layout, prof.kv_capacity_tokens))
    return fits, excluded


def shape_problem(model: ModelShape, tp: int, pp: int) -> str | None:
    """Why ``model`` cannot be split tp x pp (None when it can)."""
    if pp > model.num_layers:
        return f"pp {pp} > {model.num_layers} layers"
    for what, n in (
        ("KV heads", model.num_kv_heads),
        ("attention heads", model.num_heads),
        ("MLP width", model.intermediate_size),
    ):
        if n % tp:
            return f"tp {tp} does not divide the {n} {what}"
    return None


def memory_fit(
    model: ModelShape, gpu: GpuSpec, tp: int, pp: int, min_kv_tokens: int
) -> tuple[int, str | None]:
    """(KV tokens a replica holds, why it does not fit or None)."""
    capacities = kv_capacity_per_stage(model, gpu, pp, tp, MEM_FRACTION)
    worst = min(range(pp), key=capacities.__getitem__)
    if capacities[worst] <= 0:
        layers = pp_layer_split(model.num_layers, pp)[worst]
        left_gib = MEM_FRACTION * gpu.memory_bytes / GIB - 1
        if left_gib <= 0:
            return 0, (
                f"a {gpu.name} of {gpu.memory_bytes / GIB:g} GiB leaves no memory for weights after "
                f"the runtime reserve and activation headroom"
            )
        return 0, (
            f"weights do not fit: stage {worst} ({layers} layers over tp {tp}) needs more "
            f"than the {left_gib:.1f} GiB a {gpu.name} leaves after the runtime reserve and "
            f"activation headroom"
        )
    if capacities[worst] < min_kv_tokens:
        return capacities[worst], _kv_short(capacities[worst], min_kv_tokens)
    return capacities[worst], None


def _kv_short(capacity: int, needed: int) -> str:
    return f"KV pool of {capacity:,} tokens is smaller than the workload's P99 request ({needed:,} tokens)"


def _registered(spec: str) -> bool:
    """Whether ``spec``'s chunk policy name is registered (its argument is checked when the
    candidate's scheduler is built)."""
    try:
        check_policy_name(spec)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class PolicyGrid:
    """The policies tried on every layout: ``static:N`` for N in ``statics``, the ``dynamic``
    ones, each with and/or without ``+ds`` (``ds``: "both", "only" or "none"; +ds only when
    pp > 1), and ``exact`` specs as given."""

    statics: tuple[int, ...] = DEFAULT_STATIC_GRID
    dynamic: tuple[str, ...] = DYNAMIC_POLICIES
    ds: str = "both"
    exact: tuple[str, ...] = ()

    def for_layout(self, layout: Layout) -> list[str]:
        base = [f"static:{c}" for c in self.statics] + list(self.dynamic)
        with_ds = [f"{p}+ds" for p in base] if layout.pp > 1 else []
        specs = {"both": base + with_ds, "only": with_ds, "none": base}[self.ds]
        exact = [s for s in self.exact if layout.pp > 1 or "+ds" not in s]
        return list(dict.fromkeys(specs + exact))

    @classmethod
    def parse(cls, text: str | None) -> PolicyGrid:
        """``--policies``: a comma list of ``static`` (the default chunk grid), ``static:N``,
        ``greedy``, ``predictive`` or any other chunk policy ``fastpp policies`` lists
        (``slack``, ``greedy:tile``), full specs (``predictive+ds``), and ``ds`` (only the +ds
        variants) or ``no-ds`` (none). Without a chunk or dynamic entry, all of the default
        ones. ValueError naming an unknown entry."""
        if text is None or not text.strip():
            return cls()
        statics: list[int] = []
        dynamic: list[str] = []
        exact: list[str] = []
        ds = "both"
        grid = False
        for word in (w.strip() for w in text.split(",") if w.strip()):
            if word == "static":
                grid = True
            elif word.startswith("static:") and "+" not in word:
                n = word.partition(":")[2]
                if not n.isdigit() or int(n) < 1:
                    raise ValueError(f"--policies: static:N needs N >= 1 tokens, got {word!r}")
                statics.append(int(n))
            elif word in ("ds", "no-ds"):
                ds = "only" if word == "ds" else "none"
            elif "+" in word:
                exact.append(word)
            elif _registered(word):  # greedy, predictive or any other chunk policy
                dynamic.append(word)
            else:
                raise ValueError(
                    f"--policies: unknown entry {word!r}; use static, static:N, greedy, "
                    "predictive, another chunk policy of `fastpp policies` (slack, greedy:tile), "
                    "ds, no-ds or a spec such as predictive+ds"
                )
        if not (statics or dynamic or exact or grid):
            return cls(ds=ds)
        chunks = tuple(dict.fromkeys((DEFAULT_STATIC_GRID if grid else ()) + tuple(statics)))
        return cls(chunks, tuple(dict.fromkeys(dynamic)), ds, tuple(dict.fromkeys(exact)))

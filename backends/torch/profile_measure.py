"""Timing loops of the torch profiler: microbatch shapes through one stage, the LM head, the host.

Every timing is the median of ``repeats`` runs after ``warmup`` untimed ones, wall clock
(``time.perf_counter``), seconds. Weights and cache contents are whatever they are: CPU kernel
time does not depend on values. A shape is laid out as the engine lays out a plan
(``BatchLayout.from_plan``: decodes first, then prefill chunks).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from fastpp.backends.torch.layout import BatchLayout
from fastpp.backends.torch.model import StageModel
from fastpp.backends.torch.profile_config import ProfileGrid
from fastpp.policies.base import StaticChunkPolicy
from fastpp.scheduler import Scheduler
from fastpp.scheduler_config import SchedulerConfig
from fastpp.types import Request

Tick = Callable[[], None]
MAX_RUNS = 200  # timed runs of one shape at most (what ProfileGrid.min_time_s can ask for)
# A shape whose runs spread more than this fraction of their median (another process took the
# core for a while) gets up to EXTRA_PASSES more runs after the regular passes.
MAX_SPREAD = 0.2
EXTRA_PASSES = 2


@dataclass(frozen=True, slots=True)
class Shape:
    """One microbatch: prefill chunks ``(L_pre, L_past)`` and decodes at context ``L_dec`` (the
    decoded token included, as ``MicroBatchPlan.decode_ctx`` counts it)."""

    kind: str  # "chunk" | "split" | "prefix" | "decode" | "holdout"
    chunks: tuple[tuple[int, int], ...] = ()
    decode_ctx: tuple[int, ...] = ()
    num_completing: int = 0  # chunks (the first ones) that end their prompt and sample
    samples: bool = False  # False: no logits at all (grid shapes measure the stage body only)

    @property
    def num_tokens(self) -> int:
        return len(self.decode_ctx) + sum(n for n, _ in self.chunks)

    @property
    def num_sampled(self) -> int:
        """Rows that produce logits when ``samples`` (decodes and completing chunks)."""
        return len(self.decode_ctx) + self.num_completing if self.samples else 0

    @property
    def features(self) -> tuple[int, int, int, int]:
        """[num_tokens, sum L_past*L_pre, sum L_pre^2, sum L_dec]: the predictor's X row."""
        return (
            self.num_tokens,
            sum(n * p for n, p in self.chunks),
            sum(n * n for n, _ in self.chunks),
            sum(self.decode_ctx),
        )

    @property
    def kv_tokens(self) -> int:
        return sum(self.decode_ctx) + sum(n + p for n, p in self.chunks)

    def entries(self) -> list[tuple[int, int, int, bool]]:
        """``BatchLayout.build`` entries: decodes first, then chunks (request ids 0, 1, ...)."""
        out = [(i, 1, ctx - 1, self.samples) for i, ctx in enumerate(self.decode_ctx)]
        base = len(out)
        out += [
            (base + j, n, p, self.samples and j < self.num_completing) for j, (n, p) in enumerate(self.chunks)
        ]
        return out


def grid_shapes(grid: ProfileGrid, max_context: int) -> list[Shape]:
    """The fitted shapes of ``grid`` (see :class:`ProfileGrid`) that fit in ``max_context``
    positions, in a fixed order."""
    shapes = [Shape("chunk", chunks=((n, 0),)) for n in grid.tokens]
    for n in grid.split_tokens:
        k = grid.num_splits
        shapes.append(Shape("split", chunks=tuple((n // k + (i < n % k), 0) for i in range(k))))
    shapes += [
        Shape("prefix", chunks=((n, p),)) for p in grid.past for n in grid.chunks if n + p <= max_context
    ]
    shapes += [
        Shape("decode", decode_ctx=_spread(b, ctx, max_context))
        for b in grid.decode_batches
        for ctx in grid.decode_ctx
        if b * ctx <= grid.max_kv_tokens
    ]
    return shapes


def _spread(num: int, mean_ctx: int, max_context: int) -> tuple[int, ...]:
    """``num`` decode contexts evenly spread from mean/4 to 7/4 of the mean (capped at
    ``max_context``). Serving batches mix contexts, and the engine's decode attention pads every
    row to the longest (one SDPA call): equal contexts would measure it without that padding."""
    if num == 1:
        return (mean_ctx,)
    lo = max(2, mean_ctx // 4)
    hi = min(2 * mean_ctx - lo, max_context)
    return tuple(round(lo + (hi - lo) * i / (num - 1)) for i in range(num))


def holdout_shapes(grid: ProfileGrid, max_context: int, seed: int) -> list[Shape]:
    """``grid.num_holdout`` random serving-like microbatches (seeded): some decodes at random
    contexts plus one chunk after a random prefix, within the grid's ranges, sampling as served."""
    rng = random.Random(seed)
    top = max(grid.tokens)
    max_dec = min(max(grid.decode_batches, default=0), top)
    max_ctx = min(max(grid.decode_ctx, default=16), max_context)
    max_past = max(grid.past, default=0)
    shapes = []
    for _ in range(grid.num_holdout):
        num_dec = rng.randint(0, max_dec)
        ctx_cap = max(2, min(max_ctx, grid.max_kv_tokens // (2 * max(num_dec, 1))))
        ctx = tuple(rng.randint(2, ctx_cap) for _ in range(num_dec))
        room = top - num_dec
        pre = rng.randint(2, room) if room >= 2 else 0
        past = rng.randint(0, min(max_past, max_context - pre)) if pre and rng.random() < 0.7 else 0
        chunks = ((pre, past),) if pre else ()
        if not chunks and not ctx:
            ctx = (rng.randint(2, max_ctx),)
        shapes.append(Shape("holdout", chunks, ctx, num_completing=rng.randint(0, len(chunks)), samples=True))
    return shapes


def _median_s(fn: Callable[[], object], grid: ProfileGrid) -> float:
    """Median seconds of ``fn`` over at least ``grid.repeats`` runs and at least
    ``grid.min_time_s`` of runs (at most MAX_RUNS), after ``grid.warmup`` untimed runs."""
    for _ in range(grid.warmup):
        fn()
    times: list[float] = []
    while len(times) < grid.repeats or (sum(times) < grid.min_time_s and len(times) < MAX_RUNS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_stage(
    stage: StageModel, shapes: Sequence[Shape], grid: ProfileGrid, block_size: int, seed: int, tick: Tick
) -> list[float]:
    """Median seconds of ``stage`` on each shape, in order.

    The shapes are timed in ``grid.repeats`` interleaved passes (every shape once per pass, a
    short one again until the pass holds ``min_time_s / repeats`` of it), so a burst of load from
    another process spoils one sample of several shapes instead of every sample of one. First the
    largest shapes (most tokens, most KV) run ``grid.warmup`` times untimed: smaller shapes then
    reuse warmed buffers. Shapes whose runs still disagree (``MAX_SPREAD``) get extra runs at
    the end. ``tick`` after each shape of each regular pass.
    """
    cfg = stage.config
    blocks = max(
        sum(-(-n // block_size) for n in (*s.decode_ctx, *(a + b for a, b in s.chunks))) for s in shapes
    )
    cache = stage.make_kv_cache(num_blocks=blocks, block_size=block_size)
    gen = torch.Generator().manual_seed(seed)
    layouts = [BatchLayout.build(s.entries()) for s in shapes]
    if stage.has_embedding:  # x: [T] token ids
        inputs = [torch.randint(cfg.vocab_size, (lay.num_tokens,), generator=gen) for lay in layouts]
    else:  # x: [T, D] hidden states
        inputs = [
            torch.randn(lay.num_tokens, cfg.hidden_size, generator=gen).to(stage.dtype) for lay in layouts
        ]

    def run(k: int) -> float:
        layout = layouts[k]
        for seq in layout.seqs:
            cache.allocate(seq.req_id, seq.context_len)
        t0 = time.perf_counter()
        stage(inputs[k], layout, cache)
        dt = time.perf_counter() - t0
        for seq in layout.seqs:
            cache.free(seq.req_id)
        return dt

    largest = {
        max(range(len(shapes)), key=lambda k: shapes[k].num_tokens),
        max(range(len(shapes)), key=lambda k: shapes[k].kv_tokens),
    }
    for k in sorted(largest):
        for _ in range(grid.warmup):
            run(k)
    times: list[list[float]] = [[] for _ in shapes]
    per_pass_s = grid.min_time_s / grid.repeats
    for _ in range(grid.repeats):
        for k in range(len(shapes)):
            spent = 0.0
            while (not spent or spent < per_pass_s) and len(times[k]) < MAX_RUNS:
                times[k].append(run(k))
                spent += times[k][-1]
            tick()
    for _ in range(EXTRA_PASSES):  # shapes whose runs disagree get more, later, runs
        noisy = [k for k, t in enumerate(times) if (max(t) - min(t)) > MAX_SPREAD * statistics.median(t)]
        for k in noisy:
            times[k].append(run(k))
    return [statistics.median(t) for t in times]


def measure_lm_head(
    stage: StageModel, sampled: Sequence[int], grid: ProfileGrid, seed: int, tick: Tick
) -> list[float]:
    """Median seconds of the last stage's final norm + LM head + greedy argmax on S rows, per S
    (what ``StageModel.forward`` adds for S sampling rows, plus greedy sampling)."""
    assert stage.norm is not None and stage.lm_head is not None
    norm, head = stage.norm, stage.lm_head
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2 * max(sampled), stage.config.hidden_size, generator=gen).to(stage.dtype)
    out = []
    for s in sampled:
        rows = torch.arange(1, 2 * s, 2)  # a gather of S rows, as forward() picks the sampling rows

        @torch.inference_mode()
        def run(rows: torch.Tensor = rows) -> torch.Tensor:
            return head(norm(x[rows])).float().argmax(dim=-1)

        out.append(_median_s(run, grid))
        tick()
    return out


def measure_host_overhead(
    num_slots: int,
    kv_capacity_tokens: int,
    page_size: int,
    max_context: int,
    num_requests: int = 256,
    num_samples: int = 200,
) -> tuple[float, int]:
    """Median seconds of one host step of the engine: ``Scheduler.schedule`` + ``update`` +
    ``BatchLayout.from_plan``, in a steady state of a static 512-token chunk with decodes running
    and prompts queued. Returns (seconds, mean tokens per measured microbatch)."""
    config = SchedulerConfig(
        num_slots=num_slots,
        kv_capacity_tokens=kv_capacity_tokens,
        page_size=page_size,
        max_context=max_context,
        default_chunk=512,
        token_step=0,
    )
    sched = Scheduler(config, time.perf_counter, StaticChunkPolicy(512))
    rng = random.Random(0)
    prompt_cap = max(2, min(1024, max_context // 2))
    for i in range(num_requests):
        sched.add_request(Request(i, 0.0, rng.randint(1, prompt_cap), rng.randint(16, 256)))
    times, tokens = [], []
    slot = 0
    for step in range(10 * num_samples):
        if len(times) >= num_samples or not sched.has_work:
            break
        t0 = time.perf_counter()
        plan = sched.schedule(slot)
        if plan is not None:
            BatchLayout.from_plan(plan)
            sched.update(plan)
        dt = time.perf_counter() - t0
        slot = (slot + 1) % num_slots
        if plan is not None and step >= 4 * num_slots:  # past the first admissions
            times.append(dt)
            tokens.append(plan.num_tokens)
    if not times:
        raise RuntimeError("host overhead: the scheduler produced no microbatch to time")
    return statistics.median(times), round(sum(tokens) / len(tokens))

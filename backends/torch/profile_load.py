"""Concurrent load for the torch profiler: keep the other pipeline stages computing while one is timed.

In serving (``fastpp serve --pp N``) every stage process computes at the same time as the others
and they share the cores' memory bandwidth and caches; a stage timed alone runs faster than it
does there. ``concurrent_load(config, timed_stage)`` starts one spawned process per other stage,
each building its stage (seeded random weights: timing does not depend on values) with the
profile's intra-op threads and looping forward passes of one mixed microbatch (``LOAD_SHAPE``: a
256-token chunk after a 256-token prefix plus 16 decodes around 512 tokens of context, the last
stage sampling) until the context exits. It returns once every process has run a pass.
The load is continuous, an upper bound on the contention of serving, where a stage also waits for
its input now and then.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterator
from contextlib import contextmanager

from fastpp.backends.torch.profile_config import TorchProfileConfig
from fastpp.backends.torch.profile_measure import Shape, _spread

STARTUP_TIMEOUT_S = 300.0  # spawn + import torch + build the stage + its first pass
LOAD_SHAPE = Shape(
    "load", chunks=((256, 256),), decode_ctx=_spread(16, 512, 1 << 30), num_completing=1, samples=True
)


def load_description(config: TorchProfileConfig) -> str:
    """What the profile's provenance says about the load (``concurrent_load``)."""
    ((n, past),) = LOAD_SHAPE.chunks
    num_dec = len(LOAD_SHAPE.decode_ctx)
    return (
        f"each stage timed while the other {config.pp - 1} stage(s) looped forward passes in their own "
        f"process ({config.num_threads} intra-op thread(s) each, random weights), one mixed microbatch: "
        f"{n}-token chunk after {past} cached tokens + {num_dec} decodes at mean context "
        f"{sum(LOAD_SHAPE.decode_ctx) // num_dec}"
    )


@contextmanager
def concurrent_load(
    config: TorchProfileConfig, timed_stage: int, timeout_s: float = STARTUP_TIMEOUT_S
) -> Iterator[None]:
    """Run every stage but ``timed_stage`` in a background process for the ``with`` block."""
    ctx = mp.get_context("spawn")  # fork would copy this process's torch threads and locks
    stop = ctx.Event()
    procs = []
    try:
        for s in range(config.pp):
            if s != timed_stage:
                ready = ctx.Event()
                proc = ctx.Process(
                    target=_loop, args=(config, s, ready, stop), daemon=True, name=f"fastpp-profile-load-{s}"
                )
                proc.start()
                procs.append((proc, ready))
        for proc, ready in procs:
            if not ready.wait(timeout_s):
                raise RuntimeError(
                    f"concurrent load: {proc.name} did not start in {timeout_s:.0f} s "
                    f"(exit code {proc.exitcode})"
                )
        yield
        dead = [p.name for p, _ in procs if not p.is_alive()]
        if dead:
            raise RuntimeError(f"concurrent load: {', '.join(dead)} stopped during the measurement")
    finally:
        stop.set()
        for proc, _ in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()


def _loop(config: TorchProfileConfig, s: int, ready, stop) -> None:
    """Background process: build stage ``s`` and run ``LOAD_SHAPE`` through it until ``stop``."""
    import torch

    from fastpp.backends.torch.layout import BatchLayout
    from fastpp.backends.torch.model import StageModel, split_layers
    from fastpp.backends.torch.weights import random_weights

    torch.set_num_threads(config.num_threads)
    cfg = config.model_config
    dtype = getattr(torch, config.dtype)
    stage = StageModel(
        cfg,
        split_layers(cfg.num_layers, config.pp)[s],
        has_embedding=s == 0,
        has_lm_head=s == config.pp - 1,
        dtype=dtype,
    )
    stage.load_weights(random_weights(cfg, seed=config.seed, dtype=dtype))
    shape = Shape(
        "load",
        tuple((min(n, cfg.max_context // 2), min(p, cfg.max_context // 2)) for n, p in LOAD_SHAPE.chunks),
        tuple(min(c, cfg.max_context) for c in LOAD_SHAPE.decode_ctx),
        LOAD_SHAPE.num_completing,
        LOAD_SHAPE.samples,
    )
    layout = BatchLayout.build(shape.entries())
    blocks = sum(-(-seq.context_len // config.block_size) for seq in layout.seqs)
    cache = stage.make_kv_cache(num_blocks=blocks, block_size=config.block_size)
    for seq in layout.seqs:
        cache.allocate(seq.req_id, seq.context_len)
    gen = torch.Generator().manual_seed(config.seed + s)
    if stage.has_embedding:
        x = torch.randint(cfg.vocab_size, (layout.num_tokens,), generator=gen)
    else:
        x = torch.randn(layout.num_tokens, cfg.hidden_size, generator=gen).to(dtype)
    with torch.inference_mode():
        stage(x, layout, cache)
        ready.set()
        while not stop.is_set():
            stage(x, layout, cache)

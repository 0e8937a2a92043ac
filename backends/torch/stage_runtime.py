"""One pipeline stage at run time: its layers, its paged KV cache, and the loop of a stage process.

Stage 0 runs inside the engine's process (``PipelineEngine``); stages 1..P-1 run
:func:`stage_main` in processes of their own. Every stage applies the same KV frees and
allocations, carried by each microbatch, before computing it, so all caches hold the same
requests. A microbatch's metadata (a plain dict, see :func:`make_meta`) travels with its hidden
states and collects each stage's (rank, start, end) times on ``time.perf_counter``'s clock,
which is CLOCK_MONOTONIC and so comparable across processes on one machine.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from fastpp.backends.torch.layout import BatchLayout
from fastpp.backends.torch.model import StageModel, split_layers
from fastpp.backends.torch.sampling import FAILED_TOKEN, sample_rows
from fastpp.backends.torch.stage_liveness import Liveness, collective_timeout, ignore_stop_signals
from fastpp.backends.torch.weights import ModelWeights
from fastpp.backends.torch.weights_source import WeightsSource
from fastpp.backends.torch.wire import (
    BACKWARD,
    FORWARD,
    KIND_BATCH,
    KIND_PING,
    KIND_RESULT,
    KIND_STOP,
    Channel,
)

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True, slots=True)
class StageSpec:
    """Everything a stage process needs, picklable (it crosses a spawn)."""

    weights: WeightsSource
    num_stages: int
    kv_blocks: int
    block_size: int
    dtype: str = "float32"
    threads: int = 1  # intra-op threads per stage
    store_path: str = ""  # the rendezvous file (torch.distributed FileStore: no socket to listen on)
    stage_timeout_s: float = 30.0  # a stage that makes no progress this long is declared stalled
    seed: int = 0  # the sampler's seed for requests without one
    cores: tuple[int, ...] = ()  # the CPU core of each rank's computing thread (): unpinned

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        for name in ("num_stages", "kv_blocks", "block_size", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.cores and len(self.cores) != self.num_stages:
            raise ValueError(f"cores must name one core per stage ({self.num_stages}), got {self.cores}")

    def pin(self, rank: int) -> None:
        """Pin the calling thread (on Linux, only it) to rank's core, when cores are given."""
        if self.cores:
            os.sched_setaffinity(0, {self.cores[rank]})

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def make_meta(
    mb_id: int,
    layout: BatchLayout,
    frees: list[int],
    allocs: list[tuple[int, int]],
    rows: list[tuple],
    times: list[tuple[int, float, float]],
) -> dict[str, Any]:
    """The plain-data description of one microbatch that travels down the pipeline."""
    seqs = [(s.req_id, s.num_new_tokens, s.num_cached_tokens, s.samples) for s in layout.seqs]
    return {"mb": mb_id, "seqs": seqs, "frees": frees, "allocs": allocs, "rows": rows, "times": times}


class StageRunner:
    """A loaded stage and its cache; ``run`` applies a microbatch's KV changes, then computes it."""

    def __init__(self, spec: StageSpec, rank: int, weights: ModelWeights) -> None:
        config = weights.config
        ranges = split_layers(config.num_layers, spec.num_stages)
        self.rank = rank
        self.is_last = rank == spec.num_stages - 1
        self.model = StageModel(
            config, ranges[rank], has_embedding=rank == 0, has_lm_head=self.is_last, dtype=spec.torch_dtype
        )
        self.model.load_weights(weights)
        self.cache = self.model.make_kv_cache(spec.kv_blocks, spec.block_size)

    def apply_kv(self, frees: list[int], allocs: list[tuple[int, int]]) -> None:
        for rid in frees:
            if rid in self.cache:
                self.cache.free(rid)
        for rid, target in allocs:
            grow = target - self.cache.num_tokens(rid)
            if grow > 0:
                self.cache.allocate(rid, grow)

    def run(self, meta: dict[str, Any], inputs: torch.Tensor) -> torch.Tensor:
        self.apply_kv(meta["frees"], meta["allocs"])
        layout = BatchLayout.build(meta["seqs"])
        t0 = time.perf_counter()
        out = self.model(inputs, layout, self.cache)
        meta["times"].append((self.rank, t0, time.perf_counter()))
        return out


def stage_main(rank: int, spec: StageSpec, conn: Any, liveness: Liveness) -> None:
    """Body of stage process ``rank`` >= 1: load, report ready on ``conn``, wait for the engine's
    word to connect (it loads stage 0 first), then serve microbatches, beating on ``liveness``.

    Exits 0 after a STOP message, or if the engine went away before the word; on any error logs
    it and exits 1, which closes its sockets, so its neighbours' receives fail too and the engine
    learns of the death. SIGINT and SIGTERM are ignored (stage_liveness).
    """
    ignore_stop_signals()
    logging.basicConfig(level=logging.INFO, format=f"[stage {rank}] %(levelname)s %(message)s")
    torch.set_num_threads(spec.threads)
    spec.pin(rank)
    try:
        runner = StageRunner(spec, rank, spec.weights.load(spec.torch_dtype))
    except Exception as exc:  # report why, then die: the engine prints it
        conn.send(("error", f"stage {rank} failed to load: {exc!r}\n{traceback.format_exc()}"))
        os._exit(1)
    liveness.start_beating(rank)
    conn.send(("ready", rank))
    try:
        conn.recv()  # ("connect",): stage 0 has loaded too
    except (EOFError, OSError):
        os._exit(0)  # the engine stopped while loading
    conn.close()
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{spec.store_path}",
            rank=rank,
            world_size=spec.num_stages,
            timeout=collective_timeout(spec.stage_timeout_s),
        )
        serve_stage(runner, spec, liveness)
        dist.destroy_process_group()
    except Exception:
        log.error("stage %d stopped on an error:\n%s", rank, traceback.format_exc())
        os._exit(1)


def serve_stage(runner: StageRunner, spec: StageSpec, liveness: Liveness) -> None:
    """Receive, compute, pass on, until STOP. The last stage samples and returns tokens to stage 0;
    a ping goes on (from the last stage, back to stage 0) as it came."""
    hidden_size = runner.model.config.hidden_size
    inbox = Channel(runner.rank - 1, FORWARD, hidden_size, spec.torch_dtype)
    outbox = (
        Channel(0, BACKWARD)
        if runner.is_last
        else Channel(runner.rank + 1, FORWARD, hidden_size, spec.torch_dtype)
    )
    generator = torch.Generator().manual_seed(spec.seed)
    while True:
        kind, meta, hidden = inbox.recv()
        if kind == KIND_STOP:
            runner.apply_kv(meta["frees"], [])
            meta["free_blocks"].append(runner.cache.num_free_blocks)
            outbox.send(KIND_STOP, meta)
            outbox.flush()
            return
        if kind == KIND_PING:
            outbox.send(KIND_PING, meta)
            continue
        assert hidden is not None
        with liveness.step(runner.rank):
            out = run_or_fail(runner, meta, hidden)
            result = last_stage_result(meta, out, generator) if runner.is_last else None
        if result is not None:
            outbox.send(KIND_RESULT, result)
        else:
            outbox.send(KIND_BATCH, meta, out)


def run_or_fail(runner: StageRunner, meta: dict[str, Any], inputs: torch.Tensor) -> torch.Tensor:
    """Compute a microbatch; if that raises, or an earlier stage failed on it (``meta["failed"]``),
    the microbatch fails alone: its requests end with an error (and are freed everywhere), the
    stage goes on. It passes ``inputs`` on (the shape the next stage expects); after an earlier
    stage's failure the KV changes are applied all the same, as there."""
    if meta.get("failed") is None:
        try:
            return runner.run(meta, inputs)
        except Exception as exc:
            log.error(
                "stage %d failed on microbatch %s (its requests fail, the stage goes on):\n%s",
                runner.rank,
                meta["mb"],
                traceback.format_exc(),
            )
            meta["failed"] = f"stage {runner.rank} failed on this request's batch: {brief_error(exc)}"
            return inputs
    try:
        runner.apply_kv(meta["frees"], meta["allocs"])
    except Exception as exc:  # as where it failed first: the requests end, their frees follow
        log.error(
            "stage %d: KV changes of failed microbatch %s: %s", runner.rank, meta["mb"], brief_error(exc)
        )
    return inputs


def last_stage_result(
    meta: dict[str, Any], logits: torch.Tensor, generator: torch.Generator
) -> dict[str, Any]:
    """What the last stage returns to stage 0: a token per sampling row, and which rows (or, with
    ``failed``, the whole microbatch) failed and why."""
    result: dict[str, Any] = {"mb": meta["mb"], "times": meta["times"]}
    if meta.get("failed") is not None:
        result.update(tokens=[FAILED_TOKEN] * len(meta["rows"]), failed=meta["failed"])
        return result
    tokens, errors = sample_rows(logits, meta["rows"], generator)
    result["tokens"] = tokens
    if errors:
        log.error(
            "sampling failed for %d row(s) of microbatch %s (their requests fail): %s",
            len(errors),
            meta["mb"],
            next(iter(errors.values())),
        )
        result["errors"] = errors
    return result


def brief_error(exc: BaseException) -> str:
    """An exception as one short line for a client: its type and first line, no traceback."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text[:300]

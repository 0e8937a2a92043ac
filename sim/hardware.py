"""GPU and interconnect facts for the analytic cost model, plus the efficiencies fitted on them.

Units: FLOP/s, bytes, bytes/s, seconds. Every number names its source: a public NVIDIA spec
sheet, a PCI-SIG figure, or the measured vidur file it was fitted on (``../shared/data/
vidur_profiles``, refit and checked with ``python -m fastpp.sim.calibration``).

Spec sheets:
- [A100] NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4):
  BF16 dense 312 TFLOP/s; 40GB PCIe: HBM2 1,555 GB/s, PCIe Gen4 64 GB/s (both directions),
  NVLink only via a 2-GPU bridge; 80GB SXM: HBM2e 2,039 GB/s, NVLink 600 GB/s (both directions).
  108 SMs (A100 whitepaper).
- [H100] NVIDIA H100 Tensor Core GPU datasheet: SXM BF16 1,979 TFLOP/s *with sparsity*, so
  989.4 dense; HBM3 3.35 TB/s; 80 GB; NVLink 900 GB/s (both directions); 132 SMs.
- [H200] NVIDIA H200 Tensor Core GPU datasheet: same GH100 compute as H100 SXM (BF16 1,979
  sparse / 989.4 dense), HBM3e 141 GB at 4.8 TB/s, NVLink 900 GB/s.
- [PCIe4] PCI Express Base Specification 4.0: 16 GT/s per lane, 128b/130b coding, so an x16
  link carries 16e9 * 16 * 128/130 / 8 = 31.5e9 bytes/s per direction.
- Memory sizes are the totals nvidia-smi reports (MiB): A100-PCIE-40GB 40960,
  A100-SXM4-80GB 81920, H100 80GB HBM3 81559, H200 143771.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIB = 1024**2
GB = 1e9
PCIE4_X16_BYTES_PER_S = 16e9 * 16 * (128 / 130) / 8  # [PCIe4] 31.5e9 per direction


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model as the spec sheet states it (peak numbers, not achieved ones)."""

    name: str
    family: str  # "A100" | "H100": selects the fitted KernelEfficiency
    peak_bf16_flops: float  # dense BF16 tensor-core FLOP/s
    hbm_bytes_per_s: float  # HBM bandwidth
    memory_bytes: int  # total device memory
    num_sms: int
    interconnect: str  # default GPU-GPU link of a multi-GPU box of this part

    def __post_init__(self) -> None:
        if self.family not in EFFICIENCY:
            raise ValueError(f"{self.name}: no fitted efficiency for family {self.family!r}")
        for name in ("peak_bf16_flops", "hbm_bytes_per_s", "memory_bytes", "num_sms"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{self.name}: {name} must be > 0")


@dataclass(frozen=True, slots=True)
class InterconnectSpec:
    """Alpha-beta costs of GPU-GPU communication on one kind of link.

    Point-to-point (PP activations): ``p2p_latency_s + bytes / p2p_bytes_per_s``.
    Ring all-reduce over n GPUs (TP): ``2(n-1)/n * bytes / allreduce_bus_bytes_per_s
    + 2(n-1) * allreduce_alpha_s + allreduce_latency_s`` (``bus`` bandwidth as nccl-tests
    defines it). The textbook ring has only the per-step alpha; vidur's NVLink measurements
    show a latency that hardly grows with n (NCCL picks tree/LL protocols for small messages),
    so a constant per-call term is fitted as well and the per-step alpha comes out near zero.
    """

    name: str
    p2p_latency_s: float
    p2p_bytes_per_s: float
    allreduce_alpha_s: float  # per ring step
    allreduce_bus_bytes_per_s: float
    allreduce_latency_s: float = 0.0  # per call, independent of n

    def __post_init__(self) -> None:
        for name in ("p2p_latency_s", "allreduce_alpha_s", "allreduce_latency_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{self.name}: {name} must be >= 0")
        for name in ("p2p_bytes_per_s", "allreduce_bus_bytes_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{self.name}: {name} must be > 0")

    def allreduce_s(self, num_bytes: float, n: int) -> float:
        """Seconds for one ring all-reduce of ``num_bytes`` over ``n`` GPUs (0 when n == 1)."""
        if n <= 1:
            return 0.0
        return (
            2 * (n - 1) / n * num_bytes / self.allreduce_bus_bytes_per_s
            + 2 * (n - 1) * self.allreduce_alpha_s
            + self.allreduce_latency_s
        )

    def allreduce_fixed_s(self, n: int) -> float:
        """The size-independent part of one all-reduce over ``n`` GPUs."""
        return 0.0 if n <= 1 else 2 * (n - 1) * self.allreduce_alpha_s + self.allreduce_latency_s


@dataclass(frozen=True, slots=True)
class KernelEfficiency:
    """Achieved fractions of peak for one GPU family; the roofline's free parameters.

    The first five are FITTED by ``fastpp.sim.calibration.fit_family`` on the vidur mlp tables
    of that family (minimum MAPE of the per-layer linear time); the attention ones are stated
    assumptions (vidur's attention tables are not in our copy of the data).
    """

    gemm_flops_frac: float  # achieved / peak tensor FLOP/s in a large GEMM
    gemm_bw_frac: float  # achieved / peak HBM bandwidth of a memory-bound GEMM
    gemm_floor_s: float  # per-GEMM fixed cost (launch, tail wave), seconds
    elementwise_bw_frac: float  # achieved / peak HBM bandwidth of norms, rope, act, add
    elementwise_floor_s: float  # per elementwise kernel fixed cost, seconds
    embedding_s_per_token_hidden: float  # embedding lookup, s per (token * hidden) [vidur emb]
    attn_flops_frac: float  # prefill attention achieved / peak FLOP/s (assumption)
    decode_attn_bw_frac: float  # decode attention achieved / peak HBM bandwidth (assumption)
    token_step: int = 128  # GEMM M-tile in tokens; the steps in the vidur tables

    def __post_init__(self) -> None:
        for name in (
            "gemm_flops_frac",
            "gemm_bw_frac",
            "elementwise_bw_frac",
            "attn_flops_frac",
            "decode_attn_bw_frac",
        ):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        for name in ("gemm_floor_s", "elementwise_floor_s", "embedding_s_per_token_hidden"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.token_step < 1:
            raise ValueError(f"token_step must be >= 1, got {self.token_step}")


# Fitted by `python -m fastpp.sim.calibration --fit` (Nelder-Mead on MAPE of the per-layer sum
# attn_pre_proj + attn_post_proj + mlp_up_proj + mlp_act + mlp_down_proj + 2 norms + rope + add,
# medians, every num_tokens and TP degree of the family's *_mlp.csv files). A100 files were
# measured on A100-SXM4-80GB, H100 files on H100-SXM (vidur's DGX nodes): fractions are of
# those parts' peaks. Attention fractions: FlashAttention-2 (Dao, 2023, fig. 4) reaches
# 0.55-0.73 of A100 peak in the forward pass at head_dim 128 and ~0.35 of H100 peak; serving
# kernels on paged KV with chunked prefill do worse, so 0.5 (A100) and 0.35 (H100). Decode
# attention streams the KV cache; FlashInfer (Ye et al., 2025, fig. 7) reports 60-80% of HBM
# bandwidth on long contexts and less on short ones: 0.6.
EFFICIENCY: dict[str, KernelEfficiency] = {
    "A100": KernelEfficiency(
        gemm_flops_frac=0.734,
        gemm_bw_frac=0.744,
        gemm_floor_s=9.09e-6,
        elementwise_bw_frac=0.546,
        elementwise_floor_s=0.03e-6,
        embedding_s_per_token_hidden=1.33e-11,
        attn_flops_frac=0.5,
        decode_attn_bw_frac=0.6,
    ),
    "H100": KernelEfficiency(
        gemm_flops_frac=0.680,
        gemm_bw_frac=0.949,
        gemm_floor_s=6.42e-6,
        elementwise_bw_frac=0.95,
        elementwise_floor_s=6.97e-6,
        embedding_s_per_token_hidden=7.25e-12,
        attn_flops_frac=0.35,
        decode_attn_bw_frac=0.6,
    ),
}

GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("A100-40GB-PCIe", "A100", 312e12, 1555 * GB, 40960 * MIB, 108, "pcie4"),
        GpuSpec("A100-80GB-SXM", "A100", 312e12, 2039 * GB, 81920 * MIB, 108, "nvlink3"),
        GpuSpec("H100-SXM", "H100", 989.4e12, 3350 * GB, 81559 * MIB, 132, "nvlink4"),
        GpuSpec("H200", "H100", 989.4e12, 4800 * GB, 143771 * MIB, 132, "nvlink4"),
    )
}

_GPU_ALIASES = {
    "a100-40gb-pcie": "A100-40GB-PCIe",
    "a100-40gb": "A100-40GB-PCIe",
    "a100-pcie": "A100-40GB-PCIe",
    "a100-pcie-40gb": "A100-40GB-PCIe",
    "a100-80gb-sxm": "A100-80GB-SXM",
    "a100-80gb": "A100-80GB-SXM",
    "a100-sxm": "A100-80GB-SXM",
    "a100": "A100-80GB-SXM",
    "h100-sxm": "H100-SXM",
    "h100": "H100-SXM",
    "h100-80gb": "H100-SXM",
    "h100-sxm-80gb": "H100-SXM",
    "h200": "H200",
    "h200-sxm": "H200",
    "h200-141gb": "H200",
}

# Point-to-point and all-reduce costs per link kind.
# - nvlink3 / nvlink4: latencies and bandwidths FITTED (least relative squares) on vidur's
#   a100_dgx_{send_recv,all_reduce}.csv and h100_dgx_*.csv, intra-node rows
#   (devices_per_node == num_workers), all-reduce over n in {2, 4, 8} jointly (NVLink3 spec:
#   300 GB/s per direction, fitted p2p 286; NVLink4: 450 per direction, fitted 358).
# - pcie4: from [PCIe4] 31.5e9 B/s per direction at an achieved fraction of 0.75 for both
#   point-to-point and the all-reduce ring, with 9 us per ring step; both cross-checked on
#   vidur's a100_pairwise_nvlink_all_reduce.csv at n=4 (NVLink pairs joined over PCIe, so the
#   ring's slowest hop is PCIe): fitted bus bandwidth 23.6e9 B/s = 0.75 x 31.5e9, alpha 9.2 us
#   per step. ASSUMPTION: GPU peer-to-peer traffic crosses the CPU's host bridge (root
#   complex) as on the paper's EPYC box, which allows P2P at about the same rate; a box that
#   stages through host memory (P2P disabled) is slower still (pass a faster-failing
#   interconnect explicitly). Point-to-point latency 15 us: NCCL send/recv through the host
#   bridge (vidur's NVLink p2p alpha is 8-13 us; PCIe adds the bridge): assumption.
# - loopback: one GPU talking to itself (tests, tp=pp=1): free.
INTERCONNECTS: dict[str, InterconnectSpec] = {
    i.name: i
    for i in (
        InterconnectSpec(
            "pcie4",
            p2p_latency_s=15e-6,
            p2p_bytes_per_s=0.75 * PCIE4_X16_BYTES_PER_S,
            allreduce_alpha_s=9.2e-6,
            allreduce_bus_bytes_per_s=0.75 * PCIE4_X16_BYTES_PER_S,
        ),
        InterconnectSpec(
            "nvlink3",
            p2p_latency_s=13.2e-6,
            p2p_bytes_per_s=286 * GB,
            allreduce_alpha_s=0.44e-6,
            allreduce_bus_bytes_per_s=154 * GB,
            allreduce_latency_s=30.8e-6,
        ),
        InterconnectSpec(
            "nvlink4",
            p2p_latency_s=7.6e-6,
            p2p_bytes_per_s=358 * GB,
            allreduce_alpha_s=0.79e-6,
            allreduce_bus_bytes_per_s=328 * GB,
            allreduce_latency_s=18.3e-6,
        ),
        InterconnectSpec(
            "loopback",
            p2p_latency_s=0.0,
            p2p_bytes_per_s=1e15,
            allreduce_alpha_s=0.0,
            allreduce_bus_bytes_per_s=1e15,
        ),
    )
}


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def get_gpu(name: str) -> GpuSpec:
    """Look a GPU up by name or alias, case-insensitively ("a100-40gb", "h100", "H200").

    Raises ValueError naming the input and listing the known names.
    """
    key = _norm(name)
    canonical = _GPU_ALIASES.get(key) or next((g for g in GPUS if _norm(g) == key), None)
    if canonical is None:
        raise ValueError(
            f"unknown GPU {name!r}; known: {', '.join(GPUS)} (aliases: {', '.join(sorted(_GPU_ALIASES))})"
        )
    return GPUS[canonical]


def get_interconnect(name: str) -> InterconnectSpec:
    """Look an interconnect up by name ("pcie4", "nvlink3", "nvlink4", "loopback")."""
    try:
        return INTERCONNECTS[_norm(name)]
    except KeyError:
        raise ValueError(f"unknown interconnect {name!r}; known: {', '.join(INTERCONNECTS)}") from None


def efficiency_for(gpu: GpuSpec) -> KernelEfficiency:
    """The fitted efficiencies of ``gpu``'s family (H200 reuses H100's: same GH100 compute;
    its own, higher bandwidth enters through ``gpu.hbm_bytes_per_s``)."""
    return EFFICIENCY[gpu.family]


# What the efficiencies above were fitted on, and the error the calibration report measured
# (recorded into every analytic profile's provenance).
CALIBRATION_FILES: dict[str, tuple[str, ...]] = {
    "A100": (
        "a100_Qwen-72B_mlp.csv",
        "a100_CodeLlama-34b-Instruct-hf_mlp.csv",
        "a100_Llama-2-7b-hf_mlp.csv",
        "a100_dgx_send_recv.csv",
        "a100_dgx_all_reduce.csv",
        "a100_pairwise_nvlink_all_reduce.csv",
    ),
    "H100": (
        "h100_Qwen-72B_mlp.csv",
        "h100_CodeLlama-34b-Instruct-hf_mlp.csv",
        "h100_dgx_send_recv.csv",
        "h100_dgx_all_reduce.csv",
    ),
}
CALIBRATION_MAPE: dict[str, str] = {
    "A100": "linear MAPE 3.6%, P95 APE 10.7% (3108 points, 3 models x TP 1/2/4/8)",
    "H100": "linear MAPE 5.0%, P95 APE 16.4% (2072 points, 2 models x TP 1/2/4/8)",
}


# --------------------------------------------------------------------------- user-given GPUs

# Datasheet keys a GPU given by its numbers takes (``NAME:key=value,...``), with their units.
DATASHEET_KEYS = {
    "bf16_tflops": "dense BF16 tensor TFLOP/s",
    "hbm_gbps": "memory bandwidth, GB/s",
    "memory_gib": "device memory, GiB",
    "interconnect": f"one of {', '.join(INTERCONNECTS)}",
    "family": f"efficiencies to borrow: {', '.join(EFFICIENCY)}",
    "sms": "streaming multiprocessors",
}


MAX_DATASHEET_NUMBER = 1e9  # far above any GPU's TFLOP/s, GB/s, GiB or SM count; stops inf-like values


def parse_gpu_datasheet(text: str) -> GpuSpec:
    """A GPU from its datasheet numbers: ``L40S:bf16_tflops=362,hbm_gbps=864,memory_gib=48``
    (optional ``interconnect=pcie4``, ``family=A100``, ``sms=142``). Its achieved fractions are
    borrowed from ``family`` (default A100): an uncalibrated estimate. ValueError names the
    missing or bad key."""
    name, _, rest = text.partition(":")
    name = name.strip()
    if not name or not rest.strip():
        raise ValueError(f"GPU {text!r}: give a known name or NAME:bf16_tflops=..,hbm_gbps=..,memory_gib=..")
    values: dict[str, str] = {}
    for item in (i.strip() for i in rest.split(",") if i.strip()):
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in DATASHEET_KEYS:
            raise ValueError(
                f"GPU {name}: unknown datasheet entry {item!r}; keys: {', '.join(DATASHEET_KEYS)}"
            )
        values[key] = value.strip()
    missing = [k for k in ("bf16_tflops", "hbm_gbps", "memory_gib") if k not in values]
    if missing:
        raise ValueError(f"GPU {name}: missing {', '.join(missing)} (datasheet numbers)")
    try:
        flops, bw, mem = (float(values[k]) for k in ("bf16_tflops", "hbm_gbps", "memory_gib"))
        sms = int(values.get("sms", "108"))
    except ValueError as exc:
        raise ValueError(f"GPU {name}: datasheet numbers must be numbers ({exc})") from None
    for key, number in (("bf16_tflops", flops), ("hbm_gbps", bw), ("memory_gib", mem), ("sms", sms)):
        if not (math.isfinite(number) and number > 0) or number > MAX_DATASHEET_NUMBER:
            raise ValueError(
                f"GPU {name}: {key} must be a number in (0, {MAX_DATASHEET_NUMBER:g}], "
                f"got {values.get(key, number)}"
            )
    link = values.get("interconnect", "pcie4")
    get_interconnect(link)
    family = values.get("family", "A100").upper()
    if family not in EFFICIENCY:
        raise ValueError(f"GPU {name}: family must be one of {', '.join(EFFICIENCY)}, got {family!r}")
    return GpuSpec(name, family, flops * 1e12, bw * GB, int(mem * 1024**3), sms, link)


def resolve_gpu(text: str) -> GpuSpec:
    """A known GPU by name or alias, or one given by its datasheet numbers (``NAME:...``).
    An unknown name's error says how to give it by its numbers."""
    if ":" in text:
        return parse_gpu_datasheet(text)
    try:
        return get_gpu(text)
    except ValueError as exc:
        raise ValueError(
            f"{exc}; or give it by its datasheet: {text.strip()}:bf16_tflops=..,hbm_gbps=..,memory_gib=.."
        ) from None


def is_calibrated(gpu: GpuSpec) -> bool:
    """Is ``gpu`` one of the built-in parts, whose family efficiencies were fitted on measured
    tables (``CALIBRATION_FILES``)? A GPU given by datasheet numbers is not."""
    return GPUS.get(gpu.name) == gpu


def calibration_note(gpu: GpuSpec) -> str:
    """``calibrated (A100 family: linear MAPE 3.6% ...)`` or ``uncalibrated (...)``."""
    if is_calibrated(gpu):
        return f"calibrated ({gpu.family} family: {CALIBRATION_MAPE[gpu.family]})"
    return f"uncalibrated (datasheet numbers; achieved fractions borrowed from the {gpu.family} family fit)"

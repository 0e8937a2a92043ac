"""Calibrate the analytic cost model against vidur's measured A100/H100 operator tables.

Scenario: the roofline in ``analytic.py`` has a few free parameters per GPU family (achieved
fractions of peak FLOP/s and bandwidth, per-kernel floors). This module fits them on the
measured per-layer operator times in ``../shared/data/vidur_profiles/*_mlp.csv`` and the
NVLink alpha-beta constants on ``*_send_recv.csv`` / ``*_all_reduce.csv``, and reports the
error of the constants written down in ``hardware.py`` (the numbers profiles are made with).

    python -m fastpp.sim.calibration            # report: MAPE / P95 APE per file and TP, steps
    python -m fastpp.sim.calibration --fit      # refit and print constants to paste

The tables are ``vidur_profiles/`` in the data directory, found as every command finds it
(``fastpp.data_dir``: ``--data-dir``, else ``$FASTPP_DATA_DIR``, else ``../shared/data`` beside
the checkout); ``--data`` names a vidur_profiles folder directly.
Units: seconds and bytes (vidur's files are in milliseconds; converted on load).
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from fastpp.data_dir import DataDirError, resolve_data_dir
from fastpp.profile import ModelShape
from fastpp.sim.analytic import layer_ops_s
from fastpp.sim.hardware import (
    EFFICIENCY,
    INTERCONNECTS,
    GpuSpec,
    InterconnectSpec,
    KernelEfficiency,
    get_gpu,
)

# The operators whose medians make up "linear work" of one layer (emb is fitted separately).
LINEAR_OPS = (
    "attn_pre_proj",
    "attn_post_proj",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "input_layernorm",
    "post_attention_layernorm",
    "attn_rope",
    "add",
)
# vidur's a100 files come from A100-SXM4-80GB DGX nodes and h100 from H100-SXM DGX nodes.
FILE_PREFIX_GPU = {"a100": "A100-80GB-SXM", "h100": "H100-SXM"}
FAMILY_PREFIX = {"A100": "a100", "H100": "h100"}
# Token counts shown to demonstrate the 128-token steps.
VIDUR_SUBDIR = "vidur_profiles"  # in the data directory
STEP_DEMO_TOKENS = (120, 128, 136, 192, 256, 264, 384, 512)
# Parameters the fit moves (the rest of KernelEfficiency stays as written).
FIT_FIELDS = ("gemm_flops_frac", "gemm_bw_frac", "gemm_floor_s", "elementwise_bw_frac", "elementwise_floor_s")
MS = 1e-3  # vidur times are in milliseconds
# No kernel sustains its peak: fitted fractions are capped here (dimensionless).
MAX_FRACTION = 0.95


def default_vidur_dir(data_dir: str | Path | None = None) -> Path:
    """``vidur_profiles`` in the data directory (``fastpp.data_dir.resolve_data_dir``: the
    ``data_dir`` given, else ``$FASTPP_DATA_DIR``, else the checkout's ``../shared/data``)."""
    return resolve_data_dir(data_dir) / VIDUR_SUBDIR


@dataclass(frozen=True, slots=True)
class MlpTable:
    """One vidur ``*_mlp.csv``: per (tp, num_tokens) the median op times, duplicates averaged."""

    file: str
    gpu: GpuSpec
    shape: ModelShape  # per-layer shape read from the file's columns (num_layers = 1)
    tp: np.ndarray  # [R] int
    tokens: np.ndarray  # [R] int
    measured_s: np.ndarray  # [R] sum of LINEAR_OPS medians, seconds
    emb_s: np.ndarray  # [R] embedding median, seconds

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if not (len(self.tp) == len(self.measured_s) == len(self.emb_s) == n and n > 0):
            raise ValueError(f"{self.file}: column lengths differ or table is empty")


def load_mlp_table(path: Path) -> MlpTable:
    """Read a vidur mlp file (stdlib csv; no pandas)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path.name}: empty")
    acc: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for r in rows:
        key = (int(r["num_tensor_parallel_workers"]), int(r["num_tokens"]))
        total = sum(float(r[f"time_stats.{op}.median"]) for op in LINEAR_OPS) * MS
        acc.setdefault(key, []).append((total, float(r["time_stats.emb.median"]) * MS))
    r0 = rows[0]
    h, heads = int(r0["n_embd"]), int(r0["n_head"])
    shape = ModelShape(
        name=f"vidur:{path.stem}",
        num_layers=1,
        hidden_size=h,
        num_heads=heads,
        num_kv_heads=int(r0["n_kv_head"]),
        head_dim=h // heads,
        intermediate_size=int(r0["n_expanded_embd"]),
        vocab_size=int(r0["vocab_size"]),
        max_context=4096,
    )
    keys = sorted(acc)
    return MlpTable(
        file=path.name,
        gpu=get_gpu(FILE_PREFIX_GPU[path.name.split("_")[0]]),
        shape=shape,
        tp=np.array([k[0] for k in keys]),
        tokens=np.array([k[1] for k in keys]),
        measured_s=np.array([np.mean([v[0] for v in acc[k]]) for k in keys]),
        emb_s=np.array([np.mean([v[1] for v in acc[k]]) for k in keys]),
    )


def mlp_tables(family: str, data_dir: Path | None = None) -> list[MlpTable]:
    """All mlp tables of a family ("A100" | "H100") in the data directory."""
    d = data_dir or default_vidur_dir()
    paths = sorted(d.glob(f"{FAMILY_PREFIX[family]}_*_mlp.csv"))
    if not paths:
        raise FileNotFoundError(f"no {FAMILY_PREFIX[family]}_*_mlp.csv in {d}")
    return [load_mlp_table(p) for p in paths]


def predict(table: MlpTable, eff: KernelEfficiency) -> np.ndarray:
    """Analytic per-layer linear time for every row of ``table``, seconds."""
    out = np.empty(len(table.tokens))
    for tp in np.unique(table.tp):
        sel = table.tp == tp
        ops = layer_ops_s(table.tokens[sel], table.shape, int(tp), table.gpu, eff)
        out[sel] = sum(ops[op] for op in LINEAR_OPS)
    return out


def ape(table: MlpTable, eff: KernelEfficiency) -> np.ndarray:
    """Absolute percentage error (as a fraction) per row."""
    return np.abs(predict(table, eff) - table.measured_s) / table.measured_s


@dataclass(frozen=True, slots=True)
class ErrorRow:
    """Error of the analytic linear time on one (file, tp) slice of the measured data."""

    file: str
    tp: int
    num_points: int
    mape: float  # mean absolute percentage error, fraction
    p95_ape: float  # 95th percentile absolute percentage error, fraction


def error_rows(tables: Sequence[MlpTable], eff_of: Callable[[GpuSpec], KernelEfficiency]) -> list[ErrorRow]:
    """MAPE and P95 APE per file and TP degree."""
    rows = []
    for t in tables:
        errs = ape(t, eff_of(t.gpu))
        for tp in np.unique(t.tp):
            e = errs[t.tp == tp]
            rows.append(ErrorRow(t.file, int(tp), len(e), float(e.mean()), float(np.percentile(e, 95))))
    return rows


def family_mape(tables: Sequence[MlpTable], eff: KernelEfficiency) -> float:
    """MAPE over every row of every table (the fit's objective)."""
    return float(np.concatenate([ape(t, eff) for t in tables]).mean())


# --------------------------------------------------------------------------- fitting


def _nelder_mead(
    f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 0.3, iters: int = 400
) -> np.ndarray:
    """Minimal Nelder-Mead (standard coefficients 1, 2, 0.5, 0.5); numpy only."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex = [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex]
                values = [f(x) for x in simplex]
    return simplex[int(np.argmin(values))]


def _to_params(eff: KernelEfficiency) -> np.ndarray:
    # fractions through a logit, floors through log(1 + floor/1us): unconstrained search space
    out = []
    for name in FIT_FIELDS:
        v = getattr(eff, name)
        out.append(math.log(v / (1 - v)) if name.endswith("frac") else math.log1p(v / 1e-6))
    return np.array(out)


def _from_params(eff: KernelEfficiency, x: np.ndarray) -> KernelEfficiency:
    values = {}
    for name, v in zip(FIT_FIELDS, x, strict=True):
        if name.endswith("frac"):
            values[name] = min(MAX_FRACTION, 1 / (1 + math.exp(-v)))
        else:
            values[name] = max(0.0, math.expm1(v) * 1e-6)
    return replace(eff, **values)


def fit_family(tables: Sequence[MlpTable], start: KernelEfficiency) -> KernelEfficiency:
    """Fit FIT_FIELDS (min MAPE over all rows) and the embedding coefficient (least squares
    of emb time on tokens * hidden, TP=1 rows) of one family; other fields kept from start."""
    best = _nelder_mead(lambda x: family_mape(tables, _from_params(start, x)), _to_params(start))
    eff = _from_params(start, best)
    x = np.concatenate([t.tokens[t.tp == 1] * t.shape.hidden_size for t in tables])
    y = np.concatenate([t.emb_s[t.tp == 1] for t in tables])
    return replace(eff, embedding_s_per_token_hidden=float(x @ y / (x @ x)))


@dataclass(frozen=True, slots=True)
class CollectiveData:
    """Measured collective times from one vidur network file, one worker count."""

    file: str
    num_workers: int
    sizes: np.ndarray  # bytes
    times_s: np.ndarray


def load_collective(path: Path) -> list[CollectiveData]:
    """Intra-node rows (devices_per_node == num_workers) of a send_recv/all_reduce file."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    coll = rows[0]["collective"]
    groups: dict[int, list[tuple[int, float]]] = {}
    for r in rows:
        if r["devices_per_node"] == r["num_workers"]:
            groups.setdefault(int(r["num_workers"]), []).append(
                (int(r["size"]), float(r[f"time_stats.{coll}.median"]) * MS)
            )
    return [
        CollectiveData(path.name, n, np.array([s for s, _ in v], dtype=float), np.array([t for _, t in v]))
        for n, v in sorted(groups.items())
    ]


def _weighted_lstsq(features: np.ndarray, times: np.ndarray) -> np.ndarray:
    w = 1.0 / times  # minimise relative, not absolute, error
    coef, *_ = np.linalg.lstsq(features * w[:, None], times * w, rcond=None)
    return coef


def fit_p2p(data: CollectiveData) -> tuple[float, float]:
    """(latency_s, bytes_per_s) of ``t = latency + size / bw``, relative least squares."""
    c = _weighted_lstsq(np.stack([np.ones_like(data.sizes), data.sizes], 1), data.times_s)
    return float(c[0]), float(1 / c[1])


def fit_ring(data: Sequence[CollectiveData]) -> tuple[float, float, float]:
    """(alpha_s per step, latency_s per call, bus_bytes_per_s) of the ring model, jointly over
    worker counts. With a single worker count the two latency terms cannot be told apart and
    everything goes to the per-step alpha; a negative term is dropped and the rest refitted."""
    use_latency = len({d.num_workers for d in data}) > 1
    times = np.concatenate([d.times_s for d in data])

    def features(alpha: bool, latency: bool) -> np.ndarray:
        cols = []
        for d in data:
            n = d.num_workers
            c = [2 * (n - 1) / n * d.sizes]
            c += [np.full_like(d.sizes, 2 * (n - 1))] if alpha else []
            c += [np.ones_like(d.sizes)] if latency else []
            cols.append(np.stack(c, 1))
        return np.concatenate(cols)

    c = _weighted_lstsq(features(True, use_latency), times)
    if use_latency and min(c[1:]) < 0:
        keep_alpha = c[1] > c[2]
        c2 = _weighted_lstsq(features(keep_alpha, not keep_alpha), times)
        c = np.array([c2[0], c2[1], 0.0]) if keep_alpha else np.array([c2[0], 0.0, c2[1]])
    latency = float(c[2]) if len(c) > 2 else 0.0
    return float(c[1]), latency, float(1 / c[0])


def ring_mape(link: InterconnectSpec, d: CollectiveData) -> float:
    pred = np.array([link.allreduce_s(s, d.num_workers) for s in d.sizes])
    return float(np.mean(np.abs(pred - d.times_s) / d.times_s))


def p2p_mape(link: InterconnectSpec, d: CollectiveData) -> float:
    pred = link.p2p_latency_s + d.sizes / link.p2p_bytes_per_s
    return float(np.mean(np.abs(pred - d.times_s) / d.times_s))


# Which network file checks which interconnect constant: (link, file, workers or None = all).
LINK_CHECKS = (
    ("nvlink3", "a100_dgx_send_recv.csv", None),
    ("nvlink3", "a100_dgx_all_reduce.csv", (2, 4, 8)),
    ("nvlink4", "h100_dgx_send_recv.csv", None),
    ("nvlink4", "h100_dgx_all_reduce.csv", (2, 4, 8)),
    ("pcie4", "a100_pairwise_nvlink_all_reduce.csv", (4,)),
)


# --------------------------------------------------------------------------- report


def _table(header: Sequence[object], rows: Sequence[Sequence[object]]) -> list[str]:
    """A markdown table (pastes straight into docs/CALIBRATION.md)."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows]


def report(data_dir: Path | None = None) -> str:
    """The calibration report (markdown) for the constants written in hardware.py."""
    d = data_dir or default_vidur_dir()
    lines = [
        f"# Analytic cost model vs vidur measurements ({d})",
        "",
        "## Linear work per layer (QKV+O+gate/up+act+down+2 norms+rope+add medians)",
        "",
    ]
    tables_by_family = {fam: mlp_tables(fam, d) for fam in EFFICIENCY}
    rows = []
    for fam, tables in tables_by_family.items():
        eff = EFFICIENCY[fam]
        rows += [
            (r.file, r.tp, r.num_points, f"{r.mape:.1%}", f"{r.p95_ape:.1%}")
            for r in error_rows(tables, lambda _g, eff=eff: eff)
        ]
    lines += _table(("file", "tp", "points", "MAPE", "P95 APE"), rows) + [""]
    for fam, tables in tables_by_family.items():
        e = np.concatenate([ape(t, EFFICIENCY[fam]) for t in tables])
        lines.append(
            f"- {fam} family: MAPE {e.mean():.1%}, P95 APE {np.percentile(e, 95):.1%} over {len(e)} points"
        )
    lines += ["", "## The 128-token steps (TP=1, ms per layer: measured / predicted)", ""]
    rows = []
    for fam, tables in tables_by_family.items():
        for t in tables:
            pred = predict(t, EFFICIENCY[fam])
            cells = []
            for n in STEP_DEMO_TOKENS:
                i = np.flatnonzero((t.tp == 1) & (t.tokens == n))
                cells.append(f"{t.measured_s[i[0]] / MS:.3f} / {pred[i[0]] / MS:.3f}" if len(i) else "-")
            rows.append((t.file, *cells))
    lines += _table(("file", *STEP_DEMO_TOKENS), rows)
    lines += ["", "## Links (constants in hardware.INTERCONNECTS vs measured files)", ""]
    rows = []
    for name, file, workers in LINK_CHECKS:
        link = INTERCONNECTS[name]
        for data in load_collective(d / file):
            if workers is not None and data.num_workers not in workers:
                continue
            m = p2p_mape(link, data) if "send_recv" in file else ring_mape(link, data)
            rows.append((name, file, data.num_workers, f"{m:.1%}"))
    lines += _table(("link", "file", "workers", "MAPE"), rows)
    return "\n".join(lines)


def fit_report(data_dir: Path | None = None) -> str:
    """Refit every family and link; return the constants as text to paste into hardware.py."""
    d = data_dir or default_vidur_dir()
    lines = ["# Refitted constants (paste into sim/hardware.py)"]
    for fam, start in EFFICIENCY.items():
        tables = mlp_tables(fam, d)
        eff = fit_family(tables, start)
        vals = ", ".join(f"{f.name}={getattr(eff, f.name):.4g}" for f in fields(eff))
        lines.append(
            f"{fam}: MAPE {family_mape(tables, eff):.2%} (written constants: "
            f"{family_mape(tables, start):.2%}); {vals}"
        )
    for name, file, workers in LINK_CHECKS:
        data = [x for x in load_collective(d / file) if workers is None or x.num_workers in workers]
        if "send_recv" in file:
            lat, bw = fit_p2p(data[0])
            lines.append(f"{name} p2p from {file}: latency {lat * 1e6:.1f} us, bandwidth {bw / 1e9:.1f} GB/s")
        else:
            alpha, latency, bw = fit_ring(data)
            lines.append(
                f"{name} all-reduce from {file} n={workers}: alpha {alpha * 1e6:.2f} us "
                f"per step, latency {latency * 1e6:.2f} us per call, "
                f"bus bandwidth {bw / 1e9:.1f} GB/s"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m fastpp.sim.calibration", description=__doc__.split("\n")[0]
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--data-dir", type=Path, default=None, help="the data directory (holding vidur_profiles/)"
    )
    where.add_argument("--data", type=Path, default=None, help="a vidur_profiles directory itself")
    parser.add_argument("--fit", action="store_true", help="refit and print the constants")
    args = parser.parse_args(argv)
    try:
        tables = args.data if args.data is not None else default_vidur_dir(args.data_dir)
    except DataDirError as exc:
        parser.error(str(exc))
    if not tables.is_dir():
        parser.error(f"vidur tables not found: {tables} (expected {VIDUR_SUBDIR}/ in the data directory)")
    print(fit_report(tables) if args.fit else report(tables))


if __name__ == "__main__":
    main()

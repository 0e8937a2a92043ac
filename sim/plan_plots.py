"""Figures of a plan: goodput per candidate, goodput against the capacity bound, and latency
at the operating point. matplotlib is imported inside (the ``fastpp[plots]`` extra), under
``fastpp.sim.plots``' fixed style, so the files are reproducible."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fastpp.sim.plan_result import CandidateResult, DeploymentPlan
from fastpp.sim.plot_style import FORMATS
from fastpp.sim.plot_style import figure as _figure
from fastpp.sim.plot_style import save as _save

STATUS_COLORS = {"searched": "#4C72B0", "beaten": "#BBBBBB", "pruned": "#DDDDDD"}
BEST_COLOR = "#55A868"


def plot_plan(plan: DeploymentPlan, out_dir: Path | str, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write ``plan_goodput``, ``plan_bound`` and ``plan_latency`` into ``out_dir``."""
    out = Path(out_dir)
    title = (
        f"{plan.model} on {plan.num_gpus} x {plan.gpu}, {plan.workload}, SLO "
        f"{plan.slo_ttft_ms:g}/{plan.slo_tpot_ms:g} ms"
    )
    return (
        goodput_bars(plan, out / "plan_goodput", title, formats)
        + goodput_vs_bound(plan, out / "plan_bound", title, formats)
        + operating_latency(plan, out / "plan_latency", title, formats)
    )


def _height(results: Sequence[CandidateResult] | Sequence[object]) -> float:
    return max(2.5, 0.28 * len(results) + 1.2)


def goodput_bars(plan: DeploymentPlan, stem: Path, title: str, formats: Sequence[str]) -> list[Path]:
    """Horizontal bars: goodput of searched candidates, the 'below' value of the others
    (hatched), the bound as a tick; best first."""
    rows = list(plan.results)
    with _figure((7.5, _height(rows))) as (fig, axes):
        ax = axes[0][0]
        y = list(range(len(rows)))[::-1]
        for yi, r in zip(y, rows, strict=True):
            value = r.goodput if r.goodput is not None else (r.below or 0.0)
            color = BEST_COLOR if r is plan.best else STATUS_COLORS[r.status]
            ax.barh(
                yi,
                value,
                color=color,
                hatch=None if r.status == "searched" else "//",
                edgecolor="0.5",
                linewidth=0.5,
            )
            ax.plot([r.bound.rate], [yi], marker="|", color="0.2", markersize=9)
        ax.set_yticks(y, [r.label for r in rows], fontsize=7)
        ax.set_xlabel("goodput, req/s (hatched: below this, not searched; tick: bound)")
        fig.suptitle(title, fontsize=10)
        return _save(fig, stem, formats)


def goodput_vs_bound(plan: DeploymentPlan, stem: Path, title: str, formats: Sequence[str]) -> list[Path]:
    """Scatter of goodput against bound for the searched candidates, with the y = x line."""
    rows = [r for r in plan.results if r.status == "searched"]
    with _figure((5.5, 4.5)) as (fig, axes):
        ax = axes[0][0]
        top = max([r.bound.rate for r in rows] + [1e-9])
        ax.plot([0, top], [0, top], color="0.5", linestyle="--", linewidth=1, label="goodput = bound")
        spots: dict[tuple[float, float], list[str]] = {}  # candidates on one point share a label
        for r in rows:
            ax.scatter(
                [r.bound.rate],
                [r.goodput],
                s=18,
                color=BEST_COLOR if r is plan.best else STATUS_COLORS["searched"],
            )
            spots.setdefault((round(r.bound.rate, 2), round(r.goodput or 0.0, 2)), []).append(r.label)
        for (x, y), labels in spots.items():
            ax.annotate(
                "\n".join(labels),
                (x, y),
                fontsize=6,
                xytext=(-4, 2),
                textcoords="offset points",
                ha="right",
                va="bottom",
            )
        ax.set_xlabel("bubble-free capacity bound, req/s")
        ax.set_ylabel("goodput, req/s")
        ax.legend(loc="upper left")
        fig.suptitle(title, fontsize=10)
        return _save(fig, stem, formats)


def operating_latency(plan: DeploymentPlan, stem: Path, title: str, formats: Sequence[str]) -> list[Path]:
    """P50 and P90 TTFT, TPOT and E2E of the searched candidates at the operating point."""
    rows = [r for r in plan.results if r.operating_point]
    panels = (("ttft_ms", "TTFT, ms", 1.0), ("tpot_ms", "TPOT, ms", 1.0), ("e2e_latency_ms", "E2E, s", 1e-3))
    with _figure((10, _height(rows)), 1, 3) as (fig, axes):
        y = list(range(len(rows)))[::-1]
        for ax, (key, label, scale) in zip(axes[0], panels, strict=True):
            for yi, r in zip(y, rows, strict=True):
                op = r.operating_point
                ax.barh(yi, op[f"p90_{key}"] * scale, color="#DD8452", label="P90" if yi == y[0] else None)
                ax.barh(yi, op[f"median_{key}"] * scale, color="#4C72B0", label="P50" if yi == y[0] else None)
            ax.set_xlabel(label)
            ax.set_yticks(y, [r.label for r in rows] if ax is axes[0][0] else [""] * len(rows), fontsize=7)
        axes[0][0].legend(loc="lower right")
        fig.suptitle(f"{title}; at {100 * plan.operating_share:g}% of each candidate's goodput", fontsize=10)
        return _save(fig, stem, formats)

"""A plan for people: the ranked table, the layouts left out, the recommendation and the
ready-to-run ``fastpp serve`` commands for SGLang and vLLM.

Engine flags: fastpp's ``--pp`` sets SGLang's ``--pp-size`` and vLLM's
``--pipeline-parallel-size`` (``fastpp serve`` refuses them among the pass-through arguments);
the rest pass through to the engine: SGLang ``--tp-size`` and ``--chunked-prefill-size``, vLLM
``--tensor-parallel-size`` and ``--max-num-batched-tokens``, and SGLang's
``--pp-async-batch-depth`` for a candidate with microbatches in flight beyond one per stage
(vLLM has no such flag: no vLLM command for it), and fastpp's ``--queue-order`` for a
candidate with a queue order other than fcfs. The chunk ceiling is the policy's largest
microbatch (a static chunk, or the largest dynamic candidate).
"""

from __future__ import annotations

import math
import shlex

from rich.table import Table

from fastpp.scheduler_config import DEFAULT_CANDIDATES
from fastpp.sim.plan_result import ROUTING_NOTE, CandidateResult, DeploymentPlan
from fastpp.sim.sweep_grid import static_chunk

SGLANG_PORT = 30000
VLLM_PORT = 8000
NEAR_SHOWN = 4  # candidates named on the "as good within one search step" line
# what a plan says instead of a vLLM command for a pick at an async batch depth
NO_VLLM_ASYNC = (
    "none: vLLM keeps one batch per stage in flight (no --pp-async-batch-depth); "
    "plan with --host-loop batch-queue for vLLM"
)


def ranked_table(plan: DeploymentPlan, limit: int | None = None) -> Table:
    """One row per candidate, best first; pruned and beaten ones say why they lost."""
    slo = f"P90 TTFT <= {plan.slo_ttft_ms:g} ms, P90 TPOT <= {plan.slo_tpot_ms:g} ms"
    table = Table(
        title=f"{plan.model} on {plan.num_gpus} x {plan.gpu} ({plan.interconnect}, "
        f"{plan.gpu_note.split(' (')[0]}), {plan.workload}, {slo}",
        title_justify="left",
        caption_justify="left",
    )
    share = f"{100 * plan.operating_share:g}%"
    depths = any(r.candidate.async_depth for r in plan.results)  # an async column when asked for
    orders = any(r.candidate.queue_order != "fcfs" for r in plan.results)  # a queue column likewise
    for col, right in (
        ("#", True),
        ("layout", False),
        ("policy", False),
        *((("async", True),) if depths else ()),
        *((("queue", False),) if orders else ()),
        ("goodput", True),
        ("/GPU", True),
        ("bound", True),
        ("share", True),
        ("binds at goodput", False),
        ("TTFT ms", True),
        ("TPOT ms", True),
        ("E2E s", True),
        ("attain", True),
        ("probes", True),
    ):
        table.add_column(col, justify="right" if right else "left", overflow="fold")
    rows = plan.results if limit is None else plan.results[:limit]
    for i, r in enumerate(rows, 1):
        style = "bold green" if r is plan.best else None
        table.add_row(
            str(i),
            r.candidate.layout.label,
            r.candidate.policy,
            *((str(r.candidate.async_depth),) if depths else ()),
            *((r.candidate.queue_order,) if orders else ()),
            _goodput(r),
            _f(r.goodput_per_gpu, "{:.2f}"),
            f"{r.bound.rate:.2f}",
            _f(r.bound_share, "{:.0%}"),
            _binding(r),
            *_latency(r),
            f"= {r.candidate.policy}+ds" if r.shared_with else str(r.num_probes),
            style=style,
        )
    if limit is not None and len(plan.results) > limit:
        table.add_row("", f"+{len(plan.results) - limit} more", "(--all)", *[""] * (10 + depths + orders))
    table.caption = (
        "req/s; bound: the rate at which the busiest stage (or TP group, host, "
        "KV pool) would be 100% busy; share = goodput / bound; pruned: bound "
        "below the best goodput, so it cannot win (no probe); beaten: failed a "
        "probe at or below the best goodput, so it cannot win either (the limit it "
        "failed on; the search stops there); probes '= P+ds': the "
        "search of its +ds twin, whose delay scheduling never moved a decode (the "
        "same simulations). "
        + ("async: microbatches in flight beyond one per stage (--pp-async-batch-depth). " if depths else "")
        + (
            "queue: the waiting queue's order (late_last: a request past its SLO TTFT waits behind "
            "those that can still meet theirs, docs/POLICIES.md). "
            if orders
            else ""
        )
        + "TTFT, TPOT, E2E: "
        f"P50/P90 and SLO attainment at {share} of the candidate's goodput. Goodput "
        f"searched to {plan.precision:g} req/s per replica, seeds "
        f"{','.join(map(str, plan.seeds))} pooled. {ROUTING_NOTE}."
    )
    return table


def excluded_table(plan: DeploymentPlan) -> Table:
    table = Table(title="layouts left out", title_justify="left")
    table.add_column("layout")
    table.add_column("why", overflow="fold")
    for e in plan.excluded:
        table.add_row(e.layout.label, e.reason)
    return table


def verdict(plan: DeploymentPlan) -> list[str]:
    """The recommendation in words, or why there is none."""
    best = plan.best
    lines = [
        f"{plan.count('searched')} candidates searched, {plan.count('beaten')} beaten (their "
        f"search stopped at a failure below the best), {plan.count('pruned')} pruned by their bound"
        + (f", {plan.num_shared} took their +ds twin's search" if plan.num_shared else "")
        + f": {plan.probes_run} goodput probes run, about {plan.probes_saved:.0f} saved; "
        f"{plan.wall_s:.1f} s"
    ]
    if best is None:
        lines.append("no feasible deployment: " + no_feasible_reason(plan))
        return lines
    lines.append(
        f"recommended: {best.label}: goodput {best.goodput:.2f} req/s "
        f"({best.goodput_per_gpu:.2f} per GPU), {_f(best.bound_share, '{:.0%}')} of its "
        f"bound {best.bound.describe()}; the limit at goodput: {best.binding}"
    )
    near = plan.near_best
    if near:
        shown = ", ".join(f"{r.label} {r.goodput:.2f}" for r in near[:NEAR_SHOWN])
        more = f" and {len(near) - NEAR_SHOWN} more" if len(near) > NEAR_SHOWN else ""
        lines.append(f"as good within one search step ({plan.precision:g} req/s per replica): {shown}{more}")
    return lines


def no_feasible_reason(plan: DeploymentPlan) -> str:
    """Why nothing serves: no layout fits, or the best-bounded candidate's failing limit."""
    if not plan.results:
        reasons = "; ".join(f"{e.layout.label}: {e.reason}" for e in plan.excluded)
        return f"no layout of {plan.num_gpus} x {plan.gpu} fits {plan.model} ({reasons})"
    top = max(plan.results, key=lambda r: r.bound.rate)
    why = top.reason or "no probed rate met the SLO"
    return (
        f"no candidate meets the SLO at any probed rate; the one with the highest bound, "
        f"{top.label} ({top.bound.describe()}), fails on {top.binding or 'the SLO'}: {why}"
    )


def serve_commands(
    plan: DeploymentPlan, result: CandidateResult, model_path: str = "MODEL", profile: str | None = None
) -> dict[str, str]:
    """``fastpp serve`` for SGLang and for vLLM running ``result``'s replica with its policy."""
    layout, policy = result.candidate.layout, result.candidate.policy
    depth, order = result.candidate.async_depth, result.candidate.queue_order
    chunk = static_chunk(policy) or max(DEFAULT_CANDIDATES)
    order_flags = ["--queue-order", order] if order != "fcfs" else []
    common = [
        "--policy",
        policy,
        "--slo-ttft-ms",
        f"{plan.slo_ttft_ms:g}",
        "--slo-tpot-ms",
        f"{plan.slo_tpot_ms:g}",
    ]
    if profile is not None:
        common += ["--profile", profile]
    elif static_chunk(policy) is None:
        common += ["--profile", "PROFILE.json"]  # dynamic policies read the deployment's costs
    sglang = [
        "fastpp",
        "serve",
        "--backend",
        "sglang",
        "-m",
        model_path,
        "--pp",
        str(layout.pp),
        *common,
        *order_flags,
        "--tp-size",
        str(layout.tp),
        "--chunked-prefill-size",
        str(chunk),
    ]
    vllm = [
        "fastpp",
        "serve",
        "--backend",
        "vllm",
        "-m",
        model_path,
        "--pp",
        str(layout.pp),
        *common,
        *order_flags,
        "--tensor-parallel-size",
        str(layout.tp),
        "--max-num-batched-tokens",
        str(chunk),
    ]
    if depth:
        sglang += ["--pp-async-batch-depth", str(depth)]
    out = {"sglang": shlex.join(sglang), "vllm": NO_VLLM_ASYNC if depth else shlex.join(vllm)}
    if layout.dp > 1:
        out["replicas"] = (
            f"run {layout.dp} replicas of {layout.tp * layout.pp} GPUs each "
            f"(CUDA_VISIBLE_DEVICES per replica, one --port each) behind a router "
            f"that sends each request to a random replica"
        )
    return out


def _goodput(r: CandidateResult) -> str:
    if r.status in ("pruned", "beaten"):
        return f"<{r.below:.2f}"
    return f"{r.goodput:.2f}"  # a multiple of the precision (0.25 by default): two decimals show it


def _binding(r: CandidateResult) -> str:
    if r.status == "pruned":
        return f"pruned ({r.bound.bottleneck} bound)"
    if r.status == "beaten":
        return f"beaten ({r.binding})"
    return r.binding or "-"


def _latency(r: CandidateResult) -> list[str]:
    op = r.operating_point
    if not op:
        return ["-"] * 4
    return [
        f"{op['median_ttft_ms']:.0f}/{op['p90_ttft_ms']:.0f}",
        f"{op['median_tpot_ms']:.0f}/{op['p90_tpot_ms']:.0f}",
        f"{op['median_e2e_latency_ms'] / 1e3:.1f}/{op['p90_e2e_latency_ms'] / 1e3:.1f}",
        _f(op.get("slo_attainment"), "{:.1%}"),
    ]


def _f(value: float | None, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)

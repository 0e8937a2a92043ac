"""Regenerate the measured parts of docs/PLANNER.md: the example plan, the other plans and what
they show, and (with ``--speed``) the cost table.

    python scripts/make_planner_page.py            # the plans (about 5 min on 2 cores, 2 workers)
    python scripts/make_planner_page.py --speed    # also benchmarks/plan_speed.py (about 7 min more)

Each plan is ``fastpp plan ... --workers 2 -o runs/planner-page/NAME``, run afresh (the folder
is cleared first: a plan resumed from its folder would print the probes of this run only). The
page's generated blocks lie between ``<!-- BEGIN generated: NAME -->`` and
``<!-- END generated: NAME -->``; everything else on the page is left as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "PLANNER.md"
OUT = ROOT / "runs" / "planner-page"
WORKERS = "2"
PLANS: dict[str, list[str]] = {
    "example": ["-m", "Qwen2.5-32B", "--gpu", "A100-40GB-PCIe", "--gpus", "4", "-w", "azure-conv"]
    + ["--slo-ttft-ms", "2000", "--slo-tpot-ms", "200"],
    "14b": ["-m", "Qwen2.5-14B", "--gpus", "4"],
    "h100x8": ["-m", "Qwen2.5-32B", "--gpu", "H100-SXM", "--gpus", "8"],
    "a100x8": ["-m", "Qwen2.5-32B", "--gpu", "A100-40GB-PCIe", "--gpus", "8"],
}
# SGLang's --pp-async-batch-depth: the same pipeline at depth 0 and 1, on a prefill-heavy and a
# decode-heavy workload
ASYNC_PLANS = {
    workload: ["-m", "Qwen2.5-32B", "--gpus", "4", "-w", workload, "--layouts", "pp4"]
    + ["--policies", "static,predictive,no-ds", "--pp-async-batch-depth", "0,1"]
    for workload in ("azure-conv", "cnn-reversed-synthetic")
}
PLANS.update({f"async-{workload}": args for workload, args in ASYNC_PLANS.items()})
# the queue order: the same pipeline and policies under fcfs and late_last
PLANS["queue-order"] = ["-m", "Qwen2.5-32B", "--gpus", "4", "-w", "azure-conv", "--layouts", "pp4"]
PLANS["queue-order"] += ["--policies", "static,predictive,slack,no-ds", "--queue-orders", "fcfs,late_last"]
SPEED_RUNS = {
    "(defaults: Qwen2.5-32B, 4 x A100-40GB-PCIe) `--unpruned`": ["--unpruned"],
    "`--gpus 8 --gpu H100-SXM`": ["--gpus", "8", "--gpu", "H100-SXM"],
}


def command(name: str) -> str:
    return " ".join(["fastpp plan", *PLANS[name], "--workers", WORKERS])


def run_plan(name: str) -> tuple[str, dict[str, Any]]:
    """The plan's printed output (paths as a user's default ``-o`` would print them) and its
    plan.json."""
    out = OUT / name
    if out.exists():
        shutil.rmtree(out)
    print(f"{name}: {command(name)}", file=sys.stderr, flush=True)
    env = {**os.environ, "COLUMNS": "150"}
    fastpp = shutil.which("fastpp")
    if fastpp is None:
        raise SystemExit("the fastpp command is not on PATH: pip install -e . first")
    args = [fastpp, "plan", *PLANS[name], "--workers", WORKERS]
    done = subprocess.run([*args, "-o", str(out)], env=env, capture_output=True, text=True, check=True)
    text = "\n".join(line.rstrip() for line in done.stdout.splitlines())
    text = text.replace(str(out), "runs/plan")
    return text, json.loads((out / "plan.json").read_text())


def searched(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The searched candidates, best first, one row per goodput (a shared twin once)."""
    rows = [r for r in plan["results"] if r["status"] == "searched"]
    return sorted(rows, key=lambda r: -r["goodput"])


def best_row(plan: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in plan["results"] if r["label"] == plan_best_label(plan))


def plan_best_label(plan: dict[str, Any]) -> str:
    best = plan["best"]
    if best is None:
        raise SystemExit(f"no feasible deployment in the plan of {plan['model']}: nothing to write")
    return best


def layout_of(row: dict[str, Any]) -> str:
    return row["label"][: -len(row["policy"]) - 1]


def runners_up(plan: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """The next best searched candidates, a ``+ds`` twin of the same goodput once."""
    best = best_row(plan)

    def key(r: dict[str, Any]) -> tuple:
        return (layout_of(r), r["policy"].split("+")[0], round(r["goodput"], 6))

    seen = {key(best)}
    rows = []
    for r in searched(plan):
        key_r = key(r)
        if key_r in seen:
            continue
        seen.add(key_r)
        rows.append(r)
    return rows[:count]


def example_text(plan: dict[str, Any]) -> str:
    best = best_row(plan)
    ups = runners_up(plan, 2)
    counts = plan["counts"]
    layouts = {layout_of(r) for r in plan["results"]}
    whole = sorted(
        x for x in layouts if all(r["status"] == "pruned" for r in plan["results"] if layout_of(r) == x)
    )
    some = [r["label"] for r in plan["results"] if r["status"] == "pruned" and layout_of(r) not in whole]
    pruned = ", ".join(whole) + (f"; and {', '.join(some)}" if some else "")
    big = [
        r
        for r in plan["results"]
        if layout_of(r) == layout_of(best) and r["policy"] in ("static:1024", "static:2048")
    ]
    big_words = "; ".join(outcome(r) for r in big)
    return (
        f"Read it so: on {plan['num_gpus']} x {plan['gpu']}, {plan['model']} serves most as "
        f"{layout_of(best)} with {best['policy']} ({best['goodput']:.2f} req/s, "
        f"{best['bound_share']:.0%} of its bound, limited by {best['binding']}); next come "
        + ", ".join(f"{r['label']} ({r['goodput']:.2f})" for r in ups)
        + f". Pruned without a probe, because even their bubble-free bounds are below the best "
        f"goodput: {pruned or 'none'}. Large static chunks on the same layout: "
        f"{big_words} (long chunks stall the decodes that share their microbatch). The probes "
        f"column is what each candidate cost: {plan['probes_run']} probes for "
        f"{len(plan['results'])} candidates; {counts.get('pruned', 0)} were pruned by their bound, "
        f"{counts.get('beaten', 0)} beaten and {plan['shared_with_twin']} took their `+ds` "
        f"twin's row."
    )


def outcome(row: dict[str, Any]) -> str:
    if row["status"] == "searched":
        return f"{row['policy']} reaches {row['goodput']:.2f} req/s, limited by {row['binding']}"
    if row["status"] == "beaten":
        return f"{row['policy']} fails at {row['below']:.2f} req/s on {row['binding']}"
    return f"{row['policy']} is pruned by its bound ({row['bound']:.2f} req/s)"


def other_row(name: str, plan: dict[str, Any]) -> str:
    best = best_row(plan)
    ups = runners_up(plan, 1)
    below = sorted({layout_of(r) for r in plan["results"] if r["status"] == "beaten"} - {layout_of(best)})
    tp = [r for r in plan["results"] if r["tp"] > 1]
    parts = [f"{r['label']} {r['goodput']:.2f}" for r in ups]
    if below:
        parts.append(f"{', '.join(below)} failed at or below {best['goodput']:.2f}")
    if tp and all(r["status"] == "pruned" for r in tp):
        parts.append(f"every layout with TP pruned (bounds at most {max(r['bound'] for r in tp):.1f})")
    return (
        f"| `{command(name)}` | {best['label']} | {best['goodput']:.2f} req/s "
        f"({best['bound_share']:.0%} of its bound) | {'; '.join(parts)} | {best['binding']} |"
    )


def interconnect_text(nvlink: dict[str, Any], pcie: dict[str, Any]) -> str:
    h, a = best_row(nvlink), best_row(pcie)
    same = layout_of(h) == layout_of(a)
    pick = (
        f"the pick is the same layout, {layout_of(h)}, on either interconnect"
        if same
        else f"the pick changes with the interconnect: {layout_of(h)} over NVLink, {layout_of(a)} over PCIe"
    )
    return (
        f"On eight GPUs {pick}. {tp_words(nvlink, 'NVLink')} {tp_words(pcie, 'PCIe')} The limit at "
        f"goodput: {h['binding']} on {nvlink['gpu']} ({h['bound_share']:.0%} of the bound), "
        f"{a['binding']} on {pcie['gpu']} ({a['bound_share']:.0%})."
    )


def tp_words(plan: dict[str, Any], link: str) -> str:
    best = best_row(plan)
    tp = [r for r in plan["results"] if r["tp"] > 1]
    if not tp:
        return f"Over {link} no layout with TP fits."
    top = max(tp, key=lambda r: r["bound"])
    head = (
        f"Over {link} the highest bound of a layout with TP is {top['bound']:.2f} req/s "
        f"({layout_of(top)}), against {best['bound']:.2f} for {layout_of(best)}"
    )
    live = [r for r in tp if r["status"] != "pruned"]
    if not live:
        return f"{head}: below the pipeline's goodput {best['goodput']:.2f}, so every TP layout is pruned."
    found = [r for r in live if r["status"] == "searched"]
    if found:
        r = max(found, key=lambda r: r["goodput"])
        return f"{head}; the best of them, {r['label']}, reaches {r['goodput']:.2f} req/s."
    r = max(live, key=lambda r: r["bound"])
    return (
        f"{head}; none reaches the winner's goodput: {r['label']} fails at {r['below']:.2f} "
        f"req/s on {r['binding']}."
    )


def best_where(plan: dict[str, Any], field: str, value: Any) -> str:
    """The best searched candidate among those whose ``field`` is ``value``, or what stopped
    them all."""
    rows = [r for r in plan["results"] if r[field] == value]
    found = [r for r in rows if r["status"] == "searched"]
    if found:
        r = max(found, key=lambda r: r["goodput"])
        return f"{r['policy']}: {r['goodput']:.2f} req/s"
    statuses = " or ".join(sorted({r["status"] for r in rows}))
    return f"every candidate below {max(r['below'] for r in rows):.2f} req/s ({statuses})"


def async_rows(plans: dict[str, dict[str, Any]]) -> list[str]:
    """Per workload: the best candidate at each async batch depth, and the plan's pick."""

    def at(plan: dict[str, Any], depth: int) -> str:
        return best_where(plan, "async_batch_depth", depth)

    lines = [
        "| plan | best at depth 0 | best at depth 1 | recommendation |",
        "|---|---|---|---|",
    ]
    for workload in ASYNC_PLANS:
        plan = plans[f"async-{workload}"]
        best = best_row(plan)
        lines.append(
            f"| `{command(f'async-{workload}')}` | {at(plan, 0)} | {at(plan, 1)} | "
            f"{best['label']} ({best['goodput']:.2f} req/s) |"
        )
    return lines


def queue_rows(plan: dict[str, Any]) -> list[str]:
    """The best candidate under each queue order, and the plan's pick."""
    best = best_row(plan)
    return [
        "| plan | best under fcfs | best under late_last | recommendation |",
        "|---|---|---|---|",
        f"| `{command('queue-order')}` | {best_where(plan, 'queue_order', 'fcfs')} | "
        f"{best_where(plan, 'queue_order', 'late_last')} | {best['label']} ({best['goodput']:.2f} req/s) |",
    ]


SPEED_LINE = re.compile(
    r"(pruned|unpruned) plan: wall ([\d.]+) s, CPU ([\d.]+) s; .*?; (\d+) probes; best (.+)$"
)


def speed_rows() -> list[str]:
    rows = []
    for label, args in SPEED_RUNS.items():
        print(f"plan_speed.py {' '.join(args)}", file=sys.stderr, flush=True)
        done = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "plan_speed.py"), *args],
            capture_output=True,
            text=True,
            check=True,
        )
        found = {m[1]: m for line in done.stdout.splitlines() if (m := SPEED_LINE.match(line))}
        p = found["pruned"]
        u = found.get("unpruned")
        wall, cpu, probes = f"{float(p[2]):.1f} s", f"{float(p[3]):.0f} s", p[4]
        pick = p[5]
        if u is not None:
            saved = 1 - int(p[4]) / max(1, int(u[4]))
            wall += f" (unpruned {float(u[2]):.1f} s)"
            cpu += f" ({float(u[3]):.0f} s)"
            probes += f" (unpruned {u[4]}: {saved:.0%} saved)"
            pick += ", the same unpruned" if u[5] == p[5] else f"; unpruned: {u[5]}"
        rows.append(f"| {label} | {wall} | {cpu} | {probes} | {pick} |")
    return [
        "| `python benchmarks/plan_speed.py ...` | wall | CPU | probes | pick |",
        "|---|---|---|---|---|",
        *rows,
    ]


def replace_block(page: str, name: str, body: str) -> str:
    begin, end = f"<!-- BEGIN generated: {name} -->", f"<!-- END generated: {name} -->"
    if begin not in page or end not in page:
        raise SystemExit(f"{PAGE}: no generated block {name!r} (markers {begin} ... {end})")
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--speed", action="store_true", help="also rerun benchmarks/plan_speed.py for the cost table"
    )
    args = ap.parse_args()
    printed, plans = {}, {}
    for name in PLANS:
        printed[name], plans[name] = run_plan(name)
    page = PAGE.read_text(encoding="utf-8")
    page = replace_block(
        page, "example", f"Made with `{command('example')}`:\n\n```text\n{printed['example']}\n```"
    )
    page = replace_block(page, "example-reading", example_text(plans["example"]))
    table = [
        "| plan | recommendation | goodput | runner-up | the limit at goodput |",
        "|---|---|---|---|---|",
        *(other_row(name, plans[name]) for name in ("14b", "h100x8", "a100x8")),
    ]
    page = replace_block(page, "other-plans", "\n".join(table))
    page = replace_block(page, "interconnect", interconnect_text(plans["h100x8"], plans["a100x8"]))
    page = replace_block(page, "async-depth", "\n".join(async_rows(plans)))
    page = replace_block(page, "queue-order", "\n".join(queue_rows(plans["queue-order"])))
    if args.speed:
        page = replace_block(page, "speed", "\n".join(speed_rows()))
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Which conclusions hang on which assumed host-side constant? Goodput against each one.

    python benchmarks/goodput_sensitivity.py --json sens.json            # every cell
    python benchmarks/goodput_sensitivity.py --workload azure-conv --deploy pp4@static:512
    python benchmarks/goodput_sensitivity.py --table sens.json           # the table from saved cells

The analytic profiles (fastpp.sim.analytic) assume two host-side durations no GPU measurement
gives: ``host_overhead_s`` (the scheduler's time per launch, 3 ms; TP pays it too) and
``token_return_s`` (last stage -> scheduler hand-back of the sampled tokens per microbatch, 5 ms;
PP only, the simulator ignores it on one stage). Each cell is one `fastpp goodput` search
(fastpp.sim.goodput.slo_goodput: seeds 0 and 1 pooled, probes lengthened until settled) on
Qwen2.5-32B, 4 x A100-40GB PCIe, SLO 2 s / 200 ms, with one constant moved from its default and
the other at its default. Cells are saved after each search, so an interrupted run keeps them.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from fastpp.profile import save_profile
from fastpp.sim.analytic import DEFAULT_HOST_OVERHEAD_S, DEFAULT_TOKEN_RETURN_S, analytic_profile
from fastpp.sim.goodput import slo_goodput
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, parse_deployment

WORKLOADS = ("azure-conv", "cnn-reversed-synthetic")
DEPLOYMENTS = ("pp4@static:512", "tp4@static:2048")
MODEL, GPU = "Qwen2.5-32B", "A100-40GB-PCIe"
# (constant, values in seconds): the default first, then the plausible range's ends
CONSTANTS = (
    ("host_overhead_s", (DEFAULT_HOST_OVERHEAD_S, 1e-3, 10e-3)),
    ("token_return_s", (DEFAULT_TOKEN_RETURN_S, 1e-3, 10e-3)),
)
PRECISION = 0.25


def cells_to_run(workloads: list[str], deployments: list[str]) -> list[tuple[str, str, str, float]]:
    """(workload, deployment, constant, value): each default once, then every moved value;
    ``token_return_s`` only where pp > 1 (the simulator ignores it on one stage)."""
    out = []
    for workload in workloads:
        for spec in deployments:
            pp = parse_deployment(spec)[0]
            out.append((workload, spec, "default", 0.0))
            for name, (_default, *moved) in CONSTANTS:
                if name == "token_return_s" and pp == 1:
                    continue
                out += [(workload, spec, name, v) for v in moved]
    return out


def run_cell(workload: str, spec: str, name: str, value: float, tmp: Path) -> dict:
    pp, tp, policy = parse_deployment(spec)
    given = {} if name == "default" else {name: value}
    profile = analytic_profile(MODEL, GPU, pp, tp, created_at="2026-01-01T00:00:00Z", **given)
    path = tmp / f"{spec.replace('@', '_').replace(':', '_')}-{name}-{value:g}.json"
    save_profile(profile, path)
    dep = DeploymentConfig(profile_path=str(path), policy=policy or "static:2048")
    t0, cpu0 = time.perf_counter(), time.process_time()
    res = slo_goodput(WorkloadConfig(name=workload), dep, precision=PRECISION)
    return {
        "workload": workload,
        "deployment": spec,
        "constant": name,
        "value_ms": value * 1e3,
        "host_overhead_ms": profile.host_overhead_s * 1e3,
        "token_return_ms": profile.token_return_s * 1e3 if pp > 1 else None,
        "goodput": res.rate,
        "margin": res.margin,
        "seed_goodputs": list(res.seed_rates),
        "reason": res.reason,
        "wall_s": round(time.perf_counter() - t0, 1),
        "cpu_s": round(time.process_time() - cpu0, 1),
    }


def markdown_table(cells: list[dict]) -> str:
    """One row per workload and deployment: goodput at the defaults, then at each moved value
    (its change from the default in brackets)."""
    moved = [(name, v) for name, (_, *values) in CONSTANTS for v in values]
    header = [
        "workload",
        "deployment",
        "defaults (3 ms launch, 5 ms return)",
        *(f"{name} = {v * 1e3:g} ms" for name, v in moved),
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    keys = dict.fromkeys((c["workload"], c["deployment"]) for c in cells)
    for workload, spec in keys:
        mine = {
            (c["constant"], round(c["value_ms"], 6)): c
            for c in cells
            if (c["workload"], c["deployment"]) == (workload, spec)
        }
        base = mine.get(("default", 0.0))
        row = [workload, spec, f"{base['goodput']:.2f}" if base else "-"]
        for name, v in moved:
            c = mine.get((name, round(v * 1e3, 6)))
            if c is None:
                row.append("n/a" if name == "token_return_s" and spec.startswith("tp") else "-")
            else:
                change = f" ({c['goodput'] - base['goodput']:+.2f})" if base else ""
                row.append(f"{c['goodput']:.2f}{change}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workload", action="append", choices=WORKLOADS, help="repeat; default: both")
    ap.add_argument(
        "--deploy", action="append", help="deployment@policy (repeat); default: " + ", ".join(DEPLOYMENTS)
    )
    ap.add_argument("--json", help="write the cells to this file (after each one)")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print the table from saved cells")
    args = ap.parse_args()
    if args.table:
        print(markdown_table([c for p in args.table for c in json.loads(Path(p).read_text())]))
        return
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        for workload, spec, name, value in cells_to_run(
            args.workload or list(WORKLOADS), args.deploy or list(DEPLOYMENTS)
        ):
            cells.append(run_cell(workload, spec, name, value, Path(tmp)))
            print(json.dumps(cells[-1]), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(cells, indent=1))
    print(markdown_table(cells))


if __name__ == "__main__":
    main()

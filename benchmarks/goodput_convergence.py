"""Does the goodput estimate depend on how long one looks? Issue 13's table, redone.

    python benchmarks/goodput_convergence.py                 # both rows, every column
    python benchmarks/goodput_convergence.py --deploy tp4@static:2048 --json out.json
    python benchmarks/goodput_convergence.py --column "-n 6000" --json a.json   # one column
    python benchmarks/goodput_convergence.py --table a.json b.json   # the table from saved cells
    python benchmarks/goodput_convergence.py --deploy pp4@static:512 --looks 5.75,5.84,5.94

Rows: deployments on azure-conv, Qwen2.5-32B, 4 x A100-40GB PCIe, SLO 2 s / 200 ms. Columns:
``fastpp goodput``'s search (fastpp.sim.goodput.slo_goodput, precision 0.1 req/s; other rows with
``--workload`` / ``--model``) started from
the default probe length, from 1,000, 3,000 and 6,000 requests per seed, and with another seed
set. Each cell is the goodput (the bracket's low end) and, in brackets, each seed's own goodput
(the pooled verdict is on both seeds' records together). The last column says whether the
cells' brackets overlap within the precision: the method converged if the answer does not move
with the starting length or the seeds.

``--looks RATES`` runs no search: for each rate (on ``--workload`` and ``--model``, default
azure-conv and Qwen2.5-32B), one simulation per seed (seeds 0 and 1, the probe's run of 15,000
arrivals) is looked at over its first n requests, n the length rule's
first look doubled up to 12,000, and each look's pooled verdict, P90 TTFT and P90 TPOT and
whether the 2-error rule calls it settled are printed: what a probe at that rate would see at
each length.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from fastpp.sim.goodput import (
    MAX_REQUESTS_PER_SEED,
    first_look_length,
    is_unsettled,
    judge_records,
    open_probe_runs,
    probe_span_s,
    slo_goodput,
)
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, parse_deployment

DEPLOYMENTS = ("tp4@static:2048", "pp4@static:512")
COLUMNS = (  # (label, starting requests per seed or None for the length rule, seeds)
    ("default", None, (0, 1)),
    ("-n 1000", 1000, (0, 1)),
    ("-n 3000", 3000, (0, 1)),
    ("-n 6000", 6000, (0, 1)),
    ("seeds 2,3", None, (2, 3)),
)
PRECISION = 0.1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--deploy", action="append", help="deployment@policy (repeat); default: both rows")
    ap.add_argument(
        "--column",
        action="append",
        choices=[c[0] for c in COLUMNS],
        help="run only this column (repeat); default: all",
    )
    ap.add_argument("--json", help="also write the cells to this file")
    ap.add_argument(
        "--table",
        nargs="+",
        metavar="JSON",
        help="print the table from cells saved with --json (runs nothing)",
    )
    ap.add_argument(
        "--looks",
        metavar="RATES",
        help="comma-separated rates: each look's verdict at every length, no search",
    )
    ap.add_argument("--workload", default="azure-conv", help="the workload (default azure-conv)")
    ap.add_argument("--model", default="Qwen2.5-32B", help="the model (default Qwen2.5-32B)")
    args = ap.parse_args()
    if args.looks:
        for spec in args.deploy or DEPLOYMENTS:
            for rate in (float(r) for r in args.looks.split(",")):
                print_looks(spec, rate, WorkloadConfig(name=args.workload), args.model)
        return
    if args.table:
        cells = [c for path in args.table for c in json.loads(Path(path).read_text())]
        print(markdown_table(cells))
        return
    workload = WorkloadConfig(name=args.workload)
    cells = []
    for spec in args.deploy or DEPLOYMENTS:
        dep = deployment_of(spec, args.model)
        row = (
            spec
            if (args.workload, args.model) == ("azure-conv", "Qwen2.5-32B")
            else f"{spec}, {args.model}, {args.workload}"
        )
        for label, n, seeds in COLUMNS:
            if args.column and label not in args.column:
                continue
            t0, cpu0 = time.perf_counter(), time.process_time()
            res = slo_goodput(workload, dep, seeds=seeds, num_requests=n, precision=PRECISION)
            lengths = [int(p.metrics["requests_per_seed"]) for p in res.probes]
            cell = {
                "deployment": spec,
                "row": row,
                "column": label,
                "seeds": list(seeds),
                "goodput": res.rate,
                "margin": res.margin,
                "seed_goodputs": list(res.seed_rates),
                "probes": len(res.probes),
                "longest_probe": max(lengths),
                "unsettled_probes": sum(not p.metrics["converged"] for p in res.probes),
                "wall_s": round(time.perf_counter() - t0, 1),
                "cpu_s": round(time.process_time() - cpu0, 1),
            }
            cells.append(cell)
            print(json.dumps(cell), flush=True)
            if args.json:  # after every cell, so that an interrupted run keeps what it did
                Path(args.json).write_text(json.dumps(cells, indent=1))
    print(markdown_table(cells))


def deployment_of(spec: str, model: str) -> DeploymentConfig:
    """``pp4@static:512`` on ``model`` (SGLang's default chunk 2048 when no policy is named)."""
    pp, tp, policy = parse_deployment(spec)
    return DeploymentConfig(model=model, pp=pp, tp=tp, policy=policy or "static:2048")


def print_looks(
    spec: str, rate: float, workload: WorkloadConfig, model: str, seeds: tuple[int, ...] = (0, 1)
) -> None:
    """One line per look length at ``rate``: what slo_goodput's probe sees there."""
    dep = deployment_of(spec, model)
    cap = MAX_REQUESTS_PER_SEED
    sims = open_probe_runs(workload, dep, rate, seeds, cap)
    n = first_look_length(probe_span_s(workload, dep.slo), rate)
    while True:
        runs = [sim.run_until_ended(n) for sim in sims]
        v = judge_records(runs, dep.slo, rate=rate)
        settled = "unsettled" if is_unsettled(runs, dep.slo) else "settled"
        print(
            f"{model} {workload.name} {spec} {rate:g} req/s, {n:>6} requests per seed: "
            f"{'pass' if v.ok else 'FAIL'} "
            f"({settled})  P90 TTFT {v.metrics['p90_ttft_ms']:.0f} ms  P90 TPOT "
            f"{v.metrics['p90_tpot_ms']:.1f} ms  {v.reason}".rstrip(),
            flush=True,
        )
        if n >= cap:
            return
        n = min(2 * n, cap)


def markdown_table(cells: list[dict]) -> str:
    """One row per deployment, one column per probe-length rule / seed set; the last column
    says whether the row's goodputs lie within the precision of each other (their spread): the
    answer does not move with the probe length or the seeds."""
    labels = [c[0] for c in COLUMNS]
    header = ["deployment", *labels, "agree within 0.1?"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def row_of(cell: dict) -> str:  # cells saved before rows had other workloads lack "row"
        return cell.get("row", cell["deployment"])

    for spec in dict.fromkeys(row_of(c) for c in cells):
        row = {c["column"]: c for c in cells if row_of(c) == spec}
        shown = [
            f"{row[k]['goodput']:.2f} ({', '.join(f'{g:.2f}' for g in row[k]['seed_goodputs'])})"
            if k in row
            else "-"
            for k in labels
        ]
        spread = max(c["goodput"] for c in row.values()) - min(c["goodput"] for c in row.values())
        verdict = f"{'yes' if spread <= PRECISION + 1e-9 else 'NO'} (spread {spread:.2f})"
        lines.append("| " + " | ".join([spec, *shown, verdict]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

"""Does the goodput estimate depend on how long one looks? Issue 13's table, redone.

    python benchmarks/goodput_convergence.py                 # both rows, every column
    python benchmarks/goodput_convergence.py --deploy tp4@static:2048 --json out.json

Rows: deployments on azure-conv, Qwen2.5-32B, 4 x A100-40GB PCIe, SLO 2 s / 200 ms. Columns:
``fastpp goodput``'s search (fastpp.sim.goodput.slo_goodput, precision 0.1 req/s) started from
the default probe length, from 1,000, 3,000 and 6,000 requests per seed, and with another seed
set. Each cell is the goodput (the bracket's low end) and, in brackets, the seeds' own goodputs.
The last column says whether every cell of the row lies within the precision of the others'
brackets: the method converged if the answer does not move with the starting length or seeds.
"""

from __future__ import annotations

import argparse
import json
import time

from fastpp.sim.goodput import slo_goodput
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
    ap.add_argument("--json", help="also write the cells to this file")
    args = ap.parse_args()
    workload = WorkloadConfig(name="azure-conv")
    cells = []
    for spec in args.deploy or DEPLOYMENTS:
        pp, tp, policy = parse_deployment(spec)
        dep = DeploymentConfig(pp=pp, tp=tp, policy=policy or "static:2048")
        row = []
        for label, n, seeds in COLUMNS:
            t0 = time.perf_counter()
            res = slo_goodput(workload, dep, seeds=seeds, num_requests=n, precision=PRECISION)
            cell = {"deployment": spec, "column": label, "goodput": res.rate, "margin": res.margin,
                    "seed_goodputs": list(res.seed_rates), "probes": len(res.probes),
                    "doubled": sum(p.metrics["requests_per_seed"] > (n or 0) and n is not None
                                   for p in res.probes),
                    "wall_s": round(time.perf_counter() - t0, 1)}
            row.append(cell)
            print(json.dumps(cell), flush=True)
        cells += row
        lo = max(c["goodput"] for c in row)
        hi = min(c["goodput"] + c["margin"] for c in row)
        shown = "  ".join(f"{c['column']}: {c['goodput']:.2f} "
                          f"({', '.join(f'{g:.2f}' for g in c['seed_goodputs'])})" for c in row)
        print(f"{spec:18s} {shown}  -> {'agree' if lo < hi + PRECISION else 'DISAGREE'} "
              f"(common bracket [{lo:.2f}, {hi:.2f}))", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(cells, f, indent=1)


if __name__ == "__main__":
    main()

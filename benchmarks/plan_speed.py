"""How long a plan takes, and how many goodput probes the bound pruning saves.

    python benchmarks/plan_speed.py                       # Qwen2.5-32B, 4 x A100-40GB-PCIe, 2 workers
    python benchmarks/plan_speed.py --gpus 8 --gpu H100-SXM --policies static:512,predictive,no-ds
    python benchmarks/plan_speed.py --unpruned            # also the exhaustive plan, to count probes

Prints the wall time, the CPU time of this process and its workers (on a shared machine the
wall time also measures the other load: compare CPU / workers with wall), the probes run, each
candidate that was not pruned (its goodput, or the goodput it fell below, and its probes, or
the ``+ds`` twin whose search it shares), and,
with ``--unpruned``, the probes of the same plan without pruning (every candidate searched
fully, as an exhaustive ``fastpp goodput`` over the candidates would) and the recommendation of
both. No plan folder: nothing is read from or written to a cache.
"""

from __future__ import annotations

import argparse
import resource
import time

from fastpp.sim.plan_job import SearchSettings
from fastpp.sim.planner import PlanConfig, plan_deployment


def cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(config: PlanConfig, workers: int) -> tuple:
    wall0, cpu0 = time.perf_counter(), cpu_s()
    plan = plan_deployment(config, executor="process", workers=workers)
    return plan, time.perf_counter() - wall0, cpu_s() - cpu0


def describe(name: str, plan, wall: float, cpu: float) -> str:
    best = plan.best
    pick = "none" if best is None else f"{best.label} at {best.goodput:.2f} req/s"
    head = (
        f"{name}: wall {wall:.1f} s, CPU {cpu:.1f} s; {len(plan.results)} candidates: "
        f"{plan.count('searched')} searched, {plan.count('beaten')} beaten, "
        f"{plan.count('pruned')} pruned; {plan.num_shared} took their +ds twin's search; "
        f"{plan.probes_run} probes; best {pick}"
    )
    rows = [head]
    for r in plan.results:
        if r.status == "pruned":
            continue
        found = f"{r.goodput:.3f} req/s" if r.goodput is not None else f"< {r.below:.3f} req/s"
        cost = f"= {r.shared_with}" if r.shared_with else f"{r.num_probes} probes"
        rows.append(f"  {r.label:28} {r.status:8} {found:16} {cost}")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen2.5-32B")
    ap.add_argument("--gpu", default="A100-40GB-PCIe")
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--workload", default="azure-conv")
    ap.add_argument("--policies", default=None, help="as fastpp plan --policies")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--precision", type=float, default=0.25)
    ap.add_argument("--unpruned", action="store_true", help="also run the exhaustive plan")
    args = ap.parse_args()
    config = PlanConfig(
        model=args.model,
        gpu=args.gpu,
        num_gpus=args.gpus,
        workload=args.workload,
        policies=args.policies or "",
        settings=SearchSettings(precision=args.precision),
    )
    print(f"{args.model} on {args.gpus} x {args.gpu}, {args.workload}, {args.workers} workers")
    plan, wall, cpu = timed(config, args.workers)
    print(describe("pruned plan", plan, wall, cpu), flush=True)
    if args.unpruned:
        full, wall_u, cpu_u = timed(PlanConfig(**{**_fields(config), "prune": False}), args.workers)
        print(describe("unpruned plan", full, wall_u, cpu_u))
        print(
            f"probes saved by pruning: {full.probes_run - plan.probes_run} of "
            f"{full.probes_run} ({1 - plan.probes_run / max(1, full.probes_run):.0%}); "
            f"CPU {cpu_u:.0f} s -> {cpu:.0f} s; same recommendation: "
            f"{(plan.best and plan.best.label) == (full.best and full.best.label)}"
        )


def _fields(config: PlanConfig) -> dict:
    return {name: getattr(config, name) for name in PlanConfig.__dataclass_fields__}


if __name__ == "__main__":
    main()

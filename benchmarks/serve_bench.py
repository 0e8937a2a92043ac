"""Serve SmolLM2-135M on this machine's CPU cores and load it with ``fastpp bench``.

    python benchmarks/serve_bench.py                       # the README table, ~10 min on 2 cores
    python benchmarks/serve_bench.py --rate 0.3 -n 20 --deployments pp2@static:256
    python benchmarks/serve_bench.py --deployments pp2@static:64 pp2@static:64/late \
        --arrival gamma --cv 4 --seeds 0 1 2      # the queue orders on bursts, three seeds

Each deployment is ``ppP[@policy][/tTHREADS]``: P stage processes with THREADS intra-op threads
each (default 1), the chunk policy [+ balancer]; a suffix ``/late`` serves it with
``--queue-order late_last`` (docs/POLICIES.md). ``pp1/t2`` is the single-process baseline that
uses both cores inside each operator, the CPU analogue of tensor parallelism. Every deployment
gets the same requests (``--workload``, Poisson ``--rate``, ``--seed``), sent as sglang's
benchmark sends them (streamed, ``ignore_eos``, exact output lengths). Prints one row per
deployment and appends each run's JSON line (sglang's keys) to ``--output-file``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from fastpp.backends.openai_server.launcher import FASTPP_COMMAND, ServerProcess

DEFAULT_DEPLOYMENTS = ("pp1@static:256/t2", "pp2@static:256", "pp2@static:64", "pp2@greedy")
COLUMNS = (
    "request_throughput",
    "output_throughput",
    "median_ttft_ms",
    "p90_ttft_ms",
    "median_tpot_ms",
    "p90_tpot_ms",
    "mean_e2e_latency_ms",
)


def parse_deployment(spec: str) -> tuple[int, str | None, int]:
    """``pp2@predictive/t1`` -> (2, "predictive", 1); a ``/late`` suffix is left out."""
    head, _, threads = spec.removesuffix("/late").partition("/t")
    pp, _, policy = head.partition("@")
    if not pp.startswith("pp") or not pp[2:].isdigit():
        raise SystemExit(f"deployment {spec!r}: expected ppP[@policy][/tTHREADS]")
    return int(pp[2:]), policy or None, int(threads) if threads else 1


def run_one(spec: str, args: argparse.Namespace, out: Path, seed: int) -> dict:
    pp, policy, threads = parse_deployment(spec)
    serve = [
        "--model",
        args.model,
        "--pp",
        str(pp),
        "--threads",
        str(threads),
        "--log-level",
        "warning",
        "--slo-ttft-ms",
        str(args.slo_ttft_ms),
        "--slo-tpot-ms",
        str(args.slo_tpot_ms),
    ]
    if policy:
        serve += ["--policy", policy]
    if spec.endswith("/late"):
        serve += ["--queue-order", "late_last"]
    if args.profile and policy and policy.startswith("predictive"):
        serve += ["--profile", args.profile]
    with ServerProcess(*serve) as srv:
        bench = [
            *FASTPP_COMMAND,
            "bench",
            "--base-url",
            srv.url,
            "-w",
            args.workload,
            "-n",
            str(args.num_prompts),
            "-r",
            str(args.rate),
            "--seed",
            str(seed),
            "--arrival",
            args.arrival,
            *(["--cv", str(args.cv)] if args.cv is not None else []),
            "--slo-ttft-ms",
            str(args.slo_ttft_ms),
            "--slo-tpot-ms",
            str(args.slo_tpot_ms),
            "-o",
            str(out),
            "-q",
        ]
        done = subprocess.run(bench, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"bench against {spec} failed:\n{done.stdout}\n{done.stderr}")
        metrics = srv.metrics()
    rec = json.loads(out.read_text().splitlines()[-1])
    prefix = 'fastpp_chunk_budget_microbatches_total{chunk_budget="'
    budgets = {int(k[len(prefix) : -2]): v for k, v in metrics.items() if k.startswith(prefix)}
    total = sum(budgets.values()) or 1
    rec["chunk_budgets"] = " ".join(
        f"{c}:{n / total:.0%}" for c, n in sorted(budgets.items()) if n / total >= 0.05
    )
    busy = [v for k, v in metrics.items() if k.startswith("fastpp_stage_busy_seconds_total")]
    rec["stage_busy_s"] = busy
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--workload", "-w", default="random:256:64:0.5")
    ap.add_argument("--rate", "-r", type=float, default=0.5)
    ap.add_argument("--num-prompts", "-n", type=int, default=40)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="one run per deployment and seed")
    ap.add_argument("--arrival", default="poisson", help="poisson or gamma (bursty with --cv > 1)")
    ap.add_argument("--cv", type=float, help="gamma arrivals' coefficient of variation")
    ap.add_argument("--slo-ttft-ms", type=float, default=5000.0)
    ap.add_argument("--slo-tpot-ms", type=float, default=500.0)
    ap.add_argument("--profile", help="profile JSON for predictive policies (fastpp profile --backend torch)")
    ap.add_argument("--deployments", nargs="+", default=list(DEFAULT_DEPLOYMENTS))
    ap.add_argument("--output-file", "-o", help="append each run's JSON line here")
    args = ap.parse_args()
    print(
        f"# {args.model}, {args.workload}, {args.arrival} {args.rate} req/s"
        + (f" (cv {args.cv:g})" if args.cv is not None else "")
        + f", {args.num_prompts} requests, seeds {' '.join(map(str, args.seeds))}; "
        f"SLO TTFT {args.slo_ttft_ms:.0f} ms / TPOT {args.slo_tpot_ms:.0f} ms",
        flush=True,
    )
    header = (
        "deployment",
        "seed",
        "req/s",
        "out tok/s",
        "TTFT p50 ms",
        "TTFT p90 ms",
        "TPOT p50 ms",
        "TPOT p90 ms",
        "E2E mean s",
        "SLO attainment",
        "chunk budgets (>= 5%)",
        "wall s",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for spec in args.deployments:
                t0 = time.perf_counter()
                rec = run_one(spec, args, Path(tmp) / "run.jsonl", seed)
                wall = time.perf_counter() - t0
                if args.output_file:
                    with open(args.output_file, "a") as f:
                        f.write(json.dumps({"deployment": spec, "seed": seed, **rec}) + "\n")
                cells = [
                    f"{rec[c]:.2f}" if c.endswith("throughput") else f"{rec[c]:.0f}" for c in COLUMNS[:-1]
                ]
                cells.append(f"{rec['mean_e2e_latency_ms'] / 1e3:.1f}")
                cells.append(f"{rec['slo_attainment']:.0%}")
                cells.append(rec["chunk_budgets"])
                cells.append(f"{wall:.0f}")
                if rec["completed"] != args.num_prompts:
                    cells[-1] += f" ({rec['completed']}/{args.num_prompts} completed)"
                print(f"| {spec} | {seed} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()

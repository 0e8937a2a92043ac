"""Stock vLLM pp 2 against our policies inside vLLM, same requests from ``fastpp bench``.

    python benchmarks/vllm_policies.py                        # the README table (~40 min here)
    python benchmarks/vllm_policies.py --deployments stock greedy+ds --reps 1 -n 16

Needs the engine environment of scripts/engines/setup_vllm.sh (``FASTPP_ENGINES_DIR``). Each
deployment is served once (``fastpp serve --backend vllm --pp 2``, eager mode) and gets every
load ``--reps`` times; repetition r of a load sends the same requests to every deployment
(seed ``--seed + r``). Loads:

* ``bursty``: gamma arrivals with coefficient of variation ``--burst-cv`` at ``--burst-rate``
  (``--burst-rate inf``: every request at once, the burst that freezes stock vLLM's split);
* ``poisson``: Poisson arrivals at ``--poisson-rate`` req/s, or ``auto``: ``--load-fraction``
  (default 0.8) of the request throughput the first deployment reached on the bursty load
  (run it first, with ``--burst-rate inf``: all requests at once measure saturation).

Deployments are labels: ``stock`` (vLLM's own scheduler), or a policy spec for ours (``static``,
``greedy``, ``greedy+ds``, ``static+ds``, ``predictive``...), with ``@late_last`` appended for
that queue order (``slack@late_last``: ``--queue-order late_last``). Balancers run with
``--token-step`` (default 1: a CPU has no tile step, so the delay scheduler's tier is one
request and it evens decode counts across the two microbatches). ``predictive`` and ``slack``
(and their ``+ds`` forms) get ``--profile`` (default: the torch engine's SmolLM2 pp 2 profile,
which they correct online from vLLM's measured stage times; a profile of vLLM itself comes from
a recorded run with ``fastpp profile --from-records RUN_DIR``).

Prints, per load and deployment, the mean and the spread (min..max over reps) of output
throughput, TTFT P50/P90, TPOT P50/P90 and goodput: requests per second that met both SLOs
(sglang's ``--goodput`` definition, per request). Every run's JSON line (sglang's keys) is
appended to ``--output-file``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fastpp.backends.openai_server.launcher import FASTPP_COMMAND, ServerProcess

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DEPLOYMENTS = ("stock", "static+ds", "greedy", "greedy+ds", "predictive")
METRICS = (
    ("output_throughput", "out tok/s"),
    ("median_ttft_ms", "TTFT P50"),
    ("p90_ttft_ms", "TTFT P90"),
    ("median_tpot_ms", "TPOT P50"),
    ("p90_tpot_ms", "TPOT P90"),
    ("goodput", "goodput r/s"),
)


def serve_args(label: str, args: argparse.Namespace, record_dir: Path | None) -> list[str]:
    policy, _, queue_order = label.partition("@")
    out = [
        "--backend",
        "vllm",
        "--model",
        "smollm2",
        "--pp",
        "2",
        "--policy",
        policy,
        "--slo-ttft-ms",
        str(args.slo_ttft_ms),
        "--slo-tpot-ms",
        str(args.slo_tpot_ms),
        "--max-model-len",
        "2048",
    ]
    if policy == "stock":
        return out
    if queue_order:
        out += ["--queue-order", queue_order]
    if "+" in policy:
        out += ["--token-step", str(args.token_step)]
    if policy.startswith(("predictive", "slack")):
        out += ["--profile", args.profile]
    if record_dir is not None:
        out += ["--record-dir", str(record_dir / run_dir_name(label))]
    return out


def run_dir_name(label: str) -> str:
    """The folder of a deployment's recorded runs under ``--record-dir``."""
    return re.sub(r"[+:@]", "_", label)


def bench(url: str, model: str, load: str, rep: int, args: argparse.Namespace, out: Path) -> dict:
    cmd = [
        *FASTPP_COMMAND,
        "bench",
        "--base-url",
        url,
        "-m",
        model,
        "-w",
        args.workload,
        "-n",
        str(args.num_prompts),
        "--seed",
        str(args.seed + rep),
        "--slo-ttft-ms",
        str(args.slo_ttft_ms),
        "--slo-tpot-ms",
        str(args.slo_tpot_ms),
        "-o",
        str(out),
        "-q",
    ]
    if load == "bursty":
        cmd += ["-r", str(args.burst_rate), "--arrival", "gamma", "--cv", str(args.burst_cv)]
    else:
        cmd += ["-r", str(args.poisson_rate), "--arrival", "poisson"]
    if load == "bursty" and args.burst_rate == float("inf"):
        cmd = cmd[: cmd.index("--arrival")]  # all at once: no arrival process
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"fastpp bench failed:\n{done.stdout}\n{done.stderr}")
    rec = json.loads(out.read_text().splitlines()[-1])
    rec["goodput"] = rec["request_throughput"] * rec.get("slo_attainment", float("nan"))
    return rec


def auto_rate(results: dict[str, list[dict]], args: argparse.Namespace) -> float:
    """``--load-fraction`` of the request throughput reached on the bursty load so far."""
    bursty = results.get("bursty") or []
    if not bursty:
        raise SystemExit("--poisson-rate auto needs the bursty load to run first (--loads bursty poisson)")
    rate = args.load_fraction * statistics.fmean(r["request_throughput"] for r in bursty)
    print(
        f"  poisson rate: {args.load_fraction:.0%} of {rate / args.load_fraction:.3f} req/s "
        f"= {rate:.3f} req/s",
        flush=True,
    )
    return round(rate, 3)


def run_deployment(label: str, args: argparse.Namespace, out: Path, record_dir: Path | None) -> dict:
    results: dict[str, list[dict]] = {load: [] for load in args.loads}
    started = time.monotonic()
    with ServerProcess(*serve_args(label, args, record_dir), start_timeout_s=900) as srv:
        ready_s = time.monotonic() - started
        import httpx

        model = httpx.get(srv.url + "/v1/models", timeout=10).json()["data"][0]["id"]
        for rep in range(args.reps):
            for load in args.loads:
                if load == "poisson" and args.poisson_rate is None:
                    args.poisson_rate = auto_rate(results, args)
                rec = bench(srv.url, model, load, rep, args, out)
                rec.update(deployment=label, load=load, rep=rep)
                results[load].append(rec)
                print(
                    f"  {label:14s} {load:8s} rep {rep}: {rec['output_throughput']:6.1f} tok/s, "
                    f"TTFT P90 {rec['p90_ttft_ms']:7.0f} ms, TPOT P90 {rec['p90_tpot_ms']:6.0f} ms, "
                    f"goodput {rec['goodput']:.2f} r/s",
                    flush=True,
                )
    print(f"  {label}: ready in {ready_s:.0f} s, done in {time.monotonic() - started:.0f} s", flush=True)
    return results


def table(all_results: dict[str, dict[str, list[dict]]], loads: list[str]) -> str:
    lines = []
    for load in loads:
        lines.append(f"\n{load}: mean (min..max over reps)")
        header = "| deployment | " + " | ".join(name for _, name in METRICS) + " |"
        lines += [header, "|" + "---|" * (len(METRICS) + 1)]
        for label, results in all_results.items():
            runs = results[load]
            cells = []
            for key, _ in METRICS:
                vals = [r[key] for r in runs]
                fmt = "{:.2f}" if key == "goodput" else "{:.1f}" if key == "output_throughput" else "{:.0f}"
                lo, hi = min(vals), max(vals)
                cells.append(f"{fmt.format(statistics.fmean(vals))} ({fmt.format(lo)}..{fmt.format(hi)})")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def structure(record_dir: Path, label: str) -> str | None:
    """What the scheduler did, from its decisions.jsonl (load-independent, unlike latencies):
    the share of schedule() calls that scheduled nothing, the mean decode count of a step that
    had decodes, and the mean |decodes of slot 0 - slot 1| over those steps."""
    path = record_dir / run_dir_name(label) / "decisions.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    decoding = [r for r in rows if r["scheduled_decodes"]]
    empty = sum(r["total_scheduled"] == 0 for r in rows) / len(rows)
    mean_decodes = statistics.fmean(len(r["scheduled_decodes"]) for r in decoding) if decoding else 0.0
    gap = statistics.fmean(abs(r["running"][0] - r["running"][-1]) for r in decoding) if decoding else 0.0
    return (
        f"| {label} | {len(rows)} | {empty:.0%} | {mean_decodes:.1f} | {gap:.1f} | "
        f"{sum(1 for r in rows if r['reason'].startswith('fallback'))} |"
    )


def structure_table(record_dir: Path, labels: list[str]) -> str:
    rows = [row for label in labels if (row := structure(record_dir, label)) is not None]
    if not rows:
        return ""
    head = (
        "\nscheduler steps, all runs of a deployment (decisions.jsonl):\n"
        "| deployment | schedule() calls | empty | decodes per decode step | slot gap | fallbacks |\n"
        "|---|---|---|---|---|---|"
    )
    return "\n".join([head, *rows])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deployments", nargs="+", default=list(DEFAULT_DEPLOYMENTS))
    p.add_argument("--loads", nargs="+", default=["bursty", "poisson"], choices=["bursty", "poisson"])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("-n", "--num-prompts", type=int, default=16)
    p.add_argument("-w", "--workload", default="random:64:64:0.5")
    p.add_argument("--burst-rate", type=float, default=float("inf"))
    p.add_argument("--burst-cv", type=float, default=4.0)
    p.add_argument("--poisson-rate", default="auto", help="req/s, or auto (see the docstring)")
    p.add_argument("--load-fraction", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--slo-ttft-ms", type=float, default=3000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=300.0)
    p.add_argument("--token-step", type=int, default=1)
    p.add_argument("--profile", default=str(REPO / "profiles" / "cpu_smollm2-135m_pp2_loaded.json"))
    p.add_argument("--record-dir", type=Path, default=None, help="each deployment's run folder under it")
    p.add_argument("-o", "--output-file", type=Path, default=None)
    args = p.parse_args()
    args.poisson_rate = None if args.poisson_rate == "auto" else float(args.poisson_rate)
    # SIGTERM (and SIGINT, ignored in background jobs) stop the run through KeyboardInterrupt, so
    # the server of the deployment in progress is shut down, not orphaned.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    if not os.environ.get("FASTPP_ENGINES_DIR") and not (REPO / ".engines").is_dir():
        print("note: FASTPP_ENGINES_DIR is not set; using <repo>/.engines", file=sys.stderr)
    out = args.output_file or Path(tempfile.mkstemp(suffix=".jsonl")[1])
    started = time.monotonic()
    all_results = {}
    for label in args.deployments:
        print(f"{label}:", flush=True)
        all_results[label] = run_deployment(label, args, out, args.record_dir)
    burst = (
        "all at once"
        if args.burst_rate == float("inf")
        else f"gamma CV {args.burst_cv} at {args.burst_rate} req/s"
    )
    print(
        f"\nworkload {args.workload}, {args.num_prompts} requests per run, {args.reps} reps; "
        f"bursty: {burst}; "
        f"poisson: {args.poisson_rate} req/s; SLO TTFT "
        f"{args.slo_ttft_ms:.0f} ms, TPOT {args.slo_tpot_ms:.0f} ms; "
        f"total {time.monotonic() - started:.0f} s"
    )
    print(table(all_results, args.loads))
    if args.record_dir is not None:
        print(structure_table(args.record_dir, args.deployments))
    print(f"\nruns: {out}")


if __name__ == "__main__":
    main()

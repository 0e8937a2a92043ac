"""Real SGLang 0.5.23, pipeline parallel on this machine's CPU, under upstream and fastpp policies.

    python benchmarks/sglang_policies.py                   # all configurations, 2 runs each
    python benchmarks/sglang_policies.py --configs upstream greedy -n 8 --runs 3

Each configuration is one SGLang server (``--pp 2 --device cpu``, float32 SmolLM2-135M, chunk
ceiling ``--chunk``), loaded ``--runs`` times by ``fastpp bench`` with the same requests
(``--workload``, ``--rate``, ``--seed``) after ``--warmup`` discarded runs. Configurations:
``upstream`` (plain SGLang, ``--chunked-prefill-size CHUNK``), ``dynamic`` (plain SGLang with
``--enable-dynamic-chunking``), and fastpp's ``greedy``, ``predictive`` and ``predictive+ds``
through the plugin. Prints one row per configuration: the mean over runs and the spread
(min-max) of output throughput, median TTFT and median TPOT. Needs
scripts/engines/setup_sglang.sh.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fastpp.backends.openai_server.launcher import FASTPP_COMMAND
from fastpp.backends.ports import free_port
from fastpp.backends.sglang.launcher import LaunchSpec, SGLangServer

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {
    "upstream": {},
    "dynamic": {"sglang_args": ("--enable-dynamic-chunking",)},
    "greedy": {"policy": "greedy"},
    "predictive": {"policy": "predictive"},
    "predictive+ds": {"policy": "predictive+ds"},
}
METRICS = ("output_throughput", "median_ttft_ms", "median_tpot_ms")


def spec_for(name: str, args: argparse.Namespace) -> LaunchSpec:
    conf = CONFIGS[name]
    sglang_args = (
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--disable-radix-cache",
        "--chunked-prefill-size",
        str(args.chunk),
        *conf.get("sglang_args", ()),
    )
    policy = conf.get("policy")
    return LaunchSpec(
        model="smollm2",
        pp=2,
        port=free_port(),
        policy=policy,
        sglang_args=sglang_args,
        profile=str(args.profile) if policy and policy.startswith("predictive") else None,
        chunk_candidates=tuple(range(args.chunk // 4, args.chunk + 1, args.chunk // 4)) if policy else None,
        token_step=args.token_step if policy else None,
    )


def run_config(name: str, args: argparse.Namespace, work: Path) -> list[dict]:
    spec = spec_for(name, args)
    out = work / f"{name}.jsonl"
    t0 = time.monotonic()
    with SGLangServer(spec, work / f"{name}.log").start(timeout_s=1200):
        ready = time.monotonic() - t0
        # the first run after start-up pays one-time costs (first shapes, allocations): discarded
        for i in range(args.warmup + args.runs):
            target = out if i >= args.warmup else work / f"{name}.warmup.jsonl"
            bench = [
                *FASTPP_COMMAND,
                "bench",
                "--base-url",
                spec.url,
                "-w",
                args.workload,
                "-n",
                str(args.num_prompts),
                "-r",
                str(args.rate),
                "--seed",
                str(args.seed),
                "-o",
                str(target),
                "-q",
            ]
            done = subprocess.run(bench, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"bench against {name} failed:\n{done.stdout}\n{done.stderr}")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    print(
        f"# {name}: server ready in {ready:.0f} s, {args.runs} runs: "
        + ", ".join(f"{r['output_throughput']:.2f} tok/s" for r in rows),
        file=sys.stderr,
        flush=True,
    )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--workload", "-w", default="random:96:16:0.5")
    ap.add_argument("-n", "--num-prompts", type=int, default=8)
    ap.add_argument("--rate", default="inf")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="runs first sent and discarded, per server")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=256, help="chunk ceiling (SGLang --chunked-prefill-size)")
    ap.add_argument("--token-step", type=int, default=1, help="delay scheduling's tile, in requests")
    ap.add_argument("--profile", type=Path, default=REPO / "profiles" / "cpu_smollm2-135m_pp2.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sglang-bench-") as tmp:
        results = {name: run_config(name, args, Path(tmp)) for name in args.configs}
    print(
        f"SGLang 0.5.23 pp2 on CPU, SmolLM2-135M float32, -w {args.workload} -n {args.num_prompts} "
        f"-r {args.rate}, {args.runs} runs each: mean [min-max]"
    )
    print(f"{'config':<15}" + "".join(f"{m:>28}" for m in METRICS))
    for name, rows in results.items():
        cells = []
        for m in METRICS:
            values = [r[m] for r in rows]
            cells.append(f"{sum(values) / len(values):9.2f} [{min(values):.2f}-{max(values):.2f}]")
        print(f"{name:<15}" + "".join(f"{c:>28}" for c in cells))


if __name__ == "__main__":
    main()

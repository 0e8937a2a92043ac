"""The simulator against a recorded real run, any engine: same requests, same scheduler settings.

    python benchmarks/sim_vs_real.py RUN_DIR                     # profile fitted to RUN_DIR itself
    python benchmarks/sim_vs_real.py RUN_DIR --record vllm       # first serve, load and record it
    python benchmarks/sim_vs_real.py RUN_DIR --profile-from DIR2  # fitted to another run (held out)
    python benchmarks/sim_vs_real.py RUN_DIR --profile P.json     # any profile file
    python benchmarks/sim_vs_real.py RUN_DIR --noise-cv 0.3 --noise-seeds 5   # noisy stage times

RUN_DIR is a run folder (fastpp.run_files) with its setup in summary.json: ``fastpp serve
--backend torch|vllm|sglang --record-dir``, or ``fastpp simulate -o``. The script

0. with ``--record BACKEND``: serves SmolLM2-135M pp 2 (``fastpp serve --backend BACKEND --model
   smollm2 --pp 2 --policy POLICY --record-dir RUN_DIR``; vllm and sglang need the engine
   environments of scripts/engines/, ``FASTPP_ENGINES_DIR``), sends one ``fastpp bench`` load
   (``-w``, ``-n``, ``-r``, Poisson arrivals, ``--seed``), stops the server (which writes the
   records) and goes on with RUN_DIR; the load average before and after is printed, since on a
   shared machine it moves the real side;
1. fits a profile to the records (``fastpp.records_profile``, what ``fastpp profile
   --from-records`` writes), unless one is given;
2. replays the run's requests in the simulator: arrival times, prompt lengths and the number of
   tokens each request generated (requests.jsonl), the run's policy and scheduler settings
   (summary.json's setup: KV pool, page size, candidates, default chunk, SLO, max running);
3. prints real vs simulated TTFT and TPOT P50/P90 (both measured at the scheduler: arrival and
   token instants as the scheduler saw them, not at an HTTP client), throughput and microbatch
   counts, and the per-iteration error of the profile per stage: each recorded iteration's
   stage time predicted from its features vs the time recorded, in-sample and held out (the
   profile refitted on the even microbatches, checked on the odd ones).

``--json FILE`` also writes every number as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from fastpp.metrics import summarize
from fastpp.policies import make_policies
from fastpp.profile import Profile, load_profile
from fastpp.profile_names import resolve_profile
from fastpp.records_profile import iteration_errors, profile_from_run
from fastpp.run_files import SUMMARY, RunFiles, read_run
from fastpp.run_setup import RunSetup
from fastpp.scheduler import Scheduler
from fastpp.sim.engine import PipelineSimulation
from fastpp.types import FinishReason, Request, RequestRecord

METRICS = (
    ("median_ttft_ms", "TTFT P50 (ms)"),
    ("p90_ttft_ms", "TTFT P90 (ms)"),
    ("median_tpot_ms", "TPOT P50 (ms)"),
    ("p90_tpot_ms", "TPOT P90 (ms)"),
    ("output_throughput", "output tok/s"),
    ("duration", "makespan (s)"),
)


def replay_requests(records: list[RequestRecord]) -> tuple[list[Request], float]:
    """The run's requests as the simulator's workload (arrivals shifted to start at 0), and the
    shift. Requests that generated nothing (rejected, aborted before a token) are left out."""
    kept = [r for r in records if r.num_generated >= 1 and r.finish_reason != FinishReason.REJECTED]
    if not kept:
        raise SystemExit("no request of the run generated a token: nothing to replay")
    t0 = min(r.arrived_at for r in kept)
    return [Request(r.req_id, r.arrived_at - t0, r.prompt_len, r.num_generated) for r in kept], t0


def host_loop_of(setup: RunSetup) -> str:
    """The host loop the engine runs: ``batch-queue`` for vLLM (fastpp.pipeline.BatchQueueDriver),
    ``blocking-launch`` for SGLang on CPU (its scheduler computes stage 0 itself, synchronously:
    docs/engines/sglang.md section 6), ``free-slots`` (our PipelineDriver: SGLang's loop on GPUs,
    our engine's, the simulator's) otherwise."""
    if setup.pp > 1 and setup.engine.startswith("vllm"):
        return "batch-queue"
    if setup.engine.startswith("sglang") and setup.device.upper() == "CPU":
        return "blocking-launch"
    return "free-slots"


def simulate(
    profile: Profile,
    setup: RunSetup,
    requests: list[Request],
    host_loop: str = "free-slots",
    noise_cv: float = 0.0,
    noise_seed: int = 0,
):
    config = replace(setup.scheduler, num_slots=profile.pp)
    chunk_policy, balancer = make_policies(setup.policy, config, profile)
    scheduler = Scheduler(config, lambda: 0.0, chunk_policy, balancer)
    return PipelineSimulation(
        profile, scheduler, requests, host_loop=host_loop, noise_cv=noise_cv, noise_seed=noise_seed
    ).run()


def holdout_errors(run: RunFiles, setup: RunSetup, source: str) -> list[dict]:
    """Fit on the even microbatches, check on the odd ones."""
    even = [it for it in run.iterations if it.mb_id % 2 == 0]
    odd = [it for it in run.iterations if it.mb_id % 2 == 1]
    fitted = profile_from_run(RunFiles(run.summary, run.records, even), setup, source=source + " (even mb)")
    return iteration_errors(fitted.profile, odd)


def record_run(run_dir: Path, args: argparse.Namespace) -> None:
    """Serve with --record-dir, send one bench load, stop the server (step 0 of the docstring)."""
    import httpx

    from fastpp.backends.openai_server.launcher import FASTPP_COMMAND, ServerProcess

    if run_dir.exists() and any(run_dir.iterdir()):
        raise SystemExit(f"{run_dir} is not empty: give a new folder to --record into")
    serve = [
        "--backend",
        args.record,
        "--model",
        "smollm2",
        "--pp",
        "2",
        "--policy",
        args.policy,
        "--record-dir",
        str(run_dir),
        *args.serve_arg,
    ]
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    started = time.monotonic()
    with ServerProcess(*serve, start_timeout_s=1200) as srv:
        print(f"server ({' '.join(serve)}) ready in {time.monotonic() - started:.0f} s", flush=True)
        model = httpx.get(srv.url + "/v1/models", timeout=10).json()["data"][0]["id"]
        bench = [
            *FASTPP_COMMAND,
            "bench",
            "--base-url",
            srv.url,
            "-m",
            model,
            "-w",
            args.workload,
            "-n",
            str(args.num_prompts),
            "-r",
            str(args.rate),
            "--arrival",
            "poisson",
            "--seed",
            str(args.seed),
            "-o",
            str(run_dir) + ".bench.jsonl",
            "-q",
            "--warmup-requests",
            "0",
        ]  # the recorded run holds exactly the workload's requests
        print(" ".join(bench[len(FASTPP_COMMAND) :]), flush=True)
        t0 = time.monotonic()
        done = subprocess.run(bench, capture_output=True, text=True)
        print(f"bench: {time.monotonic() - t0:.0f} s, load average {os.getloadavg()[0]:.2f}", flush=True)
        if done.returncode != 0:
            raise SystemExit(f"fastpp bench failed:\n{done.stdout}\n{done.stderr}")
        code = srv.stop(timeout_s=180)
        Path(str(run_dir) + ".serve.log").write_text(srv.log())
    if not (run_dir / SUMMARY).is_file():
        raise SystemExit(
            f"the server (exit {code}) wrote no {SUMMARY} into {run_dir}: see {run_dir}.serve.log"
        )


def _pct(sim: float, real: float) -> str:
    if not (math.isfinite(sim) and math.isfinite(real)) or real == 0:
        return "n/a"
    return f"{(sim - real) / real:+.1%}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path, help="the recorded run folder")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--profile", help="a profile file (or shipped profile name) instead of fitting one")
    src.add_argument("--profile-from", type=Path, help="fit the profile to this other run folder")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    ap.add_argument(
        "--host-loop",
        choices=("auto", "batch-queue", "free-slots", "blocking-launch"),
        default="auto",
        help="the simulated host loop: vLLM's batch queue, launch-into-any-free-slot, or "
        "free slots with the host computing stage 0 (SGLang on CPU) (default auto: "
        "from the run's engine)",
    )
    ap.add_argument(
        "--noise-cv",
        type=float,
        default=0.0,
        help="simulated stage times jitter by a mean-one lognormal factor of this "
        "coefficient of variation (default 0: the profile's times exactly)",
    )
    ap.add_argument(
        "--no-turnaround",
        action="store_true",
        help="simulate with every stage's turnaround 0 (the model before profile schema 2)",
    )
    ap.add_argument(
        "--noise-seeds",
        type=int,
        default=1,
        help="with --noise-cv: simulate this many seeds and report their median",
    )
    rec = ap.add_argument_group("recording a run first (--record)")
    rec.add_argument(
        "--record", choices=("vllm", "sglang", "torch"), help="serve this backend and record RUN_DIR"
    )
    rec.add_argument(
        "--policy",
        default="static",
        help="the served policy (default static: the engine's own "
        "budget, which for vLLM schedules what stock vLLM does)",
    )
    rec.add_argument("-w", "--workload", default="random:256:64:0.5", help="fastpp bench workload")
    rec.add_argument("-n", "--num-prompts", type=int, default=60)
    rec.add_argument("-r", "--rate", type=float, default=0.5, help="Poisson arrivals, req/s")
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--serve-arg", action="append", default=[], help="one more fastpp serve argument")
    args = ap.parse_args(argv)
    if args.record:
        record_run(args.run_dir, args)

    run = read_run(args.run_dir)
    setup = RunSetup.from_summary(run.summary, args.run_dir / SUMMARY)
    if args.profile:
        profile, how = load_profile(resolve_profile(args.profile)), f"profile file {args.profile}"
        fit_notes: tuple[str, ...] = ()
    else:
        fit_dir = args.profile_from or args.run_dir
        fit_run = read_run(fit_dir)
        fit_setup = RunSetup.from_summary(fit_run.summary, fit_dir / SUMMARY)
        fitted = profile_from_run(fit_run, fit_setup, source=str(fit_dir))
        profile, fit_notes = fitted.profile, fitted.notes
        how = f"fitted to {'this run' if args.profile_from is None else fit_dir} (fastpp.records_profile)"
    if profile.pp != setup.pp:
        raise SystemExit(f"the profile is for pp={profile.pp}, the run had pp={setup.pp}")
    if args.no_turnaround:
        profile = replace(profile, stage_turnaround_s=(0.0,) * profile.pp)

    requests, _ = replay_requests(run.records)
    kept = {r.req_id for r in requests}
    real_records = [r for r in run.records if r.req_id in kept]
    host_loop = host_loop_of(setup) if args.host_loop == "auto" else args.host_loop
    if args.noise_cv and args.noise_seeds < 1:
        raise SystemExit(f"--noise-seeds must be >= 1, got {args.noise_seeds}")
    seeds = range(args.noise_seeds if args.noise_cv else 1)
    runs = [simulate(profile, setup, requests, host_loop, args.noise_cv, seed) for seed in seeds]
    sims = [summarize(r.records, slo=setup.scheduler.slo, backend="fastpp-sim") for r in runs]
    sim_mb = int(np.median([r.num_microbatches for r in runs]))
    sim = {key: float(np.median([float(x.get(key, math.nan)) for x in sims])) for key, _ in METRICS}
    real = summarize(real_records, slo=setup.scheduler.slo, backend=setup.engine)
    real_mb = len({it.mb_id for it in run.iterations})
    in_sample = iteration_errors(profile, run.iterations)
    held_out = holdout_errors(run, setup, str(args.run_dir)) if not args.profile else None

    print(
        f"run: {args.run_dir} ({setup.engine}, {setup.device}, pp={setup.pp}, policy {setup.policy}, "
        f"{len(requests)} requests replayed)"
    )
    print(
        f"profile: {how}; simulated host loop: {host_loop}"
        + (f"; stage-time noise CV {args.noise_cv} (median of {len(runs)} seeds)" if args.noise_cv else "")
    )
    for n in fit_notes:
        print(f"  note: {n}")
    print(
        f"host overhead {profile.host_overhead_s * 1e3:.3f} ms, "
        f"token return {profile.token_return_s * 1e3:.3f} ms, "
        f"link latency {profile.link.latency_s * 1e3:.3f} ms, stage turnaround "
        + " / ".join(f"{t * 1e3:.3f}" for t in profile.stage_turnaround_s)
        + " ms"
    )
    print()
    print("| metric | real | simulated | sim vs real |")
    print("|---|---|---|---|")
    for key, label in METRICS:
        r, s = float(real.get(key, math.nan)), float(sim.get(key, math.nan))
        print(f"| {label} | {r:.1f} | {s:.1f} | {_pct(s, r)} |")
    print(f"| microbatches | {real_mb} | {sim_mb} | {_pct(sim_mb, real_mb)} |")
    print()
    # the profile's own error on this run's iterations: in-sample when fitted to this run; with
    # --profile-from, held out across runs; the last column refits on this run's even
    # microbatches and checks the odd ones (held out within the run)
    own = "in-sample" if args.profile is None and args.profile_from is None else "profile given"
    print(
        f"| stage | iterations | median error ({own}) | median bias | p90 error | "
        "median error, fit even mb / check odd |"
    )
    print("|---|---|---|---|---|---|")
    for k, row in enumerate(in_sample):
        held = f"{held_out[k]['median_ape']:.1%}" if held_out else "n/a"
        print(
            f"| {row['stage']} | {row['n']} | {row['median_ape']:.1%} | {row['median_bias']:+.1%} | "
            f"{row['p90_ape']:.1%} | {held} |"
        )
    if args.json:
        out = {
            "run_dir": str(args.run_dir),
            "engine": setup.engine,
            "policy": setup.policy,
            "profile": how,
            "host_loop": host_loop,
            "real": {k: real.get(k) for k, _ in METRICS},
            "sim": {k: sim.get(k) for k, _ in METRICS},
            "microbatches": {"real": real_mb, "sim": sim_mb},
            "noise_cv": args.noise_cv,
            "noise_seeds": len(runs),
            "iteration_errors": in_sample,
            "iteration_errors_held_out": held_out,
            "profile_fields": {
                "host_overhead_s": profile.host_overhead_s,
                "token_return_s": profile.token_return_s,
                "link_latency_s": profile.link.latency_s,
                "stage_turnaround_s": list(profile.stage_turnaround_s),
            },
        }
        args.json.write_text(
            json.dumps(
                out, indent=2, default=lambda v: None if isinstance(v, float) and not np.isfinite(v) else v
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

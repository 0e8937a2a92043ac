"""The planner's predicted goodput against real runs of the same CPU deployments.

    python benchmarks/plan_vs_engine.py                                  # ~25 min on 2 cores
    python benchmarks/plan_vs_engine.py --policies static:256 -n 20 --max-probes 3   # a quick look
    python benchmarks/plan_vs_engine.py --profile pp1.json --profile pp2.json        # profiles given
    python benchmarks/plan_vs_engine.py --predict-only                   # profiles and plan only
    python benchmarks/plan_vs_engine.py --report out.json                # an earlier --json again

Run it on a quiet machine (on a shared one, under a lock that keeps other heavy jobs off the
cores: the real side measures the machine, the predicted side does not). For each deployment
(default ``pp1/t2,pp2/t1``: one process with 2 intra-op threads, and two stage processes of one
thread each, so both use 2 cores) of SmolLM2-135M on the CPU engine, the script

1. measures a profile, ``fastpp profile --backend torch -m smollm2-135m --weights smollm2
   --pp P --threads T --kv-tokens K`` (the settings ``fastpp serve`` runs with: float32, its KV
   pool of ``--kv-blocks`` x 16 tokens), with ``--concurrent-load`` for pp >= 2 (the stages
   compute at once when serving; ``--alone`` times each alone), unless ``--profile`` gives one;
2. plans it: ``plan_deployment`` (what ``fastpp plan --profile FILE --gpus P`` runs) on that
   profile, every policy of ``--policies`` searched fully (no pruning), with serve's chunk
   candidates (32..1024), the workload ``-w`` and SLO, under the **fixed-run protocol**
   (``fastpp plan --no-steady -n N``): each probed rate is one run of N requests per seed, judged
   by P90 TTFT and P90 TPOT alone. Each deployment is its own plan, on ``--gpus P``: the planner
   counts devices, not cores, so a pp1 profile planned on 2 "GPUs" would be two replicas;
3. serves it (``fastpp serve --backend torch --model smollm2 --pp P --threads T --policy POLICY
   --profile FILE`` and the same SLO) and searches its real goodput with the planner's own search
   (``find_goodput``: bracket, then bisection to ``--precision``), each probe one
   ``fastpp bench`` run per seed (its runner, in this process: Poisson arrivals at the rate, the
   same N requests of the same seeds as the simulated probe, exact output lengths) judged by the
   planner's own verdict (``judge_records`` without the steady-queue rule: failed requests count
   as infinite TTFT). The search starts from the bracket [(1 - s) x, (1 + s) x] around the
   predicted goodput x (``--spread`` s);
4. prints per (deployment, policy) the predicted and measured goodput, the error (predicted /
   measured - 1) and both ranks, how many pairs of rows the prediction orders as measured, and
   the load average before and after (a shared machine moves the real side); then every real
   probe beside its simulated twin (the same requests at the same rate on the profile): real
   and simulated P90 TTFT and TPOT and both verdicts, which shows where the error comes from.

Steady-state goodput (the planner's default) needs minutes of arrivals per probe and a
confirmation on 12,000 requests; on real runs that is impractical, so both sides use fixed runs of
the same N: the numbers measure how large a burst of N requests each deployment absorbs within
the SLO (docs/GOODPUT.md), and compare only at the same N. ``--json FILE`` writes everything
(profiles used, every probe on both sides, the rows).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fastpp.run_files import json_safe as finite  # NaN and infinities to None: strict JSON
from fastpp.sim.goodput import ProbeResult, find_goodput, judge_records
from fastpp.types import SLO

DEFAULT_DEPLOYMENTS = "pp1/t2,pp2/t1"
DEFAULT_POLICIES = "static:256,predictive"
BLOCK_SIZE = 16  # fastpp serve's --block-size default: the KV pool is --kv-blocks x this


@dataclass(frozen=True, slots=True)
class CpuDeployment:
    """P stage processes of T intra-op threads each."""

    pp: int
    threads: int

    @property
    def label(self) -> str:
        return f"pp{self.pp}/t{self.threads}"

    @staticmethod
    def parse(spec: str) -> CpuDeployment:
        """``pp2/t1`` -> CpuDeployment(2, 1); ``pp2`` means one thread per stage."""
        head, _, threads = spec.strip().partition("/t")
        if not head.startswith("pp") or not head[2:].isdigit() or (threads and not threads.isdigit()):
            raise ValueError(f"deployment {spec!r}: expected ppP[/tTHREADS], e.g. pp2/t1")
        dep = CpuDeployment(int(head[2:]), int(threads) if threads else 1)
        if dep.pp < 1 or dep.threads < 1:
            raise ValueError(f"deployment {spec!r}: stages and threads must be >= 1")
        return dep


def parse_deployments(text: str) -> list[CpuDeployment]:
    deps = [CpuDeployment.parse(s) for s in text.split(",") if s.strip()]
    if not deps:
        raise ValueError("give at least one deployment")
    if len({d.pp for d in deps}) != len(deps):
        raise ValueError(f"deployments {text!r}: one per pp (a profile is matched to its deployment by pp)")
    return deps


def planner_policies(policies: Sequence[str]) -> str:
    """The ``--policies`` text that plans exactly ``policies``: ``no-ds`` keeps the planner from
    adding each policy's ``+ds`` twin (full specs such as ``predictive+ds`` stay, on pp > 1)."""
    return ",".join([*policies, "no-ds"])


# ---- the real goodput search --------------------------------------------------------------------


def search_bracket(
    predicted: float | None, spread: float, fallback: tuple[float, float]
) -> tuple[float, float]:
    """Where the real search starts: [(1 - spread) x, (1 + spread) x] around the predicted
    goodput x, or ``fallback`` when there is none (0 or unknown)."""
    if not 0 < spread < 1:
        raise ValueError(f"spread must be in (0, 1), got {spread!r}")
    if predicted is None or not predicted > 0 or not math.isfinite(predicted):
        return fallback
    return predicted * (1 - spread), predicted * (1 + spread)


def search_measured(
    probe: Callable[[float], ProbeResult],
    predicted: float | None,
    *,
    spread: float,
    precision: float,
    max_probes: int,
    fallback: tuple[float, float] = (0.5, 1.0),
):
    """The real goodput: ``find_goodput`` (the planner's bracket-and-bisect, no confirmation: the
    fixed-run protocol) over ``probe``, started around the prediction."""
    low, high = search_bracket(predicted, spread, fallback)
    return find_goodput(probe, low=low, high=high, precision=precision, max_probes=max_probes)


def bench_probe(
    url: str,
    *,
    workload: str,
    num_requests: int,
    seeds: Sequence[int],
    slo: SLO,
    timeout_s: float,
    log: list[dict],
    jsonl: Path | None = None,
) -> Callable[[float], ProbeResult]:
    """A probe that runs ``fastpp bench`` (its runner) once per seed at the rate and judges the
    pooled records as a simulated fixed-run probe is judged."""
    from fastpp.backends.bench.config import BenchConfig
    from fastpp.backends.bench.report import append_jsonl
    from fastpp.backends.bench.runner import run_bench

    def probe(rate: float) -> ProbeResult:
        runs, t0, load0 = [], time.monotonic(), os.getloadavg()[0]
        for seed in seeds:
            config = BenchConfig(
                base_url=url,
                workload=workload,
                num_prompts=num_requests,
                request_rate=rate,
                arrival="poisson",
                seed=seed,
                slo=slo,
                timeout_s=timeout_s,
            )
            result = run_bench(config, handle_sigint=False)
            if result.is_interrupted:
                raise SystemExit(f"the bench at {rate:g} req/s was interrupted")
            runs.append(result.records)
            if jsonl is not None:
                append_jsonl(result, jsonl)
        verdict = judge_records(runs, slo, rate=rate, require_steady=False)
        entry = {
            "rate": rate,
            "ok": verdict.ok,
            "reason": verdict.reason,
            "p90_ttft_ms": verdict.metrics["p90_ttft_ms"],
            "p90_tpot_ms": verdict.metrics["p90_tpot_ms"],
            "slo_attainment": verdict.metrics["slo_attainment"],
            "num_failed": verdict.metrics["num_failed"],
            "wall_s": time.monotonic() - t0,
            "load_average_before": load0,
            "load_average_after": os.getloadavg()[0],
        }
        log.append(entry)
        print(
            f"    {rate:6.3f} req/s: {'pass' if verdict.ok else 'FAIL'}  P90 TTFT "
            f"{entry['p90_ttft_ms']:.0f} ms, P90 TPOT {entry['p90_tpot_ms']:.0f} ms "
            f"({entry['wall_s']:.0f} s, load {entry['load_average_after']:.2f})",
            flush=True,
        )
        return verdict

    return probe


# ---- comparing ----------------------------------------------------------------------------------


def ranks(values: Sequence[float | None]) -> list[int | None]:
    """Competition ranks, highest value first (1, 2, 2, 4); None for a missing value."""
    known = [v for v in values if v is not None]
    return [None if v is None else 1 + sum(w > v for w in known) for v in values]


def pair_agreement(predicted: Sequence[float | None], measured: Sequence[float | None]) -> tuple[int, int]:
    """(pairs the prediction orders as the measurement does, pairs the measurement orders): a
    pair counts when the measured goodputs differ; it agrees when the predicted ones differ the
    same way."""
    agree = total = 0
    rows = [(p, m) for p, m in zip(predicted, measured, strict=True) if p is not None and m is not None]
    for i, (p1, m1) in enumerate(rows):
        for p2, m2 in rows[i + 1 :]:
            if m1 == m2:
                continue
            total += 1
            agree += (p1 - p2) * (m1 - m2) > 0
    return agree, total


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    """predicted / measured - 1 (None when either is unknown or nothing was measured)."""
    if predicted is None or measured is None or not measured > 0:
        return None
    return predicted / measured - 1


def table_rows(rows: Sequence[dict]) -> list[str]:
    """The markdown table of the comparison (rows: deployment, policy, predicted, measured and
    their margins)."""
    pred_rank = ranks([r["predicted"] for r in rows])
    meas_rank = ranks([r["measured"] for r in rows])

    def gp(value: float | None, margin: float | None) -> str:
        if value is None:
            return "n/a"
        return f"{value:.2f}" + (f" (+{margin:.2f})" if margin is not None and math.isfinite(margin) else "")

    out = [
        "| deployment | policy | predicted goodput | measured goodput | error | "
        "predicted rank | measured rank |",
        "|---|---|---|---|---|---|---|",
    ]
    for r, pr, mr in zip(rows, pred_rank, meas_rank, strict=True):
        err = relative_error(r["predicted"], r["measured"])
        out.append(
            f"| {r['deployment']} | {r['policy']} | {gp(r['predicted'], r.get('predicted_margin'))} | "
            f"{gp(r['measured'], r.get('measured_margin'))} | {'n/a' if err is None else f'{err:+.0%}'} | "
            f"{pr or '-'} | {mr or '-'} |"
        )
    return out


# ---- the two sides ------------------------------------------------------------------------------


def measure_profile(dep: CpuDeployment, args: argparse.Namespace, out: Path) -> Path:
    from fastpp.backends.openai_server.launcher import FASTPP_COMMAND

    cmd = [
        "profile",
        "--backend",
        "torch",
        "-m",
        "smollm2-135m",
        "--weights",
        "smollm2",
        "--pp",
        str(dep.pp),
        "--threads",
        str(dep.threads),
        "--dtype",
        "float32",
        "--kv-tokens",
        str(args.kv_blocks * BLOCK_SIZE),
        "-o",
        str(out),
    ]
    if args.quick:
        cmd.append("--quick")
    if dep.pp > 1 and not args.alone:
        cmd.append("--concurrent-load")
    print(f"  fastpp {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    done = subprocess.run([*FASTPP_COMMAND, *cmd], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"fastpp profile failed:\n{done.stdout}\n{done.stderr}")
    print(f"  measured in {time.monotonic() - t0:.0f} s", flush=True)
    return out


def profiles_for(deps: Sequence[CpuDeployment], args: argparse.Namespace, work: Path) -> dict[int, str]:
    """Each deployment's profile file (by pp): given with --profile, else measured now."""
    from fastpp.profile import load_profile
    from fastpp.profile_names import resolve_profile

    given: dict[int, str] = {}
    for name in args.profile:
        prof = load_profile(resolve_profile(name))
        if prof.pp in given:
            raise SystemExit(f"two --profile files for pp{prof.pp}")
        given[prof.pp] = resolve_profile(name)
    out: dict[int, str] = {}
    for dep in deps:
        if dep.pp in given:
            prof = load_profile(given[dep.pp])
            threads = str(prof.provenance.get("threads_per_stage", "?"))
            if threads != str(dep.threads):
                print(
                    f"  note: {given[dep.pp]} was measured with {threads} thread(s) per stage, "
                    f"{dep.label} runs {dep.threads}"
                )
            out[dep.pp] = str(given[dep.pp])
        else:
            print(f"profile of {dep.label}:", flush=True)
            path = work / f"cpu_smollm2-135m_pp{dep.pp}_t{dep.threads}.json"
            out[dep.pp] = str(measure_profile(dep, args, path))
    return out


def predict(dep: CpuDeployment, profile: str, args: argparse.Namespace) -> dict[str, dict]:
    """The planner's fixed-run goodput of every policy on ``dep`` (by policy spec)."""
    from fastpp.backends.torch.engine_config import CPU_CHUNK_CANDIDATES
    from fastpp.sim.plan_job import SearchSettings
    from fastpp.sim.planner import PlanConfig, plan_deployment

    config = PlanConfig(
        num_gpus=dep.pp,
        workload=args.workload,
        slo=SLO(args.slo_ttft_ms / 1e3, args.slo_tpot_ms / 1e3),
        policies=planner_policies(args.policies),
        profiles=(profile,),
        chunk_candidates=CPU_CHUNK_CANDIDATES,
        settings=SearchSettings(
            seeds=tuple(args.seeds),
            precision=args.precision,
            num_requests=args.num_requests,
            require_steady=False,
        ),
        prune=False,
    )
    t0 = time.monotonic()
    plan = plan_deployment(config, executor="serial")
    out = {}
    for r in plan.results:
        if r.candidate.layout.dp != 1:
            raise SystemExit(f"the plan made {r.label}: expected one replica on --gpus {dep.pp}")
        out[r.candidate.policy] = {
            "goodput": r.goodput,
            "margin": r.margin,
            "bound": r.bound.rate,
            "bound_bottleneck": r.bound.bottleneck,
            "status": r.status,
            "binding": r.binding,
            "num_probes": r.num_probes,
            "reason": r.reason,
        }
    for exc in plan.excluded:
        print(f"  left out by the plan: {exc.layout.label}: {exc.reason}")
    print(f"  planned {dep.label} in {time.monotonic() - t0:.0f} s", flush=True)
    return out


def measure(dep: CpuDeployment, policy: str, profile: str, predicted: float | None, args) -> dict:
    """Serve ``dep`` with ``policy`` and search its real goodput."""
    from fastpp.backends.openai_server.launcher import ServerProcess

    serve = [
        "--backend",
        "torch",
        "--model",
        "smollm2",
        "--pp",
        str(dep.pp),
        "--threads",
        str(dep.threads),
        "--policy",
        policy,
        "--profile",
        profile,
        "--kv-blocks",
        str(args.kv_blocks),
        "--slo-ttft-ms",
        str(args.slo_ttft_ms),
        "--slo-tpot-ms",
        str(args.slo_tpot_ms),
        "--log-level",
        "warning",
    ]
    log: list[dict] = []
    t0 = time.monotonic()
    with ServerProcess(*serve, start_timeout_s=600) as srv:
        print(f"  fastpp serve {' '.join(serve)}  (ready in {time.monotonic() - t0:.0f} s)", flush=True)
        probe = bench_probe(
            srv.url,
            workload=args.workload,
            num_requests=args.num_requests,
            seeds=args.seeds,
            slo=SLO(args.slo_ttft_ms / 1e3, args.slo_tpot_ms / 1e3),
            timeout_s=args.request_timeout_s,
            log=log,
            jsonl=args.bench_jsonl,
        )
        res = search_measured(
            probe, predicted, spread=args.spread, precision=args.precision, max_probes=args.max_probes
        )
    return {
        "goodput": res.rate,
        "margin": res.margin,
        "reason": res.reason,
        "notes": list(res.notes),
        "probes": log,
        "wall_s": time.monotonic() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = ap.add_argument
    add("--deployments", default=DEFAULT_DEPLOYMENTS, help="comma list of ppP/tTHREADS")
    add("--policies", default=DEFAULT_POLICIES, help="comma list of policy specs")
    add("-w", "--workload", default="random:128:32:0.5", help="a workload both plan and bench take")
    add("--slo-ttft-ms", type=float, default=1000.0)
    add("--slo-tpot-ms", type=float, default=200.0)
    add("-n", "--num-requests", type=int, default=100, help="requests per seed per probe, both sides")
    add("--seeds", default="0", help="comma list: seeds pooled per probe, both sides (default 0)")
    add("--precision", type=float, default=0.2, help="both searches end on a bracket below this, req/s")
    add("--spread", type=float, default=0.2, help="the real search starts at predicted x (1 +- this)")
    add("--max-probes", type=int, default=6, help="real probes per (deployment, policy) at most")
    add("--kv-blocks", type=int, default=1024, help="fastpp serve's KV pool per stage, blocks of 16")
    add("--profile", action="append", default=[], help="a profile for one deployment (matched by pp)")
    add("--quick", action="store_true", help="measure profiles on fastpp profile's coarse grid")
    add("--alone", action="store_true", help="measure pp >= 2 profiles without --concurrent-load")
    add("--predict-only", action="store_true", help="profiles and plans only, no real runs")
    add("--request-timeout-s", type=float, default=300.0, help="per bench request")
    add("--work-dir", type=Path, default=Path("runs/plan_vs_engine"), help="measured profiles go here")
    add("--bench-jsonl", type=Path, help="append every bench run's JSON line here")
    add("--json", type=Path, help="write everything here")
    add("--report", type=Path, help="print the tables of an earlier --json file (adds simulated probes)")
    args = ap.parse_args(argv)
    if args.report:
        out = json.loads(args.report.read_text())
        if any("simulated" not in p for r in out["rows"] for p in (r.get("real") or {}).get("probes", [])):
            add_simulated_probes(out)
        print(report(out))
        if args.json:
            args.json.write_text(json.dumps(out, indent=2) + "\n")
        return 0
    try:
        deps = parse_deployments(args.deployments)
        args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if not args.policies or not args.seeds:
        raise SystemExit("give at least one policy and one seed")
    args.work_dir.mkdir(parents=True, exist_ok=True)

    load_before = os.getloadavg()
    started = time.monotonic()
    print(
        f"SmolLM2-135M on the CPU engine, {', '.join(d.label for d in deps)}; {args.workload}, "
        f"P90 TTFT <= {args.slo_ttft_ms:g} ms, P90 TPOT <= {args.slo_tpot_ms:g} ms; fixed runs of "
        f"{args.num_requests} requests, seeds {','.join(map(str, args.seeds))}, "
        f"precision {args.precision:g} req/s; "
        f"load average {load_before[0]:.2f}",
        flush=True,
    )
    profiles = profiles_for(deps, args, args.work_dir)
    predicted: dict[str, dict[str, dict]] = {}
    for dep in deps:
        print(f"plan of {dep.label} on {profiles[dep.pp]}:", flush=True)
        predicted[dep.label] = predict(dep, profiles[dep.pp], args)
        for policy in args.policies:
            p = predicted[dep.label].get(policy)
            got = "not planned" if p is None else f"{p['goodput']:.2f} req/s (bound {p['bound']:.2f})"
            print(f"  {policy}: {got}")

    rows = []
    for dep in deps:
        for policy in args.policies:
            pred = predicted[dep.label].get(policy)
            row = {
                "deployment": dep.label,
                "policy": policy,
                "profile": profiles[dep.pp],
                "predicted": None if pred is None else pred["goodput"],
                "predicted_margin": None if pred is None else pred["margin"],
                "plan": pred,
                "measured": None,
                "measured_margin": None,
            }
            if not args.predict_only:
                print(f"real {dep.label} {policy}:", flush=True)
                real = measure(dep, policy, profiles[dep.pp], row["predicted"], args)
                row.update(measured=real["goodput"], measured_margin=real["margin"], real=real)
            rows.append(row)

    load_after = os.getloadavg()
    agree, total = pair_agreement([r["predicted"] for r in rows], [r["measured"] for r in rows])
    out = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "json"},
        "protocol": "fixed runs (fastpp plan --no-steady -n N), P90 TTFT and P90 TPOT",
        "profiles": {f"pp{k}": v for k, v in profiles.items()},
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
        "rows": [{**r, "error": relative_error(r["predicted"], r["measured"])} for r in rows],
        "ranks": {
            "predicted": ranks([r["predicted"] for r in rows]),
            "measured": ranks([r["measured"] for r in rows]),
            "pairs_agreeing": agree,
            "pairs": total,
        },
        "wall_s": time.monotonic() - started,
    }
    out = finite(out)
    if not args.predict_only:
        add_simulated_probes(out)
    print()
    print(report(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


def simulate_probe(profile: str, policy: str, rate: float, config: dict) -> dict:
    """The planner's verdict on a simulated fixed run at ``rate``: the same requests (workload,
    seeds, N) on the profile, with serve's chunk candidates."""
    from fastpp.backends.torch.engine_config import CPU_CHUNK_CANDIDATES
    from fastpp.sim.run import DeploymentConfig, WorkloadConfig, open_simulation

    slo = SLO(config["slo_ttft_ms"] / 1e3, config["slo_tpot_ms"] / 1e3)
    dep = DeploymentConfig(
        profile_path=profile, policy=policy, slo=slo, chunk_candidates=CPU_CHUNK_CANDIDATES
    )
    runs = [
        open_simulation(
            WorkloadConfig(
                name=config["workload"], rate=rate, num_requests=config["num_requests"], seed=seed
            ),
            dep,
            record_iterations=False,
        )
        .run()
        .records
        for seed in config["seeds"]
    ]
    verdict = judge_records(runs, slo, rate=rate, require_steady=False)
    return {
        "ok": verdict.ok,
        "p90_ttft_ms": verdict.metrics["p90_ttft_ms"],
        "p90_tpot_ms": verdict.metrics["p90_tpot_ms"],
    }


def add_simulated_probes(out: dict) -> None:
    """Each real probe's simulated twin (``simulated`` key of the probe), in place."""
    for row in out["rows"]:
        for probe in (row.get("real") or {}).get("probes", []):
            probe["simulated"] = finite(
                simulate_probe(row["profile"], row["policy"], probe["rate"], out["config"])
            )


def _ms(value: float | None) -> str:
    return "inf" if value is None else f"{value:.0f}"  # None: infinite in the JSON (finite())


def report(out: dict) -> str:
    """The tables of a run's JSON (what ``--json`` writes; ``--report`` prints them again)."""
    rows, cfg = out["rows"], out["config"]
    lines = [
        f"SmolLM2-135M, CPU engine, {cfg['workload']}, P90 TTFT <= {cfg['slo_ttft_ms']:g} ms, "
        f"P90 TPOT <= {cfg['slo_tpot_ms']:g} ms; fixed runs of {cfg['num_requests']} requests "
        f"(seeds {','.join(map(str, cfg['seeds']))}) on both sides",
        "",
        *table_rows(rows),
        "",
    ]
    ranks_ = out.get("ranks", {})
    if ranks_.get("pairs"):
        agree, pairs = ranks_["pairs_agreeing"], ranks_["pairs"]
        lines.append(f"ranking: the prediction orders {agree} of {pairs} pairs as measured")
    before, after = out["load_average_before"], out["load_average_after"]
    lines.append(
        "goodput: req/s (+ the bracket the search ended on); error = predicted / measured - 1; "
        f"load average before {before[0]:.2f} / {before[1]:.2f} (1 / 5 min), "
        f"after {after[0]:.2f} / {after[1]:.2f}; {out['wall_s']:.0f} s"
    )
    probe_lines = []
    for row in rows:
        for p in sorted((row.get("real") or {}).get("probes", []), key=lambda p: p["rate"]):
            sim = p.get("simulated")
            if sim is None:
                continue
            probe_lines.append(
                f"| {row['deployment']} | {row['policy']} | {p['rate']:.2f} | "
                f"{_ms(p['p90_ttft_ms'])} / {_ms(sim['p90_ttft_ms'])} | "
                f"{_ms(p['p90_tpot_ms'])} / {_ms(sim['p90_tpot_ms'])} | "
                f"{'pass' if p['ok'] else 'fail'} / {'pass' if sim['ok'] else 'fail'} | "
                f"{p['load_average_after']:.2f} |"
            )
    if probe_lines:
        lines += [
            "",
            "every real probe and its simulated twin (the same requests), real / simulated:",
            "",
            "| deployment | policy | rate | P90 TTFT ms | P90 TPOT ms | verdict | load average |",
            "|---|---|---|---|---|---|---|",
            *probe_lines,
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

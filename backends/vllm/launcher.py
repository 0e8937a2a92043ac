"""``fastpp serve --backend vllm``: vLLM's OpenAI server with our scheduler, one command.

``serve_vllm(VllmLaunch(...))`` runs ``vllm serve`` in vLLM's own environment (its interpreter:
``--engine-python``, else ``$FASTPP_VLLM_PYTHON``, else
``$FASTPP_ENGINES_DIR/vllm-0.32.0/bin/python`` as scripts/engines/setup_vllm.sh builds it) with:

* ``--scheduler-cls fastpp.backends.vllm.scheduler.FastPPScheduler`` and our settings in
  ``FASTPP_VLLM_SCHEDULER`` (settings.py); ``stock=True`` leaves vLLM's own scheduler in place
  (for comparisons; the plugin's CPU fix still applies);
* ``-pp N`` and, for N > 1, ``--distributed-executor-backend mp`` (unless given);
* a folder for the workers' stage times (``FASTPP_VLLM_STAGE_TIMES_DIR``): inside
  ``--record-dir`` when recording, else a temporary folder removed at exit;
* with ``--record-dir``, ``--shutdown-timeout 30`` (unless given): vLLM's default (0) kills the
  engine core before the scheduler can write the run folder.

CPU workarounds, applied when the machine has no NVIDIA device (``cpu`` overrides the guess):

* ``VLLM_CPU_OMP_THREADS_BIND``: the allowed cores split into N contiguous groups, one per
  stage ("0|1" on two cores). vLLM refuses to place two ranks on one NUMA node by itself.
* ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB of KV per rank) unless set: vLLM's default sizes it from
  free memory.
* ``--enforce-eager`` unless ``compile=True`` or the vLLM arguments say ``--no-enforce-eager``:
  start-up in about a minute instead of a torch.compile warm-up of several; the plugin's fix
  (plugin.py) makes eager mode work with PP.
* The metadata name: the CPU build is the distribution ``vllm-cpu`` but vLLM's CLI asks for
  ``vllm``; setup_vllm.sh writes the shim, and the launcher checks for it (see the error).

Everything after the launcher's own options goes to ``vllm serve`` unchanged.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fastpp.backends.vllm.settings import STAGE_TIMES_ENV_VAR, VllmSchedulerSettings

SCHEDULER_CLS = "fastpp.backends.vllm.scheduler.FastPPScheduler"
VLLM_VERSION = "0.32.0"
REPO_ROOT = Path(__file__).resolve().parents[2]
SHUTDOWN_TIMEOUT_S = 30


def default_engine_python() -> Path:
    """The engine interpreter: $FASTPP_VLLM_PYTHON, else the venv setup_vllm.sh builds."""
    explicit = os.environ.get("FASTPP_VLLM_PYTHON")
    if explicit:
        return Path(explicit)
    engines = Path(os.environ.get("FASTPP_ENGINES_DIR") or REPO_ROOT / ".engines")
    return engines / f"vllm-{VLLM_VERSION}" / "bin" / "python"


def has_nvidia_gpu() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*"))


def cpu_bind(num_stages: int, cores: list[int] | None = None) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``num_stages`` ranks: the cores in contiguous groups."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else sorted(cores)
    if len(cores) < num_stages:
        raise ValueError(
            f"--pp {num_stages} needs at least {num_stages} CPU cores (one per stage), "
            f"this process may use {len(cores)}"
        )
    per, extra = divmod(len(cores), num_stages)
    groups, start = [], 0
    for rank in range(num_stages):
        size = per + (rank < extra)
        group = cores[start : start + size]
        start += size
        groups.append(str(group[0]) if len(group) == 1 else _ranges(group))
    return "|".join(groups)


def _ranges(cores: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    parts, first = [], cores[0]
    for prev, cur in zip(cores, [*cores[1:], None], strict=True):
        if cur != prev + 1:
            parts.append(str(first) if first == prev else f"{first}-{prev}")
            first = cur
    return ",".join(parts)


def _has_flag(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def _flag_value(args: list[str], flag: str) -> str | None:
    """The value ``flag`` is given in ``args`` (``--flag V`` or ``--flag=V``; the last wins)."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.partition("=")[2]
    return value


@dataclass
class VllmLaunch:
    """One ``vllm serve`` run (module docstring). ``vllm_args`` go to vLLM unchanged."""

    model: str
    pp: int = 2
    host: str = "127.0.0.1"
    port: int = 8000
    settings: VllmSchedulerSettings = field(default_factory=VllmSchedulerSettings)
    stock: bool = False  # vLLM's own scheduler instead of ours
    engine_python: str | None = None
    cpu: bool | None = None  # None: guess (no NVIDIA device -> CPU)
    compile: bool = False  # CPU: torch.compile warm-up instead of --enforce-eager
    kv_cache_gib: int | None = None  # CPU: VLLM_CPU_KVCACHE_SPACE; None keeps the env's, else 1
    vllm_args: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.pp < 1:
            raise ValueError(f"--pp must be >= 1, got {self.pp}")
        if not (0 < self.port < 65536):
            raise ValueError(f"--port must be in 1..65535, got {self.port}")
        if self.kv_cache_gib is not None and self.kv_cache_gib < 1:
            raise ValueError(f"kv_cache_gib must be >= 1 GiB, got {self.kv_cache_gib}")
        policy = _flag_value(self.vllm_args, "--scheduling-policy")
        if self.settings.queue_order == "late_last" and policy not in (None, "fcfs"):
            raise ValueError(
                f"--queue-order late_last reorders vLLM's FCFS queue: it needs --scheduling-policy "
                f"fcfs, got {policy}"
            )

    @property
    def python(self) -> Path:
        return Path(self.engine_python) if self.engine_python else default_engine_python()

    @property
    def on_cpu(self) -> bool:
        return not has_nvidia_gpu() if self.cpu is None else self.cpu

    def command(self) -> list[str]:
        """The ``vllm serve`` command line."""
        args = list(self.vllm_args)
        cmd = [
            str(self.python),
            "-m",
            "vllm.entrypoints.cli.main",
            "serve",
            self.model,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--pipeline-parallel-size",
            str(self.pp),
        ]
        if self.pp > 1 and not _has_flag(args, "--distributed-executor-backend"):
            cmd += ["--distributed-executor-backend", "mp"]
        if not self.stock:
            cmd += ["--scheduler-cls", SCHEDULER_CLS]
        if self.settings.record_dir and not _has_flag(args, "--shutdown-timeout"):
            cmd += ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]
        if (
            self.on_cpu
            and not self.compile
            and not _has_flag(args, "--enforce-eager")
            and not _has_flag(args, "--no-enforce-eager")
        ):
            cmd.append("--enforce-eager")
        return cmd + args

    def environment(self, stage_times_dir: str | None, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of the vLLM process."""
        env = dict(os.environ if base is None else base)
        env["PYTHONUNBUFFERED"] = "1"
        if not self.stock:
            env.update(self.settings.to_env())
            if stage_times_dir:
                env[STAGE_TIMES_ENV_VAR] = stage_times_dir
        if self.on_cpu:
            if self.kv_cache_gib is not None:
                env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_gib)
            else:
                env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_bind(self.pp))
        return env

    def check(self) -> None:
        """Fail early, naming what is missing: the engine interpreter, vLLM's metadata, the model."""
        python = self.python
        if not python.is_file():
            raise FileNotFoundError(
                f"no vLLM environment at {python}: run scripts/engines/setup_vllm.sh, or pass "
                "--engine-python / set FASTPP_VLLM_PYTHON to a Python that has vLLM "
                f"{VLLM_VERSION} and fastpp installed"
            )
        probe = (
            "import importlib.metadata as m, sys; v = m.version('vllm'); "
            "import fastpp.backends.vllm.settings; print(v)"
        )
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            hint = (
                "the CPU build is named vllm-cpu; scripts/engines/setup_vllm.sh writes the "
                "metadata shim vLLM's CLI needs"
                if "PackageNotFoundError" in done.stderr
                else f"install this repository there: {python} -m pip install --no-deps -e {REPO_ROOT}"
            )
            raise RuntimeError(f"{python} cannot run vLLM with fastpp's scheduler: {last} ({hint})")
        if self.model.startswith((".", "/", "~")) and not Path(self.model).expanduser().is_dir():
            raise FileNotFoundError(
                f"--model {self.model!r}: no such directory (a Hugging Face "
                "model directory, or a hub name such as org/model)"
            )


def serve_vllm(launch: VllmLaunch) -> int:
    """Run vLLM in the foreground until it exits or we are interrupted; returns its exit code.
    Ctrl-C / SIGTERM are passed on to vLLM, which then shuts down (and writes the run folder)."""
    launch.check()
    stage_dir, tmp = _stage_times_dir(launch)
    # Its own session: a terminal's Ctrl-C reaches only us, and we pass it on once (vLLM takes a
    # second SIGINT as "exit now", which would skip writing the run folder).
    proc = subprocess.Popen(launch.command(), env=launch.environment(stage_dir), start_new_session=True)

    def forward(signum, _frame):
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _stage_times_dir(launch: VllmLaunch) -> tuple[str | None, str | None]:
    """(folder for the workers' stage times, the temporary folder to remove afterwards)."""
    if launch.stock:
        return None, None
    if launch.settings.record_dir:
        return str(Path(launch.settings.record_dir) / "stage_times"), None
    tmp = tempfile.mkdtemp(prefix="fastpp-vllm-stages-")
    return tmp, tmp


def model_dir(model: str) -> str:
    """``smollm2`` names the directory prepare_smollm2.py writes; anything else passes as is."""
    if model == "smollm2":
        engines = Path(os.environ.get("FASTPP_ENGINES_DIR") or REPO_ROOT / ".engines")
        path = engines / "models" / "smollm2-135m-instruct"
        if not (path / "READY").is_file():
            raise FileNotFoundError(
                f"--model smollm2: {path} is not prepared; run "
                "scripts/engines/setup_vllm.sh (or prepare_smollm2.py)"
            )
        return str(path)
    return model


def launch_from_options(
    *,
    model: str,
    pp: int,
    host: str,
    port: int,
    policy: str | None,
    profile: str | None,
    slo_ttft_ms: float | None,
    slo_tpot_ms: float | None,
    chunk_candidates: str | None,
    token_step: int | None,
    record_dir: str | None,
    engine_python: str | None,
    vllm_args: list[str],
    queue_order: str | None = None,
) -> VllmLaunch:
    """The launch ``fastpp serve --backend vllm`` asks for (``--policy stock``: vLLM's own
    scheduler). ValueError / FileNotFoundError name the bad option."""
    stock = policy == "stock"
    settings = VllmSchedulerSettings(
        policy="static" if stock or policy is None else policy,
        slo_ttft_s=(slo_ttft_ms or 2000.0) / 1e3,
        slo_tpot_s=(slo_tpot_ms or 200.0) / 1e3,
        chunk_candidates=chunk_candidates,
        token_step=token_step or 0,
        profile=profile,
        record_dir=str(Path(record_dir).resolve()) if record_dir else None,
        queue_order=queue_order or "fcfs",
    )
    if stock and (profile or record_dir or queue_order not in (None, "fcfs")):
        raise ValueError(
            "--policy stock runs vLLM's own scheduler: --profile, --record-dir and --queue-order need ours"
        )
    if not stock:
        validate_policy(settings)
    return VllmLaunch(
        model_dir(model),
        pp=pp,
        host=host,
        port=port,
        settings=settings,
        stock=stock,
        engine_python=engine_python,
        vllm_args=list(vllm_args),
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m fastpp.backends.vllm.launcher --model DIR [--pp N] [--policy SPEC] ...
    [-- vllm args]``: the launcher without the fastpp CLI (what ``fastpp serve --backend vllm``
    calls)."""
    import argparse

    p = argparse.ArgumentParser(prog="fastpp-vllm", description=main.__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--policy", default="static")
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=200.0)
    p.add_argument("--chunk-candidates", default=None)
    p.add_argument("--token-step", type=int, default=0)
    p.add_argument("--profile", default=None)
    p.add_argument("--record-dir", default=None)
    p.add_argument("--queue-order", default="fcfs", help="fcfs (vLLM's order) or late_last")
    p.add_argument("--stock", action="store_true", help="vLLM's own scheduler (for comparisons)")
    p.add_argument("--engine-python", default=None)
    p.add_argument("--compile", action="store_true", help="CPU: compile instead of --enforce-eager")
    args, rest = p.parse_known_args(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    try:
        settings = VllmSchedulerSettings(
            policy=args.policy,
            slo_ttft_s=args.slo_ttft_ms / 1e3,
            slo_tpot_s=args.slo_tpot_ms / 1e3,
            chunk_candidates=args.chunk_candidates,
            token_step=args.token_step,
            profile=args.profile,
            record_dir=str(Path(args.record_dir).resolve()) if args.record_dir else None,
            queue_order=args.queue_order,
        )
        validate_policy(settings)
        launch = VllmLaunch(
            args.model,
            pp=args.pp,
            host=args.host,
            port=args.port,
            settings=settings,
            stock=args.stock,
            engine_python=args.engine_python,
            compile=args.compile,
            vllm_args=rest,
        )
        return serve_vllm(launch)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def validate_policy(settings: VllmSchedulerSettings) -> None:
    """Build the policies once here, so a bad spec fails before vLLM spends a minute starting."""
    from fastpp.profile import load_profile

    config = settings.scheduler_config(
        num_slots=2, max_budget=8192, kv_total_tokens=1 << 16, page_size=16, max_context=2048
    )
    settings.build_policies(config, load_profile(settings.profile) if settings.profile else None)


if __name__ == "__main__":
    sys.exit(main())

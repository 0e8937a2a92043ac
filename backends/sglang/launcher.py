"""Starting SGLang 0.5.23's server with fastpp's plugin: ``fastpp serve --backend sglang``.

``build_command`` turns a ``LaunchSpec`` into the argv and environment of
``python -m sglang.launch_server``; ``serve`` runs it in the foreground; ``SGLangServer`` runs it
in the background for tests and benchmarks. The interpreter is the SGLang environment's
(``engine_python``): SGLang need not be importable where fastpp's CLI runs.

With ``--device cpu`` among the SGLang arguments the launcher applies what CPU needs
(docs/engines/sglang.md, "Running on CPU"), each only when the user has not set it:

* ``SGLANG_CPU_OMP_THREADS_BIND``: the allowed cores split evenly over the PP ranks (SGLang
  refuses to place two CPU ranks on one NUMA node by itself);
* ``PYTHONPATH`` starts with ``cpu_shims/`` (the ``vllm._custom_ops`` import stub);
* a tied-embedding model served with PP > 1 is replaced by an untied copy (SGLang's last stage
  otherwise points ``lm_head`` at an embedding it does not hold and crashes);
* ``--attention-backend torch_native --sampling-backend pytorch --disable-cuda-graph``, and
  ``--max-total-tokens 16384`` (SGLang would otherwise reserve a share of all RAM for KV).

A GPU deployment gets the same command with none of these.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from fastpp.backends.sglang.settings import PluginSettings
from fastpp.scheduler_config import DEFAULT_STATIC_CHUNK, check_queue_order
from fastpp.types import SLO

SGLANG_VERSION = "0.5.23"
REPO_ROOT = Path(__file__).resolve().parents[2]
SHIMS_DIR = Path(__file__).resolve().parent / "cpu_shims"
CPU_DEFAULT_ARGS: tuple[tuple[str, str | None], ...] = (
    ("--attention-backend", "torch_native"),
    ("--sampling-backend", "pytorch"),
    ("--disable-cuda-graph", None),
    ("--max-total-tokens", "16384"),
)
MODEL_ALIASES = {"smollm2": "models/smollm2-135m-instruct"}


def engines_dir() -> Path:
    """``FASTPP_ENGINES_DIR``, default ``<repo>/.engines`` (where scripts/engines/ install)."""
    return Path(os.environ.get("FASTPP_ENGINES_DIR") or REPO_ROOT / ".engines")


def find_engine_python(explicit: str | None = None) -> str:
    """The interpreter of the SGLang environment: ``explicit``, else ``FASTPP_SGLANG_PYTHON``,
    else the venv scripts/engines/setup_sglang.sh builds, else this interpreter if it has SGLang."""
    for candidate in (explicit, os.environ.get("FASTPP_SGLANG_PYTHON")):
        if candidate:
            if not Path(candidate).exists():
                raise FileNotFoundError(f"SGLang interpreter {candidate} does not exist")
            return candidate
    venv = engines_dir() / f"sglang-{SGLANG_VERSION}" / "bin" / "python"
    if venv.exists():
        return str(venv)
    if importlib.util.find_spec("sglang") is not None:
        return sys.executable
    raise FileNotFoundError(
        f"no SGLang {SGLANG_VERSION} environment: run scripts/engines/setup_sglang.sh (builds {venv}), "
        "or pass --engine-python / set FASTPP_SGLANG_PYTHON"
    )


def resolve_model(model: str) -> str:
    """A model directory, or an alias of one prepared under ``FASTPP_ENGINES_DIR``."""
    if model in MODEL_ALIASES:
        path = engines_dir() / MODEL_ALIASES[model]
        if not (path / "READY").exists():
            raise FileNotFoundError(
                f"model {model!r} is not prepared at {path}: run "
                "scripts/engines/prepare_smollm2.py (setup_sglang.sh does)"
            )
        return str(path)
    if not Path(model, "config.json").exists():
        raise FileNotFoundError(
            f"--model {model}: not a model directory (no config.json) nor one of {', '.join(MODEL_ALIASES)}"
        )
    return str(Path(model).resolve())


@dataclass(frozen=True)
class LaunchSpec:
    """One SGLang server with (``policy`` set) or without fastpp's plugin."""

    model: str
    pp: int = 2
    policy: str | None = None
    profile: str | None = None
    slo: SLO = SLO()
    chunk_candidates: tuple[int, ...] | None = None
    token_step: int | None = None
    record_dir: str | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    sglang_args: tuple[str, ...] = ()
    engine_python: str | None = None
    inject_fault: tuple[str, ...] = ()
    fault_every: int = 1
    extra_env: dict[str, str] = field(default_factory=dict)
    queue_order: str = "fcfs"  # late_last: the plugin reorders SGLang's waiting queue

    def __post_init__(self) -> None:
        if self.pp < 1:
            raise ValueError(f"--pp must be >= 1, got {self.pp}")
        if self.queue_order != "fcfs":
            check_plugin_queue_order(self)
        for flag in ("--model-path", "--pp-size", "--port", "--host"):
            if flag in self.sglang_args:
                raise ValueError(f"pass {flag} through fastpp's own option, not among the SGLang arguments")

    @property
    def device(self) -> str | None:
        return _flag_value(self.sglang_args, "--device")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def build_command(spec: LaunchSpec, python: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start ``spec``'s server (nothing is started)."""
    if spec.policy is not None:
        check_policy(spec)
    model = resolve_model(spec.model)
    python = python or find_engine_python(spec.engine_python)
    args = list(spec.sglang_args)
    env = dict(os.environ)
    env.update(spec.extra_env)
    cpu = spec.device == "cpu"
    if cpu:
        for flag, value in CPU_DEFAULT_ARGS:
            if flag not in args:
                args += [flag] if value is None else [flag, value]
        env.setdefault("SGLANG_CPU_OMP_THREADS_BIND", cpu_thread_binding(spec.pp))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SHIMS_DIR), env.get("PYTHONPATH", "")) if p)
        if spec.pp > 1 and model_ties_embeddings(model):
            model = untied_copy(model, python)
    if spec.policy is not None:
        if "--chunked-prefill-size" not in args:
            ceiling = _default_ceiling(spec)
            if ceiling is not None:
                args += ["--chunked-prefill-size", str(ceiling)]
        settings = PluginSettings(
            policy=spec.policy,
            profile=_absolute(spec.profile),
            record_dir=_absolute(spec.record_dir),
            slo=spec.slo,
            chunk_candidates=spec.chunk_candidates,
            token_step=spec.token_step,
            epoch=time.time(),
            queue_order=spec.queue_order,
            inject_fault=spec.inject_fault,
            fault_every=spec.fault_every,
        )
        env.update(settings.to_env())
        plugins = [p for p in env.get("SGLANG_PLUGINS", "").split(",") if p]
        env["SGLANG_PLUGINS"] = ",".join(dict.fromkeys([*plugins, "fastpp"]))
    argv = [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model,
        "--pp-size",
        str(spec.pp),
        "--host",
        spec.host,
        "--port",
        str(spec.port),
        *args,
    ]
    return argv, env


def check_policy(spec: LaunchSpec) -> None:
    """Build the policies once here, so a bad spec or profile fails before SGLang's minutes of
    start-up instead of in its scheduler (``ValueError`` / ``FileNotFoundError``)."""
    from fastpp.policies import make_policies
    from fastpp.profile import load_profile
    from fastpp.scheduler_config import SchedulerConfig

    profile = load_profile(spec.profile) if spec.profile else None
    config = SchedulerConfig(
        num_slots=spec.pp,
        kv_capacity_tokens=1 << 20,
        slo=spec.slo,
        **({"chunk_candidates": spec.chunk_candidates} if spec.chunk_candidates else {}),
    )
    try:
        make_policies(spec.policy, config, profile)
    except ValueError as exc:
        needs_profile = profile is None and "needs the deployment's profile" in str(exc)
        hint = " (pass --profile FILE)" if needs_profile else ""
        raise ValueError(f"--policy {spec.policy}: {exc}{hint}") from None


def check_plugin_queue_order(spec: LaunchSpec) -> None:
    """A queue order other than fcfs is the plugin's: it needs a policy, and it reorders the
    waiting queue that SGLang admits from in order only under its fcfs schedule policy without
    priorities (any other sorts the queue again)."""
    check_queue_order(spec.queue_order, "--queue-order")
    if spec.policy is None:
        raise ValueError(f"--queue-order {spec.queue_order} needs fastpp's plugin: pass --policy")
    schedule = _flag_value(spec.sglang_args, "--schedule-policy")
    if schedule not in (None, "fcfs"):
        raise ValueError(
            f"--queue-order {spec.queue_order} reorders SGLang's FCFS queue; SGLang's "
            f"--schedule-policy {schedule} sorts it again: drop one of them"
        )
    if "--enable-priority-scheduling" in spec.sglang_args:
        raise ValueError(
            f"--queue-order {spec.queue_order} and SGLang's --enable-priority-scheduling both "
            "order the waiting queue: drop one of them"
        )


def _default_ceiling(spec: LaunchSpec) -> int | None:
    """SGLang sizes its prefill buffers from --chunked-prefill-size at start-up: our chunks must
    stay under it, so it is set to the largest chunk the policy may ask for."""
    if spec.chunk_candidates:
        return max(spec.chunk_candidates)
    name, _, arg = spec.policy.split("+")[0].partition(":")
    if name == "static":  # static without :N runs fastpp's one default static chunk
        return int(arg) if arg.isdigit() else DEFAULT_STATIC_CHUNK
    return None


def cpu_thread_binding(pp: int, cores: list[int] | None = None) -> str:
    """``SGLANG_CPU_OMP_THREADS_BIND`` for ``pp`` ranks: the allowed cores split evenly."""
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    if len(cores) < pp:
        raise ValueError(f"{pp} PP ranks need at least {pp} CPU cores, {len(cores)} allowed")
    per = len(cores) // pp
    groups = [cores[i * per : (i + 1) * per] for i in range(pp)]
    return "|".join(str(g[0]) if len(g) == 1 else ",".join(map(str, g)) for g in groups)


def model_ties_embeddings(model_dir: str) -> bool:
    config = json.loads(Path(model_dir, "config.json").read_text())
    return bool(config.get("tie_word_embeddings", False))


def untied_copy(model_dir: str, python: str) -> str:
    """A copy of ``model_dir`` with an explicit ``lm_head.weight``, made once (in the SGLang
    environment's interpreter, which has torch and safetensors) under FASTPP_ENGINES_DIR."""
    src = Path(model_dir).resolve()
    dst = engines_dir() / "untied" / f"{src.name}-{abs(hash(str(src))) % 10**8:08d}"
    if not (dst / "READY").exists():
        subprocess.run([python, "-m", "fastpp.backends.sglang.untie", str(src), str(dst)], check=True)
    return str(dst)


def _absolute(path: str | None) -> str | None:
    return None if path is None else str(Path(path).resolve())


# SGLang's processes run here: ``python -m`` puts the working directory first on sys.path, and a
# fastpp checkout there would shadow the one installed in the SGLang environment
ENGINE_CWD = Path(tempfile.gettempdir())


def _flag_value(args: tuple[str, ...] | list[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


class SGLangServer:
    """A background SGLang server (its own process group), stopped by ``stop`` or on exit of a
    ``with`` block. ``log_path`` receives its stdout and stderr."""

    def __init__(self, spec: LaunchSpec, log_path: str | Path) -> None:
        self.spec = spec
        self.log_path = Path(log_path)
        self.argv, self.env = build_command(spec)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 600.0) -> SGLangServer:
        """Launch and wait until SGLang logs that it is ready (``READY_LINE``, after its own
        warm-up request has finished) and ``/v1/models`` answers. ``/v1/models`` alone answers
        as soon as the HTTP server is up, while the warm-up may still be queued: a client's
        first requests would then share microbatches with it, and a run stopped after the
        client's last reply could cut the warm-up off unrecorded. (``/health`` would wait too,
        but each call runs a one-token generation, a request of its own in the records.)
        ``PortInUseError`` at once when SGLang's HTTP server cannot bind the port (SGLang itself
        keeps running then, never ready)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=ENGINE_CWD,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"SGLang exited with {self.proc.returncode} while starting; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            text = self.log_path.read_text(errors="replace")
            if READY_LINE in text and _http_ok(self.spec.url + "/v1/models"):
                return self
            if BIND_FAILED in text:  # anywhere in the log
                self.stop()
                raise PortInUseError(
                    f"SGLang could not bind port {self.spec.port} (address "
                    f"already in use); log {self.log_path}"
                )
            time.sleep(2.0)
        self.stop()
        raise TimeoutError(
            f"SGLang not ready after {timeout_s:.0f} s (waiting for {READY_LINE!r} in its log "
            f"and /v1/models to answer); log {self.log_path}:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def stop(self, grace_s: float = 20.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass

    def __enter__(self) -> SGLangServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PortInUseError(RuntimeError):
    """SGLang's HTTP server could not bind its port: another process holds it."""


BIND_FAILED = "error while attempting to bind on address"  # uvicorn's words, in SGLang's log
# SGLang's log line once its warm-up request has finished (or was skipped) and it serves
READY_LINE = "The server is fired up and ready to roll!"


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def serve(spec: LaunchSpec) -> int:
    """Run the server in the foreground until it exits or Ctrl-C; then finish the record dir."""
    argv, env = build_command(spec)
    print("fastpp: starting", " ".join(argv), flush=True)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # SIGTERM too, and SIGINT even where a background start left it ignored: SGLang runs in its
    # own session, so it must be stopped from here
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    proc = subprocess.Popen(argv, env=env, start_new_session=True, cwd=ENGINE_CWD)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
    if spec.record_dir and Path(spec.record_dir).exists():
        from fastpp.backends.sglang.recorder import finalize_record_dir

        finalize_record_dir(spec.record_dir, slo=spec.slo, num_stages=spec.pp)
    return code

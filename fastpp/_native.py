"""The optional compiled build of the simulator's hot path, loaded only if built from these very
sources.

``python scripts/build_native.py`` compiles :data:`MODULES` with mypyc (the same Python source;
its type hints become C types) into a cache folder named by :func:`source_key`: a hash of those
modules' sources and the Python ABI. Importing fastpp looks for the folder its own sources hash
to. Found: those modules load from it, the rest of fastpp stays Python. Not found (never built,
or any of the modules edited since): everything is pure Python, as if no build existed, so an
edit can never run stale compiled code. ``FASTPP_NATIVE=0`` turns the build off. Results are
identical either way (tests/test_native.py runs the simulator both ways). The compiled modules
carry no docstrings: ``help()`` on them needs ``FASTPP_NATIVE=0`` (or the source).

Only the standard library is used here; this module runs first on ``import fastpp``.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path

# The scheduler and the simulator's event loop: what every simulated microbatch runs through
# (benchmarks/sim_speed.py), with its stage cost function and the value types it passes
# (plan.py, types.py: their dataclasses pickle as constructor calls,
# ``types.pickle_by_constructor``, since pickle's default fails on a compiled frozen class and
# on a compiled class whose ``__init__`` is written out), and the predictive chunk policy (no
# config enums, not subclassed). Left as Python: the other policies (users subclass them and
# pass their configs' enums as strings, which compiled classes refuse), the predictor (mypyc
# cannot compile its abstract dataclass base), the protocols (view.py, policies/base.py: mypyc
# cannot compile them), scheduler_config.py (read once per run: nothing to gain) and
# DecodeSlots (the vLLM adapter hands it requests of its own type). mypyc keeps the __init__
# that dataclasses generates as Python, so the hottest value types write theirs out
# (tests/test_plan_types.py).
MODULES = (
    "fastpp.alp_rls", "fastpp.iteration_log", "fastpp.kv_ledger", "fastpp.kv_pool", "fastpp.live_request",
    "fastpp.pipeline", "fastpp.plan", "fastpp.scheduler", "fastpp.signals",
    "fastpp.stage_cost_fn", "fastpp.types", "fastpp.waiting_queue",
    "fastpp.policies.predictive", "fastpp.policies.rules", "fastpp.sim.engine", "fastpp.sim.events",
)
SWITCH = "FASTPP_NATIVE"  # "0" turns the build off
MANIFEST = "manifest.json"
_state = {"status": "off: not imported yet"}


def cache_root() -> Path:
    """Where builds live: ``$FASTPP_NATIVE_DIR``, else ``$XDG_CACHE_HOME/fastpp/native`` (by
    default ``~/.cache/fastpp/native``)."""
    if explicit := os.environ.get("FASTPP_NATIVE_DIR"):
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "fastpp" / "native"


def package_dir(package: str) -> Path:
    """The folder of ``package``'s modules (the source tree maps fastpp.sim to sim/), found
    without running the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"package {package} not found")
    return Path(next(iter(spec.submodule_search_locations)))


def source_path(module: str) -> Path:
    """The .py file of ``module``, found without importing it (its package is imported)."""
    package, _, name = module.rpartition(".")
    return package_dir(package) / f"{name}.py"


def source_key() -> str:
    """A hash of every compiled module's source, the Python ABI and the platform: the build
    folder's name. Any edit to one of the modules gives another key."""
    digest = hashlib.sha256()
    digest.update(f"{sys.implementation.cache_tag} {importlib.machinery.EXTENSION_SUFFIXES[0]}"
                  .encode())
    for module in MODULES:
        digest.update(module.encode() + b"\0" + source_path(module).read_bytes() + b"\0")
    return digest.hexdigest()[:24]


class _BuildFinder(importlib.abc.MetaPathFinder):
    """Serves the compiled modules (and mypyc's shared runtime) from one build folder."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 (importlib's API)
        file = self.files.get(fullname)
        return None if file is None else importlib.util.spec_from_file_location(fullname, file)


def status() -> str:
    """"on: N modules compiled (folder)" or "off: why", for speed reports."""
    return _state["status"]


def _activate() -> None:
    if os.environ.get(SWITCH, "1") == "0":
        _state["status"] = f"off: {SWITCH}=0"
        return
    try:
        folder = cache_root() / source_key()
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError, ImportError):
        _state["status"] = "off: not built for these sources (python scripts/build_native.py)"
        return
    try:
        files = {str(name): folder / rel for name, rel in manifest["files"].items()}
    except (KeyError, TypeError, AttributeError):
        files = {}
    if set(MODULES) - set(files) or not all(f.is_file() for f in files.values()):
        _state["status"] = f"off: incomplete build in {folder}"
        return
    sys.meta_path.insert(0, _BuildFinder(files))
    _state["status"] = f"on: {len(MODULES)} modules compiled by mypyc ({folder})"


_activate()

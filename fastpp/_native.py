"""The optional compiled build of the simulator's hot path: off unless asked for with
``FASTPP_NATIVE=1``, and then loaded only if built from these very sources, in this very place.

``python -m fastpp.native_build`` compiles :data:`MODULES` with mypyc (the same Python source;
its type hints become C types) into a cache folder named by :func:`source_key`: a hash of those
modules' sources, the Python ABI and where the package lives. With ``FASTPP_NATIVE=1``,
importing fastpp looks for the folder its own sources hash to and checks every file of it
against the size and SHA-256 its manifest recorded at build time. All good: those modules load
from it, the rest of fastpp stays Python. Otherwise (never built, a module edited since, a
build of another checkout, a damaged or truncated file) one warning line says why and
everything is pure Python, so neither an edit nor a broken cache can run wrong code. Unset or
``0``: pure Python, whatever the cache holds. Results are identical either way
(tests/test_native.py runs the simulator both ways).

With the build on, the public classes of the compiled modules (``Scheduler``,
``PredictiveChunkPolicy``, ``Request``, the records and plans) stay subclassable, and a
subclass's overrides are called (fastpp/_mypyc.py). Two differences remain: a method assigned
onto a compiled class after import (monkeypatching) is not seen by compiled callers (subclass
instead), and compiled functions and methods carry no docstrings (the modules' and classes'
are restored from the source; ``help()`` on a method needs the build off).

Only the standard library is used here; this module runs first on ``import fastpp``.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path
from types import ModuleType

# The scheduler and the simulator's event loop: what every simulated microbatch runs through
# (benchmarks/sim_speed.py), with its stage cost function and the value types it passes
# (plan.py, types.py: their dataclasses pickle as constructor calls,
# ``types.pickle_by_constructor``, since pickle's default fails on a compiled frozen class and
# on a compiled class whose ``__init__`` is written out), and the predictive chunk policy.
# Left as Python: the other policies (users pass their configs' enums as strings, which
# compiled classes refuse), the predictor (mypyc cannot compile its abstract dataclass base),
# the protocols (view.py, policies/base.py: mypyc cannot compile them), scheduler_config.py
# (read once per run: nothing to gain) and DecodeSlots (the vLLM adapter hands it requests of
# its own type). mypyc keeps the __init__ that dataclasses generates as Python, so the hottest
# value types write theirs out (tests/test_plan_types.py).
MODULES = (
    "fastpp.alp_rls",
    "fastpp.iteration_log",
    "fastpp.kv_ledger",
    "fastpp.kv_pool",
    "fastpp.live_request",
    "fastpp.pipeline",
    "fastpp.plan",
    "fastpp.scheduler",
    "fastpp.signals",
    "fastpp.stage_cost_fn",
    "fastpp.types",
    "fastpp.waiting_queue",
    "fastpp.policies.predictive",
    "fastpp.policies.rules",
    "fastpp.sim.engine",
    "fastpp.sim.events",
)
SWITCH = "FASTPP_NATIVE"  # "1" turns the build on; unset or "0": pure Python
MANIFEST = "manifest.json"
BUILD_COMMAND = "python -m fastpp.native_build"
_log = logging.getLogger("fastpp.native")
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


def source_key(staged: Path | None = None) -> str:
    """A hash of every compiled module's source, the Python ABI, the platform and the package's
    location: the build folder's name. Any edit to one of the modules, or another checkout or
    installation of fastpp, gives another key. ``staged``: read the sources from that copy
    (laid out by module name) instead, as the builder compiles them."""
    digest = hashlib.sha256()
    digest.update(f"{sys.implementation.cache_tag} {importlib.machinery.EXTENSION_SUFFIXES[0]}".encode())
    digest.update(str(package_dir("fastpp").resolve()).encode() + b"\0")
    for module in MODULES:
        path = source_path(module) if staged is None else staged / (module.replace(".", "/") + ".py")
        digest.update(module.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def file_entry(folder: Path, rel: str) -> dict[str, object]:
    """A manifest entry: the file's path under ``folder``, its size and its SHA-256."""
    path = folder / rel
    return {"path": rel, "size": path.stat().st_size, "sha256": file_sha256(path)}


def verified_files(folder: Path, manifest: object) -> dict[str, Path]:
    """Module name -> file of a build, after checking each file against its manifest entry;
    raises ValueError naming the first file that is missing, of another size or another hash
    (a truncated or overwritten extension module would crash the process when loaded)."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ValueError(f"{folder / MANIFEST} has no 'files' table")
    files: dict[str, Path] = {}
    for name, entry in manifest["files"].items():
        if not isinstance(entry, dict) or not {"path", "size", "sha256"} <= entry.keys():
            raise ValueError(f"{folder / MANIFEST}: entry {name!r} lacks path, size or sha256")
        path = folder / str(entry["path"])
        if not path.is_file():
            raise ValueError(f"{path} is missing")
        if path.stat().st_size != entry["size"]:
            raise ValueError(f"{path} is {path.stat().st_size} bytes, built as {entry['size']}")
        if file_sha256(path) != entry["sha256"]:
            raise ValueError(f"{path} differs from the file built (SHA-256)")
        files[str(name)] = path
    if missing := sorted(set(MODULES) - set(files)):
        raise ValueError(f"{folder / MANIFEST} lacks {', '.join(missing)}")
    return files


def restore_docstrings(module: ModuleType) -> None:
    """Give a compiled module, and its classes, the docstrings of its source (mypyc drops
    them; compiled functions' docstrings cannot be set, so ``help()`` on those stays bare)."""
    try:
        tree = ast.parse(source_path(module.__name__).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ImportError, ValueError):
        return
    module.__doc__ = ast.get_docstring(tree, clean=False)
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(module, node.name, None)
        if isinstance(cls, type) and cls.__module__ == module.__name__:
            with contextlib.suppress(AttributeError, TypeError):
                cls.__doc__ = ast.get_docstring(node, clean=False)


class _CompiledLoader(importlib.machinery.ExtensionFileLoader):
    """Loads one compiled module, then restores its module and class docstrings."""

    def exec_module(self, module: ModuleType) -> None:
        super().exec_module(module)
        if module.__name__ in MODULES:
            restore_docstrings(module)


class _BuildFinder(importlib.abc.MetaPathFinder):
    """Serves the compiled modules (and mypyc's shared runtime) from one build folder."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 (importlib's API)
        file = self.files.get(fullname)
        if file is None:
            return None
        loader = _CompiledLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def status() -> str:
    """ "on: N modules compiled (folder)" or "off: why", for speed reports."""
    return _state["status"]


def _off(reason: str, *, warn: bool) -> None:
    _state["status"] = f"off: {reason}"
    if warn:  # asked for and not usable: one line, then pure Python
        _log.warning("fastpp: %s=1 but %s; running pure Python", SWITCH, reason)


def _activate() -> None:
    value = os.environ.get(SWITCH, "").strip()
    if value in ("", "0"):
        _off(f"not requested ({SWITCH}=1 uses a build made by {BUILD_COMMAND})", warn=False)
        return
    if value != "1":
        _state["status"] = f"off: {SWITCH}={value!r} is neither 0 nor 1"
        _log.warning("fastpp: %s=%r is neither 0 nor 1; running pure Python", SWITCH, value)
        return
    try:
        folder = cache_root() / source_key()
    except (OSError, ImportError) as e:
        _off(f"its sources cannot be read ({e})", warn=True)
        return
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        _off(f"no build for these sources in {cache_root()} (run {BUILD_COMMAND})", warn=True)
        return
    except (OSError, ValueError) as e:
        _off(f"the build's manifest is unreadable ({e})", warn=True)
        return
    try:
        files = verified_files(folder, manifest)
    except (OSError, ValueError) as e:
        _off(f"the build in {folder} is damaged: {e} (run {BUILD_COMMAND} again)", warn=True)
        return
    sys.meta_path.insert(0, _BuildFinder(files))
    _state["status"] = f"on: {len(MODULES)} modules compiled by mypyc ({folder})"


_activate()

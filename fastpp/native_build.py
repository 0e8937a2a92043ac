"""Compile the simulator's hot modules with mypyc: the same Python source, about twice as fast.

    pip install 'fastpp[native]'            # mypy, whose mypyc compiles; needs a C compiler
    python -m fastpp.native_build           # ~20 s on 2 cores
    FASTPP_NATIVE=1 fastpp simulate ...     # use it (off unless asked for)
    python -m fastpp.native_build --check   # say whether FASTPP_NATIVE=1 would use a build

Works from a checkout and from an installed package alike: the modules (fastpp._native.MODULES)
are compiled from the installed sources into a cache folder named by a hash of those sources and
of the package's location (``$FASTPP_NATIVE_DIR``, else ``~/.cache/fastpp/native``). The
manifest records each built file's size and SHA-256, which ``import fastpp`` checks before
loading any of them. ``import fastpp`` uses the build only with ``FASTPP_NATIVE=1`` and while
those sources are unchanged, so edit freely and build again when speed matters. The build is
checked before this command reports it: the new folder is imported in a child process, which
must report it in use.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fastpp import _native

# Packages staged for mypy to read (the compiled modules import from all three).
PACKAGES = ("fastpp", "fastpp.policies", "fastpp.sim")


def stage(into: Path) -> list[Path]:
    """Copy the packages' .py files into ``into`` laid out by module name (the source tree maps
    fastpp.sim to sim/); returns the staged files of the modules to compile."""
    for package in PACKAGES:
        dst = into / package.replace(".", "/")
        dst.mkdir(parents=True, exist_ok=True)
        for file in _native.package_dir(package).glob("*.py"):
            shutil.copy2(file, dst / file.name)
    return [into / (m.replace(".", "/") + ".py") for m in _native.MODULES]


def compile_in(workdir: Path, files: list[Path]) -> None:
    """mypyc over ``files`` (imports it cannot type are not followed into errors)."""
    cmd = [
        sys.executable,
        "-m",
        "mypyc",
        "--ignore-missing-imports",
        "--follow-imports=silent",
        *(str(f.relative_to(workdir)) for f in files),
    ]
    env = {**os.environ, "MYPYC_OPT_LEVEL": "3"}
    done = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"mypyc failed (exit {done.returncode}):\n{done.stdout[-4000:]}{done.stderr[-4000:]}")


def publish(workdir: Path, folder: Path) -> dict[str, dict[str, object]]:
    """Copy the built extension modules into ``folder``; returns module name -> manifest entry
    (relative path, size, SHA-256)."""
    suffix = ".so" if os.name != "nt" else ".pyd"
    files: dict[str, dict[str, object]] = {}
    folder.mkdir(parents=True, exist_ok=True)
    for built in workdir.rglob(f"*{suffix}"):
        if "build" in built.relative_to(workdir).parts:
            continue  # setuptools' intermediate copies
        rel = built.relative_to(workdir)
        name = ".".join(rel.parts[:-1] + (rel.name.split(".")[0],))
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, folder / rel)
        files[name] = _native.file_entry(folder, str(rel))
    missing = set(_native.MODULES) - set(files)
    if missing:
        sys.exit(f"mypyc built no extension for {', '.join(sorted(missing))}")
    return files


def check_in_child() -> str:
    """Import fastpp in a fresh process with the build asked for; its build status line."""
    code = "import fastpp._native as n; print(n.status())"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, _native.SWITCH: "1"}
    )
    if done.returncode != 0:
        return f"import failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}"
    return done.stdout.strip()


def remove_stale(root: Path, keep: Path) -> list[Path]:
    """Remove the earlier builds of this very installation (their manifests name its sources;
    their sources have been edited since), so the cache holds one build per checkout."""
    here = str(_native.package_dir("fastpp").resolve())
    removed = []
    for manifest in root.glob(f"*/{_native.MANIFEST}"):
        folder = manifest.parent
        try:
            sources = json.loads(manifest.read_text()).get("sources")
        except (OSError, ValueError, AttributeError):
            continue
        if folder != keep and sources == here:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def build() -> str:
    """Compile, publish and check a build for the installed sources; its status line."""
    try:
        import mypy.version
    except ImportError:
        sys.exit(f"{_native.BUILD_COMMAND} needs mypyc: pip install 'mypy>=2.4' (the native extra)")
    with tempfile.TemporaryDirectory(prefix="fastpp-native-") as tmp:
        work = Path(tmp)
        files = stage(work)
        folder = _native.cache_root() / _native.source_key(work)  # the sources compiled
        print(f"compiling {len(files)} modules with mypyc {mypy.version.__version__} ...", flush=True)
        compile_in(work, files)
        if folder.exists():
            shutil.rmtree(folder)
        built = publish(work, folder)
    manifest = {
        "files": built,
        "mypy": mypy.version.__version__,
        "python": sys.version.split()[0],
        "sources": str(_native.package_dir("fastpp").resolve()),
    }
    (folder / _native.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    verdict = check_in_child()
    if not verdict.startswith("on:"):
        shutil.rmtree(folder)
        if _native.source_key() != folder.name:
            sys.exit("a compiled module's source changed while building; build again")
        sys.exit(f"the build does not load, removed it: {verdict}")
    remove_stale(_native.cache_root(), folder)
    return verdict


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog=_native.BUILD_COMMAND, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument(
        "--check", action="store_true", help=f"only report whether {_native.SWITCH}=1 would use a build"
    )
    args = ap.parse_args(argv)
    if args.check:
        print(check_in_child())
        return
    t0 = time.perf_counter()
    verdict = build()
    print(f"built in {time.perf_counter() - t0:.0f} s: {verdict}")
    print(f"use it with {_native.SWITCH}=1 (unset or 0: pure Python)")


if __name__ == "__main__":
    main()

"""Compile the simulator's hot modules with mypyc: the same Python source, about twice as fast.

    pip install -e '.[native]'        # mypy, whose mypyc compiles
    python scripts/build_native.py    # ~20 s on 2 cores; needs a C compiler
    python scripts/build_native.py --check   # say whether this checkout's build is in use

The modules (fastpp._native.MODULES) are compiled into a cache folder named by a hash of their
sources (fastpp/_native.py); ``import fastpp`` uses the build only while those sources are
unchanged, so edit freely and build again when speed matters. ``FASTPP_NATIVE=0`` runs pure
Python. The build is checked before it is published: the new folder is imported in a child
process, which must report it in use.
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
    cmd = [sys.executable, "-m", "mypyc", "--ignore-missing-imports", "--follow-imports=silent",
           *(str(f.relative_to(workdir)) for f in files)]
    env = {**os.environ, "MYPYC_OPT_LEVEL": "3"}
    done = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"mypyc failed (exit {done.returncode}):\n{done.stdout[-4000:]}{done.stderr[-4000:]}")


def publish(workdir: Path, folder: Path) -> dict[str, str]:
    """Move the built extension modules into ``folder``; returns module name -> relative path."""
    suffix = ".so" if os.name != "nt" else ".pyd"
    files: dict[str, str] = {}
    folder.mkdir(parents=True, exist_ok=True)
    for built in workdir.rglob(f"*{suffix}"):
        if "build" in built.relative_to(workdir).parts:
            continue  # setuptools' intermediate copies
        rel = built.relative_to(workdir)
        name = ".".join(rel.parts[:-1] + (rel.name.split(".")[0],))
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, folder / rel)
        files[name] = str(rel)
    missing = set(_native.MODULES) - set(files)
    if missing:
        sys.exit(f"mypyc built no extension for {', '.join(sorted(missing))}")
    return files


def check_in_child() -> str:
    """Import fastpp in a fresh process and return its build status line."""
    code = "import fastpp._native as n; print(n.status())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != _native.SWITCH})
    if done.returncode != 0:
        return f"import failed: {done.stderr.strip().splitlines()[-1:]}"
    return done.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only report whether a build is in use")
    args = ap.parse_args()
    if args.check:
        print(check_in_child())
        return
    try:
        import mypy.version
    except ImportError:
        sys.exit("scripts/build_native.py needs mypyc: pip install 'mypy>=2.4' (the native extra)")
    folder = _native.cache_root() / _native.source_key()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fastpp-native-") as tmp:
        work = Path(tmp)
        files = stage(work)
        print(f"compiling {len(files)} modules with mypyc {mypy.version.__version__} ...",
              flush=True)
        compile_in(work, files)
        if folder.exists():
            shutil.rmtree(folder)
        built = publish(work, folder)
    manifest = {"files": built, "mypy": mypy.version.__version__, "python": sys.version.split()[0]}
    (folder / _native.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    verdict = check_in_child()
    if not verdict.startswith("on:"):
        shutil.rmtree(folder)
        sys.exit(f"the build does not load, removed it: {verdict}")
    print(f"built in {time.perf_counter() - t0:.0f} s: {verdict}")


if __name__ == "__main__":
    main()

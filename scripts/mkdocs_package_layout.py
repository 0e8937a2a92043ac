"""MkDocs hook: lay the package out as it installs, so mkdocstrings finds every module.

pyproject.toml maps ``fastpp.sim``, ``fastpp.cli``, ``fastpp.backends`` and ``fastpp.profiles``
onto the top-level folders ``sim/``, ``cli/``, ``backends/`` and ``profiles/``. mkdocstrings
(griffe) reads sources from folders, not through that mapping, so without help it cannot find
``fastpp.sim`` and the simulator's public names (``fastpp.run_simulation`` ...) would be left out
of the API reference. Before the build this hook writes ``build/docs_pkg/fastpp/``: a symlink for
every entry of ``fastpp/`` (a copy of its ``__init__.py``, since griffe looks for submodules beside
the file it resolves) plus one per mapped subpackage, read from pyproject.toml. mkdocs.yml points
mkdocstrings there (``paths: [build/docs_pkg]``). The folder is rebuilt on every build.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

LAYOUT_DIR = Path("build") / "docs_pkg"


def write_layout(root: Path) -> Path:
    """Write ``root/build/docs_pkg/fastpp`` (symlinks and one copy) and return ``root/build/docs_pkg``."""
    package_dir = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    out = root / LAYOUT_DIR
    shutil.rmtree(out, ignore_errors=True)
    top = out / "fastpp"
    top.mkdir(parents=True)
    for entry in (root / package_dir["fastpp"]).iterdir():
        if entry.name == "__init__.py":  # a copy: griffe finds submodules beside the real file
            shutil.copyfile(entry, top / entry.name)
        elif entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry.resolve())
    for name, folder in package_dir.items():
        parts = name.split(".")
        if len(parts) == 2 and parts[0] == "fastpp":
            link = top / parts[1]
            if link.is_symlink() or link.exists():
                raise RuntimeError(f"pyproject.toml package-dir: {name} shadows fastpp/{parts[1]}")
            link.symlink_to((root / folder).resolve())
    return out


@event_priority(100)  # before mkdocstrings reads `paths` in its own on_config
def on_config(config: Any) -> Any:
    write_layout(Path(config.config_file_path).resolve().parent)
    return config

"""Where the real traces and length files live: one resolution order for every command.

1. the ``--data-dir`` option (``data_dir=`` in the library),
2. the environment variable ``FASTPP_DATA_DIR``,
3. ``../shared/data`` beside the source checkout FastPP is imported from (the folder holding
   ``pyproject.toml`` above the ``fastpp`` package), found from the package's own path, so the
   current directory never matters. An installed wheel has no checkout: steps 1 or 2 then.

FastPP has no configuration file, so no step reads one. A directory named by step 1 or 2 that
does not exist is an error naming it (a wrong path is never silently replaced by the default).
"""

from __future__ import annotations

import os
from pathlib import Path

from fastpp.length_files import WorkloadError

DATA_DIR_ENV = "FASTPP_DATA_DIR"
DATA_DIR_OPTION = "--data-dir"
CHECKOUT_DATA = Path("..") / "shared" / "data"  # relative to the checkout root


class DataDirError(WorkloadError):
    """No data directory: the message names the option, the variable and what was tried."""


def checkout_root() -> Path | None:
    """The source checkout this ``fastpp`` package was imported from, or None (installed)."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


def checkout_data_dir() -> Path | None:
    """``<checkout>/../shared/data``, resolved, when FastPP runs from a checkout."""
    root = checkout_root()
    return None if root is None else (root / CHECKOUT_DATA).resolve()


def data_dir_source(data_dir: str | Path | None = None) -> tuple[Path | None, str]:
    """The directory the resolution order picks and which step picked it (``--data-dir``,
    ``$FASTPP_DATA_DIR``, ``the checkout``); the path is None when no step applies."""
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir), DATA_DIR_OPTION
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env), f"${DATA_DIR_ENV}"
    return checkout_data_dir(), "the checkout"


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """The data directory by the order above; :class:`DataDirError` when it does not exist."""
    path, source = data_dir_source(data_dir)
    how = f"pass {DATA_DIR_OPTION} DIR or set {DATA_DIR_ENV}"
    if path is None:
        raise DataDirError(
            f"no data directory: {how} (FastPP is not running from a source "
            f"checkout, so there is no {CHECKOUT_DATA} default)"
        )
    if not path.is_dir():
        raise DataDirError(f"data directory not found: {path.resolve()} (from {source}; {how})", path=path)
    return path

"""``fastpp.__version__``: the installed distribution's version (pyproject.toml's, through the
package metadata), or, for a source checkout run without installing, the version that
pyproject.toml next to this package declares."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

_UNKNOWN = "0+unknown"


def _from_checkout() -> str:
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        match = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.MULTILINE)
    except OSError:
        return _UNKNOWN
    return match.group(1) if match else _UNKNOWN


def package_version() -> str:
    try:
        return metadata.version("fastpp")
    except metadata.PackageNotFoundError:
        return _from_checkout()


__version__ = package_version()

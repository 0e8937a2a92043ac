"""Profile names: a JSON file's path, or the name of a profile shipped with FastPP.

The shipped profiles (the repository's ``profiles/``) are package data of ``fastpp.profiles``,
so ``--profile cpu_smollm2-135m_pp2`` (or ``cpu_smollm2-135m_pp2.json``, or the checkout-style
``profiles/cpu_smollm2-135m_pp2.json``) works from an installed wheel, in any directory. An
existing file always wins over a shipped name.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

_SHIPPED_PACKAGE = "fastpp.profiles"
_CHECKOUT_DIR = "profiles/"


def shipped_profiles() -> list[str]:
    """Names (without ``.json``) of the shipped profiles."""
    root = resources.files(_SHIPPED_PACKAGE)
    return sorted(p.name[: -len(".json")] for p in root.iterdir() if p.name.endswith(".json"))


def resolve_profile(value: str | Path) -> Path:
    """The profile file ``value`` names; ``FileNotFoundError`` listing the shipped names if none."""
    path = Path(value)
    if path.is_file():
        return path
    name = str(value)
    if name.startswith(_CHECKOUT_DIR):
        name = name[len(_CHECKOUT_DIR) :]
    if "/" not in name:
        if not name.endswith(".json"):
            name += ".json"
        shipped = resources.files(_SHIPPED_PACKAGE) / name
        if shipped.is_file():
            return Path(str(shipped))  # installed packages are plain directories (no zip imports)
    if path.is_dir():
        raise FileNotFoundError(f"profile {str(value)!r} is a folder; give a profile JSON file")
    raise FileNotFoundError(
        f"profile {str(value)!r}: no such file, and no shipped profile of that name "
        f"(shipped: {', '.join(shipped_profiles())})"
    )

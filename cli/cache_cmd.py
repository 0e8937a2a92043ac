"""``fastpp cache``: show or clear the torch engine's converted-weight cache.

The cache itself (content-keyed entries, size cap, folder) is ``fastpp.backends.weight_cache``;
this module only parses and prints. ``clear`` asks before removing anything unless ``--yes``.
"""

# ruff: noqa: E501  (as in cli/app.py: Typer's Annotated option declarations read best one per line)

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer

from fastpp.cli.common import fail

_MB = float(1 << 20)


def cache(
    action: Annotated[
        str, typer.Argument(help="show (list the entries and their sizes) or clear (remove them).")
    ] = "show",
    yes: Annotated[bool, typer.Option("--yes", "-y", help="clear without asking for confirmation.")] = False,
) -> None:
    """Show or clear the converted-weight cache of the torch engine (~/.cache/fastpp/weights,
    or $FASTPP_WEIGHT_CACHE_DIR; capped at $FASTPP_WEIGHT_CACHE_MAX_MB, default 2048 MB).
    The compiled build's folder (~/.cache/fastpp/native) is not part of it."""
    from fastpp.backends import weight_cache

    if action not in ("show", "clear"):
        fail(f"cache: unknown action {action!r}; use show or clear")
    folder = weight_cache.cache_dir()
    try:
        cap = f"{weight_cache.max_bytes() / _MB:.0f} MB"
    except ValueError as exc:
        fail(str(exc))
    found = weight_cache.entries(folder)
    total = sum(e.size_bytes for e in found)
    if action == "show":
        typer.echo(f"weight cache: {folder} (cap {cap}, FASTPP_WEIGHT_CACHE_MAX_MB)")
        for e in found:
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.used_at))
            note = "  (legacy, mtime-keyed: never read; removed by clear)" if e.is_legacy else ""
            typer.echo(f"  {e.size_bytes / _MB:9.1f} MB  {used}  {e.path}{note}")
        typer.echo(f"total {total / _MB:.1f} MB in {_entries(len(found))}")
        return
    if not found:
        typer.echo(f"weight cache {folder} is already empty")
        return
    if not yes:
        if not sys.stdin.isatty():
            fail(
                f"cache clear would remove {_entries(len(found))} ({total / _MB:.1f} MB); "
                "pass --yes to confirm"
            )
        if not typer.confirm(f"remove {_entries(len(found))} ({total / _MB:.1f} MB) from {folder}?"):
            typer.echo("nothing removed")
            return
    num, freed = weight_cache.clear(folder)
    typer.echo(f"removed {_entries(num)} ({freed / _MB:.1f} MB) from {folder}")


def _entries(n: int) -> str:
    return f"{n} entry" if n == 1 else f"{n} entries"

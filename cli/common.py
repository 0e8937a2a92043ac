"""What every command module shares: the consoles, failing with a clear message, and taking only
the options a user set (so the config dataclasses' defaults stay the single source)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

# emoji=False: a user's text such as ``random:a:b`` must print as typed, not with ``:a:`` as 🅰
console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)


def fail(message: str) -> NoReturn:
    """Print ``error: message`` (verbatim: brackets such as ``fastpp[bench]`` survive) and exit 2."""
    err_console.print(f"[red]error:[/] {escape(message)}")
    raise typer.Exit(2)


def run_app(app: Callable[[], object]) -> None:
    """Run the CLI; a MemoryError or RecursionError that no input check caught (the library
    refuses the sizes it knows of up front, naming the option: fastpp.sim.limits) ends the
    command with one line and exit 2, not a traceback."""
    try:
        app()
    except MemoryError:
        err_console.print(
            "[red]error:[/] out of memory: the run is too large for this machine "
            "(fewer requests, -n, or a shorter --duration)"
        )
        raise SystemExit(2) from None
    except RecursionError:
        err_console.print("[red]error:[/] an input is nested too deeply to read (a JSON file?)")
        raise SystemExit(2) from None


def given(cls: type, **values: Any) -> dict[str, Any]:
    """Only the options the user set that ``cls`` has a field for."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in values.items() if v is not None and k in names}


def writable_dir(path: Path, option: str = "--out") -> Path:
    """Create ``path`` if needed and check it can be written, before any long work starts;
    fail naming ``option`` otherwise."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"{option} {path}: cannot create the folder ({exc.strerror or exc})")
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        fail(f"{option} {path}: not a writable folder")
    return path


def writable_file(path: Path | None, option: str, what: str) -> None:
    """Fail naming ``option``, before any work, when ``path`` (if given) is a folder or its
    folder cannot be created; ``what`` says what to give instead ("the JSON file's path")."""
    if path is None:
        return
    if path.is_dir():
        fail(f"{option} {path} is a folder; give {what}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"{option} {path}: cannot create its folder ({exc.strerror or exc})")


def positive(value: float | None, option: str) -> None:
    """Fail naming ``option`` unless ``value`` is None or a finite number > 0."""
    if value is not None and not value > 0:  # NaN included
        fail(f"{option} must be > 0, got {value:g}")
    if value is not None and not math.isfinite(value):
        fail(f"{option} must be a finite number, got {value:g}")


def gamma_needs_cv(arrival: str | None, cv: float | None) -> None:
    """Fail when ``--arrival gamma`` comes without ``--cv``: the default cv 1 is Poisson
    traffic, not the bursty traffic a user asking for gamma arrivals wants."""
    if arrival == "gamma" and cv is None:
        fail(
            "--arrival gamma needs --cv, the arrival gaps' coefficient of variation "
            "(1 is Poisson; 2 or 4 are bursty)"
        )


def slo_from_flags(ttft_ms: float | None, tpot_ms: float | None):
    """The SLO of ``--slo-ttft-ms`` / ``--slo-tpot-ms`` (unset: ``SLO``'s defaults), failing
    with the flag's name on a bad value."""
    from fastpp.types import SLO

    positive(ttft_ms, "--slo-ttft-ms")
    positive(tpot_ms, "--slo-tpot-ms")
    default = SLO()
    return SLO(
        default.ttft_s if ttft_ms is None else ttft_ms / 1e3,
        default.tpot_s if tpot_ms is None else tpot_ms / 1e3,
    )

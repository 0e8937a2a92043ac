"""One folder per run: a fresh name for each invocation that writes runs, and an explicit
``--out`` that already holds another run refused (naming it) or, with ``--overwrite``, cleared.

Scenario: ``fastpp simulate`` run twice with different models used to write both into
runs/simulate/, leaving the first run's deployment folders beside the second's, and ``fastpp plot``
drew them together. Now each invocation without ``-o`` writes ``runs/simulate/<YYYYmmdd-HHMMSS>/``
(``-2``, ``-3`` ... when two start in the same second), so runs never share a folder.

A folder "holds a run" when it has a ``summary.json`` or a subfolder with one (a run folder).
Clearing removes only what a run wrote: that ``summary.json``, the run subfolders and a
``plots/`` folder of figures; any other file stays. A folder of whole earlier invocations (such
as runs/simulate itself, whose subfolders list their runs in a summary.json) is never cleared,
nor is a folder holding another command's output (a sweep's table, a plan): simulate, sweep,
plan and goodput --plot each refuse to write beside the others' files (``OWNER_FILES``).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from fastpp.sim.planner import PLAN_JSONL
from fastpp.sim.plot_inputs import GOODPUT_JSON
from fastpp.sim.sweep_table import RESULTS_JSONL

SUMMARY = "summary.json"
PLOTS = "plots"
FIGURE_SUFFIXES = (".png", ".svg", ".pdf")
# The file by which each command's output folder is known: a folder holding one of them belongs
# to that command, and another command refuses to write beside it.
OWNER_FILES = {
    SUMMARY: "fastpp simulate",
    RESULTS_JSONL: "fastpp sweep",
    PLAN_JSONL: "fastpp plan",
    GOODPUT_JSON: "fastpp goodput --plot",
}


class RunDirError(ValueError):
    """The output folder holds another run; the message names it and the way out."""


def fresh_run_dir(parent: Path, now: float | None = None) -> Path:
    """Create and return ``parent/<YYYYmmdd-HHMMSS>`` (local time), or ``...-2``, ``-3`` when
    that name is taken: a new, empty folder per call, sortable by name."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        path = parent / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise RunDirError(f"{parent}: no free run folder name for {stamp}")


def refuse_other_command(path: Path, own: str, option: str = "--out") -> None:
    """Raise :class:`RunDirError` when ``path`` holds the output of a command other than the one
    whose owner file is ``own`` (``OWNER_FILES``; a simulate run in a subfolder counts too):
    ``--overwrite`` replaces a command's own earlier output, never another command's."""
    if not path.is_dir():
        return
    for name, command in OWNER_FILES.items():
        if name == own:
            continue
        found = (path / name).is_file() or (name == SUMMARY and bool(run_contents(path)))
        if found:
            raise RunDirError(
                f"{option} {path} holds the output of {command} ({name}); give another {option}"
            )


def run_contents(path: Path) -> list[Path]:
    """What in ``path`` a run wrote: its summary.json and run subfolders (empty: no run)."""
    if not path.is_dir():
        return []
    found = [path / SUMMARY] if (path / SUMMARY).is_file() else []
    found += sorted(d for d in path.iterdir() if d.is_dir() and (d / SUMMARY).is_file())
    return found


def _lists_runs(folder: Path) -> bool:
    """True iff ``folder/summary.json`` is a list: the folder is a whole ``fastpp simulate`` run."""
    try:
        return isinstance(json.loads((folder / SUMMARY).read_text(encoding="utf-8")), list)
    except (OSError, ValueError):
        return False


def claim_out_dir(path: Path, *, overwrite: bool, option: str = "--out") -> Path:
    """``path`` ready for a new run: refused with :class:`RunDirError` naming what it holds
    when it holds another run, unless ``overwrite``, which clears that run first. A folder
    holding whole earlier runs in subfolders, or another command's output, is refused even with
    ``overwrite``."""
    refuse_other_command(path, SUMMARY, option)
    held = run_contents(path)
    if not held:
        return path
    whole = [p.name for p in held if p.is_dir() and _lists_runs(p)]
    if whole:
        raise RunDirError(
            f"{option} {path} holds {len(whole)} earlier runs in subfolders ({', '.join(whole[:3])}"
            f"{' ...' if len(whole) > 3 else ''}); give a new {option} (or none: each run then "
            f"gets its own folder under it)"
        )
    if not overwrite:
        names = ", ".join(p.name for p in held[:6]) + (" ..." if len(held) > 6 else "")
        raise RunDirError(
            f"{option} {path} already holds a run ({names}); pass --overwrite to replace it, "
            f"or give another {option} (without {option}, each run gets its own folder)"
        )
    for p in held:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    clear_plots(path)
    return path


def clear_plots(path: Path) -> None:
    """Remove ``path/plots`` when it holds figures only (a folder with other files stays)."""
    plots = path / PLOTS
    if plots.is_dir() and all(f.is_file() and f.suffix in FIGURE_SUFFIXES for f in plots.iterdir()):
        shutil.rmtree(plots)


def claim_result_dir(path: Path, result_file: str, *, overwrite: bool, option: str) -> Path:
    """``path`` ready for a command that writes one ``result_file`` and its figures there
    (``fastpp goodput --plot DIR``): refused with :class:`RunDirError` when ``result_file``
    is already there (another run), unless ``overwrite``, which removes it and the figures
    beside it (files with a figure suffix; any other file stays). A folder holding another
    command's output is refused whatever ``overwrite`` says (``refuse_other_command``)."""
    refuse_other_command(path, result_file, option)
    held = path / result_file
    if not held.is_file():
        return path
    if not overwrite:
        raise RunDirError(
            f"{option} {path} already holds a run ({result_file}); pass --overwrite to replace it, "
            f"or give another folder"
        )
    held.unlink()
    for figure in path.iterdir():
        if figure.is_file() and figure.suffix in FIGURE_SUFFIXES:
            figure.unlink()
    return path

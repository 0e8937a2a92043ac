"""The architecture's rules, checked on the source: the core imports no outer layer, and no
executor (sim/, backends/, cli/) touches the Scheduler beyond the executor contract
(fastpp/plan.py, docs/ARCHITECTURE.md "The executor contract")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUTER = ("sim", "backends", "cli")
# What an executor may use of a Scheduler: the contract's calls and read-only config.
CONTRACT = {
    "add_request", "abort", "abort_all", "schedule", "update", "observe", "stats", "is_slot_free",
    "has_work", "num_microbatches", "num_ended", "forget", "drain_kv_frees", "config", "clock", "view",
}
SCHEDULER_NAMES = {"scheduler", "sched", "_scheduler"}  # how executors name their Scheduler


def _sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _scheduler_attributes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, attribute) of every ``<scheduler>.attr`` where the object is a name or an
    attribute called like a scheduler (``sched.x``, ``self.scheduler.x``)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
        if name in SCHEDULER_NAMES:
            found.append((node.lineno, node.attr))
    return found


@pytest.mark.parametrize("path", _sources(*OUTER), ids=lambda p: str(p.relative_to(ROOT)))
def test_executors_use_only_the_scheduler_contract(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    outside = [(line, attr) for line, attr in _scheduler_attributes(tree) if attr not in CONTRACT]
    assert not outside, f"{path.relative_to(ROOT)} reads Scheduler internals: {outside}"


def test_the_check_catches_a_read_outside_the_contract():
    tree = ast.parse("def f(engine):\n    engine.scheduler._queue\n    sched.view\n")
    assert [a for _, a in _scheduler_attributes(tree) if a not in CONTRACT] == ["_queue"]


@pytest.mark.parametrize("path", _sources("fastpp"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_core_imports_no_outer_layer(path):
    if path.name == "__main__.py":  # the `python -m fastpp` entry point runs the CLI by design
        return
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        for name in names:
            assert not any(name.startswith(f"fastpp.{o}") for o in ("sim", "backends", "cli")), \
                f"{path.relative_to(ROOT)} imports {name}"

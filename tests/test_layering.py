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


# The engine plugins drive SGLang's and vLLM's own schedulers (also named ``sched`` there), never
# ours: they implement the policy interface over another engine, so this check is not theirs.
OTHER_ENGINES = (ROOT / "backends" / "sglang", ROOT / "backends" / "vllm")
EXECUTORS = [p for p in _sources(*OUTER) if not any(p.is_relative_to(d) for d in OTHER_ENGINES)]


@pytest.mark.parametrize("path", EXECUTORS, ids=lambda p: str(p.relative_to(ROOT)))
def test_executors_use_only_the_scheduler_contract(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    outside = [(line, attr) for line, attr in _scheduler_attributes(tree) if attr not in CONTRACT]
    assert not outside, f"{path.relative_to(ROOT)} reads Scheduler internals: {outside}"


def test_the_check_catches_a_read_outside_the_contract():
    tree = ast.parse("def f(engine):\n    engine.scheduler._queue\n    sched.view\n")
    assert [a for _, a in _scheduler_attributes(tree) if a not in CONTRACT] == ["_queue"]


def _load_time_nodes(tree: ast.Module) -> list[ast.AST]:
    """Statements that run when the module is imported (not in functions, not TYPE_CHECKING)."""
    out = []
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.extend(ast.walk(node))
    return out


@pytest.mark.parametrize("path", _sources("fastpp"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_core_imports_no_outer_layer(path):
    if path.name == "__main__.py":  # the `python -m fastpp` entry point runs the CLI by design
        return
    tree = ast.parse(path.read_text(encoding="utf-8"))
    # The package facade re-exports the simulator's entry points, imported on first use only.
    nodes = _load_time_nodes(tree) if path == ROOT / "fastpp" / "__init__.py" else ast.walk(tree)
    for node in nodes:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        for name in names:
            assert not any(name.startswith(f"fastpp.{o}") for o in ("sim", "backends", "cli")), \
                f"{path.relative_to(ROOT)} imports {name}"

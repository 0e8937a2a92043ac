"""The architecture's rules, checked on the source: the core imports no outer layer, and every
executor talks to our policies through one level of the executor contract
(fastpp/policy_host_contract.py, docs/ARCHITECTURE.md "The executor contract") and uses no
member beyond it: level 1 (``PipelineScheduler``) for the simulator and the CPU engine, level 2
(``EngineHost``) for the SGLang and vLLM adapters."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from fastpp.policy_host import PolicyHost
from fastpp.policy_host_contract import EngineHost, PipelineScheduler, members
from fastpp.scheduler import Scheduler

ROOT = Path(__file__).resolve().parents[1]
OUTER = ("sim", "backends", "cli")
# The member sets of the two levels, pinned: changing a level is a decision, made here too.
LEVEL_1 = {
    "add_request",
    "abort",
    "abort_all",
    "schedule",
    "update",
    "observe",
    "observes_iterations",
    "stats",
    "is_slot_free",
    "has_work",
    "num_ended",
    "forget",
    "drain_kv_frees",
    "counters",
    "config",
    "clock",
}
LEVEL_2 = {
    "arrive",
    "begin_step",
    "launched",
    "stage_records",
    "observe",
    "returned",
    "view",
    "signals",
    "records",
    "policies",
    "counters",
}
CONTRACT = members(PipelineScheduler)
HOST_CONTRACT = members(EngineHost)
SCHEDULER_NAMES = {"scheduler", "sched", "_scheduler"}  # how executors name their Scheduler
HOST_NAMES = {"host"}  # how the engine adapters name their PolicyHost


def _sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _attributes(tree: ast.AST, owners: set[str]) -> list[tuple[int, str]]:
    """(line, attribute) of every ``<owner>.attr`` where the object is a name or an attribute
    called like an owner (``sched.x``, ``self.scheduler.x``, ``self.host.x``)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
        if name in owners:
            found.append((node.lineno, node.attr))
    return found


def _scheduler_attributes(tree: ast.AST) -> list[tuple[int, str]]:
    return _attributes(tree, SCHEDULER_NAMES)


# The engine plugins drive SGLang's and vLLM's own schedulers (also named ``sched`` there), never
# ours: they are level-2 executors, checked against the host's contract instead.
OTHER_ENGINES = (ROOT / "backends" / "sglang", ROOT / "backends" / "vllm")
ENGINE_ADAPTERS = [p for d in OTHER_ENGINES for p in sorted(d.rglob("*.py"))]
EXECUTORS = [p for p in _sources(*OUTER) if not any(p.is_relative_to(d) for d in OTHER_ENGINES)]
# the level-1 loop written once in the core (fastpp/pipeline.py) is an executor of level 1 too
LEVEL_1_USERS = [*EXECUTORS, ROOT / "fastpp" / "pipeline.py"]


def test_the_levels_have_the_pinned_members_and_their_implementations_have_them():
    assert CONTRACT == LEVEL_1 and HOST_CONTRACT == LEVEL_2
    fields = {f.name for f in dataclasses.fields(PolicyHost)}
    assert not [m for m in LEVEL_1 - {"config", "clock"} if not hasattr(Scheduler, m)]
    assert not [m for m in LEVEL_2 if not hasattr(PolicyHost, m) and m not in fields]


@pytest.mark.parametrize("path", LEVEL_1_USERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_level_1_executors_use_only_the_scheduler_contract(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    outside = [(line, attr) for line, attr in _scheduler_attributes(tree) if attr not in CONTRACT]
    assert not outside, f"{path.relative_to(ROOT)} reads Scheduler internals: {outside}"


@pytest.mark.parametrize("path", ENGINE_ADAPTERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_level_2_adapters_use_only_the_host_contract_and_never_our_scheduler(path):
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    outside = [(line, attr) for line, attr in _attributes(tree, HOST_NAMES) if attr not in HOST_CONTRACT]
    assert not outside, f"{path.relative_to(ROOT)} reads PolicyHost members outside its contract: {outside}"
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not imported & {"fastpp.scheduler", "fastpp.policies.guard"}, (
        f"{path.relative_to(ROOT)} runs policies or a scheduler beside its host"
    )


def test_every_member_of_each_level_is_used_by_some_executor():
    """Nothing in a level that no executor needs (the contract is what they use)."""
    used_1 = {a for p in LEVEL_1_USERS for _, a in _scheduler_attributes(ast.parse(p.read_text()))}
    used_2 = {a for p in ENGINE_ADAPTERS for _, a in _attributes(ast.parse(p.read_text()), HOST_NAMES)}
    assert used_1 >= LEVEL_1, sorted(LEVEL_1 - used_1)
    assert used_2 >= LEVEL_2, sorted(LEVEL_2 - used_2)


def test_the_check_catches_a_read_outside_the_contract():
    tree = ast.parse("def f(engine):\n    engine.scheduler._queue\n    sched.view\n    self.host.slots\n")
    assert [a for _, a in _scheduler_attributes(tree) if a not in CONTRACT] == ["_queue", "view"]
    assert [a for _, a in _attributes(tree, HOST_NAMES) if a not in HOST_CONTRACT] == ["slots"]


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
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        for name in names:
            assert not any(name.startswith(f"fastpp.{o}") for o in ("sim", "backends", "cli")), (
                f"{path.relative_to(ROOT)} imports {name}"
            )

"""The compatibility promise (docs/API.md), enforced: every public name of ``fastpp.__all__``
and its signature are recorded in tests/public_api.json. A name that disappears, or whose
signature changes, fails this test unless CHANGELOG.md's "Unreleased" section names it (then
refresh the record: ``FASTPP_UPDATE_API=1 python -m pytest tests/test_public_api.py``). New names
must be recorded too, so every addition is a deliberate one.

Also here: the README's "Use FastPP from Python" snippet runs as written, both examples run,
every public name has a docstring, and the API reference builds without a warning."""

from __future__ import annotations

import inspect
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

import fastpp

ROOT = Path(__file__).resolve().parents[1]
RECORD = Path(__file__).parent / "public_api.json"


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""


def describe(obj) -> dict | str:
    """A public name's surface: a function's signature; a class's constructor and its public
    members (methods with their signatures, properties and fields by name)."""
    if inspect.isclass(obj):
        members = {}
        for name, value in sorted(vars(obj).items()):
            if name.startswith("_"):
                continue
            is_method = callable(value) and not inspect.isclass(value)
            members[name] = _signature(value) if is_method else "attribute"
        for name in getattr(obj, "__annotations__", {}):
            if not name.startswith("_"):
                members.setdefault(name, "attribute")
        return {"class": _signature(obj), "members": members}
    if callable(obj):
        return _signature(obj)
    return type(obj).__name__


def surface() -> dict:
    return {name: describe(getattr(fastpp, name)) for name in sorted(fastpp.__all__) if name != "__version__"}


def unreleased_changelog() -> str:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    m = re.search(r"^## Unreleased\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    return m.group(1) if m else ""


def test_public_names_keep_their_signatures_or_the_changelog_says_so():
    now = surface()
    if os.environ.get("FASTPP_UPDATE_API"):
        RECORD.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    recorded = json.loads(RECORD.read_text(encoding="utf-8"))
    changed = sorted(name for name in recorded.keys() | now.keys() if recorded.get(name) != now.get(name))
    announced = unreleased_changelog()
    silent = [name for name in changed if f"`{name}`" not in announced]
    assert not silent, (
        f"public names changed without a CHANGELOG.md 'Unreleased' entry naming them: "
        f"{silent}; announce each change, then refresh tests/public_api.json "
        "(FASTPP_UPDATE_API=1)"
    )
    assert not changed, f"refresh tests/public_api.json for {changed} (FASTPP_UPDATE_API=1)"


def test_the_check_sees_a_changed_signature():
    recorded = json.loads(RECORD.read_text(encoding="utf-8"))

    def make_chunk_policy(spec: str, *, profile=None) -> None:  # a narrower signature
        return None

    assert describe(make_chunk_policy) != recorded["make_chunk_policy"]


def test_every_public_name_is_documented():
    missing = [n for n in fastpp.__all__ if n != "__version__" and not inspect.getdoc(getattr(fastpp, n))]
    assert not missing, f"public names without a docstring: {missing}"
    assert fastpp.__version__ != "0+unknown"  # the installed package's version


def test_readme_python_snippet_runs_as_written():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Use FastPP from Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102  (the README's own code)
    assert namespace["run"].summary["completed"] > 0


def test_example_custom_scheduler_runs_on_the_view_protocol_alone():
    source = (ROOT / "examples" / "custom_scheduler.py").read_text(encoding="utf-8")
    assert "fastpp.scheduler" not in source and "Scheduler(" not in source
    result = runpy.run_path(str(ROOT / "examples" / "custom_scheduler.py"))["serve"](num_requests=120)
    assert result["requests"] == 120 and result["parks"] > 0 and len(result["chunk_budgets"]) > 1


def test_example_compare_deployments_writes_its_figure(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "cdfs.png"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "compare_deployments.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 10_000 and "predictive" in proc.stdout


def test_api_reference_builds_without_a_warning(tmp_path):
    script = ROOT / "scripts" / "build_api_docs.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (tmp_path / "fastpp.html").read_text(encoding="utf-8")
    for name in ("PolicyView", "make_chunk_policy", "run_simulation", "ALPPredictor"):
        assert f'id="{name}"' in page

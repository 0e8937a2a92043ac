"""The documentation site builds strictly: every page in mkdocs.yml's nav exists, every link
between pages resolves, the CLI reference renders from the Typer app and the API reference
renders every public name, with no warning (``mkdocs build --strict``).

Needs the ``docs`` extra. Without MkDocs the test skips, except in CI (``CI`` set), which
installs the extra, so there a missing MkDocs fails instead of passing unseen."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fastpp

ROOT = Path(__file__).resolve().parents[1]
NEEDED = ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_click")


def _missing() -> list[str]:
    return [
        name
        for name in NEEDED
        if importlib.util.find_spec(name.split(".")[0]) is None or importlib.util.find_spec(name) is None
    ]


@pytest.mark.slow
def test_site_builds_strictly(tmp_path: Path) -> None:
    missing = _missing()
    if missing:
        message = f"the docs extra is not installed (missing {', '.join(missing)}): pip install -e '.[docs]'"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    out = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "FASTPP_NATIVE": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    # the generated references hold what they are generated from
    cli_page = (out / "cli" / "index.html").read_text()
    for name in ("simulate", "goodput", "plan", "serve", "bench", "profile"):
        assert f"fastpp {name}" in cli_page, f"the CLI reference lacks `fastpp {name}`"
    assert "--slo-ttft-ms" in cli_page, "the CLI reference lists no options"
    api_page = (out / "api-reference" / "index.html").read_text()
    documented = set(re.findall(r'id="fastpp\.([A-Za-z_]+)"', api_page))
    absent = [name for name in fastpp.__all__ if name != "__version__" and name not in documented]
    assert not absent, f"the API reference lacks {absent}"

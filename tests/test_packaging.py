"""Packaging: the version, the shipped profiles found by name from anywhere, and what a built
wheel holds (license, py.typed, profiles, the extras' requirements)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest

import fastpp
from fastpp.profile import load_profile
from fastpp.profile_names import resolve_profile, shipped_profiles

REPO = Path(__file__).resolve().parent.parent


def test_version_comes_from_the_package_metadata():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert fastpp.__version__ == metadata.version("fastpp") == declared


def test_shipped_profiles_resolve_by_name_outside_a_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no profiles/ folder here
    assert "cpu_smollm2-135m_pp2" in shipped_profiles()
    for value in ("cpu_smollm2-135m_pp2", "cpu_smollm2-135m_pp2.json", "profiles/cpu_smollm2-135m_pp2.json"):
        path = resolve_profile(value)
        assert path.name == "cpu_smollm2-135m_pp2.json" and load_profile(path).pp == 2
    (tmp_path / "mine.json").write_text("{}")
    assert resolve_profile("mine.json") == Path("mine.json")  # a file on disk wins
    with pytest.raises(FileNotFoundError, match="shipped: a100-40gb-pcie_qwen2.5-32b_pp4"):
        resolve_profile("nope")


@pytest.mark.slow
def test_the_wheel_ships_license_types_profiles_and_lower_bounds(tmp_path):
    src = tmp_path / "src"  # a copy: setuptools writes build/ next to the sources it builds
    # not the engine venvs scripts/engines/ builds in .engines (13 GB in CI: copied every run)
    shutil.copytree(
        REPO,
        src,
        ignore=shutil.ignore_patterns(
            ".git",
            ".engines",
            "build",
            "dist",
            "runs",
            "*.egg-info",
            "__pycache__",
            ".*_cache",
            ".hypothesis",
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("fastpp-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = Parser().parsestr(z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode())
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert meta["License-Expression"] == "Apache-2.0"
    assert {
        "fastpp/py.typed",
        "fastpp/profiles/cpu_smollm2-135m_pp2.json",
        "fastpp/profiles/a100-40gb-pcie_qwen2.5-32b_pp4.json",
    } <= names
    requires = meta.get_all("Requires-Dist")
    serve = [r for r in requires if 'extra == "serve"' in r]
    for package in ("torch>=2.4", "tokenizers>=0.21", "prometheus_client>=0.20", "gguf", "safetensors"):
        assert any(r.startswith(package) for r in serve), (package, serve)
    # no exact pins, but for the engine plugins, which target one release's internals
    pinned = [r for r in requires if "==" in r.split(";")[0]]
    assert all('extra == "sglang"' in r or 'extra == "vllm"' in r for r in pinned), pinned
    assert any('extra == "all"' in r for r in requires)

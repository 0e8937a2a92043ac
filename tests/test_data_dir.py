"""The data directory's one resolution order: --data-dir, $FASTPP_DATA_DIR, then ../shared/data
beside the checkout (found from the package's path, never from the current directory)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fastpp import data_dir as dd
from fastpp.cli.app import app
from fastpp.length_files import WorkloadError
from fastpp.workloads import resolve_data_dir


def test_the_flag_wins_over_the_variable_and_the_variable_over_the_checkout(tmp_path, monkeypatch):
    flag, env = tmp_path / "flag", tmp_path / "env"
    flag.mkdir()
    env.mkdir()
    monkeypatch.setenv(dd.DATA_DIR_ENV, str(env))
    assert resolve_data_dir(flag) == flag
    assert dd.data_dir_source(flag)[1] == "--data-dir"
    assert resolve_data_dir() == env and dd.data_dir_source()[1] == "$FASTPP_DATA_DIR"
    monkeypatch.delenv(dd.DATA_DIR_ENV)
    assert dd.data_dir_source() == (dd.checkout_data_dir(), "the checkout")


def test_the_checkout_default_does_not_depend_on_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.delenv(dd.DATA_DIR_ENV, raising=False)
    root = dd.checkout_root()
    assert root is not None and (root / "fastpp" / "data_dir.py").is_file()
    here = dd.checkout_data_dir()
    monkeypatch.chdir(tmp_path)
    assert dd.checkout_data_dir() == here == (root / ".." / "shared" / "data").resolve()


def test_a_missing_directory_names_the_flag_the_variable_and_where_it_came_from(tmp_path, monkeypatch):
    monkeypatch.setenv(dd.DATA_DIR_ENV, str(tmp_path / "gone"))
    with pytest.raises(WorkloadError) as err:
        resolve_data_dir()
    text = str(err.value)
    assert "--data-dir" in text and "FASTPP_DATA_DIR" in text and "gone" in text
    assert "from $FASTPP_DATA_DIR" in text and "pass data_dir" not in text


def test_no_checkout_and_nothing_given_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(dd.DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(dd, "checkout_root", lambda: None)
    with pytest.raises(WorkloadError, match="no data directory: pass --data-dir DIR or set FASTPP_DATA_DIR"):
        resolve_data_dir()


def test_the_cli_error_names_the_option(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(dd.DATA_DIR_ENV, raising=False)
    res = CliRunner().invoke(
        app,
        [
            "simulate",
            "-w",
            "azure-conv-trace",
            "-n",
            "5",
            "--data-dir",
            str(tmp_path / "nope"),
            "-o",
            str(tmp_path / "out"),
        ],
    )
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert "--data-dir" in text and "FASTPP_DATA_DIR" in text and "Traceback" not in text

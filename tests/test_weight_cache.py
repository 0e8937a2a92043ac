"""The converted-weight cache: content-keyed, hashed once per file version, size-capped, and
shown and cleared by ``fastpp cache``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fastpp.backends import weight_cache
from fastpp.cli.app import app


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    """A private ~/.cache/fastpp: the default folder is root/weights, legacy entries sit in root."""
    monkeypatch.setattr(weight_cache, "_ROOT", tmp_path / "fastpp")
    monkeypatch.delenv("FASTPP_WEIGHT_CACHE_DIR", raising=False)
    monkeypatch.delenv("FASTPP_WEIGHT_CACHE_MAX_MB", raising=False)
    return tmp_path / "fastpp"


def write(path: Path, data: bytes, mtime_s: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime_s is not None:
        os.utime(path, (mtime_s, mtime_s))
    return path


def test_the_key_is_the_content_not_the_mtime(root, tmp_path):
    src = write(tmp_path / "pkg" / "model.gguf", b"weights v1" * 1000, mtime_s=1_000_000)
    first = weight_cache.entry_path(src)
    write(src, b"weights v1" * 1000, mtime_s=2_000_000)  # a reinstall: same bytes, new mtime
    assert weight_cache.entry_path(src) == first
    assert first.parent == root / "weights" and first.name.startswith("model-")
    assert first.name.endswith(f"-v{weight_cache.FORMAT_VERSION}.pt")
    write(src, b"weights v2" * 1000)
    assert weight_cache.entry_path(src) != first


def test_a_file_is_hashed_once_per_version(root, tmp_path, monkeypatch):
    src = write(tmp_path / "model.gguf", os.urandom(3 << 20), mtime_s=1_000_000)
    calls: list[Path] = []
    real = weight_cache.file_sha256
    monkeypatch.setattr(weight_cache, "file_sha256", lambda p: calls.append(p) or real(p))
    digest = weight_cache.content_digest(src)
    assert digest == real(src) and len(calls) == 1
    assert weight_cache.content_digest(src) == digest and len(calls) == 1  # from the sidecar
    os.utime(src, (3_000_000, 3_000_000))
    assert weight_cache.content_digest(src) == digest and len(calls) == 2
    rows = (root / "weights" / "hashes.json").read_text()
    assert "1000000000000000" not in rows  # the stale (path, size, mtime) row was dropped


def test_trim_removes_legacy_then_least_recently_used_and_keeps_the_new_one(root):
    folder = root / "weights"
    legacy = write(root / "SmolLM2-98362432-1733000000000000000.pt", b"x" * 400, mtime_s=5_000)
    old = write(folder / f"a-{'0' * 16}-v1.pt", b"x" * 300, mtime_s=1_000)
    mid = write(folder / f"b-{'1' * 16}-v1.pt", b"x" * 300, mtime_s=2_000)
    new = write(folder / f"c-{'2' * 16}-v1.pt", b"x" * 300, mtime_s=500)  # just written, oldest mtime
    native = write(root / "native" / "fastpp_core.so", b"x" * 999)  # the compiled build: not ours
    assert [e.is_legacy for e in weight_cache.entries()] == [False, False, False, True]  # by last use
    removed = weight_cache.trim(keep=new, limit_bytes=700)
    assert removed == [legacy, old]
    assert mid.is_file() and new.is_file() and native.is_file()
    assert weight_cache.trim(keep=new, limit_bytes=0) == [mid] and new.is_file()


def test_a_hit_makes_an_entry_the_most_recently_used(root):
    folder = root / "weights"
    a = write(folder / f"a-{'0' * 16}-v1.pt", b"x" * 10, mtime_s=1_000)
    b = write(folder / f"b-{'1' * 16}-v1.pt", b"x" * 10, mtime_s=2_000)
    weight_cache.touch(a)
    assert weight_cache.trim(limit_bytes=10) == [b]


def test_the_cap_and_folder_come_from_the_environment(root, monkeypatch, tmp_path):
    assert weight_cache.max_bytes() == 2048 << 20
    monkeypatch.setenv("FASTPP_WEIGHT_CACHE_MAX_MB", "1.5")
    assert weight_cache.max_bytes() == 3 << 19
    monkeypatch.setenv("FASTPP_WEIGHT_CACHE_MAX_MB", "lots")
    with pytest.raises(ValueError, match="FASTPP_WEIGHT_CACHE_MAX_MB must be a number"):
        weight_cache.max_bytes()
    monkeypatch.setenv("FASTPP_WEIGHT_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert weight_cache.cache_dir() == tmp_path / "elsewhere"


def test_load_gguf_converts_once_across_reinstalls(root, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from fastpp.backends.torch import gguf_weights
    from fastpp.backends.torch.weights import random_weights

    parses: list[Path] = []
    tiny = random_weights("tiny", seed=0)

    def fake_read(path, name):  # the GGUF parse, counted; a tiny random model stands for it
        parses.append(path)
        return tiny.config, dict(tiny.tensors)

    monkeypatch.setattr(gguf_weights, "_read_gguf", fake_read)
    src = write(tmp_path / "site-packages" / "m.gguf", b"gguf bytes", mtime_s=1_000_000)
    first = gguf_weights.load_gguf(src, "m")
    key = "model.embed_tokens.weight"
    write(src, b"gguf bytes", mtime_s=2_000_000)  # pip reinstall: new mtime, same bytes
    again = gguf_weights.load_gguf(src, "m")
    assert len(parses) == 1 and torch.equal(first.tensors[key], again.tensors[key])
    assert again.config.name == "m"
    assert [e.path.name for e in weight_cache.entries()] == [weight_cache.entry_path(src).name]
    weight_cache.entry_path(src).write_bytes(b"truncated")  # a damaged entry is converted again
    assert torch.equal(gguf_weights.load_gguf(src, "m").tensors[key], first.tensors[key])
    assert len(parses) == 2
    gguf_weights.load_gguf(src, "m", cache_dir=None)
    assert len(parses) == 3


def test_cli_shows_and_clears_with_confirmation(root):
    folder = root / "weights"
    write(folder / f"a-{'0' * 16}-v1.pt", b"x" * (3 << 20))
    write(root / "old-5-6.pt", b"x" * (1 << 20))
    runner = CliRunner()
    shown = runner.invoke(app, ["cache"])
    assert shown.exit_code == 0, shown.output
    assert str(folder) in shown.stdout and "3.0 MB" in shown.stdout and "legacy" in shown.stdout
    assert "total 4.0 MB in 2 entries" in shown.stdout
    refused = runner.invoke(app, ["cache", "clear"])  # no terminal, no --yes: nothing happens
    assert refused.exit_code == 2 and "--yes" in refused.stderr and len(weight_cache.entries()) == 2
    done = runner.invoke(app, ["cache", "clear", "--yes"])
    assert done.exit_code == 0 and "removed 2 entries (4.0 MB)" in done.stdout
    assert weight_cache.entries() == []
    bad = runner.invoke(app, ["cache", "purge"])
    assert bad.exit_code == 2 and "show or clear" in bad.stderr


def test_clear_leaves_a_writer_in_progress_alone(root, tmp_path):
    folder = root / "weights"
    weight_cache.entry_path(write(tmp_path / "m.gguf", b"abc"))  # writes the hash sidecar
    write(folder / f"m-{'0' * 16}-v1.pt", b"x" * 10)
    fresh = write(folder / f"n-{'1' * 16}-v1.tmp123", b"half")  # another process is saving
    dead = write(folder / f"o-{'2' * 16}-v1.tmp456", b"half", mtime_s=1_000)  # its writer died
    assert weight_cache.clear() == (1, 10)
    assert fresh.is_file() and not dead.exists() and not (folder / "hashes.json").exists()

"""The torch engine's converted-weight cache: content-keyed files under one folder, size-capped.

A GGUF model is dequantized to float32 once and the result saved as a torch file, so later loads
skip the parse. An entry is named ``<stem>-<sha256 prefix>-v<format>.pt``: the key is the source
file's content (its full SHA-256) and the converter's format version, never its path or mtime,
so reinstalling the same package (same bytes, new mtime) reuses the entry instead of adding one.

Hashing a ~100 MB file costs a fraction of a second; to pay it only when a file changes, the
digest is remembered in ``hashes.json`` beside the entries, keyed by (path, size, mtime_ns). A
stale or missing sidecar only costs one re-hash.

The folder is ``$FASTPP_WEIGHT_CACHE_DIR``, else ``~/.cache/fastpp/weights``. After each new
entry the folder is trimmed to ``$FASTPP_WEIGHT_CACHE_MAX_MB`` (default 2048 MB) by removing the
least recently used entries (a hit refreshes an entry's mtime), never the one just written.
Entries of the older mtime-keyed scheme (``~/.cache/fastpp/<stem>-<size>-<mtime_ns>.pt``) are
never read again; they are listed and removed as ``legacy``. ``fastpp cache`` shows the entries,
``fastpp cache clear --yes`` removes them. This module needs neither torch nor numpy; nothing
here touches ``~/.cache/fastpp/native`` (the compiled build).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

FORMAT_VERSION = 1  # bump when the converted tensors change for the same source bytes
DEFAULT_MAX_MB = 2048.0
_ROOT = Path.home() / ".cache" / "fastpp"
_HASHES = "hashes.json"
_ENTRY_RE = re.compile(r"^(?P<stem>.+)-(?P<digest>[0-9a-f]{16})-v(?P<version>\d+)\.pt$")
_LEGACY_RE = re.compile(r"^.+-\d+-\d+\.pt$")  # <stem>-<size>-<mtime_ns>.pt in ~/.cache/fastpp
_CHUNK = 1 << 20
_STALE_TMP_S = 3600.0  # a tmp file this old belongs to a writer that died


def cache_dir() -> Path:
    """The weight cache folder: ``$FASTPP_WEIGHT_CACHE_DIR`` or ``~/.cache/fastpp/weights``."""
    env = os.environ.get("FASTPP_WEIGHT_CACHE_DIR")
    return Path(env).expanduser() if env else _ROOT / "weights"


def max_bytes() -> int:
    """The size cap, from ``$FASTPP_WEIGHT_CACHE_MAX_MB`` (MB = 2**20 bytes); ValueError naming
    the variable when it is not a number >= 0."""
    raw = os.environ.get("FASTPP_WEIGHT_CACHE_MAX_MB")
    if raw is None or raw.strip() == "":
        return int(DEFAULT_MAX_MB * _CHUNK)
    try:
        mb = float(raw)
    except ValueError:
        mb = -1.0
    if not mb >= 0:
        raise ValueError(f"FASTPP_WEIGHT_CACHE_MAX_MB must be a number of MB >= 0, got {raw!r}")
    return int(mb * _CHUNK)


@dataclass(frozen=True, slots=True)
class CacheEntry:
    path: Path
    size_bytes: int
    used_at: float  # mtime: last write or hit
    is_legacy: bool  # the older mtime-keyed scheme: never read, safe to remove


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(8 * _CHUNK):
            h.update(block)
    return h.hexdigest()


def content_digest(source: Path, folder: Path | None = None) -> str:
    """``source``'s SHA-256, from the sidecar when (path, size, mtime_ns) still match, else
    hashed now and remembered there."""
    folder = cache_dir() if folder is None else folder
    st = source.stat()
    stat_key = f"{source.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    known = _read_hashes(folder)
    if stat_key in known:
        return known[stat_key]
    digest = file_sha256(source)
    # keep only rows whose file still has those stats, so the sidecar cannot grow without bound
    rows = {k: v for k, v in known.items() if _stat_still_matches(k)}
    rows[stat_key] = digest
    _write_json(folder / _HASHES, rows)
    return digest


def entry_path(source: Path, folder: Path | None = None) -> Path:
    """Where the converted form of ``source`` lives (whether or not it exists yet)."""
    folder = cache_dir() if folder is None else folder
    digest = content_digest(source, folder)
    return folder / f"{source.stem}-{digest[:16]}-v{FORMAT_VERSION}.pt"


def touch(entry: Path) -> None:
    """Mark a hit: the entry becomes the most recently used (best effort)."""
    with contextlib.suppress(OSError):
        os.utime(entry)


def entries(folder: Path | None = None) -> list[CacheEntry]:
    """Every cache entry, current and legacy, oldest use first."""
    folder = cache_dir() if folder is None else folder
    found = [_entry(p, is_legacy=False) for p in _files(folder) if _ENTRY_RE.match(p.name)]
    if folder == _ROOT / "weights":  # the old scheme wrote straight into ~/.cache/fastpp
        found += [_entry(p, is_legacy=True) for p in _files(_ROOT) if _LEGACY_RE.match(p.name)]
    return sorted((e for e in found if e is not None), key=lambda e: e.used_at)


def trim(keep: Path | None = None, folder: Path | None = None, limit_bytes: int | None = None) -> list[Path]:
    """Remove legacy entries, then the least recently used ones, until the total is at most
    the cap; ``keep`` is never removed. Returns what was removed."""
    limit = max_bytes() if limit_bytes is None else limit_bytes
    found = entries(folder)
    total = sum(e.size_bytes for e in found)
    removed: list[Path] = []
    for e in sorted(found, key=lambda e: (not e.is_legacy, e.used_at)):
        if total <= limit:
            break
        if keep is not None and e.path == keep:
            continue
        with contextlib.suppress(FileNotFoundError):
            e.path.unlink()
        total -= e.size_bytes
        removed.append(e.path)
    return removed


def clear(folder: Path | None = None) -> tuple[int, int]:
    """Remove every entry and the hash sidecar; returns (files removed, bytes freed)."""
    folder = cache_dir() if folder is None else folder
    num, freed = 0, 0
    for e in entries(folder):
        with contextlib.suppress(FileNotFoundError):
            e.path.unlink()
            num, freed = num + 1, freed + e.size_bytes
    now = time.time()  # a writer's tmp file is left alone unless it is long abandoned
    stale = [p for p in _files(folder) if ".tmp" in p.suffix and now - _mtime(p) > _STALE_TMP_S]
    for leftover in (folder / _HASHES, *stale):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
    return num, freed


def write_atomically(entry: Path, save) -> None:
    """``save(tmp_path)`` then rename onto ``entry``: a concurrent reader never sees half a
    file; the tmp file is removed if ``save`` fails."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_suffix(f".tmp{os.getpid()}")
    try:
        save(tmp)
        os.replace(tmp, entry)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _entry(path: Path, *, is_legacy: bool) -> CacheEntry | None:
    """The entry, or None when another process removed the file meanwhile."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return CacheEntry(path, st.st_size, st.st_mtime, is_legacy)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return time.time()


def _files(folder: Path) -> Iterator[Path]:
    try:
        yield from (p for p in folder.iterdir() if p.is_file())
    except (FileNotFoundError, NotADirectoryError):
        return


def _stat_still_matches(stat_key: str) -> bool:
    path, size, mtime_ns = stat_key.rsplit("|", 2)
    try:
        st = os.stat(path)
    except OSError:
        return False
    return str(st.st_size) == size and str(st.st_mtime_ns) == mtime_ns


def _read_hashes(folder: Path) -> dict[str, str]:
    try:
        data = json.loads((folder / _HASHES).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}


def _write_json(path: Path, data: dict[str, str]) -> None:
    # a read-only cache still works: the digest is just computed again next time
    with contextlib.suppress(OSError):
        write_atomically(path, lambda tmp: tmp.write_text(json.dumps(data, indent=1)))

"""How ``fastpp serve --backend torch`` listens, admits, limits and stops: its defaults, and the
checks that need no model (run before loading one, so a typo fails in a second, not after it).
"""

from __future__ import annotations

import errno
import os
import resource
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fastpp.run_files import REQUESTS, SUMMARY

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
FD_RESERVE = 64  # descriptors kept for the engine, logs and the record dir past the connection cap
LOG_LEVELS = ("debug", "info", "warning", "error")  # --log-level: Python's and uvicorn's names


@dataclass(frozen=True)
class ServeConfig:
    """The HTTP side of the server. ``ValueError`` naming the option on an impossible value."""

    host: str = "127.0.0.1"
    port: int = 8000
    max_queue: int = 256  # answer 503 while this many requests wait for admission
    api_key: str | None = None  # /v1/* needs "Authorization: Bearer <api_key>" when set
    record_dir: Path | None = None
    overwrite: bool = False  # record_dir may hold an earlier run, which is replaced
    log_level: str = "info"  # one of LOG_LEVELS, lower case
    # on SIGINT / SIGTERM: stop admitting, give open requests this long, end the rest with an error
    shutdown_timeout_s: float = 5.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # a larger request body gets 413 before it is read
    # a request's headers and body must have arrived this long after the connection opened or the
    # previous response ended; slower connections are closed (408 once the headers are in)
    read_timeout_s: float = 30.0
    keep_alive_s: float = 5.0  # an idle kept-alive connection is closed after this long
    # open connections at most; past it a new one closes the longest-idle (no request under way),
    # or itself when every connection is busy
    max_connections: int = 1024

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise ValueError(f"--port must be in 1..65535, got {self.port}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        if self.max_queue < 1:
            raise ValueError(f"--max-queue must be >= 1, got {self.max_queue}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("--api-key must not be empty (unset FASTPP_API_KEY or give a key)")
        for option, value in (
            ("--shutdown-timeout", self.shutdown_timeout_s),
            ("--read-timeout", self.read_timeout_s),
            ("--keep-alive", self.keep_alive_s),
        ):
            if not value > 0:
                raise ValueError(f"{option} must be > 0 seconds, got {value:g}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"--max-body-bytes must be >= 1024, got {self.max_body_bytes}")
        if self.max_connections < 1:
            raise ValueError(f"--max-connections must be >= 1, got {self.max_connections}")

    def check(self) -> int:
        """Everything that needs no model: the port is free to listen on, the record dir is a
        writable folder without an earlier run (unless ``overwrite``), enough file descriptors
        for the connection cap (the soft limit is raised toward the hard one). Returns the
        connection cap that fits; ``ValueError`` with a one-line reason otherwise."""
        check_port(self.host, self.port)
        if self.record_dir is not None:
            check_record_dir(self.record_dir, self.overwrite)
        return fit_connections(self.max_connections)


def check_port(host: str, port: int) -> None:
    """``ValueError`` unless a server could listen on ``host:port`` now (as uvicorn will)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ValueError(f"--host {host!r}: not an address of this machine ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ValueError(
                    f"--port {port}: already in use on {host} (another server? pick another port)"
                ) from None
            raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def check_record_dir(path: Path, overwrite: bool) -> None:
    """``ValueError`` unless ``path`` is (or can be made) a folder this process can write, holding
    no earlier run unless ``overwrite``."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"--record-dir {path}: exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ValueError(f"--record-dir {path}: not a writable folder ({exc.strerror or exc})") from None
    held = [name for name in (SUMMARY, REQUESTS) if (path / name).exists()]
    if held and not overwrite:
        raise ValueError(
            f"--record-dir {path}: holds an earlier run ({', '.join(held)}); pass --overwrite "
            "to replace it, or choose another folder"
        )


def fit_connections(wanted: int) -> int:
    """Raise the soft limit on open files toward the hard one, as far as ``wanted`` connections
    need, and return the cap that fits under it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    open_now = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    return max(1, min(wanted, soft - FD_RESERVE - open_now))

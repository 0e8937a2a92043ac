"""Fault injection for the plugin's tests (FASTPP_SGLANG_INJECT_FAULT): a policy wrapped so
that every n-th call of one method raises, to prove a failing policy falls back and the server
keeps serving."""

from __future__ import annotations

from typing import Any


class PolicyFault(RuntimeError):
    """Raised on purpose by a policy wrapped for fault injection (tests)."""


class _Faulty:
    """Wraps a policy so every ``every``-th call of ``method`` raises (FASTPP_SGLANG_INJECT_FAULT)."""

    def __init__(self, inner: Any, method: str, every: int) -> None:
        self._inner, self._method, self._every = inner, method, every
        self._calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name != self._method:
            return attr

        def maybe_fail(*args: Any, **kwargs: Any) -> Any:
            self._calls += 1
            if self._calls % self._every == 0:
                raise PolicyFault(f"injected fault in {type(self._inner).__name__}.{name}")
            return attr(*args, **kwargs)

        return maybe_fail

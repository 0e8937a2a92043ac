"""Policies for the real-vLLM tests, loaded inside vLLM's engine core with ``--policy
py:vllm_test_policies:flaky`` (tests/test_vllm_backend.py puts this folder on PYTHONPATH)."""

from __future__ import annotations

from fastpp.policies import make_policies

FLAKY_SPEC = "static:48+ds"  # a binding budget on short prompts, and decode balancing
RAISE_EVERY = 4  # every 4th decision of each policy raises


class Flaky:
    """Wraps a policy; every ``RAISE_EVERY``-th call of ``choose`` / ``plan`` raises."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.calls = 0

    @property
    def last_reason(self) -> str:
        return getattr(self.inner, "last_reason", "")

    def _tick(self) -> None:
        self.calls += 1
        if self.calls % RAISE_EVERY == 0:
            raise RuntimeError(f"flaky policy: call {self.calls} fails on purpose")

    def choose(self, view):
        self._tick()
        return self.inner.choose(view)

    def plan(self, view, slot):
        self._tick()
        return self.inner.plan(view, slot)

    def observe(self, rec) -> None:
        self.inner.observe(rec)


def flaky(config, profile):
    """``static:48+ds`` whose chunk policy and balancer each raise on every 4th decision."""
    chunk, balancer = make_policies(FLAKY_SPEC, config, profile)
    return Flaky(chunk), Flaky(balancer)

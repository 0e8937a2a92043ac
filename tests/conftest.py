"""Small factories shared by the tests (tiny defaults; override what a test is about).

The suite tests the Python source: the compiled build (fastpp/_native.py, off unless
FASTPP_NATIVE=1) is kept off here even when the shell asks for it, before fastpp is imported,
so tests that patch a class or count its calls see the code they patch; tests/test_native.py
checks the compiled build gives the same results and keeps the public classes subclassable.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

os.environ["FASTPP_NATIVE"] = "0"  # before the fastpp imports below (a shell's 1 is overridden)

from pathlib import Path

import pytest

from fastpp.profile import LinearTable, LinkCost, ModelShape, Profile, StageCost
from fastpp.scheduler import Scheduler
from fastpp.scheduler_config import SchedulerConfig
from fastpp.types import Request

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
REPO_ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def script_module(path: Path) -> Iterator:
    """A script or benchmark of the repository loaded as a module named after its file, in
    ``sys.modules`` while in use (dataclasses look their module up there) and removed after."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(path.stem, None)


class FakeClock:
    """A clock tests advance by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make_requests(n: int, prompt_len: int = 16, output_len: int = 8, gap_s: float = 0.0):
    return [Request(i, i * gap_s, prompt_len, output_len) for i in range(n)]


def make_scheduler(clock=None, chunk_policy=None, balancer=None, **overrides) -> Scheduler:
    cfg = dict(num_slots=2, kv_capacity_tokens=4096, max_context=2048, default_chunk=64)
    cfg.update(overrides)
    return Scheduler(SchedulerConfig(**cfg), clock or FakeClock(), chunk_policy, balancer)


def make_profile(
    pp: int = 2,
    num_layers: int = 4,
    kv_tokens: int = 8192,
    step: int = 16,
    token_return_s: float = 0.0005,
    host_overhead_s: float = 0.0002,
) -> Profile:
    """A toy deployment with stepped linear cost (steps of ``step`` tokens) and cheap links."""
    model = ModelShape("toy", num_layers, 64, 4, 2, 16, 128, 1000, 4096)
    tokens = [n for k in range(1, 65) for n in (k * step, k * step + 1)]
    linear_per_layer = [1e-4 * (-(-t // step)) for t in tokens]
    base, extra = divmod(num_layers, pp)
    stages = []
    for i in range(pp):
        layers = base + (1 if i < extra else 0)
        stages.append(
            StageCost(
                num_layers=layers,
                linear=LinearTable(tuple(tokens), tuple(s * layers for s in linear_per_layer)),
                attn_past_x_pre_s=1e-9 * layers,
                attn_pre_sq_s=5e-10 * layers,
                attn_dec_ctx_s=1e-8 * layers,
                fixed_s=1e-4,
                embedding_s_per_token=1e-7 if i == 0 else 0.0,
                lm_head=LinearTable((1, 64), (2e-4, 4e-4)) if i == pp - 1 else None,
            )
        )
    return Profile(
        name="toy",
        kind="analytic",
        provenance={"source": "tests/conftest.py"},
        gpu="toy",
        interconnect="loopback",
        model=model,
        pp=pp,
        tp=1,
        kv_capacity_tokens=kv_tokens,
        page_size=1,
        token_step=step,
        host_overhead_s=host_overhead_s,
        token_return_s=token_return_s,
        activation_bytes_per_token=256,
        link=LinkCost(1e-5, 1e10),
        stages=tuple(stages),
    )


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture
def serve():
    """``serve(**behaviour)`` starts a fake OpenAI-compatible server (tests/fake_openai_server.py,
    ``FakeBehaviour``'s fields as keywords); all are stopped after the test."""
    from fake_openai_server import FakeBehaviour, FakeOpenAIServer

    servers: list[FakeOpenAIServer] = []

    def start(**behaviour) -> FakeOpenAIServer:
        srv = FakeOpenAIServer(FakeBehaviour(**behaviour)).__enter__()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.__exit__(None, None, None)

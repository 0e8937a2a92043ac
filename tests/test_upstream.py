"""SGLang's --enable-dynamic-chunking baseline: fit, equal-latency chunks, floor, alignment, caps."""

from __future__ import annotations

import math

import pytest

from conftest import FakeClock, make_profile, make_scheduler
from fastpp.policies import make_policies
from fastpp.policies.upstream import (
    QuadraticFit,
    UpstreamChunkConfig,
    UpstreamChunkPolicy,
    prefill_latency_s,
    profile_lengths,
)
from fastpp.scheduler_config import SchedulerConfig
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation
from fastpp.types import Request

# A known latency curve, seconds: attention-like quadratic term, linear GEMMs, fixed launch cost.
A, B, C0 = 4e-9, 6e-5, 0.01


def known(n: int) -> float:
    return A * n * n + B * n + C0


def policy(**overrides) -> UpstreamChunkPolicy:
    cfg = dict(chunk=2048, max_context=1 << 22)
    cfg.update(overrides)
    return UpstreamChunkPolicy.from_latency(UpstreamChunkConfig(**cfg), known)


def test_profile_grid_matches_upstream_descending_from_five_quarters_c():
    lengths = profile_lengths(2048)
    assert len(lengths) == 128 and lengths[0] == 2560 and lengths[-1] == 20
    assert all(a - b == 20 for a, b in zip(lengths, lengths[1:], strict=False))
    assert set(profile_lengths(64)) == {80}  # 1.25 * 64 // 128 == 0: one repeated length


def test_fit_recovers_a_known_quadratic():
    p = policy()
    assert p.fit is not None
    assert p.fit.a == pytest.approx(A, rel=1e-6)
    assert p.fit.b == pytest.approx(B, rel=1e-6)
    assert p.fit.c == pytest.approx(C0, rel=1e-6)
    assert p.target_s == pytest.approx(known(2048) - known(0), rel=1e-9)


def test_fit_skips_the_first_sample():
    lengths = profile_lengths(2048)
    lat = [known(n) for n in lengths]
    lat[0] = 100.0  # upstream's cold first run: ignored
    fit = QuadraticFit.fit(lengths, lat)
    assert fit is not None and fit.a == pytest.approx(A, rel=1e-6)


def test_failed_fits_keep_the_static_chunk():
    lengths = profile_lengths(2048)
    concave = QuadraticFit.fit(lengths, [-1e-9 * n * n + 1e-4 * n for n in lengths])
    assert concave is None  # a <= 0
    assert QuadraticFit.fit(lengths[:8], [known(n) for n in lengths[:8]]) is None  # 7 points
    tiny = UpstreamChunkPolicy.from_latency(UpstreamChunkConfig(chunk=64), known)
    assert tiny.fit is None  # every grid length equal: rank-deficient
    sched = make_scheduler(chunk_policy=tiny, default_chunk=64)
    sched.add_request(Request(0, 0.0, 300, 2))
    sched.schedule(0)
    plan = sched.schedule(1)
    assert plan.chunk_budget == 64 and plan.reason == "static: no fit"


def test_negative_linear_term_is_clamped_to_zero():
    lengths = profile_lengths(2048)
    fit = QuadraticFit.fit(lengths, [1e-8 * n * n - 1e-6 * n + 0.01 for n in lengths])
    assert fit is not None and fit.b == 0.0 and fit.a == pytest.approx(1e-8, rel=1e-6)


def test_root_gives_equal_predicted_latency_per_chunk():
    p = policy()
    for prefix in (0, 2048, 8192, 65536):
        x = p.root(prefix)
        assert x is not None
        assert known(prefix + x) - known(prefix) == pytest.approx(p.target_s, rel=1e-9)
    assert p.root(0) == pytest.approx(2048, rel=1e-9)


def test_smoothing_floor_and_alignment_follow_upstream_arithmetic():
    p = policy()
    for prefix in (1000, 4096, 20000, 100000):
        x = p.root(prefix)
        expected = max(int(2048 + 0.75 * (x - 2048)), 2048 // 4) // 64 * 64
        assert p.predict(prefix) == expected


def test_later_chunks_of_a_long_prompt_get_smaller():
    p = policy()
    prefix, sizes = 2048, []
    while prefix < 60000:
        size = p.predict(prefix)
        sizes.append(size)
        prefix += size
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < sizes[0] < 2048


def test_floor_at_a_quarter_of_c():
    assert policy().predict(10**6) == 512
    assert policy(smooth_factor=1.0).predict(10**6) == 512


def test_chunks_align_to_max_of_page_size_and_64():
    p = policy()
    assert all(p.predict(n) % 64 == 0 for n in range(0, 50000, 777))
    p = policy(page_size=256)
    assert all(p.predict(n) % 256 == 0 for n in range(0, 50000, 777))
    assert policy(chunk=128).predict(10**6) == 64  # floor 32 is below one alignment unit


def test_caps_at_max_prefill_tokens_and_context():
    assert policy(max_prefill_tokens=1000).predict(1) == 960
    assert policy(max_context=4096).predict(3000) == 960  # 4096 - 3000 - 100 = 996, aligned
    assert policy(max_context=4096).predict(3950) is None  # cap below 64: keep C


def test_choose_is_static_without_a_chunked_request_then_shrinks():
    clock = FakeClock()
    p = policy(max_context=32768)
    sched = make_scheduler(
        clock, chunk_policy=p, num_slots=4, kv_capacity_tokens=65536, max_context=32768, default_chunk=2048
    )
    sched.add_request(Request(0, 0.0, 20000, 2))
    plans = [sched.schedule(slot) for slot in range(4)]
    assert plans[0].chunk_budget == 2048 and plans[0].reason == "static"
    prefix = 2048
    for plan in plans[1:]:
        assert plan.chunk_budget == p.predict(prefix) < 2048
        assert plan.reason == f"shrunk for prefix {prefix}"
        prefix += plan.chunk_budget
    assert [pl.chunk_budget for pl in plans] == sorted(pl.chunk_budget for pl in plans)[::-1]


def test_registry_builds_from_profile_and_scheduler_config():
    profile = make_profile()
    cfg = SchedulerConfig(num_slots=2, kv_capacity_tokens=8192, page_size=128, max_context=4096)
    chunk_policy, _ = make_policies("upstream:1024", cfg, profile)
    assert isinstance(chunk_policy, UpstreamChunkPolicy)
    assert chunk_policy.config == UpstreamChunkConfig(chunk=1024, page_size=128, max_context=4096)
    assert chunk_policy.fit is not None
    lengths = profile_lengths(1024)[1:]
    worst = max(abs(chunk_policy.fit(n) - prefill_latency_s(profile, n)) for n in lengths)
    assert worst < 0.05 * prefill_latency_s(profile, 1024)  # tile steps the quadratic smooths
    default, _ = make_policies("upstream", cfg, profile)
    assert default.config.chunk == cfg.default_chunk == 2048
    with pytest.raises(ValueError, match="needs the deployment's profile"):
        make_policies("upstream", cfg)
    with pytest.raises(ValueError, match="integer number of tokens"):
        make_policies("upstream:big", cfg, profile)


def test_prefill_latency_is_the_bottleneck_stage():
    profile = make_profile(pp=3, num_layers=7)  # 3/2/2 layers: stage 0 is slowest
    n = 500
    times = [s.time_s(n, 1, 0, n * n, 0) for s in profile.stages]
    assert prefill_latency_s(profile, n) == max(times) == times[0]


@pytest.mark.parametrize(
    "kw",
    [
        dict(chunk=0),
        dict(page_size=0),
        dict(max_prefill_tokens=0),
        dict(max_context=1),
        dict(smooth_factor=-0.1),
        dict(smooth_factor=math.nan),
    ],
)
def test_config_rejects_bad_values(kw):
    with pytest.raises(ValueError):
        UpstreamChunkConfig(**kw)


def test_simulation_completes_and_shrinks_later_chunks():
    run = run_simulation(WorkloadConfig(num_requests=150, rate=2), DeploymentConfig(policy="upstream"))
    s = run.summary
    assert s["num_unfinished"] == s["num_rejected"] == s["num_aborted"] == 0
    assert all(r.finish_reason is not None for r in run.result.records)
    shrunk = [it for it in run.result.iterations if it.chunk_budget < 2048]
    assert shrunk and all(it.reason.startswith("shrunk for prefix") for it in shrunk)
    assert all(it.chunk_budget % 64 == 0 and it.chunk_budget >= 512 for it in shrunk)

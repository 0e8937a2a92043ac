"""The last stage's sampler: any integer seed works and draws reproducibly (issue 14: a seed
above about 1.8e13 overflowed the generator's 64-bit seed and killed the stage process)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fastpp.backends.torch.sampling import SamplingParams, generator_seed, sample_tokens  # noqa: E402

ISSUE_SEED = 4611686018427387904  # 2**62, from the issue's curl reproduction


@pytest.mark.parametrize("seed", [ISSUE_SEED, 2**63 - 1, -(2**63), 10**30, -(10**30), 0, -1, 7])
def test_any_seed_samples_reproducibly_at_temperature_above_zero(seed):
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(max_tokens=4, temperature=0.7, top_p=0.9, seed=seed)
    rows = [params.row(step) for step in range(3)]
    first = sample_tokens(logits, rows, torch.Generator())
    assert first == sample_tokens(logits, rows, torch.Generator().manual_seed(99))  # the seed decides
    assert all(0 <= t < 50 for t in first)
    assert 0 <= generator_seed(seed, 2) < 2**64


def test_seeds_that_fitted_before_keep_their_generator_seed():
    # the old formula (seed * 1_000_003 + step) as torch reads it, for seeds where it did not overflow
    for seed in (0, 7, -5, 2**40, -(2**40)):
        old = torch.Generator().manual_seed(seed * 1_000_003 + 3).initial_seed()
        assert torch.Generator().manual_seed(generator_seed(seed, 3)).initial_seed() == old

"""The last stage's sampler over the whole range of values a request can carry (issue 27: a
temperature of 1e-38 overflowed float32 and softmax gave NaN; a top_p of 1e-46 became 0 in
float32 and left no token; either killed the stage and the server). Properties on the real
sampler: every row gets a valid token id, a seed decides the draw whatever shares the batch, a
temperature below GREEDY_BELOW is greedy, a tiny top_p keeps the top token, and a row that cannot
be sampled fails alone."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fastpp.backends.torch.sampling import (  # noqa: E402
    FAILED_TOKEN,
    GREEDY_BELOW,
    SamplingError,
    SamplingParams,
    sample_rows,
    sample_tokens,
)

F32_MAX = float(torch.finfo(torch.float32).max)
# everything SamplingParams accepts (the HTTP protocol accepts a subset: temperature <= 2,
# seeds within int64)
TEMPERATURES = st.one_of(
    st.floats(0.0, 100.0),
    st.sampled_from([0.0, 5e-324, 1e-320, 1e-46, 1e-38, 9.99e-6, GREEDY_BELOW, 1e-4, 100.0]),
)
TOP_PS = st.one_of(st.floats(0.0, 1.0, exclude_min=True), st.sampled_from([5e-324, 1e-46, 1e-39, 1e-8, 1.0]))
SEEDS = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.integers(-(10**40), 10**40))
STEPS = st.integers(0, 100_000)
LOGIT = st.one_of(st.floats(-50.0, 50.0), st.floats(-F32_MAX, F32_MAX, width=32))


@st.composite
def batches(draw: st.DrawFn) -> tuple[torch.Tensor, list[tuple[float, float, int | None, int]]]:
    rows = draw(st.integers(1, 4))
    vocab = draw(st.integers(1, 40))
    values = draw(st.lists(st.lists(LOGIT, min_size=vocab, max_size=vocab), min_size=rows, max_size=rows))
    params = [
        SamplingParams(max_tokens=1, temperature=draw(TEMPERATURES), top_p=draw(TOP_PS), seed=draw(SEEDS))
        for _ in range(rows)
    ]
    return torch.tensor(values, dtype=torch.float32), [p.row(draw(STEPS)) for p in params]


@settings(max_examples=300, deadline=None)
@given(batches(), st.integers(0, 2**32))
# two logits whose float32 probabilities tie: a vanishing top_p still keeps the larger logit
@example((torch.tensor([[0.0, 1.1755e-38]]), [(1.0, 5e-324, None, 0)]), 0)
def test_every_accepted_value_samples_a_valid_token(batch, generator_seed):
    logits, rows = batch
    tokens, errors = sample_rows(logits, rows, torch.Generator().manual_seed(generator_seed))
    assert errors == {}
    assert len(tokens) == len(rows)
    assert all(isinstance(t, int) and 0 <= t < logits.shape[1] for t in tokens)
    for i, (temperature, top_p, _, _) in enumerate(rows):
        top = int(logits[i].argmax())  # the lowest id among the largest
        if temperature < GREEDY_BELOW:
            assert tokens[i] == top, "a temperature below GREEDY_BELOW is greedy"
        assert logits[i, tokens[i]] > -math.inf
        if top_p <= 1e-30:  # below any token's probability: only the most likely one is left
            assert logits[i, tokens[i]] == logits[i, top]


@settings(max_examples=150, deadline=None)
@given(batches(), batches(), st.integers(0, 2**32), st.integers(0, 2**32))
def test_a_seeded_row_draws_the_same_token_whatever_shares_its_batch(batch, others, g1, g2):
    logits, rows = batch
    other_logits, other_rows = others
    if logits.shape[1] != other_logits.shape[1]:
        other_logits = torch.zeros(len(other_rows), logits.shape[1])
    alone = sample_tokens(logits, rows, torch.Generator().manual_seed(g1))
    mixed = sample_tokens(
        torch.cat([other_logits, logits]), [*other_rows, *rows], torch.Generator().manual_seed(g2)
    )[len(other_rows) :]
    for i, (temperature, _, seed, _) in enumerate(rows):
        if seed is not None or temperature < GREEDY_BELOW:
            assert alone[i] == mixed[i]


def test_the_issue_values_sample_the_top_token():
    logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(3)) * 30
    rows = [(1e-38, 1.0, None, 0), (1.0, 1e-46, None, 0), (1e-38, 1e-46, 7, 2), (2.0, 5e-324, 2**62, 5)]
    assert sample_tokens(logits, rows, torch.Generator()) == logits.argmax(dim=-1).tolist()


def test_a_row_without_a_finite_logit_fails_alone():
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(0))
    logits[1] = math.nan
    logits[2, 5] = math.inf  # an infinite logit is the most likely token, NaNs are never drawn
    logits[2, 6] = math.nan
    rows = [(0.7, 0.9, 1, 0), (0.7, 0.9, 1, 0), (0.7, 1.0, 2, 0)]
    tokens, errors = sample_rows(logits, rows, torch.Generator())
    assert tokens[1] == FAILED_TOKEN and list(errors) == [1]
    assert "no finite value" in errors[1] and "Traceback" not in errors[1]
    assert 0 <= tokens[0] < 20 and tokens[2] == 5
    with pytest.raises(SamplingError, match="row 1"):
        sample_tokens(logits, rows, torch.Generator())
    # greedy rows too, and a bfloat16 model's logits
    half = logits.to(torch.bfloat16)
    tokens, errors = sample_rows(half, [(0.0, 1.0, None, 0)] * 3, torch.Generator())
    assert list(errors) == [1] and tokens[2] == 5


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", math.nan),
        ("temperature", -1e-300),
        ("temperature", math.inf),
        ("top_p", 0.0),
        ("top_p", math.nan),
        ("top_p", 1.0000001),
    ],
)
def test_values_outside_the_accepted_range_never_reach_the_sampler(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})

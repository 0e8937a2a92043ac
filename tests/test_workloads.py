"""Tests for fastpp.workloads and fastpp.length_tables (readers, samplers, arrivals, registry)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO_ROOT, script_module
from fastpp.workloads import (
    WORKLOADS,
    EmpiricalLengths,
    SyntheticLengths,
    Trace,
    WorkloadError,
    builtin_quantile_lengths,
    gamma_arrivals,
    load_builtin_tables,
    make_requests,
    poisson_arrivals,
    read_azure_trace,
    read_length_csv,
    replay,
    replay_requests,
    workload_stats,
)

# CI clones the repo beside a copy of shared/, so keep this relative layout.
DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
CONV = DATA_DIR / "azure" / "AzureLLMInferenceTrace_conv.csv"
CODE = DATA_DIR / "azure" / "AzureLLMInferenceTrace_code.csv"
needs_data = pytest.mark.skipif(not CONV.is_file(), reason=f"shared data not at {DATA_DIR}")

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
GOOD_ROWS = [
    "2023-11-16 18:15:46.6805900,374,44",
    "2023-11-16 18:15:50.9951690,396,109",
    "2023-11-16 18:15:51.2224670,879,55",
]


def write_csv(tmp_path: Path, lines: list[str], name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def conv_trace() -> Trace:
    return read_azure_trace(CONV)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    rank = lambda v: np.argsort(np.argsort(v, kind="stable"), kind="stable")  # noqa: E731
    return float(np.corrcoef(rank(x), rank(y))[0, 1])


# --- readers -------------------------------------------------------------------------------


@needs_data
def test_real_conv_trace() -> None:
    trace = read_azure_trace(CONV)
    assert len(trace) == 19366
    assert trace.prompt_lens.mean() == pytest.approx(1154.7, abs=0.05)
    assert trace.output_lens.mean() == pytest.approx(211.1, abs=0.05)
    assert trace.arrival_s[0] == 0.0
    # 18:15:46.6805900 to 19:14:08.4025270
    assert trace.duration_s == pytest.approx(3501.721937, abs=1e-6)
    assert np.all(np.diff(trace.arrival_s) >= 0)
    assert trace.num_clamped_outputs == 0
    assert trace.prompt_lens.dtype == np.int64 and trace.arrival_s.dtype == np.float64


@needs_data
def test_real_length_files() -> None:
    sharegpt_path = "sharegpt/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
    sharegpt = read_length_csv(DATA_DIR / sharegpt_path)
    assert len(sharegpt) == 30731
    assert sharegpt.prompt_lens.mean() == pytest.approx(2340.0, abs=0.05)
    arxiv_path = "arxiv_summarization/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
    arxiv = read_length_csv(DATA_DIR / arxiv_path)
    assert len(arxiv) == 28257
    assert arxiv.output_lens.mean() == pytest.approx(291.4, abs=0.05)


def test_reader_parses_timestamps_exactly(tmp_path: Path) -> None:
    trace = read_azure_trace(write_csv(tmp_path, [AZURE_HEADER, *GOOD_ROWS]))
    np.testing.assert_allclose(trace.arrival_s, [0.0, 4.314579, 4.541877], atol=1e-9)
    assert trace.prompt_lens.tolist() == [374, 396, 879]
    assert trace.output_lens.tolist() == [44, 109, 55]
    assert trace.source == "trace.csv"


@pytest.mark.parametrize(
    ("bad_row", "column", "fragment"),
    [
        ("2023-11-16 18:15:52.1,-3,5", "ContextTokens", "non-negative integer, got '-3'"),
        ("2023-11-16 18:15:52.1,12.5,5", "ContextTokens", "got '12.5'"),
        ("2023-11-16 18:15:52.1,0,5", "ContextTokens", ">= 1, got '0'"),
        ("2023-11-16 18:15:52.1,7,abc", "GeneratedTokens", "got 'abc'"),
        ("2023-11-16 18:15:52.1,7,-1", "GeneratedTokens", "got '-1'"),
        ("2023/11/16 18:15:52.1,7,5", "TIMESTAMP", "YYYY-MM-DD"),
        ("2023-11-16 25:15:52.1,7,5", "TIMESTAMP", "time of day"),
        ("2023-02-30 18:15:52.1,7,5", "TIMESTAMP", "invalid date"),
        ("2023-11-16 18:15:40.0,7,5", "TIMESTAMP", "earlier than the previous"),
        ("2023-11-16 18:15:52.1,7", "GeneratedTokens", "2 fields"),
    ],
)
def test_malformed_row_names_file_line_column(
    tmp_path: Path, bad_row: str, column: str, fragment: str
) -> None:
    path = write_csv(tmp_path, [AZURE_HEADER, *GOOD_ROWS, bad_row, GOOD_ROWS[0]], "bad.csv")
    with pytest.raises(WorkloadError) as info:
        read_azure_trace(path)
    assert info.value.line == 5 and info.value.column == column
    assert str(info.value).startswith(f"bad.csv line 5: {column}: ")
    assert fragment in str(info.value)


def test_wrong_header(tmp_path: Path) -> None:
    path = write_csv(tmp_path, ["time,ContextTokens,GeneratedTokens", *GOOD_ROWS])
    with pytest.raises(WorkloadError, match=r"trace.csv line 1: TIMESTAMP: missing column"):
        read_azure_trace(path)
    lengths = write_csv(tmp_path, ["num_prefill_tokens,decode", "3,4"], "len.csv")
    with pytest.raises(WorkloadError, match=r"len.csv line 1: num_decode_tokens: missing"):
        read_length_csv(lengths)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="not found"):
        read_azure_trace(tmp_path / "absent.csv")
    with pytest.raises(WorkloadError, match="no data rows"):
        read_azure_trace(write_csv(tmp_path, [AZURE_HEADER]))


def test_zero_outputs_are_clamped(tmp_path: Path) -> None:
    rows = [
        AZURE_HEADER,
        "2023-11-16 18:00:00.0,10,0",
        "2023-11-16 18:00:01.0,20,3",
        "2023-11-16 18:00:02.0,30,0",
    ]
    trace = read_azure_trace(write_csv(tmp_path, rows))
    assert trace.output_lens.tolist() == [1, 3, 1]
    assert trace.num_clamped_outputs == 2
    header = "num_prefill_tokens,num_decode_tokens"
    lengths = write_csv(tmp_path, [f"{header},pd_ratio", "5,0,x"], "l.csv")
    table = read_length_csv(lengths)
    assert table.output_lens.tolist() == [1] and table.num_clamped_outputs == 1
    with pytest.raises(WorkloadError, match=r"l0.csv line 2: num_prefill_tokens: .*got '0'"):
        read_length_csv(write_csv(tmp_path, [header, "0,4"], "l0.csv"))


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 10**9), st.integers(1, 10**6), st.integers(0, 10**4)),
        min_size=1,
        max_size=30,
    )
)
def test_reader_round_trip(rows: list[tuple[int, int, int]]) -> None:
    import tempfile

    gaps_us = [g for g, _, _ in rows]
    times_us = np.cumsum(gaps_us)  # microseconds after 2023-11-16 00:00:00
    lines = [AZURE_HEADER]
    for t_us, (_, p, o) in zip(times_us, rows, strict=True):
        day, rest = divmod(int(t_us), 86_400 * 10**6)
        secs, micros = divmod(rest, 10**6)
        lines.append(
            f"2023-11-{16 + day:02d} {secs // 3600:02d}:{secs // 60 % 60:02d}:"
            f"{secs % 60:02d}.{micros:06d}0,{p},{o}"
        )
    with tempfile.TemporaryDirectory() as tmp:
        trace = read_azure_trace(write_csv(Path(tmp), lines))
    np.testing.assert_allclose(trace.arrival_s, (times_us - times_us[0]) / 1e6, rtol=0, atol=1e-6)
    assert trace.prompt_lens.tolist() == [p for _, p, _ in rows]
    assert trace.output_lens.tolist() == [max(o, 1) for _, _, o in rows]


# --- arrivals ------------------------------------------------------------------------------


def test_poisson_rate() -> None:
    times = poisson_arrivals(5.0, np.random.default_rng(1), num_requests=20000)
    assert times.dtype == np.float64 and times.size == 20000 and np.all(np.diff(times) >= 0)
    assert 20000 / times[-1] == pytest.approx(5.0, rel=0.03)
    gaps = np.diff(np.r_[0.0, times])
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)
    windowed = poisson_arrivals(5.0, np.random.default_rng(2), duration_s=4000.0)
    assert windowed.size == pytest.approx(20000, rel=0.03) and windowed[-1] < 4000.0


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_rate_and_cv(cv: float) -> None:
    times = gamma_arrivals(2.0, cv, np.random.default_rng(3), num_requests=50000)
    gaps = np.diff(np.r_[0.0, times])
    assert gaps.mean() == pytest.approx(0.5, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


@settings(max_examples=40, deadline=None)
@given(
    rate=st.floats(0.01, 1000),
    cv=st.floats(0.1, 10),
    n=st.integers(1, 500),
    duration=st.floats(0.1, 100),
    seed=st.integers(0, 2**32),
)
def test_arrivals_are_sorted_nonnegative_and_seeded(
    rate: float, cv: float, n: int, duration: float, seed: int
) -> None:
    for make in (
        lambda rng, **kw: poisson_arrivals(rate, rng, **kw),
        lambda rng, **kw: gamma_arrivals(rate, cv, rng, **kw),
    ):
        counted = make(np.random.default_rng(seed), num_requests=n)
        assert counted.size == n and np.all(np.diff(counted) >= 0) and counted[0] >= 0
        timed = make(np.random.default_rng(seed), duration_s=duration)
        assert np.all(np.diff(timed) >= 0) and np.all((timed >= 0) & (timed < duration))
        np.testing.assert_array_equal(timed, make(np.random.default_rng(seed), duration_s=duration))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": 0.0, "num_requests": 5}, "rate must be a positive finite number, got 0.0"),
        ({"rate": float("inf"), "num_requests": 5}, "rate must be .* got inf"),
        ({"rate": float("nan"), "num_requests": 5}, "rate must be .* got nan"),
        ({"rate": 1.0}, "exactly one of num_requests and duration_s"),
        ({"rate": 1.0, "num_requests": 5, "duration_s": 1.0}, "exactly one"),
        ({"rate": 1.0, "num_requests": 0}, "num_requests must be an integer >= 1, got 0"),
        ({"rate": 1.0, "duration_s": -1.0}, "duration_s must be .* got -1.0"),
    ],
)
def test_arrival_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        poisson_arrivals(rng=np.random.default_rng(0), **kwargs)
    with pytest.raises(ValueError, match="cv must be a positive finite number, got 0"):
        gamma_arrivals(1.0, 0.0, np.random.default_rng(0), num_requests=3)


# --- replay --------------------------------------------------------------------------------


def toy_trace() -> Trace:
    return Trace(np.arange(10, dtype=float), np.arange(1, 11), np.arange(101, 111), "toy")


def test_replay_window_and_speed() -> None:
    arrival_s, prompt_lens, output_lens = replay(toy_trace(), start_s=2.0, window_s=3.0)
    assert arrival_s.tolist() == [0.0, 1.0, 2.0]  # rows at t = 2, 3, 4; t = 5 is excluded
    assert prompt_lens.tolist() == [3, 4, 5] and output_lens.tolist() == [103, 104, 105]
    slow, _, _ = replay(toy_trace(), start_s=2.0, window_s=3.0, speed=0.5)
    assert slow.tolist() == [0.0, 2.0, 4.0]  # 0.5x the rate: gaps twice as long
    fast, _, _ = replay(toy_trace(), start_s=1.5, speed=2.0)
    assert fast.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]  # first row at 2 -> 0
    with pytest.raises(ValueError, match="holds no request"):
        replay(toy_trace(), start_s=2.2, window_s=0.5)
    for bad in ({"speed": 0.0}, {"window_s": -1.0}, {"start_s": -1.0}, {"start_s": float("nan")}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            replay(toy_trace(), **bad)


@needs_data
def test_replay_first_15_minutes_at_0_9x(conv_trace: Trace) -> None:
    trace = conv_trace
    requests = replay_requests("azure-conv", start_s=0.0, window_s=900.0, speed=0.9, data_dir=DATA_DIR)
    assert len(requests) == int(np.count_nonzero(trace.arrival_s < 900.0))
    assert [r.req_id for r in requests] == list(range(len(requests)))
    assert requests[0].arrived_at == 0.0
    assert requests[-1].arrived_at == pytest.approx(trace.arrival_s[len(requests) - 1] / 0.9)
    assert requests[:50] == replay_requests(CONV, window_s=40.0, speed=0.9)[:50]


def test_replay_requests_unknown_trace(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="known trace names: azure-conv, azure-code"):
        replay_requests(str(tmp_path / "nope.csv"))


# --- samplers and registry -----------------------------------------------------------------


def test_empirical_resamples_pairs_jointly() -> None:
    sampler = EmpiricalLengths(np.arange(1, 101), np.arange(1001, 1101), "pairs")
    prompt_lens, output_lens = sampler.sample(np.random.default_rng(0), 5000)
    assert np.all(output_lens - prompt_lens == 1000)
    assert prompt_lens.dtype == np.int64 and set(prompt_lens) == set(range(1, 101))


@pytest.mark.parametrize("name", [n for n, s in WORKLOADS.items() if s.is_synthetic])
def test_synthetic_workloads_hit_their_means(name: str) -> None:
    spec = WORKLOADS[name]
    sampler = spec.make_sampler()
    assert isinstance(sampler, SyntheticLengths)
    assert "synthetic" in name and "synthetic" in spec.description
    assert "synthetic" in spec.source and "synthetic" in sampler.describe()
    prompt_lens, output_lens = sampler.sample(np.random.default_rng(7), 20000)
    assert prompt_lens.mean() == pytest.approx(sampler.mean_in, rel=0.03)
    assert output_lens.mean() == pytest.approx(sampler.mean_out, rel=0.03)
    assert prompt_lens.min() >= 1 and prompt_lens.max() <= sampler.max_in
    assert output_lens.min() >= 1 and output_lens.max() <= sampler.max_out


@settings(max_examples=20, deadline=None)
@given(mean=st.floats(1.5, 1000), cv=st.floats(0.1, 1.5), cap_factor=st.floats(1.5, 8))
def test_synthetic_mean_survives_clipping(mean: float, cv: float, cap_factor: float) -> None:
    cap = max(2, int(mean * cap_factor))
    sampler = SyntheticLengths("t-synthetic", mean, mean, cv, cv, cap, cap)
    prompt_lens, _ = sampler.sample(np.random.default_rng(0), 100_000)
    assert prompt_lens.mean() == pytest.approx(mean, rel=0.03)


def test_synthetic_validation() -> None:
    with pytest.raises(ValueError, match="must say 'synthetic'"):
        SyntheticLengths("sharegpt", 226, 199, 1.0, 1.0, 1024, 1024)
    with pytest.raises(ValueError, match="mean_in must be in"):
        SyntheticLengths("x-synthetic", 2000, 199, 1.0, 1.0, 1024, 1024)
    with pytest.raises(ValueError, match="cv_out must be a positive number"):
        SyntheticLengths("x-synthetic", 226, 199, 1.0, 0.0, 1024, 1024)


@pytest.mark.parametrize("name", ["azure-conv", "azure-code"])
def test_quantile_sampler_reproduces_table(name: str) -> None:
    table = load_builtin_tables()["tables"][name]
    sampler = builtin_quantile_lengths(name)
    prompt_lens, output_lens = sampler.sample(np.random.default_rng(11), 50000)
    for values, stats in ((prompt_lens, table["input"]), (output_lens, table["output"])):
        assert np.median(values) == pytest.approx(stats["median"], rel=0.03)
        assert np.quantile(values, 0.9) == pytest.approx(stats["p90"], rel=0.03)
        assert values.mean() == pytest.approx(stats["mean"], rel=0.05)
        assert values.max() <= stats["max"]
    assert spearman(prompt_lens, output_lens) == pytest.approx(table["rank_correlation"], abs=0.03)


def test_builtin_json_loads_without_data_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # ../shared/data does not exist from here
    monkeypatch.setenv("FASTPP_DATA_DIR", str(tmp_path / "missing"))
    document = load_builtin_tables()
    assert len(document["probabilities"]) == 201
    for name in ("azure-conv", "azure-code"):
        table = document["tables"][name]
        assert "CC BY 4.0" in table["source"] and "Splitwise" in table["source"]
        assert len(table["input"]["quantiles"]) == len(table["output"]["quantiles"]) == 201
    requests = make_requests("azure-conv", seed=0, rate=2.0, num_requests=100)
    assert len(requests) == 100
    with pytest.raises(WorkloadError, match=str(tmp_path / "missing")):
        make_requests("sharegpt-8k", seed=0, rate=2.0, num_requests=10)


@needs_data
def test_builtin_json_matches_a_fresh_derivation(tmp_path: Path) -> None:
    out = tmp_path / "tables.json"
    with script_module(REPO_ROOT / "scripts" / "derive_length_tables.py") as derive_script:
        derive_script.main(["--data-dir", str(DATA_DIR), "--out", str(out)])
    assert json.loads(out.read_text()) == load_builtin_tables()
    tables = load_builtin_tables()["tables"]
    assert tables["azure-conv"]["sha256"].startswith("2f1e5b666d4e3055")  # as in the data README
    assert tables["azure-code"]["num_rows"] == 8819


@needs_data
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_workload_samples_valid_lengths(name: str) -> None:
    spec = WORKLOADS[name]
    sampler = spec.make_sampler(DATA_DIR)
    prompt_lens, output_lens = sampler.sample(np.random.default_rng(0), 100)
    assert prompt_lens.dtype == output_lens.dtype == np.int64
    assert prompt_lens.min() >= 1 and output_lens.min() >= 1 and sampler.describe()
    assert spec.needs_data_dir == isinstance(sampler, EmpiricalLengths)


@pytest.mark.parametrize("name", ["azure-conv", "cnn-dailymail-synthetic"])
def test_workload_stats(name: str) -> None:
    stats = workload_stats(name, n=2000, seed=1)
    assert stats["synthetic"] == WORKLOADS[name].is_synthetic
    assert stats["source"] == WORKLOADS[name].source and stats["num_samples"] == 2000
    assert stats["input_median"] <= stats["input_p90"] <= stats["input_p99"]
    assert stats["output_median"] <= stats["output_p90"] <= stats["output_p99"]
    assert stats == workload_stats(name, n=2000, seed=1)


# --- make_requests -------------------------------------------------------------------------


def test_make_requests_is_seeded_and_ordered() -> None:
    first = make_requests("cnn-reversed-synthetic", seed=5, rate=3.0, num_requests=300)
    assert first == make_requests("cnn-reversed-synthetic", seed=5, rate=3.0, num_requests=300)
    assert first != make_requests("cnn-reversed-synthetic", seed=6, rate=3.0, num_requests=300)
    assert [r.req_id for r in first] == list(range(300))
    assert all(a.arrived_at <= b.arrived_at for a, b in zip(first, first[1:], strict=False))
    # Lengths come from their own stream: a new rate or arrival process keeps them.
    bursty = make_requests(
        "cnn-reversed-synthetic", seed=5, rate=9.0, num_requests=300, arrival="gamma", cv=4.0
    )
    assert [r.output_len for r in bursty] == [r.output_len for r in first]
    timed = make_requests("azure-code", seed=1, rate=4.0, duration_s=60.0)
    assert timed and timed[-1].arrived_at < 60.0
    batch = make_requests("azure-conv", seed=1, num_requests=8)
    assert [r.arrived_at for r in batch] == [0.0] * 8


def test_make_requests_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown workload 'nope'; known: azure-conv, azure-code"):
        make_requests("nope", seed=0, rate=1.0, num_requests=1)
    with pytest.raises(ValueError, match="arrival must be one of poisson, gamma"):
        make_requests("azure-conv", seed=0, rate=1.0, num_requests=1, arrival="uniform")
    with pytest.raises(ValueError, match="needs arrival='gamma'"):
        make_requests("azure-conv", seed=0, rate=1.0, num_requests=1, cv=2.0)
    with pytest.raises(ValueError, match="rate=None"):
        make_requests("azure-conv", seed=0, duration_s=5.0)
    with pytest.raises(ValueError, match="unknown workload"):
        workload_stats("nope")


def test_make_requests_accepts_a_sampler() -> None:
    sampler = EmpiricalLengths([7], [3], "one row")
    requests = make_requests(sampler, seed=0, rate=1.0, num_requests=4)
    assert {(r.prompt_len, r.output_len) for r in requests} == {(7, 3)}


def test_cnn_reversed_output_spread_matches_the_article_histogram() -> None:
    """cnn-reversed-synthetic's output CV lies in the band scripts/cnn_article_spread.py derives
    from the published CNN/DailyMail article-length histogram, whose bars reproduce the
    figure's printed mean within 1.5%."""
    with script_module(REPO_ROOT / "scripts" / "cnn_article_spread.py") as spread:
        (_, mean_low, cv_low), (_, mean_high, cv_high) = spread.cv_bounds()
        printed_mean = spread.PRINTED_MEAN_CHARS
    for mean in (mean_low, mean_high):
        assert abs(mean / printed_mean - 1) < 0.015
    _, out = WORKLOADS["cnn-reversed-synthetic"].make_sampler().sample(np.random.default_rng(0), 100_000)
    cv = out.std() / out.mean()
    assert cv_low - 0.01 <= cv <= cv_high + 0.01, (cv_low, cv, cv_high)

"""Workloads: arrival processes, trace replay, and the registry of built-in workloads.

A workload is a length distribution (a :class:`~fastpp.length_tables.LengthSampler`) paired
with an arrival process, or a real trace replayed with its own timestamps. Everything random
takes an explicit seed or ``np.random.Generator``; the same arguments give the same requests.
All times are in seconds. Reading files and sampling lengths live in
:mod:`fastpp.length_tables`; its public names are re-exported here.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastpp.data_dir import resolve_data_dir as _resolve_data_dir
from fastpp.length_files import LengthTable, Trace, WorkloadError, read_azure_trace, read_length_csv
from fastpp.length_tables import (
    EmpiricalLengths,
    LengthSampler,
    QuantileLengths,
    SyntheticLengths,
    builtin_quantile_lengths,
    load_builtin_tables,
)
from fastpp.types import Request
from fastpp.uniform_lengths import PREFIX as UNIFORM_PREFIX
from fastpp.uniform_lengths import UniformLengths

__all__ = [
    "DEFAULT_WORKLOAD",
    "WORKLOADS",
    "EmpiricalLengths",
    "LengthSampler",
    "LengthTable",
    "QuantileLengths",
    "SyntheticLengths",
    "Trace",
    "WorkloadError",
    "WorkloadSpec",
    "builtin_quantile_lengths",
    "check_arrival",
    "check_workload_name",
    "gamma_arrivals",
    "load_builtin_tables",
    "make_requests",
    "poisson_arrivals",
    "read_azure_trace",
    "read_length_csv",
    "replay",
    "replay_requests",
    "resolve_data_dir",
    "workload_stats",
]

# The most requests one call generates (~100 bytes each as Request objects, ~1 GB in all):
# a count or a rate x duration past it is refused before anything is drawn. A simulation
# holds far fewer (fastpp.sim.limits).
MAX_REQUESTS = 10_000_000
DEFAULT_WORKLOAD = "azure-conv"
ARRIVALS = ("poisson", "gamma")

# Files under the data directory (see its READMEs for provenance and licences).
TRACE_FILES = {
    "azure-conv": "azure/AzureLLMInferenceTrace_conv.csv",
    "azure-code": "azure/AzureLLMInferenceTrace_code.csv",
}
SHAREGPT_FILE = "sharegpt/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
ARXIV_FILE = "arxiv_summarization/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"

AZURE_SOURCE = (
    "Azure LLM inference trace 2023, Azure/AzurePublicDataset, CC BY 4.0; Patel et al., Splitwise, ISCA 2024"
)


# ---------------------------------------------------------------------------------------------
# Arrival processes


def _check_positive(name: str, value: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not (math.isfinite(value) and value > 0)
    ):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def _check_extent(num_requests: int | None, duration_s: float | None) -> None:
    if (num_requests is None) == (duration_s is None):
        raise ValueError(
            f"give exactly one of num_requests and duration_s, got num_requests={num_requests!r}, "
            f"duration_s={duration_s!r}"
        )
    if num_requests is not None and (
        isinstance(num_requests, bool) or not isinstance(num_requests, numbers.Integral) or num_requests < 1
    ):
        raise ValueError(f"num_requests must be an integer >= 1, got {num_requests!r}")
    if num_requests is not None and num_requests > MAX_REQUESTS:
        raise ValueError(
            f"num_requests={num_requests:,} is more than one workload generates ({MAX_REQUESTS:,})"
        )
    if duration_s is not None:
        _check_positive("duration_s", duration_s)


def _check_expected(rate: float, duration_s: float | None) -> None:
    """Refuse a duration whose expected arrivals (rate x duration) pass ``MAX_REQUESTS``."""
    if duration_s is not None and rate * duration_s > MAX_REQUESTS:
        raise ValueError(
            f"duration_s={duration_s:g} at rate={rate:g} req/s is about {rate * duration_s:.3g} "
            f"requests, more than one workload generates ({MAX_REQUESTS:,})"
        )


def _renewal(
    draw_gaps: Callable[[int], np.ndarray],
    rate: float,
    num_requests: int | None,
    duration_s: float | None,
) -> np.ndarray:
    """Arrival times of a renewal process started at t=0: the cumulative sums of the gaps.

    With ``duration_s`` the result holds every arrival in [0, duration_s), drawing gaps in
    blocks until one passes the end; the draws depend only on the arguments.
    """
    if num_requests is not None:
        return np.cumsum(draw_gaps(num_requests))
    assert duration_s is not None
    times = np.empty(0)
    block = max(16, int(rate * duration_s * 1.1) + 16)
    while times.size == 0 or times[-1] < duration_s:
        start = times[-1] if times.size else 0.0
        times = np.concatenate((times, start + np.cumsum(draw_gaps(block))))
    return times[: np.searchsorted(times, duration_s, side="left")]


def poisson_arrivals(
    rate: float,
    rng: np.random.Generator,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """Poisson arrivals at ``rate`` requests/s: sorted float64 seconds, the first one
    exponential(1/rate) after t=0. Give exactly one of ``num_requests`` and ``duration_s``."""
    _check_positive("rate", rate)
    _check_extent(num_requests, duration_s)
    _check_expected(rate, duration_s)
    return _renewal(lambda n: rng.exponential(1.0 / rate, n), rate, num_requests, duration_s)


def gamma_arrivals(
    rate: float,
    cv: float,
    rng: np.random.Generator,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """Gamma-renewal arrivals: gaps with mean 1/rate and coefficient of variation ``cv``
    (shape 1/cv^2). cv=1 is Poisson, cv>1 bursty, cv<1 more regular than Poisson."""
    _check_positive("rate", rate)
    _check_positive("cv", cv)
    _check_extent(num_requests, duration_s)
    _check_expected(rate, duration_s)
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    return _renewal(lambda n: rng.gamma(shape, scale, n), rate, num_requests, duration_s)


def replay(
    trace: Trace, start_s: float = 0.0, window_s: float | None = None, speed: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of ``trace`` with ``start_s <= t < start_s + window_s`` (to the end when
    ``window_s`` is None), shifted so the first is at 0 and divided by ``speed``.

    ``speed`` scales the rate: 0.9 replays at 0.9x the trace's rate (gaps 1/0.9 longer), as
    ``(ts - ts0) / timestamp_speedup`` in the paper's reference code. Returns copies of
    (arrival_s, prompt_lens, output_lens). Raises ValueError for an empty window.
    """
    if not (isinstance(start_s, numbers.Real) and math.isfinite(start_s) and start_s >= 0):
        raise ValueError(f"start_s must be a finite number >= 0, got {start_s!r}")
    if window_s is not None:
        _check_positive("window_s", window_s)
    _check_positive("speed", speed)
    end_s = math.inf if window_s is None else start_s + window_s
    lo = int(np.searchsorted(trace.arrival_s, start_s, side="left"))
    hi = int(np.searchsorted(trace.arrival_s, end_s, side="left"))
    if hi <= lo:
        raise ValueError(
            f"replay window [{start_s}, {end_s}) s holds no request of {trace.source} "
            f"(its arrivals span 0 to {trace.duration_s:.3f} s)"
        )
    arrival_s = (trace.arrival_s[lo:hi] - trace.arrival_s[lo]) / speed
    return arrival_s, trace.prompt_lens[lo:hi].copy(), trace.output_lens[lo:hi].copy()


# ---------------------------------------------------------------------------------------------
# Registry


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """The data directory (``fastpp.data_dir``: ``data_dir``, else $FASTPP_DATA_DIR, else
    ../shared/data beside the source checkout). Raises WorkloadError if it does not exist."""
    return _resolve_data_dir(data_dir)


def _data_file(data_dir: str | Path | None, relative: str) -> Path:
    path = resolve_data_dir(data_dir) / relative
    if not path.is_file():
        raise WorkloadError(f"data file not found: {path.resolve()}", path=path)
    return path


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A built-in workload. ``make_sampler(data_dir)`` builds its LengthSampler; only specs
    with ``needs_data_dir`` read files (and raise WorkloadError when they are missing)."""

    name: str
    description: str
    source: str  # the dataset (and licence) the lengths come from, or the basis of a synthetic one
    is_synthetic: bool
    needs_data_dir: bool
    factory: Callable[[str | Path | None], LengthSampler]

    def make_sampler(self, data_dir: str | Path | None = None) -> LengthSampler:
        return self.factory(data_dir)


def _file_lengths(relative: str) -> Callable[[str | Path | None], LengthSampler]:
    def factory(data_dir: str | Path | None) -> LengthSampler:
        path = _data_file(data_dir, relative)
        reader = read_azure_trace if relative in TRACE_FILES.values() else read_length_csv
        return EmpiricalLengths.from_table(reader(path))

    return factory


def _synthetic(name: str, description: str, source: str, **params: Any) -> WorkloadSpec:
    sampler = SyntheticLengths(name, **params)  # built once: validates and solves mu at import
    return WorkloadSpec(name, description, source, True, False, lambda _data_dir: sampler)


# CVs and caps of the synthetic workloads are OUR ASSUMPTIONS; only the means are published.
_PAPER = "calibrated to the mean lengths reported in the FastPP paper (its section 5)"
WORKLOADS: dict[str, WorkloadSpec] = {
    spec.name: spec
    for spec in (
        WorkloadSpec(
            "azure-conv",
            "Azure conversation lengths from the built-in quantile table (the default workload)",
            AZURE_SOURCE,
            False,
            False,
            lambda _d: builtin_quantile_lengths("azure-conv"),
        ),
        WorkloadSpec(
            "azure-code",
            "Azure code-completion lengths from the built-in quantile table (long prompts, short outputs)",
            AZURE_SOURCE,
            False,
            False,
            lambda _d: builtin_quantile_lengths("azure-code"),
        ),
        WorkloadSpec(
            "azure-conv-trace",
            "Azure conversation (input, output) pairs resampled from the trace file",
            AZURE_SOURCE,
            False,
            True,
            _file_lengths(TRACE_FILES["azure-conv"]),
        ),
        WorkloadSpec(
            "azure-code-trace",
            "Azure code (input, output) pairs resampled from the trace file",
            AZURE_SOURCE,
            False,
            True,
            _file_lengths(TRACE_FILES["azure-code"]),
        ),
        WorkloadSpec(
            "sharegpt-8k",
            "ShareGPT multi-turn lengths (context accumulated, 8k cap); NOT the paper's first-turn ShareGPT",
            "microsoft/sarathi-serve sharegpt_8k (Apache-2.0); lengths derived from ShareGPT",
            False,
            True,
            _file_lengths(SHAREGPT_FILE),
        ),
        WorkloadSpec(
            "arxiv-summarization",
            "arXiv summarization lengths (4k total cap); NOT CNN/DailyMail",
            "microsoft/vidur arxiv_summarization (MIT); lengths derived from the arXiv summarization dataset",
            False,
            True,
            _file_lengths(ARXIV_FILE),
        ),
        _synthetic(
            "sharegpt-synthetic",
            "synthetic first-turn ShareGPT: lognormal, mean 226 in "
            "/ 199 out; CVs 1.5 / 1.0 and caps 1024 / 1024 (vLLM's ShareGPT filter) are "
            "assumptions",
            f"synthetic, {_PAPER}",
            mean_in=226,
            mean_out=199,
            cv_in=1.5,
            cv_out=1.0,
            max_in=1024,
            max_out=1024,
        ),
        _synthetic(
            "cnn-dailymail-synthetic",
            "synthetic CNN/DailyMail summarization: lognormal, "
            "mean 883 in / 65 out; article CV 0.5 as in the dataset (0.49-0.50: scripts/"
            "cnn_article_spread.py); summary CV 0.4 and caps 4096 / 512 are assumptions",
            f"synthetic, {_PAPER}",
            mean_in=883,
            mean_out=65,
            cv_in=0.5,
            cv_out=0.4,
            max_in=4096,
            max_out=512,
        ),
        _synthetic(
            "cnn-reversed-synthetic",
            "synthetic CNN-Reversed (CNN/DailyMail with input "
            "and output swapped; decode-heavy): lognormal, mean 65 in / 883 out; article "
            "(output) CV 0.5 as in the dataset (0.49-0.50: scripts/cnn_article_spread.py); "
            "summary CV 0.4 and caps 512 / 4096 are assumptions",
            f"synthetic, {_PAPER}",
            mean_in=65,
            mean_out=883,
            cv_in=0.4,
            cv_out=0.5,
            max_in=512,
            max_out=4096,
        ),
    )
}


def _sampler(workload: str | LengthSampler, data_dir: str | Path | None) -> LengthSampler:
    if not isinstance(workload, str):
        return workload
    found = _sampler_or_spec(workload)
    return found if isinstance(found, UniformLengths) else found.make_sampler(data_dir)


def check_workload_name(name: str) -> str:
    """``name`` when it is a built-in workload or a valid ``random:IN:OUT[:RATIO]``; else
    ValueError naming the bad part, or listing the known names."""
    _sampler_or_spec(name)
    return name


def _sampler_or_spec(name: str) -> UniformLengths | WorkloadSpec:
    if name.startswith(UNIFORM_PREFIX):
        return UniformLengths.parse(name)  # raises naming the bad part
    spec = WORKLOADS.get(name)
    if spec is None:
        raise ValueError(
            f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}, or {UNIFORM_PREFIX}IN:OUT[:RATIO]"
        )
    return spec


def _to_requests(arrival_s: np.ndarray, prompt_lens: np.ndarray, output_lens: np.ndarray):
    return [
        Request(i, float(t), int(p), int(o))
        for i, (t, p, o) in enumerate(zip(arrival_s, prompt_lens, output_lens, strict=True))
    ]


def check_arrival(arrival: str, cv: float) -> None:
    """Refuse an unknown arrival process, a cv other than 1 for Poisson arrivals, and a gamma
    cv that is not a positive finite number (ValueError naming the field)."""
    if arrival not in ARRIVALS:
        raise ValueError(f"arrival must be one of {', '.join(ARRIVALS)}, got {arrival!r}")
    if arrival == "poisson" and cv != 1.0:
        raise ValueError(f"cv={cv!r} needs arrival='gamma' (Poisson arrivals have cv 1)")
    _check_positive("cv", cv)


def make_requests(
    workload: str | LengthSampler,
    *,
    seed: int,
    rate: float | None = None,
    num_requests: int | None = None,
    duration_s: float | None = None,
    arrival: str = "poisson",
    cv: float = 1.0,
    data_dir: str | Path | None = None,
) -> list[Request]:
    """Requests with ids 0..n-1 in arrival order: lengths from ``workload`` (a registry name
    or any LengthSampler), arrivals from a Poisson or gamma (``cv``) process at ``rate`` req/s.

    ``rate=None`` means an offline batch: ``num_requests`` requests all arriving at t=0.
    Arrivals and lengths use independent streams spawned from ``seed``, so changing the rate
    keeps the lengths. The same arguments give an identical list.
    """
    check_arrival(arrival, cv)
    sampler = _sampler(workload, data_dir)
    arrival_seq, length_seq = np.random.SeedSequence(seed).spawn(2)
    arrival_rng = np.random.default_rng(arrival_seq)
    if rate is None:  # offline batch
        if duration_s is not None or num_requests is None:
            raise ValueError("rate=None (all requests at t=0) needs num_requests, not duration_s")
        _check_extent(num_requests, None)
        arrival_s = np.zeros(int(num_requests))
    elif arrival == "gamma":
        arrival_s = gamma_arrivals(rate, cv, arrival_rng, num_requests, duration_s)
    else:
        arrival_s = poisson_arrivals(rate, arrival_rng, num_requests, duration_s)
    prompt_lens, output_lens = sampler.sample(np.random.default_rng(length_seq), arrival_s.size)
    return _to_requests(arrival_s, prompt_lens, output_lens)


def replay_requests(
    trace_path_or_name: str | Path,
    *,
    start_s: float = 0.0,
    window_s: float | None = None,
    speed: float = 1.0,
    data_dir: str | Path | None = None,
) -> list[Request]:
    """Requests replayed from a real trace (see :func:`replay` for the window and speed rules).

    ``azure-conv`` / ``azure-code`` (or their ``-trace`` names) resolve to the Azure files in
    the data directory; any other value is a path to an Azure-format CSV.
    """
    name = str(trace_path_or_name).removesuffix("-trace")
    if isinstance(trace_path_or_name, str) and name in TRACE_FILES:
        path = _data_file(data_dir, TRACE_FILES[name])
    else:
        path = Path(trace_path_or_name)
        if path.is_dir():
            raise WorkloadError(f"trace {path} is a folder; give an Azure-format CSV file", path=path)
        if not path.is_file():
            raise WorkloadError(
                f"trace not found: {path} (known trace names: {', '.join(TRACE_FILES)})", path=path
            )
    return _to_requests(*replay(read_azure_trace(path), start_s, window_s, speed))


def workload_stats(
    name: str, n: int = 20000, seed: int = 0, data_dir: str | Path | None = None
) -> dict[str, Any]:
    """Summary of ``n`` sampled lengths of a registered workload, one flat dict per workload:
    name, description, source, synthetic, num_samples, {input,output}_{mean,median,p90,p99}."""
    spec = WORKLOADS.get(name)
    if spec is None:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    prompt_lens, output_lens = spec.make_sampler(data_dir).sample(np.random.default_rng(seed), n)
    stats: dict[str, Any] = {
        "name": name,
        "description": spec.description,
        "source": spec.source,
        "synthetic": spec.is_synthetic,
        "num_samples": n,
    }
    for side, values in (("input", prompt_lens), ("output", output_lens)):
        stats[f"{side}_mean"] = float(values.mean())
        stats[f"{side}_median"] = float(np.median(values))
        stats[f"{side}_p90"] = float(np.quantile(values, 0.9))
        stats[f"{side}_p99"] = float(np.quantile(values, 0.99))
    return stats

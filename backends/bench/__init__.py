"""``fastpp bench``: a load generator for OpenAI-compatible servers (FastPP, SGLang, vLLM).

Needs the ``bench`` extra (httpx). ``BenchConfig`` says what to send, ``run_bench`` sends it
and returns a ``BenchResult``; ``format_result`` and ``append_jsonl`` report it the way
``sglang.benchmark.serving`` does (its console block with the Goodput section, its JSONL keys).
"""

from fastpp.backends.bench.config import Backend, BenchConfig, parse_goodput, slo_from_goodput
from fastpp.backends.bench.report import append_jsonl, format_result, jsonl_record
from fastpp.backends.bench.runner import BenchError, BenchResult, run_bench, run_bench_async

__all__ = [
    "Backend",
    "BenchConfig",
    "BenchError",
    "BenchResult",
    "append_jsonl",
    "format_result",
    "jsonl_record",
    "parse_goodput",
    "run_bench",
    "run_bench_async",
    "slo_from_goodput",
]

"""``fastpp bench``: load an OpenAI-compatible server with a FastPP workload, report like sglang.

Options mirror ``sglang.benchmark.serving`` where one exists (``--backend``, ``--base-url`` or
``--host``/``--port``, ``--num-prompts``, ``--request-rate``, ``--max-concurrency``, ``--seed``,
``--goodput ttft:MS tpot:MS e2el:MS``, ``--warmup-requests``, ``--tokenizer``,
``--extra-request-body``, ``--output-file``, ``--output-details``, ``--tag``); the workload
options are ``fastpp simulate``'s. Defaults live in ``BenchConfig``; the default server is
``fastpp serve``'s (port 8000). A server started with ``--api-key`` gets ``OPENAI_API_KEY``.
"""

# ruff: noqa: E501  (as in cli/app.py: Typer's Annotated option declarations read best one per line)

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated
from urllib.parse import urlsplit

import typer

from fastpp.cli.common import err_console, fail, gamma_needs_cv, given, writable_file
from fastpp.cli.options import (
    ArrivalOpt,
    CvOpt,
    DataDirOpt,
    ReplayOpt,
    ReplaySpeedOpt,
    ReplayStartOpt,
    ReplayWindowOpt,
    WorkloadOpt,
)

if TYPE_CHECKING:  # the bench package needs httpx: imported when the command runs
    from fastpp.backends.bench import BenchConfig, BenchResult

_EXIT_INTERRUPTED = 130  # the shell's code for a run stopped by SIGINT
_EXIT_NONE_SUCCEEDED = 1  # the run ended but no request succeeded


HELP = (
    "Benchmark an OpenAI-compatible server (FastPP, SGLang, vLLM) with a FastPP workload.\n\n"
    "Prompts are random common words, about one token each, or exactly the workload's length with "
    "--tokenizer; every request asks for exactly its workload output length (max_tokens with "
    "ignore_eos). One untimed warm-up request goes first (--warmup-requests 0: none), as in "
    "sglang.benchmark.serving. OPENAI_API_KEY, if set, is sent as the bearer key. Ctrl-C stops the "
    "run, cancels what is in flight and still reports what finished (exit 130). Failed requests "
    "(HTTP or connection errors, timeouts) are summarized on stderr; exit 1 when none succeeded."
)


def bench(
    ctx: typer.Context,
    base_url: Annotated[
        str | None,
        typer.Option(
            "--base-url",
            help="Server URL; a trailing /v1 (the OpenAI clients' form) is dropped, the bench adds /v1/... itself. [default: http://127.0.0.1:8000, fastpp serve's]",
        ),
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Server host, instead of --base-url. [default: 127.0.0.1]")
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            help="Server port, instead of --base-url (SGLang's own default is 30000). [default: 8000]"
        ),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="openai (/v1/completions) or openai-chat (/v1/chat/completions). [default: openai]",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="Model name to send. [default: the first of GET /v1/models]"),
    ] = None,
    workload: WorkloadOpt = None,
    num_prompts: Annotated[
        int | None,
        typer.Option(
            "--num-prompts", "-n", help="Requests to send. [default: 1000; a replay: its whole window]"
        ),
    ] = None,
    request_rate: Annotated[
        float | None,
        typer.Option(
            "--request-rate", "-r", help="Arrival rate, requests/s; inf sends all at once. [default: inf]"
        ),
    ] = None,
    arrival: ArrivalOpt = None,
    cv: CvOpt = None,
    replay: ReplayOpt = None,
    replay_start: ReplayStartOpt = None,
    replay_window: ReplayWindowOpt = None,
    replay_speed: ReplaySpeedOpt = None,
    data_dir: DataDirOpt = None,
    seed: Annotated[int | None, typer.Option(help="Workload and prompt seed. [default: 0]")] = None,
    max_concurrency: Annotated[
        int | None,
        typer.Option("--max-concurrency", help="Most requests in flight at once. [default: no limit]"),
    ] = None,
    timeout_s: Annotated[
        float | None,
        typer.Option(
            "--timeout-s", help="Per-request limit, seconds; a request past it is aborted. [default: 300]"
        ),
    ] = None,
    goodput: Annotated[
        list[str] | None,
        typer.Option(
            "--goodput",
            help="Per-request SLOs as sglang writes them, ms: --goodput ttft:500 tpot:50 e2el:2000 (any of the three); adds the Goodput section.",
        ),
    ] = None,
    slo_ttft_ms: Annotated[float | None, typer.Option(help="TTFT SLO in ms (instead of --goodput).")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option(help="TPOT SLO in ms (instead of --goodput).")] = None,
    output_file: Annotated[
        Path | None,
        typer.Option(
            "--output-file", "-o", help="Append the run as one JSON line (sglang's keys) to this file."
        ),
    ] = None,
    tag: Annotated[
        str | None,
        typer.Option("--tag", help="A label written into the JSON line's tag key, as sglang's --tag."),
    ] = None,
    output_details: Annotated[
        bool,
        typer.Option(
            "--output-details",
            help="Add per-request input_lens, output_lens, ttfts, itls, errors to the JSON line.",
        ),
    ] = False,
    warmup_requests: Annotated[
        int | None,
        typer.Option(
            "--warmup-requests",
            help="Untimed requests before the run (copies of the first, at most 32 output tokens); 0: none. [default: 1]",
        ),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer",
            help="A tokenizer.json, or a model folder holding one: exact prompt lengths and retokenized output counts. [default: none, one word per token]",
        ),
    ] = None,
    extra_request_body: Annotated[
        str | None,
        typer.Option(
            "--extra-request-body",
            metavar="JSON",
            help="A JSON object merged into every request body, e.g. '{\"temperature\": 0.7}' (its keys win).",
        ),
    ] = None,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet",
            "-q",
            help="No progress bar or notes on stderr (failed requests are still summarized there).",
        ),
    ] = False,
) -> None:
    """Benchmark an OpenAI-compatible server; ``HELP`` is the user-facing text."""
    try:
        from fastpp.backends.bench import BenchConfig, BenchError
    except ModuleNotFoundError as exc:
        if exc.name != "httpx":
            raise
        fail("fastpp bench needs httpx: pip install 'fastpp[bench]'")
        return
    gamma_needs_cv(arrival, cv)
    try:
        config = BenchConfig(
            **given(
                BenchConfig,
                base_url=_base_url(base_url, host, port, BenchConfig().base_url),
                backend=backend,
                model=model,
                workload=workload,
                num_prompts=num_prompts,
                request_rate=request_rate,
                arrival=arrival,
                cv=cv,
                replay=replay,
                replay_start_s=replay_start,
                replay_window_s=replay_window,
                replay_speed=replay_speed,
                data_dir=data_dir,
                seed=seed,
                max_concurrency=max_concurrency,
                timeout_s=timeout_s,
                tag=tag,
                warmup_requests=warmup_requests,
                tokenizer=tokenizer,
                extra_request_body=_json_object(extra_request_body, "--extra-request-body"),
                **_slos(ctx.args, goodput, slo_ttft_ms, slo_tpot_ms),
            )
        )
    except ValueError as exc:
        fail(str(exc))
        return
    writable_file(output_file, "--output-file", "the JSONL file's path")  # before the run
    try:
        result = _run(config, quiet=quiet or not sys.stderr.isatty())
    except BenchError as exc:
        fail(str(exc))
        return
    _report(result, output_file, output_details, quiet)


def _base_url(base_url: str | None, host: str | None, port: int | None, default: str) -> str | None:
    if host is None and port is None:
        return base_url
    if base_url is not None:
        fail("give --base-url or --host/--port, not both")
    if host is not None and not host.strip():
        fail("--host must name a host, got ''")
    if port is not None and not 1 <= port <= 65535:
        fail(f"--port must be in 1..65535, got {port}")
    parts = urlsplit(default)
    return f"http://{host or parts.hostname}:{port if port is not None else parts.port}"


def _slos(
    extra_args: list[str], goodput: list[str] | None, slo_ttft_ms: float | None, slo_tpot_ms: float | None
) -> dict:
    """``goodput`` (sglang's pairs, from --goodput and its extra words: ``--goodput ttft:500
    tpot:50`` leaves ``tpot:50`` as a stray argument) or ``slo`` (--slo-ttft-ms/--slo-tpot-ms)
    for BenchConfig; BenchConfig derives the other."""
    from fastpp.backends.bench.config import make_slo, parse_goodput

    if extra_args and goodput is None:
        fail(f"unexpected arguments: {' '.join(extra_args)}")
    if goodput is not None:
        if slo_ttft_ms is not None or slo_tpot_ms is not None:
            fail("give --goodput or --slo-ttft-ms/--slo-tpot-ms, not both")
        try:
            return {"goodput": parse_goodput([*goodput, *extra_args])}
        except ValueError as exc:
            fail(f"--goodput: {exc}")
    slo = make_slo(slo_ttft_ms, slo_tpot_ms)
    return {} if slo is None else {"slo": slo}


def _json_object(text: str | None, option: str) -> dict | None:
    """A JSON object option's value, failing with the option's name and the parser's message."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        fail(f"{option}: not valid JSON ({exc}): {text!r}")
    if not isinstance(value, dict):
        fail(f"{option} must be a JSON object ({{...}}), got {type(value).__name__}: {text!r}")
    return value


def _run(config: BenchConfig, *, quiet: bool) -> BenchResult:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fastpp.backends.bench import run_bench

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        disable=quiet,
    ) as bar:
        task = bar.add_task(
            f"bench {config.base_url}", total=None
        )  # the count is known once the workload is drawn
        return run_bench(config, progress=lambda done, total: bar.update(task, completed=done, total=total))


def _report(result: BenchResult, output_file: Path | None, output_details: bool, quiet: bool) -> None:
    from fastpp.backends.bench import append_jsonl, format_result
    from fastpp.backends.bench.report import failure_lines

    typer.echo(format_result(result))
    for line in failure_lines(result):  # even with -q: the block has counts, not reasons
        err_console.print(line, markup=False, highlight=False)
    if output_file is not None:
        try:
            append_jsonl(result, output_file, details=output_details)
        except OSError as exc:
            fail(f"--output-file {output_file}: cannot append the run ({exc.strerror or exc})")
        if not quiet:
            err_console.print(f"appended the run to {output_file}", markup=False, highlight=False)
    if result.is_interrupted:
        err_console.print(
            f"[yellow]interrupted:[/] {len(result.records)} sent ({len(result.aborted_ids)} cancelled "
            f"in flight), {result.num_not_sent} not sent"
        )
        raise typer.Exit(_EXIT_INTERRUPTED)
    if result.summary["completed"] == 0:
        what = f"all {len(result.records)} failed" if result.records else "none was sent"
        err_console.print(f"[red]error:[/] no request succeeded ({what})")
        raise typer.Exit(_EXIT_NONE_SUCCEEDED)

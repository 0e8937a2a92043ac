"""Run one benchmark: send the workload's requests on schedule, collect records, summarize.

Each request is sent at its workload arrival time (seconds after the bench start), waits for a
slot when ``max_concurrency`` is set, and streams into a ``RequestRecord`` whose ``arrived_at``
is the moment it was actually sent (sglang's convention: the concurrency wait is not latency).
The run is bounded: every request has ``timeout_s``, and there are finitely many. A stop
(Ctrl-C in :func:`run_bench`, or the ``stop`` event) cancels what is in flight or not yet sent;
requests in flight end as ABORTED, unsent ones get no record, and the summary covers the rest.

Every sent request that did not complete has finish reason ABORTED (the record type has no
other); the summary tells the two kinds apart: ``num_aborted`` counts those a stop cancelled,
``num_failed`` those the server or the network failed (an HTTP error, a refused or dropped
connection, a bad stream, ``timeout_s`` passed), whose reasons are in ``detail``.

Before the timed run, ``warmup_requests`` copies of the first request (at most 32 output tokens,
at the run's concurrency limit) are sent and not counted, then the bench waits one second, as
``sglang.benchmark.serving`` does; if none of them succeeds the run stops with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from fastpp.backends.bench.client import OpenAIClient, get_server_info, list_models
from fastpp.backends.bench.config import BenchConfig
from fastpp.backends.bench.goodput import sglang_goodput
from fastpp.backends.bench.prompts import make_prompts
from fastpp.backends.bench.tokens import BenchTokenizer, load_tokenizer
from fastpp.metrics import summarize
from fastpp.types import FinishReason, Request, RequestRecord

ProgressFn = Callable[[int, int], None]  # (requests ended, requests planned)

# summarize() keys a client cannot observe (scheduler internals); dropped rather than shown as 0
_SERVER_ONLY_KEYS = (
    "num_retractions",
    "num_parked",
    "mean_queueing_delay_ms",
    "p99_queueing_delay_ms",
    "max_queueing_delay_ms",
)
_CONNECT_TIMEOUT_S = 10.0  # cap on one TCP connect, within the request's own timeout_s
_COMPLETED = (FinishReason.LENGTH, FinishReason.STOP)
_SIDE_TIMEOUT_S = 10.0  # GET /v1/models and /server_info, before the run starts
WARMUP_MAX_TOKENS = 32  # sglang's warm-up output length cap
WARMUP_PAUSE_S = 1.0  # sglang's pause between the warm-up and the timed run
_AUTH_ERRORS = ("HTTP 401", "HTTP 403")  # a RequestRecord.detail the API key would fix
T = TypeVar("T")


class BenchError(RuntimeError):
    """The run could not start (no model to ask for, bad workload files, ...)."""


@dataclass(slots=True)
class _Clock:
    """Seconds since ``restart()``: the run's clock."""

    start_at: float = field(default_factory=time.perf_counter)

    def restart(self) -> None:
        self.start_at = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start_at


@dataclass(slots=True)
class BenchResult:
    """A finished (or interrupted) run: its records, the summary and what the server said."""

    config: BenchConfig
    model: str
    requests: list[Request]  # every planned request
    records: list[RequestRecord]  # the requests that were sent, in request order
    summary: dict[str, Any]  # fastpp.metrics.summarize keys (server-only ones dropped) + bench keys
    server_info: dict[str, Any] | None  # GET /server_info, None where the server has none
    is_interrupted: bool  # stopped before every request was sent and answered
    goodput: dict[str, Any] | None = None  # sglang's goodput keys when config.goodput is set
    generated_texts: list[str] = field(default_factory=list)  # per sent record, in its order
    # the sent requests a stop cancelled in flight (ABORTED); any other unfinished one failed
    aborted_ids: frozenset[int] = frozenset()

    @property
    def num_not_sent(self) -> int:
        return len(self.requests) - len(self.records)

    @property
    def failed_records(self) -> list[RequestRecord]:
        """The sent requests that failed (not completed, not cancelled by a stop)."""
        return [r for r in self.records if is_failed(r, self.aborted_ids)]


def is_failed(record: RequestRecord, aborted_ids: frozenset[int]) -> bool:
    """True when ``record`` did not complete and was not cancelled by a stop."""
    return record.finish_reason not in _COMPLETED and record.req_id not in aborted_ids


def run_bench(
    config: BenchConfig,
    *,
    requests: Sequence[Request] | None = None,
    progress: ProgressFn | None = None,
    handle_sigint: bool = True,
) -> BenchResult:
    """Run the benchmark to the end; Ctrl-C (SIGINT) stops it early and still returns a result.

    ``requests`` replaces ``config.requests()``. SIGINT is caught only on the main thread with
    ``handle_sigint``; the previous handler is restored afterwards.
    """

    async def main() -> BenchResult:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        installed = False
        if handle_sigint and threading.current_thread() is threading.main_thread():
            try:
                loop.add_signal_handler(signal.SIGINT, stop.set)
                installed = True
            except (NotImplementedError, RuntimeError):
                # this event loop takes no signal handlers (e.g. not the main loop on some
                # platforms): Ctrl-C then raises KeyboardInterrupt, handled by the caller
                installed = False
        try:
            return await run_bench_async(config, requests=requests, progress=progress, stop=stop)
        finally:
            if installed:
                loop.remove_signal_handler(signal.SIGINT)

    previous = signal.getsignal(signal.SIGINT)
    try:
        return asyncio.run(main())
    finally:
        if handle_sigint and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, previous)


async def run_bench_async(
    config: BenchConfig,
    *,
    requests: Sequence[Request] | None = None,
    progress: ProgressFn | None = None,
    stop: asyncio.Event | None = None,
) -> BenchResult:
    """The benchmark as a coroutine; setting ``stop`` cancels what is left (see module doc)."""
    try:
        reqs = list(config.requests() if requests is None else requests)
        tokenizer = load_tokenizer(config.tokenizer) if config.tokenizer else None
    except (ValueError, OSError) as exc:
        raise BenchError(str(exc)) from exc
    reqs, prompts = _prompts(reqs, config.seed, tokenizer)
    stop = stop or asyncio.Event()
    clock = _Clock()
    timeout = httpx.Timeout(config.timeout_s, connect=min(_CONNECT_TIMEOUT_S, config.timeout_s))
    transport = httpx.AsyncHTTPTransport(
        # no pool limit: the semaphore alone bounds concurrency, and a pool wait would count as TTFT
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        # TCP_NODELAY as aiohttp (sglang's client) sets it: Nagle can hold a request body ~40 ms
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
    )
    async with httpx.AsyncClient(timeout=timeout, transport=transport, headers=auth_headers()) as http:
        model, server_info = await _unless_stopped(_ask_server(http, config), stop)
        client = OpenAIClient(
            http, config.base_url, config.backend, model, config.timeout_s, clock, config.extra_request_body
        )
        bodies = [client.payload(p, r.output_len) for p, r in zip(prompts, reqs, strict=True)]
        if config.warmup_requests and reqs:
            warm = client.payload(prompts[0], min(reqs[0].output_len, WARMUP_MAX_TOKENS))
            await _unless_stopped(_warm_up(client, warm, config), stop)
        records, replies, aborted_ids = await _dispatch(client, reqs, bodies, config, clock, stop, progress)
        duration_s = clock()
    sent = [records[r.req_id] for r in reqs if r.req_id in records]
    texts = [replies.get(r.req_id, (None, ""))[1] for r in sent]
    summary = _summary(config, sent, {k: v[0] for k, v in replies.items()}, duration_s, aborted_ids)
    summary["total_output_tokens_retokenized"] = _retokenized(sent, texts, tokenizer)
    goodput = sglang_goodput(sent, config.goodput_slos_ms, duration_s) if config.goodput else None
    return BenchResult(
        config, model, reqs, sent, summary, server_info, stop.is_set(), goodput, texts, aborted_ids
    )


def _prompts(
    reqs: list[Request], seed: int, tokenizer: BenchTokenizer | None
) -> tuple[list[Request], list[str]]:
    """The prompt texts; with a tokenizer exact-length ones, and each request's ``prompt_len``
    then the text's own token count (sglang's input count)."""
    if tokenizer is None:
        return reqs, make_prompts(reqs, seed)
    prompts = [tokenizer.prompt(r.prompt_len, seed, r.req_id) for r in reqs]
    counts = tokenizer.count_many(prompts)
    return [dataclasses.replace(r, prompt_len=n) for r, n in zip(reqs, counts, strict=True)], prompts


def _retokenized(
    records: list[RequestRecord], texts: list[str], tokenizer: BenchTokenizer | None
) -> int | None:
    """The completed requests' output text counted again by the tokenizer (None without one)."""
    if tokenizer is None:
        return None
    done = [t for r, t in zip(records, texts, strict=True) if r.finish_reason in _COMPLETED]
    return sum(tokenizer.count_many(done))


async def _warm_up(client: OpenAIClient, body: dict[str, Any], config: BenchConfig) -> None:
    """sglang's warm-up: ``config.warmup_requests`` copies of ``body`` at the run's concurrency
    limit, then a pause; BenchError when none succeeds."""
    sem = asyncio.Semaphore(config.max_concurrency or config.warmup_requests)
    records = [
        RequestRecord(-1 - i, 0.0, 0, int(body.get("max_tokens") or 1)) for i in range(config.warmup_requests)
    ]

    async def one(record: RequestRecord) -> None:
        async with sem:
            await client.send(dict(body), record)

    await asyncio.gather(*(one(r) for r in records))
    if not any(r.finish_reason in _COMPLETED for r in records):
        detail = records[0].detail
        if detail.startswith(_AUTH_ERRORS):
            raise BenchError(f"the warm-up request failed ({detail}); {api_key_hint()}")
        raise BenchError(
            f"the warm-up request failed ({detail}); check --model, --backend, "
            f"--extra-request-body and the server (or skip it: --warmup-requests 0)"
        )
    await asyncio.sleep(WARMUP_PAUSE_S)


def auth_headers() -> dict[str, str]:
    """``Authorization: Bearer $OPENAI_API_KEY`` when that is set, as the openai client and
    sglang's benchmark send it (for a server started with --api-key)."""
    key = os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def api_key_hint() -> str:
    """What to do about an HTTP 401/403: the only key the bench sends is OPENAI_API_KEY."""
    if os.environ.get("OPENAI_API_KEY"):
        return "the server refused the key in OPENAI_API_KEY; set it to the server's --api-key"
    return "the server wants an API key: set OPENAI_API_KEY to its --api-key"


async def _ask_server(http: httpx.AsyncClient, config: BenchConfig) -> tuple[str, dict[str, Any] | None]:
    """The model to send (``config.model`` or the first listed) and GET /server_info."""
    model = config.model or await _first_model(http, config.base_url)
    return model, await get_server_info(http, config.base_url, timeout_s=_SIDE_TIMEOUT_S)


async def _unless_stopped(aw: Awaitable[T], stop: asyncio.Event) -> T:
    """``await aw``, unless ``stop`` is set first: then cancel it and raise BenchError."""
    task = asyncio.ensure_future(aw)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise BenchError("interrupted before any request was sent")
    return task.result()


async def _first_model(http: httpx.AsyncClient, base_url: str) -> str:
    try:
        models = await list_models(http, base_url, timeout_s=_SIDE_TIMEOUT_S)
    except httpx.TransportError as exc:
        raise BenchError(
            f"no server answers at {base_url} ({exc}); start one (fastpp serve) or "
            f"point --host/--port or --base-url at it"
        ) from exc
    except httpx.HTTPStatusError as exc:
        status = exc.response.status_code
        hint = api_key_hint() if status in (401, 403) else "pass --model, or check --base-url"
        raise BenchError(f"could not list models at {base_url}/v1/models (HTTP {status}); {hint}") from exc
    except (httpx.HTTPError, ValueError) as exc:
        raise BenchError(f"could not list models at {base_url}/v1/models ({exc}); pass --model") from exc
    if not models:
        raise BenchError(f"{base_url}/v1/models lists no model; pass --model")
    return models[0]


async def _dispatch(
    client: OpenAIClient,
    reqs: list[Request],
    bodies: list[dict[str, Any]],
    config: BenchConfig,
    clock: _Clock,
    stop: asyncio.Event,
    progress: ProgressFn | None,
) -> tuple[dict[int, RequestRecord], dict[int, tuple[int | None, str]], frozenset[int]]:
    """Start each request at its arrival time; wait for all, or cancel them all on ``stop``.
    Returns the records and replies of the sent requests and the ids of those cancelled."""
    sem = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
    records: dict[int, RequestRecord] = {}
    replies: dict[int, tuple[int | None, str]] = {}  # req_id -> (usage.prompt_tokens, output text)
    cancelled_ids: set[int] = set()  # sent, then cancelled by the stop
    num_ended = 0

    async def send(req: Request, body: dict[str, Any]) -> None:
        nonlocal num_ended
        record = RequestRecord(req.req_id, 0.0, req.prompt_len, req.output_len)
        records[req.req_id] = record
        try:
            replies[req.req_id] = await client.send(body, record)
        except asyncio.CancelledError:
            cancelled_ids.add(req.req_id)
            raise
        finally:
            num_ended += 1
            if progress is not None:
                progress(num_ended, len(reqs))

    async def limited(req: Request, body: dict[str, Any]) -> None:
        if sem is None:
            await send(req, body)
            return
        async with sem:
            await send(req, body)

    if progress is not None:
        progress(0, len(reqs))
    clock.restart()
    tasks: list[asyncio.Task[None]] = []
    for req, body in zip(reqs, bodies, strict=True):
        delay = req.arrived_at - clock()  # absolute schedule: no drift from late wake-ups
        if (delay > 0 and await _stopped_within(stop, delay)) or stop.is_set():
            break
        tasks.append(asyncio.create_task(limited(req, body)))
    if tasks:
        all_ended = asyncio.gather(*tasks, return_exceptions=True)
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({all_ended, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not all_ended.done():
            for task in tasks:
                task.cancel()
        results = await all_ended
        for res in results:  # a bug in the client, not a failed request: do not hide it
            if isinstance(res, BaseException) and not isinstance(res, asyncio.CancelledError):
                raise res
    return records, replies, frozenset(cancelled_ids)


async def _stopped_within(stop: asyncio.Event, delay_s: float) -> bool:
    """Sleep ``delay_s``; True as soon as ``stop`` is set instead."""
    try:
        await asyncio.wait_for(stop.wait(), delay_s)
    except TimeoutError:
        return False
    return True


def _summary(
    config: BenchConfig,
    records: list[RequestRecord],
    prompt_tokens: dict[int, int | None],
    duration_s: float,
    aborted_ids: frozenset[int],
) -> dict[str, Any]:
    summary = summarize(
        records,
        duration_s=duration_s,
        slo=config.slo,
        backend=str(config.backend),
        request_rate=config.traffic_rate,
    )
    for key in _SERVER_ONLY_KEYS:
        summary.pop(key, None)
    # summarize counts every ABORTED record; split off the failures from the stop's cancellations
    summary["num_aborted"] = sum(r.req_id in aborted_ids for r in records)
    summary["num_failed"] = sum(is_failed(r, aborted_ids) for r in records)
    summary["total_input_text_tokens"] = summary["total_input_tokens"]  # sglang's; no images here
    summary["total_input_vision_tokens"] = 0
    done = [r for r in records if r.finish_reason in _COMPLETED]
    server_in = [prompt_tokens.get(r.req_id) for r in done]
    # the prompt as the server tokenized it (template and BOS included); None unless all reported
    summary["total_input_tokens_server"] = (
        sum(server_in) if server_in and None not in server_in else None  # type: ignore[arg-type]
    )
    return summary

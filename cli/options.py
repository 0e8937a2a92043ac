"""Option declarations shared by several commands (one help text per option)."""

# ruff: noqa: E501  (Typer's Annotated option declarations read best one per line)

from __future__ import annotations

from typing import Annotated

import typer

WorkloadOpt = Annotated[
    str | None,
    typer.Option(
        "--workload",
        "-w",
        help="Length distribution (see `fastpp workloads`), or random:IN:OUT[:RATIO] for uniform lengths like sglang's random dataset. [default: azure-conv]",
    ),
]
ArrivalOpt = Annotated[str | None, typer.Option(help="poisson or gamma. [default: poisson]")]
CvOpt = Annotated[
    float | None,
    typer.Option(
        help="Gamma arrivals' coefficient of variation, required with --arrival gamma (1 is Poisson)."
    ),
]
ReplayOpt = Annotated[
    str | None, typer.Option(help="Replay a trace instead: azure-conv, azure-code or a CSV path.")
]
ReplayStartOpt = Annotated[float | None, typer.Option(help="Replay from this second of the trace.")]
ReplayWindowOpt = Annotated[float | None, typer.Option(help="Replay this many seconds of the trace.")]
ReplaySpeedOpt = Annotated[
    float | None, typer.Option(help="Rate factor: 0.9 replays at 0.9x the trace's rate.")
]
DataDirOpt = Annotated[
    str | None,
    typer.Option(
        help="Folder with the real traces. [default: $FASTPP_DATA_DIR, else ../shared/data beside the source checkout]"
    ),
]
ChunkCandidatesOpt = Annotated[
    str | None,
    typer.Option(
        help="Chunk sizes dynamic policies choose from: START:STOP:STEP or a comma list. [default: 128:2048:128; serve: 32:1024:32]"
    ),
]
AdmissionOpt = Annotated[
    str | None,
    typer.Option(
        "--admission",
        help="Whose remaining output the admission reserve counts: slot (the launching slot's decodes only, as the paper's reference: more admissions, more retractions) or all (every admitted request, running, in flight or parked: fewer admissions, fewer retractions). [default: slot]",
    ),
]
AsyncBatchDepthOpt = Annotated[
    int | None,
    typer.Option(
        "--pp-async-batch-depth",
        help="Microbatches in flight beyond one per pipeline stage, as SGLang's flag of that name: the scheduler runs pp + N slots, so a slot's next microbatch can wait at stage 0 while its tokens come back. [default: 0]",
    ),
]
QueueOrderOpt = Annotated[
    str | None,
    typer.Option(
        "--queue-order",
        help="Which waiting request is admitted next: fcfs (arrival order) or late_last (a request that has waited past the SLO TTFT without its first token waits behind those that can still meet it, until it has waited 10 x the SLO TTFT). [default: fcfs]",
    ),
]
RetractionOpt = Annotated[
    str | None,
    typer.Option(
        "--retraction",
        help="Which request a KV shortage retracts: newest_front (the slot's newest, back to the front of the queue) or fewest_output_back (fewest generated tokens, to the back, as SGLang). [default: newest_front]",
    ),
]

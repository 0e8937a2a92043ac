"""A run's stage-iteration records, kept column-wise.

A microbatch passes every stage with the same counts, budget and reason; only the stage and its
two instants differ. ``IterationLog`` keeps those per-microbatch fields once, as a plain tuple
(its *head*) shared by the microbatch's stage rows, and the rest in three columns. An hour's
replay on PP=4 keeps 276,000 stage iterations: as IterationRecord objects they were the largest
set of objects alive in the simulation, and the garbage collector's passes over them took about
a tenth of its time (benchmarks/sim_speed.py --iterations). A head holds only numbers and one
string, so the collector stops tracking it after one look; the columns are three lists.

It is a ``Sequence[IterationRecord]``: indexing and iteration build the records on demand, so
code that reads records works unchanged; the run-folder writers read the columns directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from operator import attrgetter
from typing import overload

from fastpp._mypyc import mypyc_attr
from fastpp.types import IterationRecord

# The fields of IterationRecord other than stage, started_at and finished_at, in its order.
HEAD_FIELDS = (
    "mb_id",
    "slot",
    "num_tokens",
    "num_prefill_tokens",
    "num_decode_reqs",
    "sum_past_x_pre",
    "sum_pre_sq",
    "sum_dec_ctx",
    "chunk_budget",
    "reason",
    "num_sampled",
)
Head = tuple  # the values of HEAD_FIELDS, in that order

record_head: attrgetter = attrgetter(*HEAD_FIELDS)  # an IterationRecord's head


def make_head(
    mb_id: int,
    slot: int,
    num_tokens: int,
    num_prefill_tokens: int,
    num_decode_reqs: int,
    sum_past_x_pre: int,
    sum_pre_sq: int,
    sum_dec_ctx: int,
    chunk_budget: int,
    reason: str,
    num_sampled: int,
) -> Head:
    """The head of one microbatch (HEAD_FIELDS, in that order): the one place it is built."""
    return (
        mb_id,
        slot,
        num_tokens,
        num_prefill_tokens,
        num_decode_reqs,
        sum_past_x_pre,
        sum_pre_sq,
        sum_dec_ctx,
        chunk_budget,
        reason,
        num_sampled,
    )


def make_record(head: Head, stage: int, started_at: float, finished_at: float) -> IterationRecord:
    """The IterationRecord of the microbatch ``head`` on ``stage`` between the two instants."""
    return IterationRecord(head[0], stage, head[1], started_at, finished_at, *head[2:])


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassable when compiled (fastpp/_mypyc.py)
class IterationLog(Sequence[IterationRecord]):
    """Stage-iteration records in the order they were added (module docstring)."""

    __slots__ = ("heads", "stages", "started_at", "finished_at")

    def __init__(self, records: Iterable[IterationRecord] = ()) -> None:
        self.heads: list[Head] = []  # per row: its microbatch's head (one tuple per microbatch)
        self.stages: list[int] = []
        self.started_at: list[float] = []
        self.finished_at: list[float] = []
        for rec in records:
            self.append(rec)

    @classmethod
    def of(cls, records: Iterable[IterationRecord]) -> IterationLog:
        """``records`` as a log: itself when it is one, else a log of its records."""
        return records if isinstance(records, IterationLog) else cls(records)

    def append(self, rec: IterationRecord) -> None:
        self.add(record_head(rec), rec.stage, rec.started_at, rec.finished_at)

    def add(self, head: Head, stage: int, started_at: float, finished_at: float) -> None:
        """One stage iteration of the microbatch ``head``."""
        self.heads.append(head)
        self.stages.append(stage)
        self.started_at.append(started_at)
        self.finished_at.append(finished_at)

    def add_stages(self, head: Head, times: Sequence[tuple[float, float]]) -> None:
        """Stages 0, 1, ... of the microbatch ``head`` between these (start, end) instants."""
        self.heads.extend([head] * len(times))
        self.stages.extend(range(len(times)))
        for start, end in times:
            self.started_at.append(start)
            self.finished_at.append(end)

    def __len__(self) -> int:
        return len(self.stages)

    @overload
    def __getitem__(self, i: int) -> IterationRecord: ...

    @overload
    def __getitem__(self, i: slice) -> list[IterationRecord]: ...

    def __getitem__(self, i: int | slice) -> IterationRecord | list[IterationRecord]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return make_record(self.heads[i], self.stages[i], self.started_at[i], self.finished_at[i])

    def __iter__(self) -> Iterator[IterationRecord]:
        return map(make_record, self.heads, self.stages, self.started_at, self.finished_at)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IterationLog):
            return (
                self.stages == other.stages
                and self.started_at == other.started_at
                and self.finished_at == other.finished_at
                and self.heads == other.heads
            )
        if isinstance(other, list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return f"IterationLog({len(self)} stage iterations)"

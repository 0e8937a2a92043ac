"""Request records and latency signals of one executor, written in one place.

Every executor keeps one ``RequestRecord`` per request (fastpp.types) and feeds the recent
signals the policies read (fastpp.signals). The rules for both live here, once: an arrival is a
record and an arrival sample; a request's first token is a TTFT sample; every new token has
its time (unless the executor keeps none); an end closes the record with one ``FinishReason``,
which each engine adapter maps its own finish states into explicitly. Our Scheduler and the
engine adapters call these methods instead of writing record fields themselves.

Times are seconds on the executor's clock.
"""

from __future__ import annotations

from fastpp.signals import Signals
from fastpp.types import FinishReason, RequestRecord


class RequestLog:
    """The records of the requests one executor has seen, by our integer request id, until
    ``forget``. ``keep_token_times=False``: records keep no per-token times (no ITL; TTFT and
    TPOT come from the first-token and finish instants)."""

    __slots__ = ("by_id", "signals", "keep_token_times")

    def __init__(self, signals: Signals, *, keep_token_times: bool = True) -> None:
        self.by_id: dict[int, RequestRecord] = {}
        self.signals = signals
        self.keep_token_times = keep_token_times

    def arrive(self, req_id: int, arrived_at: float, prompt_len: int, output_len: int) -> RequestRecord:
        """A new request: its record, and an arrival sample. ``ValueError`` for a reused id."""
        if req_id in self.by_id:
            raise ValueError(f"duplicate request id {req_id}")
        rec = RequestRecord(req_id, arrived_at, prompt_len, output_len)
        self.by_id[req_id] = rec
        self.signals.on_arrival(arrived_at, prompt_len)
        return rec

    @staticmethod
    def scheduled(rec: RequestRecord, now: float) -> None:
        """Some of ``rec``'s prompt entered a microbatch (only the first time counts)."""
        if rec.scheduled_at is None:
            rec.scheduled_at = now

    def took(self, rec: RequestRecord, num_generated: int, now: float) -> int:
        """The request has ``num_generated`` output tokens now (the engine's own count): fold in
        the new ones, all available at ``now``; the first is a TTFT sample. Returns how many."""
        new = num_generated - rec.num_generated
        if new <= 0:
            return 0
        rec.num_generated = num_generated
        if self.keep_token_times:
            rec.token_times.extend([now] * new)
        if rec.first_token_at is None:
            self.first_token(rec, now)
        return new

    def first_token(self, rec: RequestRecord, now: float) -> None:
        """``rec``'s first token came back at ``now`` (a caller that counts tokens itself)."""
        rec.first_token_at = now
        self.signals.on_first_token(now, now - rec.arrived_at)

    @staticmethod
    def parked(rec: RequestRecord) -> None:
        rec.num_parked += 1

    @staticmethod
    def retracted(rec: RequestRecord) -> None:
        """Its KV was freed (retraction, vLLM's preemption): it is recomputed later."""
        rec.num_retractions += 1

    @staticmethod
    def end(rec: RequestRecord, now: float, reason: FinishReason, detail: str = "") -> None:
        """Close ``rec``: it ended at ``now`` for ``reason`` (``detail`` says why, if not plain)."""
        rec.finish_reason = reason
        rec.finished_at = now
        rec.detail = detail

    def forget(self, req_id: int) -> RequestRecord | None:
        """Drop a record (a long-running executor's ended requests); None if unknown."""
        return self.by_id.pop(req_id, None)

"""Recent-latency signals: the bounded (time, value) histories the chunk policies and the decode
balancer read through the view. Any executor records them the same way, through these methods."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

SIGNAL_HISTORY = 4096  # samples kept per signal; policies window them further by time


def _history(maxlen: int = SIGNAL_HISTORY) -> deque:
    return deque(maxlen=maxlen)


@dataclass(slots=True)
class Signals:
    """Bounded histories of (time, value) samples, newest last. Times in seconds on the
    scheduler's clock.

    * ``ttft``: (first-token time, TTFT seconds), one per request's first token;
    * ``token_gap``: (return time, seconds since that slot's previous return), one per returning
      microbatch that carried decodes: the slot round a decoding request waits between tokens;
    * ``arrivals``: (arrival time, prompt tokens), one per arrival; ``num_arrivals`` counts them
      all (the deque forgets the oldest), so a policy can ingest only the new ones.
    """

    ttft: deque[tuple[float, float]] = field(default_factory=_history)
    token_gap: deque[tuple[float, float]] = field(default_factory=_history)
    arrivals: deque[tuple[float, int]] = field(default_factory=lambda: _history(4 * SIGNAL_HISTORY))
    num_arrivals: int = 0
    _last_return_at: dict[int, float] = field(default_factory=dict, repr=False)

    def on_arrival(self, at: float, prompt_len: int) -> None:
        self.arrivals.append((at, prompt_len))
        self.num_arrivals += 1

    def on_first_token(self, at: float, ttft_s: float) -> None:
        self.ttft.append((at, ttft_s))

    def on_return(self, slot: int, at: float, has_decodes: bool) -> None:
        """A microbatch of ``slot`` returned at ``at``; a gap sample when it carried decodes and
        the slot returned before."""
        last = self._last_return_at.get(slot)
        if has_decodes and last is not None:
            self.token_gap.append((at, at - last))
        self._last_return_at[slot] = at

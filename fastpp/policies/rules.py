"""Rules every chunk policy shares, written once.

* The decode guard: C is the whole budget of a microbatch, so a C at or below the launching
  slot's decode count would leave some decodes without their token and the prompt with
  nothing; a policy returns a candidate strictly above it (the largest when none is).
* KV pressure: below a free share of the pool, admitting more prompts only leads to
  retractions. A policy then shrinks C to the smallest candidate above the largest decode count
  of any slot: every decode still gets its token, prefill nearly stops, finishing requests free
  KV. A heuristic, not an out-of-memory guarantee (the scheduler retracts when memory runs out).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastpp.view import PolicyView


def first_above(candidates: tuple[int, ...], n: int) -> int | None:
    """Index of the smallest candidate strictly above ``n``; None if none is."""
    i = bisect_right(candidates, n)
    return i if i < len(candidates) else None


def index_above(candidates: tuple[int, ...], n: int) -> int:
    """Index of the smallest candidate strictly above ``n``; of the largest if none is."""
    i = first_above(candidates, n)
    return len(candidates) - 1 if i is None else i


def under_kv_pressure(view: PolicyView, free_watermark: float) -> bool:
    """True when the free share of the KV pool is below ``free_watermark``."""
    return view.kv_free_tokens < free_watermark * view.kv_total_tokens


def max_running(view: PolicyView) -> int:
    """The largest decode count of any slot."""
    return max(view.num_running(s) for s in range(view.num_slots))


def kv_pressure_index(view: PolicyView, candidates: tuple[int, ...]) -> int:
    """Index of the pressure chunk: the smallest candidate above every slot's decode count."""
    return index_above(candidates, max_running(view))

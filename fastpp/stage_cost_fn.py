"""A pipeline stage's cost model in the form the simulator calls it, once per stage and
microbatch: ``StageCost.time_s`` on the tables' dense form (``dense_at``, which is also
``LinearTable.at`` and the ALP predictor's lookup) and the terms the stage does not have left
out (``StageCost.cost_fn`` builds one). It is its own small module so that the
compiled build (fastpp/_native.py) compiles it: called from the compiled simulator engine, its
``time_s`` takes its five counts as machine integers, with no boxing and no interpreted frame.

The arithmetic is ``time_s``'s, term for term and in the same order, so the floats are the same
(tests/test_profile.py compares them exactly); adding an absent term's 0.0 to a positive time
changes nothing, so leaving it out does not either.

Units: seconds; token counts are plain ints.
"""

from __future__ import annotations


def dense_at(dense: list[float], top: int, slope: float, num_tokens: int) -> float:
    """A ``LinearTable`` at ``num_tokens`` >= 0 from its dense form: ``dense[n]`` up to its last
    point ``top``, extrapolated by ``slope`` past it."""
    if num_tokens <= top:
        return dense[num_tokens]
    return dense[top] + slope * (num_tokens - top)


class StageCostFn:
    """Seconds of one iteration of one stage from a microbatch's token counts."""

    __slots__ = (
        "dense",
        "top",
        "slope",
        "fixed",
        "a_past_x_pre",
        "a_pre_sq",
        "a_dec_ctx",
        "embedding",
        "allreduce_fixed",
        "allreduce_token",
        "has_head",
        "head_dense",
        "head_top",
        "head_slope",
    )

    def __init__(
        self,
        dense: list[float],
        top: int,
        slope: float,
        fixed: float,
        a_past_x_pre: float,
        a_pre_sq: float,
        a_dec_ctx: float,
        embedding: float,
        allreduce_fixed: float,
        allreduce_token: float,
        head: tuple[list[float], int, float] | None,
    ) -> None:
        """``dense``/``top``/``slope``: the linear table's dense values, last point and
        extrapolation slope (``LinearTable``); ``head``: the LM head table's, or None."""
        self.dense = dense
        self.top = top
        self.slope = slope
        self.fixed = fixed
        self.a_past_x_pre = a_past_x_pre
        self.a_pre_sq = a_pre_sq
        self.a_dec_ctx = a_dec_ctx
        self.embedding = embedding
        self.allreduce_fixed = allreduce_fixed
        self.allreduce_token = allreduce_token
        self.has_head = head is not None
        self.head_dense: list[float] = [] if head is None else head[0]
        self.head_top = 0 if head is None else head[1]
        self.head_slope = 0.0 if head is None else head[2]

    def time_s(
        self, num_tokens: int, num_sampled: int, sum_past_x_pre: int, sum_pre_sq: int, sum_dec_ctx: int
    ) -> float:
        """``StageCost.time_s`` of the same counts, the very same float."""
        if num_tokens <= 0:
            return 0.0
        t = (
            dense_at(self.dense, self.top, self.slope, num_tokens)
            + self.fixed
            + self.a_past_x_pre * sum_past_x_pre
            + self.a_pre_sq * sum_pre_sq
            + self.a_dec_ctx * sum_dec_ctx
        )
        if self.embedding:
            t += self.embedding * num_tokens
        if self.allreduce_fixed:
            t += self.allreduce_fixed
        if self.allreduce_token:
            t += self.allreduce_token * num_tokens
        if self.has_head and num_sampled > 0:
            t += dense_at(self.head_dense, self.head_top, self.head_slope, num_sampled)
        return t

    def __call__(
        self, num_tokens: int, num_sampled: int, sum_past_x_pre: int, sum_pre_sq: int, sum_dec_ctx: int
    ) -> float:
        return self.time_s(num_tokens, num_sampled, sum_past_x_pre, sum_pre_sq, sum_dec_ctx)

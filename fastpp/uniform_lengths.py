"""``random:IN:OUT[:RATIO]``: uniform lengths as ``sglang.benchmark.serving --dataset-name random``
draws them: prompt lengths uniform in [max(1, RATIO * IN), IN], outputs in [max(1, RATIO * OUT),
OUT]. RATIO defaults to 0.0, as sglang's ``--random-range-ratio`` (so ``random:256:64`` draws
prompts of 1-256 tokens; ``random:256:64:0.5`` draws 128-256, ``random:256:64:1`` exactly 256).
For servers whose context is too short for the trace-derived workloads, such as small models on CPU."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PREFIX = "random:"
DEFAULT_RANGE_RATIO = 0.0  # sglang's --random-range-ratio default


@dataclass(frozen=True, slots=True)
class UniformLengths:
    max_in: int
    max_out: int
    range_ratio: float = DEFAULT_RANGE_RATIO

    def __post_init__(self) -> None:
        for name in ("max_in", "max_out"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"workload random: {name} must be a positive integer, got {v!r}")
        if not 0.0 <= self.range_ratio <= 1.0:
            raise ValueError(f"workload random: range ratio must be in [0, 1], got {self.range_ratio}")

    @staticmethod
    def parse(name: str) -> UniformLengths:
        """``random:IN:OUT`` or ``random:IN:OUT:RATIO``; ``ValueError`` names the bad part."""
        parts = name[len(PREFIX) :].split(":") if name.startswith(PREFIX) else []
        if len(parts) not in (2, 3):
            raise ValueError(f"workload {name!r}: expected random:IN:OUT or random:IN:OUT:RATIO")
        try:
            ints = int(parts[0]), int(parts[1])
            ratio = float(parts[2]) if len(parts) == 3 else DEFAULT_RANGE_RATIO
        except ValueError:
            raise ValueError(f"workload {name!r}: IN and OUT must be integers, RATIO a number") from None
        return UniformLengths(*ints, ratio)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        def draw(hi: int) -> np.ndarray:
            lo = max(1, int(hi * self.range_ratio))
            return rng.integers(lo, hi + 1, size=n, dtype=np.int64)

        return draw(self.max_in), draw(self.max_out)

    def describe(self) -> str:
        return (
            f"uniform lengths: prompt in [{max(1, int(self.max_in * self.range_ratio))}, {self.max_in}], "
            f"output in [{max(1, int(self.max_out * self.range_ratio))}, {self.max_out}]"
        )

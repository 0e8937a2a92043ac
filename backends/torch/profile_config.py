"""What ``fastpp profile --backend torch`` measures: the grid of microbatch shapes and the run's settings.

Torch-free plain data (like ``config.py``), so the CLI validates a request before loading weights.
Token counts are ints; every shape is checked against the model's context and the KV cap here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fastpp.backends.torch.config import CONFIGS, ModelConfig, get_config

# Token counts the linear table may use, in order; a grid takes those up to its ``max_tokens``.
TOKEN_LADDER: tuple[int, ...] = (
    1,
    8,
    16,
    32,
    64,
    128,
    256,
    512,
    768,
    1024,
    1536,
    2048,
    3072,
    4096,
    6144,
    8192,
)
WEIGHT_SOURCES = ("random", "smollm2")
DTYPES = {"float32": 4, "bfloat16": 2}  # name -> bytes per element


def _positive_ascending(name: str, values: tuple[int, ...], allow_empty: bool = False) -> None:
    if not values and not allow_empty:
        raise ValueError(f"grid.{name} must not be empty")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"grid.{name} must hold positive integers, got {v!r}")
    if list(values) != sorted(set(values)):
        raise ValueError(f"grid.{name} must be strictly ascending, got {values}")


@dataclass(frozen=True, slots=True)
class ProfileGrid:
    """Microbatch shapes measured on every stage (PAPER.md 3.2's ALP features need all four kinds).

    * ``tokens``: one prefill chunk of N tokens and no cached prefix: the linear table's points.
    * ``split_tokens``: N tokens as ``num_splits`` chunks of different requests: same N, smaller
      sum L_pre^2, which separates attention's L_pre^2 term from the table.
    * ``past`` x ``chunks``: a chunk of L_pre tokens after L_past cached ones (sum L_past*L_pre).
    * ``decode_batches`` x ``decode_ctx``: B one-token decodes at contexts spread around a mean L
      (sum L_dec = B*L; spread as in serving, since decode attention pads to the longest).
    * ``sampled``: the last stage's final norm + LM head + greedy argmax on S rows.
    * ``num_holdout``: random mixed microbatches (decodes + a chunk after a prefix, sampling rows
      as in serving), measured end to end and never fitted: the honest error of the profile.
    ``chunks``, ``split_tokens`` and ``decode_batches`` must be points of ``tokens`` (each sample
    then shares its table value with a single-chunk sample, which makes the fit identifiable).
    """

    tokens: tuple[int, ...] = tuple(t for t in TOKEN_LADDER if t <= 1024)
    split_tokens: tuple[int, ...] = (512, 1024)
    num_splits: int = 4
    past: tuple[int, ...] = (256, 2048)
    chunks: tuple[int, ...] = (64, 512)
    decode_batches: tuple[int, ...] = (1, 16, 64)
    decode_ctx: tuple[int, ...] = (256, 1024, 4096)
    sampled: tuple[int, ...] = (1, 4, 16, 64, 256)
    link_tokens: tuple[int, ...] = (1, 64, 512, 2048)  # rows of [T, hidden] sent between processes
    num_holdout: int = 4
    repeats: int = 3  # timed passes over the shapes (runs per shape at least); the median is kept
    min_time_s: float = 0.05  # ...and more runs (up to MAX_RUNS) until they add up to this: short
    # shapes get enough samples for a median that one preempted run cannot move
    warmup: int = 1  # untimed runs first: of a stage's largest shapes, and of each LM head point
    max_kv_tokens: int = 65536  # KV one shape may hold on a stage; larger decode shapes are skipped

    def __post_init__(self) -> None:
        for name in ("tokens", "past", "chunks", "decode_batches", "decode_ctx", "sampled", "link_tokens"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
            _positive_ascending(name, getattr(self, name), allow_empty=name not in ("tokens", "sampled"))
        object.__setattr__(self, "split_tokens", tuple(self.split_tokens))
        _positive_ascending("split_tokens", self.split_tokens, allow_empty=True)
        for name in ("chunks", "split_tokens", "decode_batches"):
            missing = sorted(set(getattr(self, name)) - set(self.tokens))
            if missing:
                raise ValueError(f"grid.{name} values {missing} are not points of grid.tokens {self.tokens}")
        if self.num_splits < 2:
            raise ValueError(f"grid.num_splits must be >= 2, got {self.num_splits}")
        small = [n for n in self.split_tokens if n < 2 * self.num_splits]
        if small:
            raise ValueError(
                f"grid.split_tokens {small} cannot be split into {self.num_splits} chunks of >= 2 tokens each"
            )
        for name, minimum in (("num_holdout", 0), ("repeats", 1), ("warmup", 0), ("max_kv_tokens", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
                raise ValueError(f"grid.{name} must be an integer >= {minimum}, got {v!r}")
        if not 0.0 <= self.min_time_s < 60.0:
            raise ValueError(f"grid.min_time_s must be in [0, 60) seconds, got {self.min_time_s!r}")

    @staticmethod
    def quick() -> ProfileGrid:
        """A coarse grid (about a quarter of the default's time): fewer points, two repeats."""
        return ProfileGrid(
            tokens=(1, 16, 64, 256, 512),
            split_tokens=(512,),
            past=(256, 2048),
            chunks=(64,),
            decode_batches=(1, 16),
            decode_ctx=(256, 2048),
            sampled=(1, 16, 64),
            link_tokens=(1, 512),
            num_holdout=3,
            repeats=2,
        )

    def with_max_tokens(self, max_tokens: int) -> ProfileGrid:
        """The same grid with the linear table's points taken from ``TOKEN_LADDER`` up to
        ``max_tokens`` (plus ``max_tokens`` itself); points of other axes above it are dropped."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        tokens = tuple(sorted({t for t in TOKEN_LADDER if t <= max_tokens} | {max_tokens}))
        return replace(self, tokens=tokens, **self._within(tokens))

    def for_context(self, max_context: int) -> ProfileGrid:
        """The grid shrunk to a model of ``max_context`` positions: token points beyond it
        dropped, prefixes and decode contexts clipped (``grid_shapes`` skips a prefix/chunk pair
        that still does not fit)."""
        tokens = tuple(t for t in self.tokens if t <= max_context) or (max_context,)
        kept = self._within(tokens)
        shortest_chunk = min(kept["chunks"], default=0)
        past = tuple(p for p in sorted({min(p, max_context - shortest_chunk) for p in self.past}) if p > 0)
        ctx = tuple(sorted({min(c, max_context) for c in self.decode_ctx}))
        return replace(self, tokens=tokens, past=past, decode_ctx=ctx, **kept)

    def _within(self, tokens: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        allowed = set(tokens)
        return {
            name: tuple(v for v in getattr(self, name) if v in allowed)
            for name in ("chunks", "split_tokens", "decode_batches")
        }


@dataclass(frozen=True, slots=True)
class TorchProfileConfig:
    """One profiling run of the CPU engine: which model, split, numerics and grid.

    ``model`` is a named config (``CONFIGS``); weights are seeded random (timing does not depend
    on their values) or the real SmolLM2-135M ones. Each stage is measured alone in this process
    with ``num_threads`` intra-op threads, as the engine runs one stage per process; with
    ``concurrent_load`` the other stages compute meanwhile in their own processes (``profile_load``).
    """

    model: str = "smollm2-135m"
    pp: int = 2
    weights: str = "random"  # "random" | "smollm2"
    dtype: str = "float32"  # "float32" | "bfloat16"
    num_threads: int = 1
    kv_capacity_tokens: int = 16384  # the engine's KV pool per stage (its default: 1024 blocks of 16)
    block_size: int = 16  # KV page size in tokens (the engine's block size)
    grid: ProfileGrid = field(default_factory=ProfileGrid)
    measure_link: bool = True  # False: an assumed loopback link (stated in the provenance)
    concurrent_load: bool = False  # True: time each stage while the others loop in their own processes
    seed: int = 0

    def __post_init__(self) -> None:
        if self.model not in CONFIGS:
            raise ValueError(
                f"unknown model {self.model!r} for the torch backend; known: {', '.join(sorted(CONFIGS))}"
            )
        if self.weights not in WEIGHT_SOURCES:
            raise ValueError(f"weights must be one of {WEIGHT_SOURCES}, got {self.weights!r}")
        if self.weights == "smollm2" and self.model != "smollm2-135m":
            raise ValueError(
                f"weights 'smollm2' are SmolLM2-135M's: model must be smollm2-135m, got {self.model!r}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        num_layers = self.model_config.num_layers
        if isinstance(self.pp, bool) or not isinstance(self.pp, int) or not 1 <= self.pp <= num_layers:
            raise ValueError(
                f"pp must be in 1..{num_layers} (the layer count of {self.model}), got {self.pp!r}"
            )
        for name in ("num_threads", "block_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.kv_capacity_tokens < self.block_size:
            raise ValueError(
                f"kv_capacity_tokens must be >= block_size {self.block_size}, got {self.kv_capacity_tokens}"
            )

    @property
    def model_config(self) -> ModelConfig:
        return get_config(self.model)

    @property
    def dtype_bytes(self) -> int:
        return DTYPES[self.dtype]

"""Deployment profiles: the versioned JSON file the simulator reads its costs from.

A profile describes ONE deployment (GPU, interconnect, model, pp, tp): KV capacity, the cost of
one iteration of each pipeline stage, the stage-to-stage link and the host-side overheads. It is
made analytically (``fastpp.sim.analytic``) or measured (torch engine, SGLang) and says which in
``kind`` and ``provenance``.

Units: every duration is in seconds (suffix ``_s``), sizes in bytes, token counts are ints.

Schema (``SCHEMA_VERSION`` 2), top level keys::

    schema_version, name, kind, provenance{str: str}, gpu, interconnect,
    model{name, num_layers, hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size,
          vocab_size, max_context, dtype_bytes, qkv_bias, tie_word_embeddings},
    pp, tp, kv_capacity_tokens, page_size, token_step, host_overhead_s, token_return_s,
    activation_bytes_per_token, link{latency_s, bandwidth_bytes_per_s},
    stages[{num_layers, linear{tokens, seconds}, attn_past_x_pre_s, attn_pre_sq_s,
            attn_dec_ctx_s, fixed_s, embedding_s_per_token, lm_head{tokens, seconds} | null,
            allreduce_fixed_s, allreduce_s_per_token}],
    stage_turnaround_s[per stage]

Every field is required. Version 1 files (no ``stage_turnaround_s``) still load, with every
stage's turnaround 0, which is what the simulator assumed before version 2. Validation raises
:class:`ProfileError` naming the file and the dotted field path (``"qwen.json:
stages[2].linear.seconds: missing field"``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fastpp.stage_cost_fn import StageCostFn, dense_at

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: before stage_turnaround_s (read as zeros)
KINDS = ("analytic", "measured")
# bytes per element of the dtypes model configs and engines name
DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float8_e4m3fn": 1}
# Extrapolation window beyond the end of a LinearTable, in tokens: one A100/H100 GEMM tile
# (128 rows), so extrapolation follows the average slope of the last full step, not a riser.
_EXTRAPOLATION_WINDOW_TOKENS = 128
# Largest last table point accepted, tokens: the dense lookup list costs 8 bytes per token, so
# this caps it at 8 MiB per table; longer batches extrapolate.
MAX_TABLE_TOKENS = 1 << 20


class ProfileError(ValueError):
    """A profile is malformed. ``source`` is the file (or "<dict>"), ``field`` the dotted path."""

    def __init__(self, reason: str, field: str = "", source: str = "") -> None:
        self.reason = reason
        self.field = field
        self.source = source
        parts = [p for p in (source, field) if p]
        super().__init__(": ".join([*parts, reason]))

    def within(self, prefix: str, source: str) -> ProfileError:
        """Return the same error with ``prefix`` prepended to the field path."""
        path = prefix
        if self.field:
            sep = "" if self.field.startswith("[") else "."
            path = f"{prefix}{sep}{self.field}"
        return ProfileError(self.reason, path.lstrip("."), source or self.source)


# --------------------------------------------------------------------------- value checks


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(f"expected an integer, got {type(value).__name__} {value!r}", name)
    if value < minimum:
        raise ProfileError(f"must be >= {minimum}, got {value}", name)


def _check_float(name: str, value: Any, minimum: float = 0.0, strict: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfileError(f"expected a number, got {type(value).__name__} {value!r}", name)
    if not math.isfinite(value):
        raise ProfileError(f"must be finite, got {value!r}", name)
    if value < minimum or (strict and value == minimum):
        op = ">" if strict else ">="
        raise ProfileError(f"must be {op} {minimum}, got {value!r}", name)


def _check_str(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ProfileError(f"expected a non-empty string, got {value!r}", name)


# --------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Shape of a decoder-only transformer (the fields of its HF ``config.json`` that cost time
    or memory). ``dtype_bytes`` is the weight/activation/KV element size (2 for BF16)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_context: int
    dtype_bytes: int = 2
    qkv_bias: bool = False  # Qwen2 family: bias on the q/k/v projections
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix

    def __post_init__(self) -> None:
        _check_str("name", self.name)
        for name in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "dtype_bytes",
        ):
            _check_int(name, getattr(self, name), 1)
        _check_int("max_context", self.max_context, 2)  # a prompt token and an output token
        for name in ("qkv_bias", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ProfileError(f"expected a bool, got {getattr(self, name)!r}", name)
        if self.num_heads % self.num_kv_heads:
            raise ProfileError(
                f"num_heads {self.num_heads} not a multiple of num_kv_heads {self.num_kv_heads}",
                "num_kv_heads",
            )

    @classmethod
    def from_hf_config(
        cls, cfg: dict[str, Any], name: str | None = None, dtype_bytes: int | None = None
    ) -> ModelShape:
        """The shape in a Hugging Face ``config.json`` (as a dict) of a decoder-only model.
        ``dtype_bytes`` defaults to the config's ``torch_dtype`` / ``dtype`` (2 when it names
        none). ProfileError names a missing key or a head count below 1."""
        for key in (
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "intermediate_size",
            "vocab_size",
        ):
            if key not in cfg:
                raise ProfileError("missing key in the model's config.json", key)
        heads = cfg["num_attention_heads"]
        _check_int("num_attention_heads", heads, 1)  # before it divides the hidden size
        if dtype_bytes is None:
            dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
            dtype_bytes = DTYPE_BYTES.get(dtype.removeprefix("torch."), 2)
        return cls(
            name=name or cfg.get("_name_or_path") or cfg.get("model_type") or "model",
            num_layers=cfg["num_hidden_layers"],
            hidden_size=cfg["hidden_size"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate_size=cfg["intermediate_size"],
            vocab_size=cfg["vocab_size"],
            max_context=cfg.get("max_position_embeddings") or 2048,
            dtype_bytes=dtype_bytes,
            qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Any, path: str = "model") -> ModelShape:
        """Build from ``to_dict``'s output; ProfileError names the field under ``path``."""
        return _build(cls, _take(_obj(d, path), _names(cls), path), path)


@dataclass(frozen=True, slots=True)
class LinearTable:
    """Time of token-proportional work against the number of tokens, as a table.

    Contract of :meth:`at`: 0 tokens cost 0.0; between 1 and ``tokens[0]`` the cost is
    ``seconds[0]`` (a GEMM on fewer rows than the smallest point is no cheaper: one tile);
    between table points linear interpolation (points at 128 and 129 keep a step); beyond the
    last point linear extrapolation with the slope over the last 128 tokens of the table (or the
    last two points when the table is shorter; proportional when it has one point).
    ``at`` is O(1): a dense list for every integer 0..tokens[-1] is built at construction.
    """

    tokens: tuple[int, ...]  # strictly ascending, tokens[0] >= 1
    seconds: tuple[float, ...]  # same length, finite, >= 0 (need not be monotone: noise)
    _dense: list[float] = field(init=False, repr=False, compare=False)
    _top: int = field(init=False, repr=False, compare=False)
    _slope: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(self.tokens))
        # JSON may spell 2.0 as 2: store floats (bools stay bools and fail the check below)
        object.__setattr__(self, "seconds", tuple(float(s) if type(s) is int else s for s in self.seconds))
        if not self.tokens:
            raise ProfileError("must have at least one point", "tokens")
        if len(self.seconds) != len(self.tokens):
            raise ProfileError(
                f"length {len(self.seconds)} != length of tokens {len(self.tokens)}", "seconds"
            )
        for i, t in enumerate(self.tokens):
            _check_int(f"tokens[{i}]", t, 1)
            if i and t <= self.tokens[i - 1]:
                raise ProfileError(
                    f"must be strictly ascending, got {self.tokens[i - 1]} then {t}", f"tokens[{i}]"
                )
        for i, s in enumerate(self.seconds):
            _check_float(f"seconds[{i}]", s)
        if self.tokens[-1] > MAX_TABLE_TOKENS:
            raise ProfileError(
                f"last point {self.tokens[-1]} exceeds {MAX_TABLE_TOKENS}", f"tokens[{len(self.tokens) - 1}]"
            )
        dense = [0.0] * (self.tokens[-1] + 1)
        t0, s0 = self.tokens[0], self.seconds[0]
        for n in range(1, t0 + 1):
            dense[n] = s0
        for (ta, sa), (tb, sb) in zip(
            zip(self.tokens, self.seconds, strict=True),
            zip(self.tokens[1:], self.seconds[1:], strict=True),
            strict=False,
        ):
            step = (sb - sa) / (tb - ta)
            for n in range(ta + 1, tb + 1):
                dense[n] = sa + step * (n - ta)
        top = self.tokens[-1]
        if len(self.tokens) == 1:
            slope = s0 / t0
        elif top - _EXTRAPOLATION_WINDOW_TOKENS >= t0:
            slope = (dense[top] - dense[top - _EXTRAPOLATION_WINDOW_TOKENS]) / _EXTRAPOLATION_WINDOW_TOKENS
        else:
            slope = (self.seconds[-1] - self.seconds[-2]) / (top - self.tokens[-2])
        object.__setattr__(self, "_dense", dense)
        object.__setattr__(self, "_top", top)
        object.__setattr__(self, "_slope", max(slope, 0.0))

    def at(self, num_tokens: int) -> float:
        """Seconds for ``num_tokens`` tokens (>= 0). O(1)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return dense_at(self._dense, self._top, self._slope, num_tokens)

    def to_dict(self) -> dict[str, list]:
        return {"tokens": list(self.tokens), "seconds": list(self.seconds)}


@dataclass(frozen=True, slots=True)
class StageCost:
    """Cost of one iteration of one pipeline stage (a TP deployment has one stage, all layers).

    ``time_s`` = linear(tokens) + attention (the ALP features of PAPER.md 3.2, coefficients
    summed over this stage's layers) + fixed + embedding + LM head(sampled) + all-reduce.
    An iteration with 0 tokens costs 0.0 (nothing is launched).
    """

    num_layers: int
    linear: LinearTable  # GEMMs+norms+rope+act+adds of this stage's layers vs microbatch tokens
    attn_past_x_pre_s: float  # s per unit of sum(L_past * L_pre) over prefill chunks
    attn_pre_sq_s: float  # s per unit of sum(L_pre^2)
    attn_dec_ctx_s: float  # s per unit of sum(L_dec) (decode context lengths)
    fixed_s: float  # per-iteration fixed cost (kernel launches etc.)
    embedding_s_per_token: float  # > 0 only on the first stage
    lm_head: LinearTable | None  # last stage only: LM head + sampling vs sampled tokens
    allreduce_fixed_s: float = 0.0  # TP only: latency part of the iteration's all-reduces
    allreduce_s_per_token: float = 0.0  # TP only: bandwidth part, per token

    def __post_init__(self) -> None:
        _check_int("num_layers", self.num_layers, 1)
        if not isinstance(self.linear, LinearTable):
            raise ProfileError(f"expected a LinearTable, got {type(self.linear).__name__}", "linear")
        if self.lm_head is not None and not isinstance(self.lm_head, LinearTable):
            raise ProfileError(
                f"expected a LinearTable or null, got {type(self.lm_head).__name__}", "lm_head"
            )
        for name in (
            "attn_past_x_pre_s",
            "attn_pre_sq_s",
            "attn_dec_ctx_s",
            "fixed_s",
            "embedding_s_per_token",
            "allreduce_fixed_s",
            "allreduce_s_per_token",
        ):
            _check_float(name, getattr(self, name))

    def time_s(
        self, num_tokens: int, num_sampled: int, sum_past_x_pre: int, sum_pre_sq: int, sum_dec_ctx: int
    ) -> float:
        """Seconds of one iteration of this stage on a microbatch of ``num_tokens`` tokens of
        which ``num_sampled`` produce logits. Pure Python arithmetic (hot path)."""
        if num_tokens <= 0:
            return 0.0
        t = (
            self.linear.at(num_tokens)
            + self.fixed_s
            + self.attn_past_x_pre_s * sum_past_x_pre
            + self.attn_pre_sq_s * sum_pre_sq
            + self.attn_dec_ctx_s * sum_dec_ctx
            + self.embedding_s_per_token * num_tokens
            + self.allreduce_fixed_s
            + self.allreduce_s_per_token * num_tokens
        )
        if self.lm_head is not None and num_sampled > 0:
            t += self.lm_head.at(num_sampled)
        return t

    def cost_fn(self) -> StageCostFn:
        """:meth:`time_s` for a hot loop (the simulator calls it per stage and microbatch): the
        same arithmetic in the same order, so the same floats, on the tables' dense form
        (``dense_at``) and with the terms this stage does not have (zero coefficients) left
        out: adding 0.0 to a positive time changes nothing (fastpp/stage_cost_fn.py, compiled
        with the simulator)."""
        head = self.lm_head
        return StageCostFn(
            self.linear._dense,
            self.linear._top,
            self.linear._slope,
            self.fixed_s,
            self.attn_past_x_pre_s,
            self.attn_pre_sq_s,
            self.attn_dec_ctx_s,
            self.embedding_s_per_token,
            self.allreduce_fixed_s,
            self.allreduce_s_per_token,
            None if head is None else (head._dense, head._top, head._slope),
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            d[f.name] = v.to_dict() if isinstance(v, LinearTable) else v
        return d


@dataclass(frozen=True, slots=True)
class LinkCost:
    """Alpha-beta cost of moving bytes from one stage to the next (also the scheduler's
    broadcast): ``latency_s + num_bytes / bandwidth_bytes_per_s``."""

    latency_s: float
    bandwidth_bytes_per_s: float

    def __post_init__(self) -> None:
        _check_float("latency_s", self.latency_s)
        _check_float("bandwidth_bytes_per_s", self.bandwidth_bytes_per_s, strict=True)

    def time_s(self, num_bytes: int) -> float:
        """Seconds to send ``num_bytes`` (0 bytes cost nothing: no message is sent)."""
        if num_bytes <= 0:
            return 0.0
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True, slots=True)
class Profile:
    """One deployment's cost model. See the module docstring for the JSON schema.

    Invariants: ``len(stages) == pp``; stage layers sum to ``model.num_layers``; only the first
    stage has embedding cost and only the last an LM head; ``kv_capacity_tokens`` is the KV pool
    of the whole deployment (the minimum over stages, since every stage holds every token).
    """

    name: str
    kind: str  # "analytic" | "measured"
    provenance: dict[str, str]  # source, created_at, tool, notes, calibration error, ...
    gpu: str  # e.g. "A100-40GB-PCIe"
    interconnect: str  # "pcie4" | "nvlink3" | "nvlink4" | "loopback" ...
    model: ModelShape
    pp: int
    tp: int
    kv_capacity_tokens: int  # tokens the KV pool holds for the deployment (min over stages)
    page_size: int  # KV page size in tokens
    token_step: int  # tile step in tokens seen in the linear tables (128 on A100/H100); 0 = none
    host_overhead_s: float  # scheduler/host time per iteration before launch
    token_return_s: float  # last stage -> scheduler hand-back of sampled tokens, per microbatch
    activation_bytes_per_token: int  # bytes crossing a stage boundary per token
    link: LinkCost
    stages: tuple[StageCost, ...]  # len == pp
    # Per stage: time the stage's worker spends on each microbatch outside its recorded compute
    # and not overlapped with it (receiving and preparing the next input, sampling and sending
    # the output), during which it takes no new microbatch; () = 0 on every stage.
    stage_turnaround_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))
        for name in ("name", "gpu", "interconnect"):
            _check_str(name, getattr(self, name))
        if self.kind not in KINDS:
            raise ProfileError(f"must be one of {KINDS}, got {self.kind!r}", "kind")
        if not isinstance(self.provenance, dict):
            raise ProfileError("expected an object of strings", "provenance")
        for k, v in self.provenance.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ProfileError(f"expected a string, got {v!r}", f"provenance.{k}")
        if not isinstance(self.model, ModelShape):
            raise ProfileError("expected a ModelShape", "model")
        for name, minimum in (
            ("pp", 1),
            ("tp", 1),
            ("kv_capacity_tokens", 1),
            ("page_size", 1),
            ("token_step", 0),
            ("activation_bytes_per_token", 1),
        ):
            _check_int(name, getattr(self, name), minimum)
        if self.page_size > self.kv_capacity_tokens:
            raise ProfileError(
                f"{self.page_size} tokens is more than kv_capacity_tokens {self.kv_capacity_tokens}: "
                "the KV pool must hold at least one page",
                "page_size",
            )
        _check_float("host_overhead_s", self.host_overhead_s)
        _check_float("token_return_s", self.token_return_s)
        if not isinstance(self.link, LinkCost):
            raise ProfileError("expected a LinkCost", "link")
        if len(self.stages) != self.pp:
            raise ProfileError(f"has {len(self.stages)} stages but pp is {self.pp}", "stages")
        for i, stage in enumerate(self.stages):
            if not isinstance(stage, StageCost):
                raise ProfileError("expected a StageCost", f"stages[{i}]")
            if i < self.pp - 1 and stage.lm_head is not None:
                raise ProfileError("only the last stage has an LM head", f"stages[{i}].lm_head")
            if i > 0 and stage.embedding_s_per_token > 0:
                raise ProfileError(
                    "only the first stage has an embedding", f"stages[{i}].embedding_s_per_token"
                )
        object.__setattr__(self, "stage_turnaround_s", tuple(self.stage_turnaround_s) or (0.0,) * self.pp)
        if len(self.stage_turnaround_s) != self.pp:
            raise ProfileError(
                f"has {len(self.stage_turnaround_s)} values but pp is {self.pp}", "stage_turnaround_s"
            )
        for i, t in enumerate(self.stage_turnaround_s):
            _check_float(f"stage_turnaround_s[{i}]", t)
        total = sum(s.num_layers for s in self.stages)
        if total != self.model.num_layers:
            raise ProfileError(
                f"stage layers sum to {total} but model.num_layers is {self.model.num_layers}", "stages"
            )

    # ----------------------------------------------------------------------- (de)serialise

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict, ``schema_version`` first."""
        return {
            "schema_version": SCHEMA_VERSION,
            "name": self.name,
            "kind": self.kind,
            "provenance": dict(self.provenance),
            "gpu": self.gpu,
            "interconnect": self.interconnect,
            "model": self.model.to_dict(),
            "pp": self.pp,
            "tp": self.tp,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "page_size": self.page_size,
            "token_step": self.token_step,
            "host_overhead_s": self.host_overhead_s,
            "token_return_s": self.token_return_s,
            "activation_bytes_per_token": self.activation_bytes_per_token,
            "link": {
                "latency_s": self.link.latency_s,
                "bandwidth_bytes_per_s": self.link.bandwidth_bytes_per_s,
            },
            "stages": [s.to_dict() for s in self.stages],
            "stage_turnaround_s": list(self.stage_turnaround_s),
        }

    @classmethod
    def from_dict(cls, d: Any, source: str = "<dict>") -> Profile:
        """Build and validate a profile; raise :class:`ProfileError` naming ``source`` and the
        dotted path of the first bad field."""
        try:
            return _profile_from_dict(d)
        except ProfileError as e:
            raise e.within("", source) from None


def _obj(d: Any, path: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ProfileError(f"expected an object, got {type(d).__name__}", path)
    return d


def _take(d: dict[str, Any], names: tuple[str, ...], path: str) -> dict[str, Any]:
    """Pick ``names`` from ``d`` (all required); unknown keys are an error too."""
    for name in names:
        if name not in d:
            raise ProfileError("missing field", f"{path}.{name}".lstrip("."))
    extra = sorted(set(d) - set(names))
    if extra:
        raise ProfileError("unknown field", f"{path}.{extra[0]}".lstrip("."))
    return {name: d[name] for name in names}


def _build(ctor: Any, kwargs: dict[str, Any], path: str) -> Any:
    try:
        return ctor(**kwargs)
    except ProfileError as e:
        raise e.within(path, "") from None


def _table_from_dict(d: Any, path: str) -> LinearTable:
    kw = _take(_obj(d, path), ("tokens", "seconds"), path)
    for key in ("tokens", "seconds"):
        if not isinstance(kw[key], list):
            raise ProfileError(f"expected a list, got {type(kw[key]).__name__}", f"{path}.{key}")
    return _build(LinearTable, kw, path)


def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls) if f.init)


def _profile_from_dict(d: Any) -> Profile:
    d = _obj(d, "")
    if "schema_version" not in d:
        raise ProfileError("missing field", "schema_version")
    version = d["schema_version"]
    if version not in READABLE_VERSIONS:
        raise ProfileError(
            f"unsupported version {version!r}, this fastpp reads {', '.join(map(str, READABLE_VERSIONS))}",
            "schema_version",
        )
    names = _names(Profile)
    if version == 1:
        names = tuple(n for n in names if n != "stage_turnaround_s")
    kw = _take({k: v for k, v in d.items() if k != "schema_version"}, names, "")
    if "stage_turnaround_s" in kw and not isinstance(kw["stage_turnaround_s"], list):
        raise ProfileError(
            f"expected a list, got {type(kw['stage_turnaround_s']).__name__}", "stage_turnaround_s"
        )
    kw["model"] = ModelShape.from_dict(kw["model"])
    kw["link"] = _build(LinkCost, _take(_obj(kw["link"], "link"), _names(LinkCost), "link"), "link")
    if not isinstance(kw["stages"], list):
        raise ProfileError(f"expected a list, got {type(kw['stages']).__name__}", "stages")
    stages = []
    for i, sd in enumerate(kw["stages"]):
        path = f"stages[{i}]"
        skw = _take(_obj(sd, path), _names(StageCost), path)
        skw["linear"] = _table_from_dict(skw["linear"], f"{path}.linear")
        if skw["lm_head"] is not None:
            skw["lm_head"] = _table_from_dict(skw["lm_head"], f"{path}.lm_head")
        stages.append(_build(StageCost, skw, path))
    kw["stages"] = tuple(stages)
    return _build(Profile, kw, "")


# --------------------------------------------------------------------------- files


def _dumps(value: Any, indent: int = 0) -> str:
    """JSON with objects indented and lists of scalars on one line (tables stay readable)."""
    pad = "  " * (indent + 1)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{pad}{json.dumps(k)}: {_dumps(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * indent + "}"
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        items = [f"{pad}{_dumps(v, indent + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + "\n" + "  " * indent + "]"
    return json.dumps(value, allow_nan=False)


def save_profile(profile: Profile, path: str | Path) -> None:
    """Write ``profile`` as JSON to ``path`` (parent directories are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_dumps(profile.to_dict()) + "\n", encoding="utf-8")


MAX_JSON_DEPTH = 64  # a profile nests 4 levels; Python's JSON parser fails near 1,000


def json_depth_error(text: str, limit: int = MAX_JSON_DEPTH) -> str | None:
    """Where ``text`` (JSON) first nests deeper than ``limit`` arrays and objects: "line N,
    column M", or None. Strings are skipped, so brackets inside them do not count."""
    depth, line, col, in_string, escaped = 0, 1, 0, False, False
    for ch in text:
        col += 1
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return f"line {line}, column {col}"
        elif ch in "]}":
            depth -= 1
        if ch == "\n":
            line, col = line + 1, 0
    return None


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file; errors name the file and the field (or the line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ProfileError(
            f"not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): not a profile JSON file",
            "",
            path.name,
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProfileError(f"not valid JSON: {e}", "", path.name) from None
    except RecursionError:  # a crafted or broken file: say where, not Python's parser error
        where = json_depth_error(text) or "somewhere"
        raise ProfileError(
            f"nested more than {MAX_JSON_DEPTH} levels deep at {where}", "", path.name
        ) from None
    return Profile.from_dict(data, source=path.name)

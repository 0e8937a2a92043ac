"""What ran a recorded run: the ``setup`` object every executor writes into its run folder's
summary.json, so a run can be turned into a profile (``fastpp.records_profile``) and replayed in
the simulator under the same scheduler settings.

    "setup": {"engine": "vllm 0.32.0", "device": "CPU", "pp": 2, "tp": 1,
              "model": {ModelShape fields} | null, "layers_per_stage": [15, 15] | null,
              "dtype": "float32" | null, "policy": "static",
              "scheduler": {SchedulerConfig fields; slo as {"ttft_s", "tpot_s"}}}

KV capacity and page size are the scheduler's (``scheduler.kv_capacity_tokens``,
``scheduler.page_size``): the pool the policies saw. Reading raises :class:`SetupError` naming
the file and the dotted field.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from fastpp.profile import ModelShape, ProfileError
from fastpp.scheduler_config import SchedulerConfig
from fastpp.types import SLO

SETUP_KEY = "setup"


class SetupError(ValueError):
    """A summary's ``setup`` lacks a field or has a bad one; the message names file and field."""


@dataclass(frozen=True, slots=True)
class RunSetup:
    """The deployment and scheduler settings of one recorded run."""

    engine: str  # who executed: "fastpp-torch", "fastpp-sim", "vllm 0.32.0", "sglang 0.5.23"
    device: str  # "CPU" or the accelerator's name
    pp: int
    tp: int
    policy: str  # the policy spec the run used
    scheduler: SchedulerConfig  # the limits the policies saw (KV pool, page, candidates, SLO...)
    model: ModelShape | None = None  # None when the executor could not tell
    layers_per_stage: tuple[int, ...] | None = None
    dtype: str | None = None  # weights / activations dtype

    def __post_init__(self) -> None:
        if self.pp < 1 or self.tp < 1:
            raise SetupError(f"pp and tp must be >= 1, got pp={self.pp} tp={self.tp}")
        if self.layers_per_stage is not None:
            object.__setattr__(self, "layers_per_stage", tuple(self.layers_per_stage))
            if len(self.layers_per_stage) != self.pp:
                raise SetupError(f"layers_per_stage {list(self.layers_per_stage)} needs pp={self.pp} entries")

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "device": self.device,
            "pp": self.pp,
            "tp": self.tp,
            "model": None if self.model is None else self.model.to_dict(),
            "layers_per_stage": None if self.layers_per_stage is None else list(self.layers_per_stage),
            "dtype": self.dtype,
            "policy": self.policy,
            "scheduler": scheduler_config_to_dict(self.scheduler),
        }

    @classmethod
    def from_summary(cls, summary: Any, source: str | Path = "summary.json") -> RunSetup:
        """The setup in a run's summary dict; SetupError naming ``source`` and the field."""

        def fail(field: str, reason: str) -> SetupError:
            return SetupError(f"{source}: {field}: {reason}")

        if not isinstance(summary, dict):
            raise fail("(top level)", "expected a JSON object")
        d = summary.get(SETUP_KEY)
        if d is None:
            raise fail(
                SETUP_KEY,
                "missing field (the run was recorded by an executor that does not write "
                "its setup; record it again with this fastpp)",
            )
        if not isinstance(d, dict):
            raise fail(SETUP_KEY, f"expected an object, got {type(d).__name__}")
        for key in ("engine", "device", "pp", "tp", "policy", "scheduler"):
            if key not in d:
                raise fail(f"{SETUP_KEY}.{key}", "missing field")
        model = None
        if d.get("model") is not None:
            try:
                model = ModelShape.from_dict(d["model"], "model")
            except ProfileError as e:
                raise fail(f"{SETUP_KEY}.{e.field}", e.reason) from None
        try:
            scheduler = scheduler_config_from_dict(d["scheduler"])
        except SetupError as e:  # its text starts with the field's name
            raise SetupError(f"{source}: {SETUP_KEY}.scheduler.{e}") from None
        except (TypeError, ValueError) as e:
            raise fail(f"{SETUP_KEY}.scheduler", str(e)) from None
        for key in ("pp", "tp"):
            if isinstance(d[key], bool) or not isinstance(d[key], int):
                raise fail(f"{SETUP_KEY}.{key}", f"expected an integer, got {d[key]!r}")
        try:
            return cls(
                engine=str(d["engine"]),
                device=str(d["device"]),
                pp=d["pp"],
                tp=d["tp"],
                policy=str(d["policy"]),
                scheduler=scheduler,
                model=model,
                layers_per_stage=d.get("layers_per_stage"),
                dtype=d.get("dtype"),
            )
        except SetupError as e:
            raise fail(SETUP_KEY, str(e)) from None


def scheduler_config_to_dict(config: SchedulerConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(value, SLO):
            value = {"ttft_s": value.ttft_s, "tpot_s": value.tpot_s}
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def scheduler_config_from_dict(d: Any) -> SchedulerConfig:
    """Inverse of :func:`scheduler_config_to_dict`; a missing field raises SetupError whose
    text is the field's name, a bad value ValueError (SchedulerConfig's own checks)."""
    if not isinstance(d, dict):
        raise ValueError(f"expected an object, got {type(d).__name__}")
    kwargs: dict[str, Any] = {}
    for f in fields(SchedulerConfig):
        if f.name not in d:
            raise SetupError(f"{f.name}: missing field")
        kwargs[f.name] = d[f.name]
    slo = kwargs["slo"]
    if not isinstance(slo, dict) or set(slo) != {"ttft_s", "tpot_s"}:
        raise ValueError(f'slo must be {{"ttft_s": s, "tpot_s": s}}, got {slo!r}')
    kwargs["slo"] = SLO(float(slo["ttft_s"]), float(slo["tpot_s"]))
    kwargs["chunk_candidates"] = tuple(kwargs["chunk_candidates"])
    return SchedulerConfig(**kwargs)

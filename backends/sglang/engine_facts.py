"""What the SGLang adapter reads of SGLang's own objects outside the decision: its finish
reasons (mapped explicitly to fastpp's ``FinishReason``) and the deployment a recorded run ran
on (``fastpp.run_setup``)."""

from __future__ import annotations

import logging
from typing import Any

from fastpp.profile import DTYPE_BYTES, ModelShape
from fastpp.run_setup import RunSetup
from fastpp.scheduler_config import SchedulerConfig
from fastpp.types import FinishReason

log = logging.getLogger("fastpp.sglang")

# SGLang 0.5.23's finish reasons (managers/schedule_batch.py, by class name) -> ours
_FINISHED: dict[str, tuple[FinishReason, str]] = {
    "FINISH_LENGTH": (FinishReason.LENGTH, ""),
    "FINISH_MATCHED_TOKEN": (FinishReason.STOP, ""),
    "FINISH_MATCHED_STR": (FinishReason.STOP, "stop string"),
    "FINISHED_MATCHED_REGEX": (FinishReason.STOP, "stop regex"),
    "FINISH_ABORT": (FinishReason.ABORTED, "aborted by SGLang"),
}


def finish_reason_of(reason: Any) -> tuple[FinishReason, str]:
    """Our reason (and a detail) for a finished SGLang request's ``finished_reason``."""
    if reason is None:
        return FinishReason.ABORTED, "SGLang gave no finish reason"
    name = type(reason).__name__
    found = _FINISHED.get(name)
    if found is None:
        return FinishReason.ABORTED, f"SGLang finish reason {name}"
    if found[0] is FinishReason.ABORTED and getattr(reason, "message", None):
        return found[0], str(reason.message)
    return found


def run_setup(sched: Any, policy: str, config: SchedulerConfig, pp_size: int) -> RunSetup | None:
    """What the recorded run ran on (fastpp.run_setup, for ``fastpp profile --from-records``):
    the model's shape from SGLang's HF config, layers per stage as SGLang places them. None (and a
    warning) if SGLang's objects do not have what is read here: records must never stop serving."""
    try:
        import sglang
        from sglang.srt.distributed.utils import get_pp_indices

        mc = sched.model_config
        dtype = str(mc.dtype).removeprefix("torch.")
        name = str(getattr(sched.server_args, "served_model_name", None) or sched.server_args.model_path)
        model = ModelShape.from_hf_config(
            mc.hf_config.to_dict(), name=name.rstrip("/").split("/")[-1], dtype_bytes=DTYPE_BYTES.get(dtype)
        )
        spans = (get_pp_indices(model.num_layers, r, pp_size) for r in range(pp_size))
        layers = tuple(b - a for a, b in spans)
        device = str(getattr(sched, "device", "") or sched.server_args.device)
        return RunSetup(
            engine=f"sglang {sglang.__version__}",
            device="CPU" if device == "cpu" else device.upper(),
            pp=pp_size,
            tp=1,
            policy=policy,
            scheduler=config,
            model=model,
            layers_per_stage=layers,
            dtype=dtype,
        )
    except Exception as exc:  # noqa: BLE001 (any SGLang-side surprise: serve on, without the setup)
        log.warning("fastpp: the run's setup is not recorded (%s: %s)", type(exc).__name__, exc)
        return None

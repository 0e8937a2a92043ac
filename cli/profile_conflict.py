"""A ``--profile`` fixes the model and GPU; a ``-m`` / ``--gpu`` that names others is an error
naming both, never silently ignored (asking for Qwen2.5-72B on A100 must not give the profile's
Llama-8B on H100). Shared by the commands that take both."""

from __future__ import annotations

from typing import Any

from fastpp.cli.common import fail


def model_and_gpu(deployment: Any) -> tuple[str, str]:
    """The model and GPU a deployment really runs: its profile's when it has one."""
    if deployment.profile_path is None:
        return deployment.model, deployment.gpu
    profile = deployment.load_profile()
    return profile.model.name, str(profile.gpu)


def check_profile_against(profile: str | None, model: str | None, gpu: str | None, deployment: Any) -> None:
    """Fail naming ``--profile`` and the flag when ``model`` or ``gpu`` (as given, or None when
    not given) differ from the profile's; a name the resolvers map to the profile's is no
    conflict."""
    if profile is None or (model is None and gpu is None):
        return
    from fastpp.sim.hardware import resolve_gpu
    from fastpp.sim.models import resolve_model

    actual_model, actual_gpu = model_and_gpu(deployment)
    conflicts = []
    for flag, asked, resolve, actual in (
        ("-m/--model", model, resolve_model, actual_model),
        ("--gpu", gpu, resolve_gpu, actual_gpu),
    ):
        if asked is None:
            continue
        try:
            name = resolve(asked).name
        except (ValueError, KeyError):
            name = asked
        if actual.lower() not in (name.lower(), asked.lower()):
            conflicts.append((flag, f"{flag} {asked} (the profile's is {actual})"))
    if conflicts:
        fail(
            f"--profile {profile} is {actual_model} on {actual_gpu}; it conflicts with "
            f"{' and '.join(text for _, text in conflicts)}: drop "
            f"{' and '.join(flag for flag, _ in conflicts)}, or pass a profile measured for that "
            f"model and GPU"
        )

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
    actual_model, actual_gpu = model_and_gpu(deployment)
    check_names_against(
        profile, actual_model, actual_gpu, [] if model is None else [model], [] if gpu is None else [gpu]
    )


def profile_model_and_gpu(profile: str) -> tuple[str, str]:
    """The model and GPU a profile file (or a shipped profile's name) was made for."""
    from fastpp.profile import load_profile
    from fastpp.profile_names import resolve_profile

    loaded = load_profile(resolve_profile(profile))
    return loaded.model.name, str(loaded.gpu)


def check_names_against(
    profile: str, actual_model: str, actual_gpu: str, models: list[str], gpus: list[str]
) -> None:
    """Fail naming ``--profile`` and each ``-m`` / ``--gpu`` value that is not the profile's
    ``actual_model`` / ``actual_gpu`` (names the resolvers map to the profile's are no conflict)."""
    from fastpp.sim.hardware import resolve_gpu
    from fastpp.sim.models import resolve_model

    conflicts = []
    for flag, asked_values, resolve, actual in (
        ("-m/--model", models, resolve_model, actual_model),
        ("--gpu", gpus, resolve_gpu, actual_gpu),
    ):
        for asked in asked_values:
            try:
                name = resolve(asked).name
            except (ValueError, KeyError):
                name = asked
            if actual.lower() not in (name.lower(), asked.lower()):
                conflicts.append((flag, f"{flag} {asked} (the profile's is {actual})"))
    if conflicts:
        flags = " and ".join(dict.fromkeys(flag for flag, _ in conflicts))
        fail(
            f"--profile {profile} is {actual_model} on {actual_gpu}; it conflicts with "
            f"{' and '.join(text for _, text in conflicts)}: drop {flags}, or pass a profile "
            f"measured for that model and GPU"
        )

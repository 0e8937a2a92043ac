"""Writing a simulation run to disk: one run folder per deployment (fastpp.run_files), named by
the deployment's run id, so simulated and recorded real runs share one format."""

from __future__ import annotations

from pathlib import Path

from fastpp.run_files import Submit, write_run
from fastpp.sim.run import SimulationRun


def write_simulation(
    run: SimulationRun,
    out_dir: Path,
    *,
    timeline: bool = True,
    submit: Submit | None = None,
    table_format: str = "text",
) -> dict[str, Path]:
    """Write ``run`` into ``out_dir / run.deployment.run_id``; returns the paths by kind
    (``submit``, ``table_format``: see ``fastpp.run_files.write_run``)."""
    names = [f"stage {i} ({s.num_layers} layers)" for i, s in enumerate(run.profile.stages)]
    return write_run(
        out_dir / run.deployment.run_id,
        run.result.records,
        run.result.iterations,
        run.summary,
        stage_names=names,
        timeline=timeline,
        submit=submit,
        table_format=table_format,
    )

"""Writing a simulation run to disk: summary JSON, request records, iterations, timeline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastpp.metrics import json_safe, write_iterations_csv, write_records_jsonl
from fastpp.sim.run import SimulationRun
from fastpp.sim.timeline import write_chrome_trace


def write_json(obj: Any, path: Path) -> Path:
    path.write_text(json.dumps(json_safe(obj), indent=2) + "\n")
    return path


def write_run(run: SimulationRun, out_dir: Path, *, timeline: bool = True) -> dict[str, Path]:
    """Write one deployment's outputs under ``out_dir`` with its label as file prefix."""
    out_dir.mkdir(parents=True, exist_ok=True)
    label = run.deployment.run_id
    paths = {
        "summary": write_json(run.summary, out_dir / f"{label}_summary.json"),
        "records": write_records_jsonl(run.result.records, out_dir / f"{label}_requests.jsonl"),
    }
    if run.result.iterations:
        paths["iterations"] = write_iterations_csv(
            run.result.iterations, out_dir / f"{label}_iterations.csv"
        )
        if timeline:
            names = [f"stage {i} ({s.num_layers} layers)" for i, s in enumerate(run.profile.stages)]
            paths["timeline"] = write_chrome_trace(
                run.result.iterations, out_dir / f"{label}_timeline.json", stage_names=names
            )
    return paths

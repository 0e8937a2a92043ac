"""Measured stage times of a real run against what its profile predicts for the same microbatches.

    fastpp serve --model smollm2 --pp 2 --record-dir runs/real    # then load it, e.g.
    fastpp bench --port 8000 -w random:256:64:0.5 -n 30 -r 0.5       # and stop the server (Ctrl-C)
    python benchmarks/stage_times_vs_profile.py runs/real profiles/cpu_smollm2-135m_pp2.json

Reads ``iterations.csv`` (one row per stage per microbatch, measured by the engine) and prints,
per stage, the mean measured and predicted time and the median ratio measured / predicted; then
the hand-off delay from one stage's end to the next stage's start of the same microbatch. The
iteration rows do not say how many rows were sampled, so the LM head is predicted for the decodes
plus one completing prompt when the microbatch holds prefill (an approximation).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from fastpp.profile import load_profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("record_dir", type=Path)
    ap.add_argument("profile", type=Path)
    args = ap.parse_args()
    profile = load_profile(args.profile)
    rows = list(csv.DictReader((args.record_dir / "iterations.csv").open()))
    if not rows:
        raise SystemExit(f"{args.record_dir / 'iterations.csv'} has no iterations")
    by_stage: dict[int, list[tuple[float, float]]] = {}
    spans: dict[str, dict[int, tuple[float, float]]] = {}
    for r in rows:
        stage = int(r["stage"])
        if stage >= len(profile.stages):
            raise SystemExit(f"iteration of stage {stage}, but the profile has {len(profile.stages)} stages")
        start, end = float(r["started_at"]), float(r["finished_at"])
        sampled = int(r["num_decode_reqs"]) + (1 if int(r["num_prefill_tokens"]) else 0)
        predicted = profile.stages[stage].time_s(
            int(r["num_tokens"]),
            sampled,
            int(r["sum_past_x_pre"]),
            int(r["sum_pre_sq"]),
            int(r["sum_dec_ctx"]),
        )
        by_stage.setdefault(stage, []).append((end - start, predicted))
        spans.setdefault(r["mb_id"], {})[stage] = (start, end)
    print(f"{len(spans)} microbatches from {args.record_dir}; profile {args.profile}")
    for stage, pairs in sorted(by_stage.items()):
        measured, predicted = np.array(pairs).T
        print(
            f"stage {stage}: measured mean {measured.mean() * 1e3:.1f} ms, "
            f"predicted {predicted.mean() * 1e3:.1f} ms, "
            f"median measured/predicted {np.median(measured / predicted):.2f}"
        )
    for stage in sorted(by_stage)[:-1]:
        gaps = [s[stage + 1][0] - s[stage][1] for s in spans.values() if stage in s and stage + 1 in s]
        print(
            f"stage {stage} end -> stage {stage + 1} start: median {np.median(gaps) * 1e3:.1f} ms, "
            f"p90 {np.percentile(gaps, 90) * 1e3:.1f} ms (link plus waiting for the stage to free up)"
        )


if __name__ == "__main__":
    main()

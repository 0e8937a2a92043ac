"""Notebook-style what-if through the public API: PP=4 with the best static chunk against PP=4
with the predictive policy, same requests, then their TTFT and TPOT distributions side by side.

Run: ``python examples/compare_deployments.py [OUT.png]`` (needs matplotlib: ``fastpp[plots]``).
"""

from __future__ import annotations

import sys

import numpy as np

from fastpp import DeploymentConfig, WorkloadConfig, run_simulation

# %% Simulate: 400 Azure-conversation requests at 4 req/s on 4 x A100-40GB (PCIe), Qwen2.5-32B.
workload = WorkloadConfig(name="azure-conv", rate=4.0, num_requests=400, seed=0)
runs = {
    policy: run_simulation(workload, DeploymentConfig(pp=4, policy=policy), record_iterations=False)
    for policy in ("static:512", "predictive")
}
for policy, run in runs.items():
    s = run.summary
    print(
        f"{policy:>11}: P90 TTFT {s['p90_ttft_ms']:7.1f} ms, P90 TPOT {s['p90_tpot_ms']:6.1f} ms, "
        f"SLO met: {s['slo_met']}"
    )

# %% Plot the two latency CDFs from the per-request records.
import matplotlib  # noqa: E402  (optional dependency, needed from here on)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
for ax, metric in zip(axes, ("ttft_s", "tpot_s"), strict=True):
    for policy, run in runs.items():
        values = np.sort([v * 1e3 for r in run.result.records if (v := getattr(r, metric)) is not None])
        ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=policy)
    ax.set_xlabel(f"{metric.removesuffix('_s').upper()} (ms)")
    ax.set_ylabel("share of requests")
    ax.legend()
fig.tight_layout()
out = sys.argv[1] if len(sys.argv) > 1 else "latency_cdfs.png"
fig.savefig(out, dpi=120)
print(f"wrote {out}")

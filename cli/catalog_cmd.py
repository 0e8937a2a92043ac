"""``fastpp workloads`` and ``fastpp policies``: what a user can name."""

from __future__ import annotations

from typing import Annotated

import typer

from fastpp.cli.common import console, fail
from fastpp.cli.render import workloads_table


def workloads(
    data_dir: Annotated[str | None, typer.Option(help="Folder with the real traces.")] = None,
    samples: Annotated[int, typer.Option(help="Samples drawn per workload for the statistics.")] = 20000,
) -> None:
    """List the built-in workloads with their length statistics."""
    from fastpp.workloads import MAX_REQUESTS, WORKLOADS, WorkloadError, workload_stats

    if not 1 <= samples <= MAX_REQUESTS:
        fail(f"--samples must be in [1, {MAX_REQUESTS:,}], got {samples:,}")

    rows, missing = [], []
    for name in WORKLOADS:
        try:
            rows.append(workload_stats(name, n=samples, data_dir=data_dir))
        except WorkloadError as exc:
            missing.append(f"{name}: {exc}")
    console.print(workloads_table(rows, samples))
    for line in missing:
        console.print(f"[yellow]unavailable[/] {line}")


def policies() -> None:
    """List the chunk policies and decode balancers a --policy spec can name."""
    from rich.table import Table

    from fastpp.policies import BALANCERS, POLICIES

    for title, table_src in (("chunk policies", POLICIES), ("decode balancers (after +)", BALANCERS)):
        table = Table(title=title, title_justify="left")
        for col in ("name", "what it is", "optional :ARG"):
            table.add_column(col)
        for name, info in table_src.items():
            table.add_row(name, info.summary, info.argument or "-")
        console.print(table)
    console.print("spec: NAME[:ARG][+BALANCER[:ARG]], e.g. static:512, greedy:p90, predictive+ds")

"""The ``fastpp`` command line: one Typer app, every command registered here explicitly.

Command modules define plain functions (no import of this module, so no import cycle); each
parses options, builds a config and calls the library. Defaults live in the config dataclasses
(an option left unset takes the dataclass default). Help is plain text (``rich_markup_mode=None``)
so option help such as ``[default: 4.0]`` or ``fastpp[bench]`` shows as written.
"""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from fastpp.cli import (
    bench_cmd,
    cache_cmd,
    catalog_cmd,
    goodput_cmd,
    plan_cmd,
    plot_cmd,
    profile_cmd,
    serve_cmd,
    simulate_cmd,
    sweep_cmd,
)
from fastpp.cli.common import run_app

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="FastPP: pipeline-parallel LLM serving policies, simulator and backends.",
)

app.command("simulate")(simulate_cmd.simulate)
app.command("goodput")(goodput_cmd.goodput)
app.command("sweep")(sweep_cmd.sweep)
app.command("plan")(plan_cmd.plan)
app.command("plot")(plot_cmd.plot)
app.command("workloads")(catalog_cmd.workloads)
app.command("policies")(catalog_cmd.policies)
app.command("profile")(profile_cmd.profile)
# sglang / vllm: what follows fastpp's own options goes to the engine's server
app.command("serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    serve_cmd.serve
)
app.command("bench", help=bench_cmd.HELP, context_settings={"allow_extra_args": True})(bench_cmd.bench)
app.command("cache")(cache_cmd.cache)


def _print_version(value: bool) -> None:
    if value:
        from fastpp import __version__

        typer.echo(f"fastpp {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """FastPP: pipeline-parallel LLM serving policies, simulator and backends."""


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    run_app(app)  # a MemoryError or RecursionError: one line, no traceback


if __name__ == "__main__":
    main()

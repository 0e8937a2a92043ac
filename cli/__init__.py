"""Typer CLI (installed as fastpp.cli)."""

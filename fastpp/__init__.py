"""FastPP: pipeline-parallel LLM serving policies, simulator and backends."""

from fastpp._version import __version__

__all__ = ["__version__"]

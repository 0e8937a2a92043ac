"""FastPP: pipeline-parallel LLM serving policies, simulator and backends."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fastpp")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

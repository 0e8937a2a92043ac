"""FastPP: pipeline-parallel LLM serving policies, simulator and backends."""

"""Real execution backends (installed as fastpp.backends)."""

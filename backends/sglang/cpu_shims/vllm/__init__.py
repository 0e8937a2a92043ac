"""Import shim for SGLang 0.5.23 on CPU (see ../README.md); this is not vLLM."""

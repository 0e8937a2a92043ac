"""Import shim: SGLang 0.5.23 imports this name on CPU but never calls it (see ../README.md)."""


def rotary_embedding(*args, **kwargs):
    raise NotImplementedError(
        "fastpp's CPU import shim stands in for vllm._custom_ops.rotary_embedding; SGLang was "
        "expected to use forward_native on CPU. Install vLLM or report this code path."
    )

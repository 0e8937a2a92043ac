"""CPU pipeline-parallel engine: the model split into stages, paged KV caches, stage processes.

Imports torch; nothing in ``fastpp`` core imports this package. Serving (``engine.py``)::

    engine = PipelineEngine(WeightsSource.parse("smollm2"), EngineConfig(num_stages=2)).start()
    req_id = engine.submit(prompt_ids, SamplingParams(max_tokens=32), on_event)  # events: new tokens, end
    engine.shutdown()

The model layer underneath, in one process::

    weights = random_weights("tiny", seed=0)        # or load_hf_dir(path), load_smollm2()
    stages = build_stages(weights, num_stages=2)   # StageModel per stage, layers as vLLM places them
    caches = [s.make_kv_cache(num_blocks=64) for s in stages]
    layout = BatchLayout.build([(req_id, num_new, num_cached, samples), ...])
    for c in caches: c.allocate(req_id, num_new)   # every stage reserves the same tokens
    h = stages[0](token_ids, layout, caches[0])     # [T] ids -> [T, D] hidden
    logits = stages[1](h, layout, caches[1])         # -> [S, V] for layout.sample_req_ids

The tokenizer (``tokenizer.LibTokenizer``) is not re-exported: it needs the ``tokenizers`` package.
"""

from fastpp.backends.torch.config import CONFIGS, ModelConfig, from_hf_config, get_config
from fastpp.backends.torch.gguf_weights import load_gguf, load_smollm2
from fastpp.backends.torch.kv_cache import KVCacheFullError, PagedKVCache
from fastpp.backends.torch.layout import BatchLayout, SeqSlice
from fastpp.backends.torch.model import StageModel, build_stages, split_layers
from fastpp.backends.torch.reference import reference_generate, reference_logits
from fastpp.backends.torch.weights import ModelWeights, load_hf_dir, random_weights

__all__ = [
    "CONFIGS",
    "BatchLayout",
    "KVCacheFullError",
    "ModelConfig",
    "ModelWeights",
    "PagedKVCache",
    "SeqSlice",
    "StageModel",
    "build_stages",
    "from_hf_config",
    "get_config",
    "load_gguf",
    "load_hf_dir",
    "load_smollm2",
    "random_weights",
    "reference_generate",
    "reference_logits",
    "split_layers",
]

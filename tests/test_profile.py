"""Profile schema: round trip, field-naming errors, LinearTable interpolation contract."""

from __future__ import annotations

import copy
import json
import time

import pytest

from fastpp.profile import (
    SCHEMA_VERSION,
    LinearTable,
    LinkCost,
    ModelShape,
    Profile,
    ProfileError,
    StageCost,
    load_profile,
    save_profile,
)


def _table(scale: float = 1e-3) -> LinearTable:
    return LinearTable(tokens=(1, 128, 129, 256), seconds=(scale, scale, 2 * scale, 2 * scale))


def make_profile(pp: int = 3) -> Profile:
    num_layers = 7
    per = [num_layers // pp + (1 if i >= pp - num_layers % pp else 0) for i in range(pp)]
    stages = tuple(
        StageCost(
            num_layers=per[i],
            linear=_table(),
            attn_past_x_pre_s=1e-9,
            attn_pre_sq_s=5e-10,
            attn_dec_ctx_s=1e-8,
            fixed_s=1e-4,
            embedding_s_per_token=1e-7 if i == 0 else 0.0,
            lm_head=_table(2e-4) if i == pp - 1 else None,
        )
        for i in range(pp)
    )
    model = ModelShape(
        name="toy",
        num_layers=num_layers,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=100,
        max_context=4096,
        dtype_bytes=2,
        qkv_bias=True,
    )
    return Profile(
        name="toy",
        kind="analytic",
        provenance={"source": "test"},
        gpu="A100-40GB-PCIe",
        interconnect="pcie4",
        model=model,
        pp=pp,
        tp=1,
        kv_capacity_tokens=1000,
        page_size=1,
        token_step=128,
        host_overhead_s=0.002,
        token_return_s=0.005,
        activation_bytes_per_token=256,
        link=LinkCost(1e-5, 2e10),
        stages=stages,
    )


def test_round_trip(tmp_path):
    prof = make_profile()
    path = tmp_path / "toy.json"
    save_profile(prof, path)
    loaded = load_profile(path)
    assert loaded == prof
    assert loaded.to_dict() == prof.to_dict()
    assert json.loads(path.read_text())["schema_version"] == SCHEMA_VERSION
    assert loaded.stages[0].time_s(200, 0, 0, 0, 0) == prof.stages[0].time_s(200, 0, 0, 0, 0)


def _error(d: dict) -> str:
    with pytest.raises(ProfileError) as info:
        Profile.from_dict(d, source="qwen.json")
    return str(info.value)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d["stages"][2]["linear"].pop("seconds"),
            "qwen.json: stages[2].linear.seconds: missing field",
        ),
        (lambda d: d.pop("gpu"), "qwen.json: gpu: missing field"),
        (lambda d: d["model"].update(hidden_size="64"), "qwen.json: model.hidden_size: expected"),
        (lambda d: d.update(pp=2.0), "qwen.json: pp: expected an integer"),
        (lambda d: d["stages"][1].update(fixed_s=-1.0), "qwen.json: stages[1].fixed_s: must be >="),
        (lambda d: d["link"].update(latency_s=-1e-6), "qwen.json: link.latency_s: must be >="),
        (lambda d: d.update(schema_version=99), "qwen.json: schema_version: unsupported version"),
        (lambda d: d.pop("schema_version"), "qwen.json: schema_version: missing field"),
        (lambda d: d.update(pp=2), "qwen.json: stages: has 3 stages but pp is 2"),
        (lambda d: d.update(kv_capacity_tokens=0), "qwen.json: kv_capacity_tokens: must be >= 1"),
        (
            lambda d: d["stages"][0]["linear"].update(tokens=[1, 129, 128, 256]),
            "qwen.json: stages[0].linear.tokens[2]: must be strictly ascending",
        ),
        (
            lambda d: d["stages"][2]["lm_head"].update(seconds=[1.0, float("nan"), 1.0, 1.0]),
            "qwen.json: stages[2].lm_head.seconds[1]: must be finite",
        ),
        (lambda d: d.update(kind="guess"), "qwen.json: kind: must be one of"),
        (lambda d: d.update(extra=1), "qwen.json: extra: unknown field"),
        (lambda d: d["provenance"].update(mape=0.1), "qwen.json: provenance.mape: expected a str"),
        (
            lambda d: d["stages"][0].update(lm_head={"tokens": [1], "seconds": [1.0]}),
            "qwen.json: stages[0].lm_head: only the last stage",
        ),
        (lambda d: d["stages"][0].update(num_layers=5), "qwen.json: stages: stage layers sum"),
        (lambda d: d.pop("stage_turnaround_s"), "qwen.json: stage_turnaround_s: missing field"),
        (
            lambda d: d.update(stage_turnaround_s=[0.0, 0.001]),
            "qwen.json: stage_turnaround_s: has 2 values but pp is 3",
        ),
        (
            lambda d: d.update(stage_turnaround_s=[0.0, -0.001, 0.0]),
            "qwen.json: stage_turnaround_s[1]: must be >=",
        ),
        (lambda d: d.update(stage_turnaround_s=0.001), "qwen.json: stage_turnaround_s: expected a list"),
    ],
)
def test_errors_name_their_field(mutate, expected):
    d = copy.deepcopy(make_profile().to_dict())
    mutate(d)
    assert _error(d).startswith(expected), _error(d)


def test_version_1_files_load_with_no_turnaround(tmp_path):
    """Profiles written before schema version 2 (no stage_turnaround_s) read as zeros; a
    version-1 file that has the field is refused, naming it."""
    d = make_profile().to_dict()
    assert d["stage_turnaround_s"] == [0.0, 0.0, 0.0]
    del d["stage_turnaround_s"]
    d["schema_version"] = 1
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(d))
    assert load_profile(path) == make_profile()
    d["stage_turnaround_s"] = [0.0, 0.0, 0.0]
    assert _error(d).startswith("qwen.json: stage_turnaround_s: unknown field")


def test_load_names_file(tmp_path):
    path = tmp_path / "bad.json"
    d = make_profile().to_dict()
    del d["stages"][1]["attn_pre_sq_s"]
    path.write_text(json.dumps(d))
    with pytest.raises(ProfileError, match=r"^bad\.json: stages\[1\]\.attn_pre_sq_s: missing"):
        load_profile(path)
    path.write_text("{not json")
    with pytest.raises(ProfileError, match=r"^bad\.json: not valid JSON"):
        load_profile(path)


def test_linear_table_keeps_steps():
    t = LinearTable(tokens=(128, 129, 256), seconds=(1.0, 2.0, 2.0))
    assert t.at(0) == 0.0
    assert t.at(1) == 1.0  # below the first point: one tile's cost
    assert t.at(128) == 1.0
    assert t.at(129) == 2.0
    assert t.at(200) == 2.0
    assert t.at(256) == 2.0


def test_linear_table_interpolates_and_extrapolates():
    t = LinearTable(tokens=(1, 128, 256), seconds=(1.0, 1.0, 3.0))
    assert t.at(192) == pytest.approx(2.0)
    # slope of the last 128 tokens: (3 - 1) / 128 per token
    assert t.at(512) == pytest.approx(3.0 + 256 * 2.0 / 128)
    short = LinearTable(tokens=(10, 20), seconds=(1.0, 2.0))  # shorter than 128: last two points
    assert short.at(30) == pytest.approx(3.0)
    single = LinearTable(tokens=(100,), seconds=(2.0,))  # proportional
    assert single.at(200) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        t.at(-1)


def test_stage_time_components():
    prof = make_profile()
    first, last = prof.stages[0], prof.stages[-1]
    assert first.time_s(0, 0, 0, 0, 0) == 0.0
    base = first.linear.at(100) + first.fixed_s + 100 * first.embedding_s_per_token
    assert first.time_s(100, 0, 0, 0, 0) == pytest.approx(base)
    assert first.time_s(100, 5, 1000, 100, 2000) == pytest.approx(
        base + 1e-9 * 1000 + 5e-10 * 100 + 1e-8 * 2000
    )
    # the LM head is paid only on the last stage and only for sampled tokens
    assert last.time_s(100, 5, 0, 0, 0) - last.time_s(100, 0, 0, 0, 0) == pytest.approx(2e-4)
    assert prof.link.time_s(0) == 0.0
    assert prof.link.time_s(2_000_000) == pytest.approx(1e-5 + 1e-4)


def test_cost_fn_gives_the_very_floats_of_time_s():
    """The simulator's StageCost.cost_fn must equal time_s exactly (not approximately): a PP
    stage of each kind, a TP stage with all-reduces, and points beyond the table."""
    import random

    from fastpp.sim.analytic import analytic_profile

    stages = [
        *make_profile().stages,
        *analytic_profile("Qwen2.5-32B", "A100-40GB-PCIe", 4, 1).stages,
        *analytic_profile("Qwen2.5-32B", "A100-40GB-PCIe", 1, 4).stages,
    ]
    rng = random.Random(0)
    for stage in stages:
        cost = stage.cost_fn()
        for _ in range(2000):
            args = (
                rng.choice([0, 1, rng.randrange(1, 9000)]),
                rng.randrange(0, 300),
                rng.randrange(0, 10**8),
                rng.randrange(0, 10**7),
                rng.randrange(0, 10**6),
            )
            assert cost(*args) == stage.time_s(*args), (stage.num_layers, args)


def test_lookup_is_cheap():
    """Not a timing test: 1e5 lookups of a dense 16k-point table stay well under a second."""
    t = LinearTable(
        tokens=tuple(range(128, 16385, 128)), seconds=tuple(float(i) for i in range(128, 16385, 128))
    )
    stage = make_profile().stages[-1]
    start = time.perf_counter()
    for n in range(100_000):
        t.at(n % 16000)
        stage.time_s(n % 2000, 1, 0, 0, 0)
    assert time.perf_counter() - start < 5.0

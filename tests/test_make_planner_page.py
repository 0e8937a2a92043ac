"""scripts/make_planner_page.py: the blocks it writes exist on the page, and its words follow
the plan it is given (a hand-made plan.json, no plan run)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = runpy.run_path(str(ROOT / "scripts" / "make_planner_page.py"))


def _row(label, policy, status, tp=1, goodput=None, bound=10.0, below=None, binding="TTFT"):
    share = None if goodput is None else goodput / bound
    return dict(
        label=label, policy=policy, status=status, tp=tp, goodput=goodput, bound=bound,
        below=below, binding=binding, bound_share=share,
    )  # fmt: skip


PLAN = {
    "model": "M",
    "gpu": "G",
    "num_gpus": 4,
    "best": "pp4 predictive",
    "counts": {"searched": 3, "beaten": 1, "pruned": 1},
    "probes_run": 12,
    "shared_with_twin": 1,
    "results": [
        _row("pp4 predictive", "predictive", "searched", goodput=8.0, binding="KV capacity"),
        _row("pp4 predictive+ds", "predictive+ds", "searched", goodput=8.0),
        _row("pp4 greedy", "greedy", "searched", goodput=7.0),
        _row("pp4 static:2048", "static:2048", "beaten", below=8.0, binding="TPOT"),
        _row("tp4 greedy", "greedy", "pruned", tp=4, bound=5.0, below=5.0),
    ],
}


def test_every_block_the_script_writes_is_marked_on_the_page():
    page = (ROOT / "docs" / "PLANNER.md").read_text(encoding="utf-8")
    for name in (
        "example",
        "example-reading",
        "other-plans",
        "interconnect",
        "async-depth",
        "queue-order",
        "speed",
    ):
        assert SCRIPT["replace_block"](page, name, "X").count(f"generated: {name} -->\nX\n") == 1
    with pytest.raises(SystemExit, match="no generated block 'missing'"):
        SCRIPT["replace_block"](page, "missing", "X")


def test_the_reading_names_the_pick_its_runner_up_once_and_what_was_pruned():
    text = SCRIPT["example_text"](PLAN)
    assert "pp4 with predictive (8.00 req/s, 80% of its bound, limited by KV capacity)" in text
    assert "next come pp4 greedy (7.00)." in text  # predictive+ds is the pick's twin: left out
    assert "bounds are below the best goodput: tp4" in text
    assert "static:2048 fails at 8.00 req/s on TPOT" in text


def test_the_interconnect_words_follow_which_tp_layouts_were_pruned():
    text = SCRIPT["tp_words"](PLAN, "PCIe")
    assert "highest bound of a layout with TP is 5.00 req/s (tp4)" in text
    assert "every TP layout is pruned" in text
    tp_row = _row("tp4 greedy", "greedy", "searched", 4, 4.0)
    searched_tp = {**PLAN, "results": [*PLAN["results"][:3], tp_row]}
    assert "the best of them, tp4 greedy, reaches 4.00 req/s" in SCRIPT["tp_words"](searched_tp, "NVLink")


def test_the_queue_order_rows_name_the_best_under_each_order():
    plan = {
        "best": "pp4 slack late_last",
        "results": [
            {**_row("pp4 slack late_last", "slack", "searched", goodput=6.44), "queue_order": "late_last"},
            {
                **_row("pp4 static:512 late_last", "static:512", "beaten", below=6.44),
                "queue_order": "late_last",
            },
            {**_row("pp4 slack", "slack", "searched", goodput=6.22), "queue_order": "fcfs"},
            {**_row("pp4 static:2048", "static:2048", "pruned", below=6.22), "queue_order": "fcfs"},
        ],
    }
    row = SCRIPT["queue_rows"](plan)[2]
    assert "| slack: 6.22 req/s | slack: 6.44 req/s | pp4 slack late_last (6.44 req/s) |" in row
    assert "--queue-orders fcfs,late_last" in row

"""Plots: every figure writes PNG and SVG from small rows, `fastpp plot` finds what a result path
holds and draws it, bad input is named, and the same data gives byte-identical SVG."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from typer.testing import CliRunner

pytest.importorskip("matplotlib")

from fastpp.cli.app import app  # noqa: E402
from fastpp.sim import plots  # noqa: E402
from fastpp.sim.plot_inputs import detect, load_results, load_run_dir, probe_rows  # noqa: E402
from fastpp.sim.plot_report import plot_results  # noqa: E402

runner = CliRunner()
SYSTEMS = (("tp4", "static:2048"), ("pp4", "static:512"), ("pp4", "predictive"))


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def flat(text: str) -> str:
    """Console output with rich's line wrapping undone."""
    return " ".join(text.split())


def unbroken(text: str) -> str:
    """Console output without any whitespace: a long path rich folded mid-word is whole again."""
    return "".join(text.split())


def sweep_rows() -> list[dict]:
    """A tiny grid: 2 workloads x 3 systems x 3 rates x 2 SLO scales, one value of each metric."""
    rows = []
    for w, workload in enumerate(("sharegpt", "cnn-reversed")):
        for s, (dep, pol) in enumerate(SYSTEMS):
            for rate in (1.0, 2.0, 4.0):
                for scale in (1.0, 0.2):
                    ttft = 200.0 * rate * (s + 1) / scale
                    rows.append(
                        {
                            "workload": workload,
                            "deployment": dep,
                            "policy": pol,
                            "rate": rate,
                            "slo_scale": scale,
                            "model": "Qwen2.5-14B",
                            "gpu": "A100-40GB-PCIe",
                            "goodput": 0.0 if (w, s) == (1, 0) or scale < 0.5 else 1.5 + s - w,
                            "p90_ttft_ms": float("inf") if rate == 4.0 and s == 0 else ttft,
                            "p90_tpot_ms": 40.0 * rate / scale,
                            "slo_attainment": scale - 0.1 * s,
                            "slo_ttft_ms": 2000 * scale,
                            "slo_tpot_ms": 200 * scale,
                        }
                    )
    return rows


def request_rows(n: int, ttft_s: float) -> list[dict]:
    rows = []
    for i in range(n):
        done = i != n - 1  # the last one never finishes
        rows.append(
            {
                "req_id": i,
                "arrived_at": float(i),
                "first_token_at": i + ttft_s * (1 + i / n),
                "finished_at": i + 1.0 if done else None,
                "num_generated": 5 if done else 1,
                "finish_reason": "length" if done else None,
                "itl_ms": [20.0 + i] * 4,
            }
        )
    return rows


def iteration_rows(num_stages: int = 2, n: int = 30, chunk=lambda i: 256) -> list[dict]:
    rows = []
    for i in range(n):
        for k in range(num_stages):
            t0 = 0.05 * i + 0.02 * k
            rows.append(
                {
                    "mb_id": i,
                    "stage": k,
                    "slot": i % num_stages,
                    "started_at": t0,
                    "finished_at": t0 + 0.03,
                    "num_tokens": 100,
                    "num_prefill_tokens": 90 if i % 3 == 0 else 0,
                    "num_decode_reqs": 0 if i % 5 == 0 else 10,
                    "chunk_budget": chunk(i),
                }
            )
    return rows


def assert_written(paths, stem) -> None:
    assert [p.name for p in paths] == [f"{stem}.png", f"{stem}.svg"]
    assert all(p.stat().st_size > 1000 for p in paths)
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in paths[1].read_bytes()[:1000]


def test_every_figure_writes_png_and_svg(tmp_path):
    rows = sweep_rows()
    at_scale_1 = [r for r in rows if r["slo_scale"] == 1.0]
    assert_written(plots.goodput_bars(at_scale_1, tmp_path / "goodput"), "goodput")
    assert_written(
        plots.latency_vs_rate(
            [r for r in at_scale_1 if r["workload"] == "sharegpt"],
            tmp_path / "rate",
            slo_ttft_ms=2000,
            slo_tpot_ms=200,
            log_ttft=True,
        ),
        "rate",
    )
    requests = {"pp4 static:512": request_rows(20, 0.3), "pp4 predictive": request_rows(20, 0.1)}
    assert_written(
        plots.latency_cdf(requests, tmp_path / "cdf", metric="ttft", slo_ms=250.0, log_x=True), "cdf"
    )
    iterations = {"static": iteration_rows(), "adaptive": iteration_rows(chunk=lambda i: 64 * (1 + i % 4))}
    assert_written(plots.chunk_over_time(iterations, tmp_path / "chunk", window=5), "chunk")
    assert_written(plots.stage_timeline(iteration_rows(4), tmp_path / "tl", num_stages=4), "tl")
    assert_written(plots.attainment_vs_slo_scale(rows, tmp_path / "slo"), "slo")


def test_figures_tolerate_missing_columns_and_stems_with_a_suffix(tmp_path):
    rows = [{"goodput": 2.0}, {"goodput": 0.0, "workload": "x"}, {"rate": 1.0}]
    svg = {"formats": ("svg",)}
    assert [p.name for p in plots.goodput_bars(rows, tmp_path / "g.png", **svg)] == ["g.svg"]
    assert plots.latency_vs_rate(rows, tmp_path / "r", **svg)[0].stat().st_size > 1000
    assert plots.attainment_vs_slo_scale(rows, tmp_path / "s", **svg)[0].stat().st_size > 1000
    with pytest.raises(ValueError, match="format must be one of"):
        plots.goodput_bars(rows, tmp_path / "g", formats=("jpeg",))


def test_cdf_counts_failed_requests_and_skips_undefined_tpot():
    rows = request_rows(4, 0.5)
    ttft = plots.request_latencies_ms(rows, "ttft")
    assert ttft[:3].tolist() == pytest.approx([500.0, 625.0, 750.0]) and ttft[3] == float("inf")
    tpot = plots.request_latencies_ms(rows, "tpot").tolist()
    assert tpot == pytest.approx([20.0, 21.0, 22.0, float("inf")])
    one_token = dict(rows[0], num_generated=1, itl_ms=[])
    assert plots.request_latencies_ms([one_token], "tpot").size == 0


def test_svg_and_png_are_byte_identical_across_runs(tmp_path):
    rows = [r for r in sweep_rows() if r["slo_scale"] == 1.0]
    a = plots.goodput_bars(rows, tmp_path / "a")
    b = plots.goodput_bars(rows, tmp_path / "b")
    assert a[1].read_bytes() == b[1].read_bytes()
    assert a[0].read_bytes() == b[0].read_bytes()
    assert b"<dc:date>" not in a[1].read_bytes() and b"Matplotlib v" not in a[1].read_bytes()
    (c,) = plots.stage_timeline(iteration_rows(3), tmp_path / "c", formats=("svg",))
    (d,) = plots.stage_timeline(iteration_rows(3), tmp_path / "d", formats=("svg",))
    assert c.read_bytes() == d.read_bytes()


def test_simulate_then_plot_writes_the_run_figures(tmp_path):
    res = invoke(
        "simulate", "-n", "40", "-d", "pp2", "-d", "pp2@predictive", "-m", "Qwen2.5-14B", "-o", str(tmp_path)
    )
    assert res.exit_code == 0, res.output
    res = invoke("plot", str(tmp_path))
    assert res.exit_code == 0, res.output
    stems = [
        "cdf_ttft",
        "cdf_tpot",
        "cdf_e2e",
        "chunk_over_time",
        "timeline_pp2-static-2048",
        "timeline_pp2-predictive",
    ]
    expected = [tmp_path / "plots" / f"{s}.{fmt}" for s in stems for fmt in ("png", "svg")]
    assert all(p.stat().st_size > 1000 for p in expected)
    assert flat(res.stdout).split() == [str(p) for p in expected]
    log = flat(res.stderr)  # what is plotted, then one line per figure
    assert f"plotting {tmp_path}: Qwen2.5-14B on A100-40GB-PCIe" in log
    assert "2 run(s): pp2 static:2048, pp2 predictive" in log and log.count("drew ") == len(stems)
    assert detect(tmp_path / "summary.json") == ("run_dir", tmp_path)
    runs = load_run_dir(tmp_path)
    assert [r.label for r in runs] == ["pp2 static:2048", "pp2 predictive"]
    assert len(runs[0].requests) == 40 and runs[0].iterations["stage"][0] == 0


def test_sweep_csv_cells_come_back_typed_as_in_jsonl(tmp_path):
    rows = sweep_rows()
    header = list(rows[0])
    (tmp_path / "results.csv").write_text(
        ",".join(header) + "\n" + "".join(",".join(str(r[k]) for k in header) + "\n" for r in rows)
    )
    assert load_results(tmp_path) == rows
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_results(tmp_path / "results.jsonl") == rows


def test_plot_a_sweep_table_makes_goodput_rate_and_slo_figures(tmp_path):
    rows = [r for r in sweep_rows() if r["rate"] != 2.0 and r["policy"] != "predictive"]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths = plot_results(tmp_path, tmp_path / "out", formats=("svg",))
    assert [p.name for p in paths] == [
        "goodput_slo-scale-1.svg",
        "goodput_slo-scale-0.2.svg",
        "latency_vs_rate_workload-sharegpt_slo-scale-1.svg",
        "latency_vs_rate_workload-sharegpt_slo-scale-0.2.svg",
        "latency_vs_rate_workload-cnn-reversed_slo-scale-1.svg",
        "latency_vs_rate_workload-cnn-reversed_slo-scale-0.2.svg",
        "slo_scale_rate-1.svg",
        "slo_scale_rate-4.svg",
        "slo_scale_goodput_rate-1.svg",
        "slo_scale_goodput_rate-4.svg",
    ]
    assert all(p.parent == tmp_path / "out" for p in paths)
    at_1 = tmp_path / "at_1.jsonl"
    at_1.write_text("".join(json.dumps(r) + "\n" for r in rows if r["slo_scale"] == 1.0))
    (path,) = plot_results(at_1, kind="goodput", formats=("svg",))
    assert path == tmp_path / "plots" / "goodput.svg"


def test_plot_goodput_json_draws_the_probes(tmp_path):
    result = {
        "deployment": "pp2",
        "policy": "static:2048",
        "goodput": 2.0,
        "margin": 0.1,
        "probes": [
            {"rate": 4.0, "ok": False, "p90_ttft_ms": None, "p90_tpot_ms": 90.0},
            {"rate": 1.0, "ok": True, "p90_ttft_ms": 300.0, "p90_tpot_ms": 50.0},
            {"rate": 2.0, "ok": True, "p90_ttft_ms": 900.0, "p90_tpot_ms": 70.0},
        ],
    }
    path = tmp_path / "gp.json"
    path.write_text(json.dumps([result]))
    assert [r["rate"] for r in probe_rows([result])] == [1.0, 2.0, 4.0]
    assert probe_rows([result])[-1]["p90_ttft_ms"] == float("inf")
    res = invoke("plot", str(path), "--slo-ttft-ms", "2000", "--slo-tpot-ms", "200")
    assert res.exit_code == 0, res.output
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {
        "goodput_probes.png",
        "goodput_probes.svg",
        "goodput.png",
        "goodput.svg",
    }


def test_a_probe_stopped_early_marks_the_objective_it_failed_not_ttft():
    def stopped(rate, ttft_share, tpot_share):
        metrics = {"ttft_missed_at_least": ttft_share, "tpot_missed_at_least": tpot_share}
        return {"rate": rate, "ok": False, "stopped_early": 1.0, "num_requests": 50.0, **metrics}

    result = {"deployment": "pp4", "policy": "static:512"}
    result["probes"] = [stopped(1.0, 0.0, 0.52), stopped(2.0, 0.4, 0.0), stopped(4.0, 0.06, 0.06)]
    rows = probe_rows([result])
    marks = [(r["p90_ttft_ms"], r["p90_tpot_ms"]) for r in rows]
    assert [tuple(math.isinf(v) for v in m) for m in marks] == [(False, True), (True, False), (True, True)]
    assert math.isnan(marks[0][0]) and math.isnan(marks[1][1])  # unknown, not drawn


def test_a_goodput_plot_folder_plots_again(tmp_path):
    out = tmp_path / "gp"
    args = ("goodput", "-n", "50", "--seeds", "1", "--precision", "2", "--plot", str(out))
    assert invoke(*args).exit_code == 0
    res = invoke("plot", str(out), "-o", str(tmp_path / "again"))
    assert res.exit_code == 0, res.output
    assert {p.name for p in (tmp_path / "again").iterdir()} >= {"goodput.png", "goodput_probes.png"}


def test_unrecognised_input_and_wrong_kind_are_named(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    res = invoke("plot", str(notes))
    assert res.exit_code == 2 and "not a recognised result" in flat(res.output)
    assert "notes.txt" in unbroken(res.output)
    res = invoke("plot", str(tmp_path / "missing"))
    assert res.exit_code == 2 and "no such file or folder" in flat(res.output)
    stray = tmp_path / "stray.json"
    stray.write_text('{"a": 1}')
    res = invoke("plot", str(stray))
    assert res.exit_code == 2 and "not `fastpp goodput --json` output" in flat(res.output)
    table = tmp_path / "results.jsonl"
    table.write_text(json.dumps({"workload": "x", "rate": 1.0}) + "\n")
    res = invoke("plot", str(table))
    assert res.exit_code == 2 and "nothing to plot" in flat(res.output)
    res = invoke("plot", str(table), "-k", "timeline")
    assert res.exit_code == 2 and "makes goodput, rate, slo plots, not timeline" in flat(res.output)


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"fastpp\[plots\]"):
        plots.goodput_bars([{"goodput": 1.0}], tmp_path / "g")


def test_the_cli_and_the_plot_modules_do_not_import_matplotlib():
    code = (
        "import sys, fastpp.cli.app, fastpp.sim.plots, fastpp.sim.plot_report; "
        "sys.exit('matplotlib' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_folder_of_several_simulate_runs_plots_the_newest_and_says_so(tmp_path):
    import os

    older, newer = tmp_path / "20260101-000000", tmp_path / "20260101-000100"
    assert invoke("simulate", "-n", "20", "-d", "pp2", "-m", "Qwen2.5-14B", "-o", str(older)).exit_code == 0
    assert invoke("simulate", "-n", "20", "-d", "tp2", "-o", str(newer)).exit_code == 0
    os.utime(older / "summary.json", (1, 1))  # older by its summary's time, whatever the names
    res = invoke("plot", str(tmp_path), "-k", "cdf")
    assert res.exit_code == 0, res.output
    log = flat(res.stderr)
    assert f"{tmp_path} holds 2 `fastpp simulate` runs; plotting the newest, {newer}" in log
    assert "1 run(s): tp2 static:2048" in log and "pp2" not in log.split("plotting the newest")[1]
    assert all(p.startswith(str(newer / "plots")) for p in flat(res.stdout).split())


def test_run_folders_left_by_an_earlier_run_are_skipped_and_named(tmp_path):
    assert invoke("simulate", "-n", "20", "-d", "pp2", "-o", str(tmp_path)).exit_code == 0
    assert invoke("simulate", "-n", "20", "-d", "pp4", "-o", str(tmp_path / "x")).exit_code == 0
    (tmp_path / "x" / "pp4-static-2048").rename(tmp_path / "pp4-static-2048")  # as older fastpp left it
    notes: list[str] = []
    runs = load_run_dir(tmp_path, notes)
    assert [r.run_id for r in runs] == ["pp2-static-2048"]
    assert notes == [f"{tmp_path}: skipped pp4-static-2048: not in its summary.json (left by another run)"]


def test_timelines_of_one_run_share_one_window_and_say_whose(tmp_path):
    from fastpp.sim.plot_inputs import RunData
    from fastpp.sim.plot_report import _common_window

    fast = {
        k: __import__("numpy").array([r[k] for r in iteration_rows(2, 60)], float)
        for k in ("stage", "started_at", "finished_at", "num_prefill_tokens", "num_decode_reqs")
    }
    slow = {k: v * (3.0 if k in ("started_at", "finished_at") else 1.0) for k, v in fast.items()}
    runs = [
        RunData("a", {"deployment": "pp2"}, iterations=fast),
        RunData("b", {"deployment": "tp2"}, iterations=slow),
    ]
    start, end, whose = _common_window(runs)
    w_fast, w_slow = plots.timeline_window(fast), plots.timeline_window(slow)
    assert whose == "tp2" and (start, end) == w_slow and end - start > w_fast[1] - w_fast[0]


def test_rolling_median_and_columns_match_the_plain_definitions(tmp_path):
    import numpy as np

    values = np.random.default_rng(0).integers(0, 50, 301).astype(float)
    for window in (1, 4, 25, 400):
        half = max(1, window) // 2
        plain = [np.median(values[max(0, i - half) : i + half + 1]) for i in range(values.size)]
        assert plots.rolling_median(values, window).tolist() == plain
    from fastpp.sim.plot_inputs import read_columns

    csv = tmp_path / "it.csv"
    csv.write_text('stage,started_at,reason,chunk_budget\n0,0.5,"a,b",128\n1,1.5,optimal,\n')
    cols = read_columns(csv)
    assert cols["stage"].tolist() == [0.0, 1.0] and cols["reason"].tolist() == ["a,b", "optimal"]
    assert cols["chunk_budget"][0] == 128 and np.isnan(cols["chunk_budget"][1])
    assert list(read_columns(csv, ("started_at",))) == ["started_at"]


def test_tick_labels_stay_short_and_legends_sit_outside_the_axes(tmp_path):
    assert [plots.compact_number(v) for v in (0.5, 20, 500, 2000, 50_000, 1.5e6)] == [
        "0.5",
        "20",
        "500",
        "2k",
        "50k",
        "1.5M",
    ]
    slow = request_rows(30, 400.0)  # TTFTs up to ~800 s: the labels would read 100000200000
    requests = {"pp4 static:512": slow, "pp4 predictive": slow}  # two identical series
    (svg,) = plots.latency_cdf(
        requests, tmp_path / "cdf", metric="ttft", slo_ms=2000, log_x=True, formats=("svg",)
    )
    text = svg.read_text()
    assert "same as pp4 static:512" in text and "100000" not in text


def test_coinciding_series_are_named_in_the_legend_or_above_the_panel(tmp_path):
    rows = [r for r in sweep_rows() if r["slo_scale"] == 1.0 and r["workload"] == "sharegpt"]
    rows += [dict(r, policy="static:512b") for r in rows if r["policy"] == "static:512"]
    (svg,) = plots.latency_vs_rate(rows, tmp_path / "rate", log_ttft=True, formats=("svg",))
    text = svg.read_text()
    assert "pp4 static:512b (= pp4 static:512)" in text  # equal in both panels: in the legend
    assert "lines coincide: pp4 static:512 = tp4 static:2048" in text  # TPOT panel only


def test_a_parquet_run_plots_as_its_text_form_does(tmp_path):
    pytest.importorskip("pyarrow")
    for fmt in ("text", "parquet"):
        res = invoke(
            "simulate",
            "-n",
            "20",
            "-d",
            "pp2",
            "--table-format",
            fmt,
            "--no-timeline",
            "-o",
            str(tmp_path / fmt),
        )
        assert res.exit_code == 0, res.output
    text, parquet = (load_run_dir(tmp_path / f) for f in ("text", "parquet"))
    assert text[0].requests == parquet[0].requests
    assert all((text[0].iterations[k] == parquet[0].iterations[k]).all() for k in text[0].iterations)
    res = invoke("plot", str(tmp_path / "parquet"), "-k", "timeline")
    assert res.exit_code == 0, res.output
    assert flat(res.stdout).split()[0].endswith("timeline_pp2-static-2048.png")


def test_run_folders_side_by_side_get_labels_that_tell_them_apart(tmp_path):
    for model in ("Qwen2.5-14B", "Qwen2.5-32B"):
        assert (
            invoke(
                "simulate", "-n", "10", "-d", "pp2", "-m", model, "--no-timeline", "-o", str(tmp_path / model)
            ).exit_code
            == 0
        )
    recorded = tmp_path / "recorded"  # bare run folders, as `fastpp serve --record-dir` leaves them
    recorded.mkdir()
    for model in ("Qwen2.5-14B", "Qwen2.5-32B"):
        (tmp_path / model / "pp2-static-2048").rename(recorded / model)
    res = invoke("plot", str(recorded), "-k", "cdf")
    assert res.exit_code == 0, res.output
    assert "2 run(s): pp2 static:2048 Qwen2.5-14B, pp2 static:2048 Qwen2.5-32B" in flat(res.stderr)

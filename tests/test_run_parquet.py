"""Parquet run tables: the same columns as the text files, read back to the same records, bad
files named; `fastpp simulate --table-format parquet` writes them."""

from __future__ import annotations

import json

import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from fastpp.cli.app import app  # noqa: E402
from fastpp.records_profile import profile_from_records  # noqa: E402
from fastpp.run_files import read_run, write_run  # noqa: E402
from fastpp.run_parquet import ITERATIONS_PARQUET, REQUESTS_PARQUET  # noqa: E402
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation  # noqa: E402
from fastpp.types import ITERATION_FIELDS, FinishReason  # noqa: E402


@pytest.fixture(scope="module")
def run():
    # greedy on a burst: shrunk budgets, reasons, a time limit that leaves requests unfinished
    return run_simulation(
        WorkloadConfig(rate=12.0, num_requests=80, seed=4),
        DeploymentConfig(pp=2, tp=1, policy="greedy"),
        max_time_s=8.0,
    )


def test_both_formats_read_back_the_same_run(run, tmp_path):
    res = run.result
    text = write_run(tmp_path / "text", res.records, res.iterations, run.summary)
    parquet = write_run(tmp_path / "pq", res.records, res.iterations, run.summary, table_format="parquet")
    assert text["records"].name == "requests.jsonl" and parquet["records"].name == REQUESTS_PARQUET
    assert parquet["iterations"].name == ITERATIONS_PARQUET and parquet["timeline"].is_file()
    a, b = read_run(tmp_path / "text"), read_run(tmp_path / "pq")
    assert a.summary == b.summary
    assert [r.to_dict() for r in a.records] == [r.to_dict() for r in b.records]
    assert [r.token_times for r in a.records] == [r.token_times for r in b.records]  # to the bit
    assert {r.finish_reason for r in b.records} == {FinishReason.LENGTH, FinishReason.ABORTED}
    assert a.iterations == b.iterations == list(res.iterations)
    fits = [profile_from_records(tmp_path / name).profile.to_dict() for name in ("pq", "text")]
    for fit in fits:
        fit["provenance"].pop("run_dir")
        fit["provenance"].pop("created_at")  # the two fits may straddle a second
    assert fits[0] == fits[1]


def test_the_columns_are_the_text_files_keys_typed(run, tmp_path):
    res = run.result
    paths = write_run(tmp_path, res.records, res.iterations, run.summary, table_format="parquet")
    requests = pq.read_table(paths["records"])
    first_line = json.loads(
        next(iter(write_run(tmp_path / "t", res.records[:1], [], {})["records"].read_text().splitlines()))
    )
    assert requests.column_names == list(first_line)
    assert requests.schema.field("itl_ms").type == pa.list_(pa.float64())
    assert requests.schema.field("first_token_at").type == pa.float64()
    iterations = pq.read_table(paths["iterations"])
    assert iterations.column_names == list(ITERATION_FIELDS)
    assert iterations.num_rows == len(res.iterations)
    assert iterations.schema.field("reason").type == pa.string()


def test_a_bad_table_is_named(run, tmp_path):
    res = run.result
    paths = write_run(tmp_path, res.records, res.iterations, run.summary, table_format="parquet")
    table = pq.read_table(paths["iterations"]).drop_columns(["sum_pre_sq"])
    pq.write_table(table, paths["iterations"])
    with pytest.raises(ValueError, match=r"iterations\.parquet: no column sum_pre_sq"):
        read_run(tmp_path)
    paths["records"].write_text("not parquet")
    with pytest.raises(ValueError, match=r"requests\.parquet: not a Parquet table"):
        read_run(tmp_path)
    write_run(tmp_path, res.records[:3], [], {"again": True})  # as text: the Parquet tables go
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [
        "iterations.csv",
        "requests.jsonl",
        "summary.json",
        "timeline.json",
    ]
    assert len(read_run(tmp_path).records) == 3
    with pytest.raises(ValueError, match="table format must be one of text, parquet"):
        write_run(tmp_path / "x", res.records, res.iterations, {}, table_format="xml")


def test_simulate_writes_parquet_tables(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["simulate", "-n", "30", "-d", "pp2", "--table-format", "parquet", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    (folder,) = (p for p in out.iterdir() if p.is_dir())
    assert sorted(p.name for p in folder.iterdir()) == [
        "iterations.parquet",
        "requests.parquet",
        "summary.json",
        "timeline.json",
    ]
    assert len(read_run(folder).records) == 30
    bad = CliRunner().invoke(app, ["simulate", "-n", "5", "--table-format", "xml", "-o", str(out)])
    assert bad.exit_code != 0 and "--table-format must be one of text, parquet, got 'xml'" in bad.output

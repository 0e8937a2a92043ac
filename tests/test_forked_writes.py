"""ForkedWrites: run-folder files written by forked children are complete once ``wait``
returns, a failing writer is named (and does not take the others down), and without fork the
writers run in the parent."""

from __future__ import annotations

import os

import pytest

from fastpp.cli.forked_writes import ForkedWrites
from fastpp.run_files import read_run, write_run
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


@needs_fork
def test_children_write_the_same_folder_as_the_parent(tmp_path):
    run = run_simulation(WorkloadConfig(rate=4.0, num_requests=50, seed=3), DeploymentConfig(pp=2, tp=1))
    res = run.result
    write_run(tmp_path / "here", res.records, res.iterations, run.summary)
    writes = ForkedWrites(max_children=2)  # three files: the third waits for a free child
    paths = write_run(tmp_path / "forked", res.records, res.iterations, run.summary, submit=writes.submit)
    assert writes.wait() == []
    for kind, path in paths.items():
        assert path.read_bytes() == (tmp_path / "here" / path.name).read_bytes(), kind
    assert len(read_run(tmp_path / "forked").records) == 50


@needs_fork
def test_a_failing_writer_is_named_and_the_others_finish(tmp_path, capfd):
    writes = ForkedWrites()
    good = tmp_path / "good.txt"

    def fail():
        raise ValueError("disk on fire")

    writes.submit("bad.txt", fail)
    writes.submit(str(good), lambda: good.write_text("ok"))
    assert writes.wait() == ["bad.txt"]
    assert good.read_text() == "ok"
    assert "disk on fire" in capfd.readouterr().err


def test_without_fork_the_writers_run_in_the_parent(tmp_path):
    writes = ForkedWrites(fork=False)
    seen = []
    writes.submit("a", lambda: seen.append(os.getpid()))
    writes.submit(str(tmp_path / "missing" / "b"), lambda: (tmp_path / "missing" / "b").write_text("x"))
    assert seen == [os.getpid()]  # ran here, at once
    assert writes.wait() == [str(tmp_path / "missing" / "b")]

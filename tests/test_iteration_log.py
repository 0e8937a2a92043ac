"""IterationLog: stage records kept column-wise must read back as the records they stand for,
share one head per microbatch (the point of keeping them so), and write the same files."""

from __future__ import annotations

import gc

from fastpp.iteration_log import IterationLog, make_record, record_head
from fastpp.run_files import write_iterations_csv
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation
from fastpp.timeline import write_chrome_trace
from fastpp.types import IterationRecord


def rec(mb_id: int, stage: int, start: float, end: float, reason: str = "r") -> IterationRecord:
    return IterationRecord(mb_id, stage, mb_id % 2, start, end, 10, 4, 6, 8, 16, 300, 64, reason, 7)


def test_a_log_reads_back_the_records_it_was_given():
    quoted = 'say "hi"'
    records = [rec(0, 0, 0, 1.0), rec(0, 1, 1.0, 2.5), rec(1, 0, 1.0, 1.5, quoted), rec(1, 1, 2.5, 3, quoted)]
    log = IterationLog(records)
    assert len(log) == 4 and list(log) == records and log == records and records == list(log)
    assert log[-1] == records[-1] and log[1:3] == records[1:3] and log[::-1] == records[::-1]
    assert IterationLog.of(log) is log and IterationLog.of(records) == log
    assert log != records[:3] and log != IterationLog(records[:3])
    by_stages = IterationLog()
    by_stages.add_stages(record_head(records[0]), [(0, 1.0), (1.0, 2.5)])
    by_stages.add_stages(record_head(records[2]), [(1.0, 1.5), (2.5, 3)])
    assert by_stages == log
    assert make_record(record_head(records[3]), 1, 2.5, 3) == records[3]


def test_a_simulation_keeps_what_its_policies_observed_with_one_head_per_microbatch():
    run = run_simulation(
        WorkloadConfig(rate=4.0, num_requests=60, seed=2), DeploymentConfig(pp=4, tp=1, policy="predictive")
    )
    log = run.result.iterations
    assert isinstance(log, IterationLog) and len(log) == 4 * run.result.num_microbatches
    assert [it.stage for it in log[:8]] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert len({id(h) for h in log.heads}) == run.result.num_microbatches  # shared by 4 stages
    gc.collect()
    assert not any(gc.is_tracked(h) for h in log.heads)  # numbers and a string: untracked

    observed: list[IterationRecord] = []

    class Spy:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def observe(self, r):
            observed.append(r)
            self.inner.observe(r)

    from fastpp.sim.engine import PipelineSimulation
    from fastpp.sim.run import build_scheduler

    dep = DeploymentConfig(pp=4, tp=1, policy="predictive")
    profile = dep.load_profile()
    sched = build_scheduler(profile, dep)
    sched.chunk_policy = Spy(sched.chunk_policy)
    result = PipelineSimulation(
        profile, sched, WorkloadConfig(rate=4.0, num_requests=60, seed=2).requests()
    ).run()
    assert observed and observed == list(result.iterations)


def test_the_writers_write_the_same_files_from_a_log_and_from_its_records(tmp_path):
    run = run_simulation(
        WorkloadConfig(rate=4.0, num_requests=40, seed=1), DeploymentConfig(pp=2, tp=1, policy="greedy")
    )
    log = run.result.iterations
    records = list(log)
    for write, name in ((write_iterations_csv, "i.csv"), (write_chrome_trace, "t.json")):
        a, b = write(log, tmp_path / f"log-{name}"), write(records, tmp_path / f"list-{name}")
        assert a.read_bytes() == b.read_bytes()

"""Goodput search: bisection and bracketing on synthetic criteria, the probe judge (P90,
attainment, failures, steady state) on fabricated records, and one small real simulation."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastpp.metrics import SLO_SLACK_MS
from fastpp.sim.goodput import (
    ProbeResult,
    find_goodput,
    judge_records,
    slo_goodput,
)
from fastpp.sim.run import DeploymentConfig, WorkloadConfig, run_simulation
from fastpp.sim.steady import check_steady_state
from fastpp.types import SLO, FinishReason, RequestRecord

THRESHOLD = 3.37  # req/s: the synthetic criterion's true goodput
SLO_DEFAULT = SLO()  # 2 s TTFT, 200 ms TPOT


def threshold_criterion(rate: float) -> ProbeResult:
    ok = rate <= THRESHOLD
    return ProbeResult(rate, ok, {"load": rate / THRESHOLD}, "" if ok else "over the threshold")


def assert_consistent(result) -> None:
    """No feasible probe above an infeasible one, and the goodput is the top feasible probe."""
    ok = [p.rate for p in result.probes if p.ok]
    bad = [p.rate for p in result.probes if not p.ok]
    if ok and bad:
        assert max(ok) < min(bad)
    assert result.rate == (max(ok) if ok else 0.0)


@pytest.mark.parametrize(
    ("low", "high", "expansion"),
    [
        (0.5, 8.0, None),
        (0.1, 1.0, "expanded upward to 4"),
        (0.5, 2.0, "expanded upward to 4"),
        (5.0, 8.0, "expanded downward to 2.5"),
    ],
)
def test_bisection_finds_threshold_within_precision(low, high, expansion):
    result = find_goodput(threshold_criterion, low=low, high=high, precision=0.01, max_probes=40)
    assert result.rate <= THRESHOLD < result.rate + result.margin
    assert result.margin < 0.01
    assert result.reason == ""
    assert_consistent(result)
    notes = " ".join(result.notes)
    assert (expansion in notes) if expansion else not notes


@settings(max_examples=200, deadline=None)
@given(
    looks=st.floats(0.05, 40.0),
    confirmed=st.floats(0.0, 1.0),
    low=st.floats(0.2, 6.0),
    span=st.floats(1.5, 8.0),
    precision=st.sampled_from([0.01, 0.1, 0.5]),
)
def test_the_answer_is_confirmed_and_a_withdrawn_pass_closes_the_bracket(
    looks, confirmed, low, span, precision
):
    """First looks pass up to ``looks`` req/s, the longest look only up to a lower rate (a short
    look is optimistic): the answer passes confirmation, the rate above it fails, within the
    precision, and every probe that passed above the answer was replaced by its failed
    confirmation."""
    truth = looks * confirmed
    confirms: list[float] = []

    def first_look(rate: float) -> ProbeResult:
        return ProbeResult(rate, rate <= looks, {"look": 1.0})

    def longest_look(rate: float) -> ProbeResult:
        confirms.append(rate)
        return ProbeResult(rate, rate <= truth, {"look": 2.0}, "" if rate <= truth else "longer")

    result = find_goodput(
        first_look, low=low, high=low * span, precision=precision, max_probes=60, confirm=longest_look
    )
    assert_consistent(result)
    assert len(set(confirms)) == len(confirms)  # no rate confirmed twice
    # a withdrawn pass does not start a walk down, one confirmation per step
    assert len(confirms) <= 2 * math.log2(16 * 16 * span / precision) + 2
    if result.rate > 0:
        assert result.best.metrics["look"] == 2.0 and result.rate <= truth
        assert result.margin < precision or math.isinf(result.margin)
        assert result.rate + result.margin > truth or math.isinf(result.margin)
    else:  # nothing passed confirmation down to the floor (low / 16)
        assert truth < low / 8 and result.reason.startswith("even ")
    for p in result.probes:
        if p.rate > result.rate:
            assert not p.ok
    withdrawn = [r for r in confirms if r > truth]
    assert sum("failed confirmation" in n for n in result.notes) == len(withdrawn)


@settings(max_examples=100, deadline=None)
@given(
    truth=st.floats(0.0, 10.0),
    low=st.floats(0.2, 6.0),
    span=st.floats(1.1, 8.0),
    precision=st.sampled_from([0.01, 0.1, 0.5]),
)
def test_a_high_known_to_fail_is_not_probed_and_changes_nothing_else(truth, low, span, precision):
    """``high_fails``: the search runs as it would after a failed probe at ``high``, one probe
    fewer (when ``high`` fails at all), and never probes ``high`` itself."""
    high = low * span
    truth = min(truth, high * 0.999)  # high is infeasible, as the flag promises

    def judged(rate: float) -> ProbeResult:
        return ProbeResult(rate, rate <= truth, {}, "" if rate <= truth else "over")

    kwargs = dict(low=low, high=high, precision=precision, max_probes=60)
    probed = find_goodput(judged, **kwargs)
    skipped = find_goodput(judged, **kwargs, high_fails=True)
    assert high not in [p.rate for p in skipped.probes]
    assert (skipped.rate, skipped.margin, skipped.reason) == (probed.rate, probed.margin, probed.reason)
    assert [p.rate for p in skipped.probes] == [p.rate for p in probed.probes if p.rate != high]
    assert_consistent(skipped)


@settings(max_examples=200, deadline=None)
@given(
    looks=st.floats(0.05, 40.0),
    confirmed=st.floats(0.0, 1.0),
    low=st.floats(0.2, 6.0),
    span=st.floats(1.5, 8.0),
    precision=st.sampled_from([0.01, 0.1, 0.5]),
)
def test_deferring_the_first_confirmation_below_a_withdrawal_finds_the_same_answer(
    looks, confirmed, low, span, precision
):
    """Monotone first looks and confirmations: confirming the pass below the first withdrawal
    after the bisection above it gives the same goodput and bracket as confirming it first."""
    truth = looks * confirmed

    def search(defer: bool):
        confirms: list[float] = []

        def longest_look(rate: float) -> ProbeResult:
            confirms.append(rate)
            return ProbeResult(rate, rate <= truth, {"look": 2.0}, "" if rate <= truth else "longer")

        result = find_goodput(
            lambda r: ProbeResult(r, r <= looks, {"look": 1.0}),
            low=low,
            high=low * span,
            precision=precision,
            max_probes=60,
            confirm=longest_look,
            defer_confirmation=defer,
        )
        return result, confirms

    (first, _), (deferred, confirms) = search(False), search(True)
    assert (deferred.rate, deferred.margin, deferred.reason) == (first.rate, first.margin, first.reason)
    assert_consistent(deferred)
    assert len(set(confirms)) == len(confirms)
    if deferred.rate > 0:
        assert deferred.best.metrics["look"] == 2.0


@settings(max_examples=200, deadline=None)
@given(
    looks=st.floats(0.3, 30.0),
    confirmed=st.floats(0.3, 1.0),
    starts=st.lists(
        st.tuples(st.floats(0.1, 25.0), st.floats(1.05, 6.0), st.booleans()), min_size=2, max_size=4
    ),
    grid=st.sampled_from([0.1, 0.25, 0.5]),
)
def test_on_a_grid_the_answer_does_not_depend_on_the_bracket(looks, confirmed, starts, grid):
    """With ``grid``, searches from different brackets (with or without an infeasible ``high``
    known, as the planner's) probe only multiples of the grid and agree on the answer: the
    highest multiple that passes its confirmation, whose neighbour above fails."""
    truth = looks * confirmed
    answers = set()
    for low, span, known in starts:
        high = low * span
        result = find_goodput(
            lambda r: ProbeResult(r, r <= looks),
            low=low,
            high=high,
            precision=grid,
            max_probes=60,
            min_rate=grid,  # the default floors (low / 16, high x 16) would differ between starts
            max_rate=256.0,
            confirm=lambda r: ProbeResult(r, r <= truth, {"look": 2.0}),
            high_fails=known and high > looks,
            defer_confirmation=True,
            grid=grid,
        )
        assert_consistent(result)
        for p in result.probes:
            assert math.isclose(p.rate / grid, round(p.rate / grid))
        answers.add(round(result.rate / grid))
    expected = math.floor(truth / grid) + 1
    while expected > 0 and expected * grid > truth:  # the multiples as the search computes them
        expected -= 1
    assert answers == {expected}


def test_on_a_grid_rates_below_one_step_are_halved_as_before():
    """A goodput below one grid step is not rounded to 0: under the grid the search halves on,
    from any bracket to the same rates."""
    for low, high in ((4.0, 8.0), (6.5, 9.0), (1.0, 2.0)):
        result = find_goodput(
            lambda r: ProbeResult(r, r <= 0.3),
            low=low,
            high=high,
            precision=2.0,
            max_probes=20,
            min_rate=0.1,
            grid=2.0,
        )
        assert result.rate == 0.25 and result.margin == 0.25
        assert [p.rate for p in result.probes][-4:] == [2.0, 1.0, 0.5, 0.25]


def test_a_deferred_confirmation_is_saved_when_a_pass_above_it_confirms():
    """First looks pass to 6.6 req/s, the longest to 6.3: 6.5 is withdrawn; confirming 6.0
    first (the rule) costs a confirmation the bisection's confirmed 6.25 makes moot."""
    runs = {}
    for defer in (False, True):
        confirms: list[float] = []

        def longest_look(rate: float, confirms=confirms) -> ProbeResult:
            confirms.append(rate)
            return ProbeResult(rate, rate <= 6.3)

        result = find_goodput(
            lambda r: ProbeResult(r, r <= 6.6),
            low=4.0,
            high=8.0,
            precision=0.5,
            max_probes=30,
            confirm=longest_look,
            high_fails=True,
            defer_confirmation=defer,
        )
        runs[defer] = (result.rate, confirms)
    assert runs[False] == (6.25, [6.5, 6.0, 6.25])
    assert runs[True] == (6.25, [6.5, 6.25])


def test_feasible_at_cap_reports_lower_bound():
    result = find_goodput(
        lambda r: ProbeResult(r, True), low=1.0, high=4.0, precision=0.1, max_probes=20, max_rate=32.0
    )
    assert result.rate == 32.0 and math.isinf(result.margin)
    assert "at least" in result.notes[-1]
    assert [p.rate for p in result.probes] == [1.0, 4.0, 8.0, 16.0, 32.0]


def test_search_is_deterministic_and_reports_progress():
    seen: list[float] = []
    first = find_goodput(
        threshold_criterion,
        low=0.5,
        high=8.0,
        precision=0.05,
        max_probes=30,
        progress=lambda p: seen.append(p.rate),
    )
    second = find_goodput(threshold_criterion, low=0.5, high=8.0, precision=0.05, max_probes=30)
    assert first.to_dict() == second.to_dict()
    assert seen == [p.rate for p in first.probes]


def test_probe_budget_stops_the_search():
    result = find_goodput(threshold_criterion, low=0.5, high=8.0, precision=1e-6, max_probes=5)
    assert len(result.probes) == 5
    assert result.margin > 1e-6 and "exhausted" in result.notes[-1]
    assert result.rate <= THRESHOLD < result.rate + result.margin


def test_zero_goodput_names_the_reason():
    result = find_goodput(
        lambda r: ProbeResult(r, False, reason="P90 TPOT: 312.00 ms > 200 ms"),
        low=0.5,
        high=8.0,
        precision=0.1,
        max_probes=20,
        min_rate=0.125,
    )
    assert result.rate == 0.0 and result.best is None and math.isnan(result.attainment)
    assert result.reason == "even 0.125 req/s fails: P90 TPOT: 312.00 ms > 200 ms"
    assert [p.rate for p in result.probes] == [0.5, 0.25, 0.125]
    assert "goodput 0" in result.describe()


def test_invalid_search_arguments_are_rejected():
    with pytest.raises(ValueError, match="low < high"):
        find_goodput(threshold_criterion, low=8.0, high=1.0, precision=0.1, max_probes=10)
    with pytest.raises(ValueError, match="precision"):
        find_goodput(threshold_criterion, low=1.0, high=8.0, precision=0.0, max_probes=10)


# ---- the probe judge on fabricated records -------------------------------------------------------


def record(
    i: int, arrived_at: float, ttft_s: float, tpot_s: float = 0.05, num_tokens: int = 5
) -> RequestRecord:
    first = arrived_at + ttft_s
    times = [first + k * tpot_s for k in range(num_tokens)]
    return RequestRecord(
        i,
        arrived_at,
        100,
        num_tokens,
        num_generated=num_tokens,
        scheduled_at=arrived_at,
        first_token_at=first,
        finished_at=times[-1],
        finish_reason=FinishReason.LENGTH,
        token_times=times,
    )


def run_with_misses(rate: float, n: int = 200) -> list[RequestRecord]:
    """Requests whose miss share grows with rate: floor(2 r)% slow TTFT and as many slow TPOT
    (on other requests), so each P90 passes up to 10% while attainment falls twice as fast."""
    misses = math.floor(2 * rate)  # per 100 requests, each kind
    out = []
    for i in range(n):
        slot = i % 100
        ttft = 3.0 if slot < misses else 0.3
        tpot = 0.3 if misses <= slot < 2 * misses else 0.05
        out.append(record(i, i / rate, ttft, tpot))
    return out


def test_attainment_is_stricter_than_p90():
    runs = [run_with_misses(4.0)]  # 8% slow TTFT + 8% slow TPOT on other requests
    p90 = judge_records(runs, SLO_DEFAULT, rate=4.0, criterion="p90")
    share = judge_records(runs, SLO_DEFAULT, rate=4.0, criterion="attainment", attainment=0.9)
    assert p90.ok and p90.metrics["slo_attainment"] == pytest.approx(0.84)
    assert not share.ok and share.reason.startswith("attainment 84.0% < 90%")


def test_attainment_goodput_on_synthetic_records():
    def judge(criterion):
        return lambda rate: judge_records(
            [run_with_misses(rate)], SLO_DEFAULT, rate=rate, criterion=criterion, attainment=0.9
        )

    share = find_goodput(judge("attainment"), low=0.5, high=8.0, precision=0.05, max_probes=30)
    # attainment = 1 - 2 floor(2 r) / 100 >= 0.9 iff floor(2 r) <= 5 iff r < 3
    assert share.rate < 3.0 <= share.rate + share.margin and share.margin < 0.05
    assert share.attainment >= 0.9
    assert_consistent(share)
    # each P90 passes while floor(2 r) <= 10, i.e. r < 5.5: the P90 goodput is the laxer one
    p90 = find_goodput(judge("p90"), low=0.5, high=8.0, precision=0.05, max_probes=30)
    assert p90.rate < 5.5 <= p90.rate + p90.margin
    assert p90.attainment < 0.9


def test_failed_requests_count_as_infinite_ttft():
    runs = [[record(i, i * 0.5, 0.2) for i in range(85)]]
    for i in range(85, 100):  # 15% rejected
        runs[0].append(
            RequestRecord(i, i * 0.5, 100, 5, finished_at=i * 0.5, finish_reason=FinishReason.REJECTED)
        )
    probe = judge_records(runs, SLO_DEFAULT, rate=2.0)
    assert not probe.ok and math.isinf(probe.metrics["p90_ttft_ms"])
    assert "15 of 100 requests rejected" in probe.reason


def test_the_probe_tpot_percentile_is_the_run_summarys():
    """judge_records takes P90 TPOT without building the whole summary: the same number as
    fastpp.metrics.summarize, failures and one-token outputs left out as there."""
    from fastpp.metrics import summarize

    records = run_simulation(
        WorkloadConfig(rate=9.0, num_requests=300, seed=1),
        DeploymentConfig(pp=4, policy="static:256"),
        record_iterations=False,
    ).result.records
    records += [
        RequestRecord(900, 1.0, 100, 5, finished_at=1.0, finish_reason=FinishReason.REJECTED),
        record(901, 2.0, 0.3),
    ]
    probe = judge_records([records], SLO_DEFAULT, rate=9.0)
    assert probe.metrics["p90_tpot_ms"] == summarize(records)["p90_tpot_ms"]
    one_token = [[record(0, 0.0, 0.1, num_tokens=1)]]  # no TPOT at all: NaN, as summarize
    assert math.isnan(judge_records(one_token, SLO_DEFAULT, rate=1.0).metrics["p90_tpot_ms"])


def test_steady_state_flags_a_growing_queue():
    # TTFT climbs 9 ms per request: pooled P90 (~1.7 s) passes, but the queue is growing
    growing = [[record(i, i * 0.25, 0.1 + 0.009 * i) for i in range(200)]]
    steady = check_steady_state(growing, SLO_DEFAULT)
    assert not steady.is_stationary
    probe = judge_records(growing, SLO_DEFAULT, rate=4.0)
    assert probe.metrics["p90_ttft_ms"] < 2000
    assert not probe.ok and probe.reason.startswith("queue not stationary")
    # the paper's fixed-run protocol judges the P90s alone; the growth is still in the metrics
    lax = judge_records(growing, SLO_DEFAULT, rate=4.0, require_steady=False)
    assert lax.ok and lax.metrics["median_ttft_q4_ms"] > 1.5 * lax.metrics["median_ttft_q2_ms"]

    flat = [[record(i, i * 0.25, 0.3 + 0.2 * ((i * 7) % 10) / 10) for i in range(200)]]
    assert check_steady_state(flat, SLO_DEFAULT).is_stationary
    assert judge_records(flat, SLO_DEFAULT, rate=4.0).ok


def test_steady_state_catches_a_queue_whose_median_ttft_doubles():
    """Issue 13's TP probe: median TTFT 320 ms early, 617 ms late, both P90s passing. The old
    halves test (50% + 10% of the SLO) let it through; the quarters test must not."""
    n = 400
    doubling = [[record(i, i * 0.3, 0.25 + 0.45 * i / n) for i in range(n)]]
    steady = check_steady_state(doubling, SLO_DEFAULT)
    assert steady.late_ms > 1.5 * steady.early_ms and not steady.is_stationary
    assert not judge_records(doubling, SLO_DEFAULT, rate=3.0).ok


def test_a_simulated_run_says_whether_its_queue_was_steady():
    """The summary's queue_steady is the goodput search's rule on that one run: PP=4 sustains
    Azure lengths at 3 req/s, not at 9 (a replay, whose own rate changes, gets no verdict)."""
    deployment = DeploymentConfig(pp=4, policy="static:512")
    light, heavy = (
        run_simulation(
            WorkloadConfig(rate=rate, num_requests=600), deployment, record_iterations=False
        ).summary
        for rate in (3.0, 9.0)
    )
    assert light["queue_steady"] is True and heavy["queue_steady"] is False
    assert heavy["median_ttft_q4_ms"] > 2 * heavy["median_ttft_q2_ms"]
    assert light["median_ttft_q4_ms"] < 2000
    replay = WorkloadConfig(replay="azure-conv", replay_window_s=30.0)
    assert "queue_steady" not in run_simulation(replay, deployment, record_iterations=False).summary


def test_a_share_of_misses_near_ten_percent_is_unsettled_and_far_from_it_settled():
    from fastpp.sim.goodput import is_unsettled

    def runs(share_slow):  # each request misses the TTFT SLO with this chance, 800 requests
        rng = random.Random(1)
        return [[record(i, i * 0.25, 3.0 if rng.random() < share_slow else 0.3) for i in range(800)]]

    assert is_unsettled(runs(0.1), SLO_DEFAULT)
    assert not is_unsettled(runs(0.02), SLO_DEFAULT) and not is_unsettled(runs(0.5), SLO_DEFAULT)


def test_seed_rates_are_each_seeds_own_bracket():
    from fastpp.sim.goodput import ProbeResult, _seed_rates

    probes = [
        ProbeResult(2.0, True, seed_ok=(True, True)),
        ProbeResult(4.0, False, seed_ok=(True, False)),
        ProbeResult(3.0, True, seed_ok=(True, False)),
        ProbeResult(5.0, False, seed_ok=(False, False)),
    ]
    assert _seed_rates(probes, 2) == (4.0, 2.0)
    assert _seed_rates([ProbeResult(1.0, False, seed_ok=(False,))], 1) == (0.0,)


# ---- one small real search -----------------------------------------------------------------------


def test_slo_goodput_small_real_run(monkeypatch):
    import fastpp.sim.goodput as goodput_module

    monkeypatch.setattr(goodput_module, "MAX_REQUESTS_PER_SEED", 1500)
    workload = WorkloadConfig(name="cnn-dailymail-synthetic")
    deployment = DeploymentConfig(model="Qwen2.5-14B", pp=2, policy="static:512")
    kwargs = dict(seeds=(0,), num_requests=120, precision=2.0, low=1.0, high=8.0)
    result = slo_goodput(workload, deployment, **kwargs)
    assert result.rate > 0 and result.reason == ""
    assert result.margin < 2.0
    assert_consistent(result)
    assert 0.0 < result.attainment <= 1.0
    assert "P90 TTFT <= 2000 ms" in result.criterion
    again = slo_goodput(workload, deployment, **kwargs)
    assert again.to_dict() == result.to_dict()
    assert result.seeds == (0,) and len(result.seed_rates) == 1
    for p in result.probes:  # settled at some doubling of the start, or at the cap (the last)
        assert p.metrics["requests_per_seed"] in (120, 240, 480, 960, 1500)
        assert p.metrics["converged"] == 1.0 or p.metrics["requests_per_seed"] == 1500
        assert p.seed_ok == (p.ok,)  # one seed: its own verdict is the pooled one
    fixed = slo_goodput(workload, deployment, **kwargs, converge=False)
    assert all(p.metrics["requests_per_seed"] == 120 for p in fixed.probes)


def test_a_longer_look_judges_the_first_requests_of_one_run_that_goes_on(monkeypatch):
    """A converging probe of n requests per seed judges the first n arrivals of a run whose
    arrivals go on a quarter of the cap past the longest look: the same verdict and metrics as
    judge_records on those records taken from one uninterrupted run."""
    import fastpp.sim.goodput as goodput_module

    monkeypatch.setattr(goodput_module, "MAX_REQUESTS_PER_SEED", 240)
    workload = WorkloadConfig(name="cnn-dailymail-synthetic")
    deployment = DeploymentConfig(model="Qwen2.5-14B", pp=2, policy="static:512")
    result = slo_goodput(
        workload, deployment, seeds=(0, 1), num_requests=60, precision=2.0, low=4.0, high=8.0
    )
    for probe in result.probes:
        n = int(probe.metrics["requests_per_seed"])
        runs = [
            run_simulation(
                replace(workload, rate=probe.rate, seed=seed, num_requests=240 + 60),
                deployment,
                record_iterations=False,
            ).result.records[:n]
            for seed in (0, 1)
        ]
        again = judge_records(runs, deployment.slo, rate=probe.rate)
        assert (again.ok, again.reason) == (probe.ok, probe.reason)
        assert again.metrics == {k: v for k, v in probe.metrics.items() if k in again.metrics}


def test_slo_misses_count_only_what_is_certain():
    from fastpp.sim.goodput import SloMisses

    late, prompt = record(0, 0.0, 2.5), record(1, 1.0, 0.5)  # missed, met
    rejected = RequestRecord(2, 2.0, 100, 5, finished_at=2.0, finish_reason=FinishReason.REJECTED)
    waiting = RequestRecord(3, 3.0, 100, 5)  # no first token yet
    after = RequestRecord(4, 3.5, 100, 5, finished_at=3.5, finish_reason=FinishReason.REJECTED)
    records = [late, prompt, rejected, waiting, after]
    misses = SloMisses(SLO_DEFAULT)
    assert misses.count(records, now=4.0) == (2, 0)  # 3 waited 1 s: open, and so is 4 after it
    assert misses.count(records, now=5.5) == (4, 0)  # request 3 has now waited past 2 s
    stop_at = misses.give_up_when(lambda ttft, tpot: ttft > 3)
    assert stop_at(records, 6.0)


def test_slo_misses_count_a_tpot_once_it_cannot_meet_the_slo():
    """Met TTFT: a finished request with a slow TPOT misses; one still decoding misses once the
    time since its first token exceeds 200 ms x (tokens asked for - 1); a fast one never."""
    from fastpp.sim.goodput import SloMisses

    slow_done = record(0, 0.0, 0.5, tpot_s=0.3)  # finished at 1.7 s, TPOT 300 ms
    decoding = RequestRecord(
        1, 1.0, 100, 5, num_generated=2, scheduled_at=1.0, first_token_at=1.2
    )  # 5 tokens asked: at most 4 x 200 ms after 1.2
    fast = RequestRecord(2, 1.0, 100, 5, num_generated=2, scheduled_at=1.0, first_token_at=1.5)
    records = [slow_done, decoding, fast]
    misses = SloMisses(SLO_DEFAULT)
    assert misses.count(records, now=1.9) == (0, 1)  # decoding: 0.7 s / 4 = 175 ms, still open
    assert misses.count(records, now=2.1) == (0, 2)  # 0.9 s / 4 = 225 ms: it cannot make 200 ms
    assert misses.count(records, now=2.2) == (0, 2)  # counted once
    fast.finished_at, fast.finish_reason, fast.num_generated = 2.0, FinishReason.LENGTH, 5
    assert misses.count(records, now=9.0) == (0, 2)  # it finished at 125 ms per token


@pytest.mark.parametrize("n", [2, 10, 11, 101, 1234])
def test_sure_p90_failure_needs_certain_p90_miss_ttft_misses(n):
    """One TTFT miss fewer than ``certain_p90_miss`` (just over the limit, the rest fast) and
    the look can still pass: no sure failure; with that many it fails, and is sure to."""
    from fastpp.sim.goodput import certain_p90_miss, sure_p90_failure

    limit = 2.0 + SLO_SLACK_MS / 1e3
    for misses in (certain_p90_miss(n) - 1, certain_p90_miss(n)):
        records = [record(i, float(i), limit * (1 + 1e-6) if i < misses else 0.1) for i in range(n)]
        verdict = judge_records([records], SLO_DEFAULT, rate=1.0, require_steady=False)
        assert sure_p90_failure(n)(misses, 0) == (not verdict.ok)


def _near(limit: float) -> st.SearchStrategy[float]:
    """Latencies on either side of an objective's limit (where a miss count is decided)."""
    return st.sampled_from([0.0, 0.5 * limit, limit * (1 - 1e-6), limit * (1 + 1e-6), 2 * limit])


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 2.0),
            _near(2.0 + SLO_SLACK_MS / 1e3),
            _near(0.2 + SLO_SLACK_MS / 1e3),
            st.sampled_from([1, 2, 3, 9]),
            st.booleans(),
        ),
        min_size=2,
        max_size=40,
    ),
    st.lists(st.floats(0.0, 30.0), min_size=1, max_size=6),
    st.integers(1, 2),
)
def test_a_sure_p90_failure_is_the_whole_looks_verdict(requests, looks, num_seeds):
    """Whenever the certain misses counted part-way through a run say the P90s fail for sure
    (``sure_p90_failure``), the finished run fails its P90s (pooled over the seeds too).
    Latencies sit just either side of the limits, where a count is tight."""
    from fastpp.sim.goodput import SloMisses, sure_p90_failure

    def arrival(i: int, gap: float) -> float:
        return i * 0.5 + gap

    def advance(rec: RequestRecord, ttft: float, tpot: float, aborts: bool, now: float) -> None:
        """The record as the scheduler leaves it at ``now`` (updated in place, as in a run)."""
        first = rec.arrived_at + ttft
        end = first + tpot * (rec.output_len - 1) * (0.5 if aborts else 1.0)
        if first <= now:
            rec.first_token_at, rec.num_generated = first, 1
        if end <= now:
            rec.finished_at = end
            rec.finish_reason = FinishReason.ABORTED if aborts else FinishReason.LENGTH
            rec.num_generated = 1 if aborts else rec.output_len

    order = sorted(range(len(requests)), key=lambda i: arrival(i, requests[i][0]))
    seeds = [
        [RequestRecord(i, arrival(i, requests[i][0]), 100, requests[i][3]) for i in order]
        for _ in range(num_seeds)
    ]
    counters = [SloMisses(SLO_DEFAULT) for _ in seeds]
    sure = sure_p90_failure(len(requests) * num_seeds)
    said_sure = False
    for now in [*sorted(looks), math.inf]:
        for records in seeds:
            for rec in records:
                _, ttft, tpot, _, aborts = requests[rec.req_id]
                advance(rec, ttft, tpot, aborts, now)
        if now < math.inf:
            counts = [
                counter.count([r for r in records if r.arrived_at <= now], now)
                for counter, records in zip(counters, seeds, strict=True)
            ]
            said_sure |= sure(sum(c[0] for c in counts), sum(c[1] for c in counts))
    verdict = judge_records(seeds, SLO_DEFAULT, rate=1.0, require_steady=False)
    if said_sure:
        assert not verdict.ok


def test_a_swamped_probe_stops_early_and_fails_as_its_whole_run_would(monkeypatch):
    """At a rate far past capacity each seed's look stops once more than half of its requests
    have missed TTFT; run to the end, the same look fails its P90 TTFT by far."""
    import fastpp.sim.goodput as goodput_module

    monkeypatch.setattr(goodput_module, "MAX_REQUESTS_PER_SEED", 400)
    workload = WorkloadConfig(name="cnn-dailymail-synthetic")
    deployment = DeploymentConfig(model="Qwen2.5-14B", pp=2, policy="static:512")
    result = slo_goodput(
        workload, deployment, seeds=(0, 1), num_requests=200, precision=8.0, low=4.0, high=96.0
    )
    (swamped,) = [p for p in result.probes if p.rate == 96.0]
    assert not swamped.ok and "probe stopped early" in swamped.reason
    assert swamped.metrics["stopped_early"] == 1.0 and swamped.seed_ok == (False, False)
    assert swamped.metrics["ttft_missed_at_least"] > 0.5
    n = int(swamped.metrics["requests_per_seed"])
    runs = [
        run_simulation(
            replace(workload, rate=96.0, seed=seed, num_requests=400 + 400 // 4),
            deployment,
            record_iterations=False,
        ).result.records[:n]
        for seed in (0, 1)
    ]
    whole = judge_records(runs, deployment.slo, rate=96.0)
    assert not whole.ok and whole.reason.startswith("P90 TTFT")
    assert whole.metrics["slo_attainment"] < 0.5


def test_a_seed_judged_alone_is_looked_at_longer_when_only_its_queue_looks_unsteady():
    """TP=4 on azure-conv at 2 req/s: seed 0's first 300 requests alone end in a burst that
    the quarters test reads as a growing queue; a single-seed search would look longer (600
    requests) and pass, so the seed's own verdict at that probe is a pass. (2.5 req/s passes
    too and is the answer, confirmed on the longest look; 2 req/s keeps its first look.)"""
    from fastpp.sim.goodput import MAX_REQUESTS_PER_SEED
    from fastpp.sim.run import open_simulation

    workload, deployment = WorkloadConfig(name="azure-conv"), DeploymentConfig(pp=1, tp=4)
    result = slo_goodput(workload, deployment, seeds=(0, 1), low=2.0, high=2.5, precision=1.0, max_probes=2)
    probe, answer = result.probes
    assert result.rate == 2.5 and answer.metrics["requests_per_seed"] == MAX_REQUESTS_PER_SEED
    assert probe.ok and probe.metrics["requests_per_seed"] == 300 and probe.seed_ok == (True, True)
    seed0 = open_simulation(
        replace(workload, rate=2.0, seed=0, num_requests=MAX_REQUESTS_PER_SEED + MAX_REQUESTS_PER_SEED // 4),
        deployment,
        record_iterations=False,
    )
    short = judge_records([seed0.run_until_ended(300)], deployment.slo, rate=2.0)
    assert short.reason.startswith("queue not stationary")
    assert judge_records([seed0.run_until_ended(600)], deployment.slo, rate=2.0).ok


def test_a_pass_that_fails_on_the_longest_look_is_withdrawn(monkeypatch):
    """TP=4 (14B) on cnn-reversed at 8.25 req/s: the first look (2,879 requests per seed) passes,
    settled, before the KV cache has filled; at the longest look (here 6,000) the queue has
    grown past the TTFT SLO, so the answer is withdrawn and, with no probe left, goodput is 0."""
    import fastpp.sim.goodput as goodput_module

    monkeypatch.setattr(goodput_module, "MAX_REQUESTS_PER_SEED", 6000)
    seen: list[ProbeResult] = []
    result = slo_goodput(
        WorkloadConfig(name="cnn-reversed-synthetic"),
        DeploymentConfig(model="Qwen2.5-14B", pp=1, tp=4),
        low=8.25,
        high=16.0,
        precision=4.0,
        max_probes=1,
        progress=seen.append,
    )
    first, confirmation = seen
    assert first.ok and first.metrics["converged"] == 1.0
    assert first.metrics["requests_per_seed"] < 6000
    assert not confirmation.ok and confirmation.reason.startswith("P90 TTFT")
    assert confirmation.metrics["requests_per_seed"] == 6000
    assert confirmation.metrics["confirmed"] == 1.0
    assert result.probes == (confirmation,) and result.rate == 0.0
    assert "8.25 req/s passed its first looks but failed confirmation" in result.notes


@pytest.mark.parametrize("n", [2, 3, 9, 10, 11, 12, 99, 100, 101, 1234, 12_000, 24_000])
def test_certain_p90_miss_is_the_fewest_misses_that_fail_the_p90_for_sure(n):
    """With that many misses the P90 exceeds the limit whatever the values; with one fewer it
    can stay within it (the others far below, the misses just above)."""
    from fastpp.sim.goodput import _p90, certain_p90_miss

    limit = 2000.0
    m = certain_p90_miss(n)
    assert 1 <= m <= n
    for miss in (limit + 1e-6, math.inf):
        for ok in (0.0, limit):
            assert _p90([ok] * (n - m) + [miss] * m) > limit
    assert _p90([0.0] * (n - m + 1) + [limit + 1e-6] * (m - 1)) <= limit


def test_the_longest_look_stops_at_a_sure_p90_failure_with_the_same_verdict(monkeypatch):
    """The confirmation of the 14B TP cnn-reversed pass (below) at its longest look, with the
    exact early stop and without it: the same verdict for the pool and for each seed; the early
    one says it stopped early."""
    import fastpp.sim.goodput as goodput_module

    monkeypatch.setattr(goodput_module, "MAX_REQUESTS_PER_SEED", 6000)

    def confirmation() -> ProbeResult:
        seen: list[ProbeResult] = []
        slo_goodput(
            WorkloadConfig(name="cnn-reversed-synthetic"),
            DeploymentConfig(model="Qwen2.5-14B", pp=1, tp=4),
            low=8.25,
            high=16.0,
            precision=4.0,
            max_probes=1,
            progress=seen.append,
        )
        return seen[-1]

    early = confirmation()
    monkeypatch.setattr(goodput_module, "certain_p90_miss", lambda n: n + 1)  # never sure
    whole = confirmation()
    assert not early.ok and not whole.ok and early.seed_ok == whole.seed_ok
    assert early.metrics["stopped_early"] == 1.0 and "stopped_early" not in whole.metrics
    assert early.metrics["requests_per_seed"] == whole.metrics["requests_per_seed"] == 6000
    assert whole.metrics["p90_ttft_ms"] > 2000


def test_the_cli_searches_from_the_library_defaults():
    import inspect

    from fastpp.cli.goodput_cmd import goodput
    from fastpp.sim.goodput import DEFAULT_HIGH, DEFAULT_LOW

    params = inspect.signature(goodput).parameters
    assert (params["low"].default, params["high"].default) == (DEFAULT_LOW, DEFAULT_HIGH)


def test_slo_goodput_rejects_a_replayed_trace():
    with pytest.raises(ValueError, match="replayed trace"):
        slo_goodput(WorkloadConfig(replay="azure-conv"), DeploymentConfig())


def test_goodput_cli_sweep_and_library_give_one_answer(tmp_path, monkeypatch):
    """`fastpp goodput`, `fastpp sweep --metric goodput` and slo_goodput (what
    scripts/make_results.py runs through the sweep) on one point: the same search, the same
    numbers. (The longest look is shortened to 2,000 requests per seed for speed; all three
    run in this process, the sweep with the serial executor.)"""
    import json

    from typer.testing import CliRunner

    import fastpp.sim.goodput as goodput_module
    from fastpp.cli.app import app

    monkeypatch.setattr(goodput_module, "MAX_REQUESTS_PER_SEED", 2000)

    point = ["-w", "cnn-dailymail-synthetic", "-m", "Qwen2.5-14B", "-n", "60"]
    runner = CliRunner()
    res = runner.invoke(
        app, ["goodput", *point, "-d", "pp2", "-p", "static:512", "--precision", "2", "--json"]
    )
    assert res.exit_code == 0, res.stderr
    cli = json.loads(res.stdout)[0]
    res = runner.invoke(
        app,
        [
            "sweep",
            "--metric",
            "goodput",
            *point,
            "-d",
            "pp2",
            "-p",
            "static:512",
            "--precision",
            "2",
            "--executor",
            "serial",
            "-o",
            str(tmp_path),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.stderr
    (row,) = json.loads(res.stdout)["rows"]
    lib = slo_goodput(
        WorkloadConfig(name="cnn-dailymail-synthetic"),
        DeploymentConfig(model="Qwen2.5-14B", pp=2, policy="static:512"),
        num_requests=60,
        precision=2.0,
    )
    assert lib.seeds == (0, 1) and cli["seeds"] == [0, 1]
    assert cli["goodput"] == row["goodput"] == lib.rate > 0
    assert cli["margin"] == row["margin"] == lib.margin
    assert cli["seed_goodputs"] == row["seed_goodputs"] == list(lib.seed_rates)
    assert len(cli["probes"]) == row["num_probes"] == len(lib.probes)


def test_a_probe_runs_with_the_collector_paused_and_restored():
    import gc

    from fastpp.sim.goodput import _collector_paused

    seen: list[bool] = []

    def probe(rate: float) -> ProbeResult:
        seen.append(gc.isenabled())
        if rate < 0:
            raise ValueError("bad rate")
        return ProbeResult(rate, True)

    assert gc.isenabled()
    assert _collector_paused(probe)(1.0).ok and seen == [False] and gc.isenabled()
    with pytest.raises(ValueError, match="bad rate"):
        _collector_paused(probe)(-1.0)
    assert gc.isenabled()
    gc.disable()
    try:
        _collector_paused(probe)(2.0)
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()

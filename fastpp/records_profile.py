"""A profile from a recorded run (``fastpp profile --from-records DIR``), whoever executed it.

Input: a run folder (``fastpp.run_files``) as the simulator, ``fastpp serve --backend torch
--record-dir``, the vLLM scheduler and the SGLang plugin write it: ``summary.json`` with the
run's ``setup`` (``fastpp.run_setup``: pp, the scheduler's KV pool and page size, the model's
shape, layers per stage), ``iterations.csv`` (each stage's measured interval per microbatch, with
the microbatch's ALP features) and ``requests.jsonl`` (the instants each token reached the
scheduler). Output: a ``measured`` profile of the same deployment that the simulator runs.

What comes from what (seconds; every estimate also lands in the profile's provenance):

* Stage costs: for each stage, its own recorded durations fitted by NNLS (``fastpp.stage_fit``)
  to ``table(N) + ALP terms``, and on the last stage ``+ h * sampled`` (the LM head per sampled
  row, ``IterationRecord.num_sampled``; files without it use the decode count, a lower bound).
  The table's points are chosen from the recorded token counts. One refit drops iterations whose
  relative residual is an outlier (``OUTLIER_MADS`` median absolute deviations, and at least
  ``OUTLIER_FLOOR``): a stall of the machine is not a cost of the microbatch.
* Link (stage i -> i+1): the gap from stage i's end to stage i+1's start of the same
  microbatch, taken only where stage i+1 was idle (its previous iteration had ended by then),
  so the gap is the hand-off and not queueing; alpha-beta fitted over the activation bytes.
  An executor that folds the transfer into the receiving stage's time (vLLM: a later stage's
  interval starts when it has the activations) shows gaps of ~0 and gets a zero-latency link.
* Token return (last stage -> scheduler): for each microbatch that sampled, the first instant
  at or after its last stage's end at which requests.jsonl records a token; median delay.
* Stage turnaround (stages after the first): the gap from a stage's end to its next start where
  the next microbatch's activations were already there (the previous stage had ended a link
  latency before): the worker's time outside its recorded compute that does not overlap it
  (the CPU engine: receiving and preparing the input, sampling and sending the output);
  median, over at least ``MIN_TURNAROUND_GAPS`` such pairs (else 0, with a note). Stage 0's
  counterpart is inside the host overhead (below): 0.
* Host overhead per launch: the cycle gap of a slot, from a microbatch's last-stage end to the
  stage-0 start of the next microbatch of the same slot, where that one carried decodes (it was
  ready the moment the tokens came back) and stage 0 sat idle across the gap. In the simulator
  that gap is token return + host overhead, so host overhead = median gap - token return.
  With pp = 1 the simulator has no token return: the whole gap is host overhead.
* KV capacity, page size, pp, tp, token step, model shape, layers per stage: the setup (the
  model may be given instead, ``model=``); activation bytes per token = hidden size x dtype size.

Everything here is numpy and the core; nothing is engine-specific.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from fastpp.profile import DTYPE_BYTES, LinearTable, LinkCost, ModelShape, Profile, StageCost
from fastpp.run_files import ITERATIONS, REQUESTS, SUMMARY, RunFiles, read_run
from fastpp.run_setup import RunSetup
from fastpp.stage_fit import StageFit, fit_stage, nnls, table_points
from fastpp.types import IterationRecord, RequestRecord

MIN_ITERATIONS_PER_STAGE = 8  # fewer cannot pin a table and three attention terms
OUTLIER_MADS = 6.0  # refit without iterations this many MADs of relative residual from the median
OUTLIER_FLOOR = 0.1  # ... and at least this far (relative): a near-perfect fit drops nothing
MAX_OUTLIER_SHARE = 0.1  # never drop more than this share of a stage's iterations as outliers
# Bandwidth written when the gaps show no growth with the activation bytes (the transfer is
# not visible in the records): effectively free per byte, finite so the schema accepts it.
UNSEEN_BANDWIDTH_BYTES_PER_S = 1e15
# Token times are rebuilt from gaps rounded to 0.1 us (requests.jsonl), recorder clocks to 1 us:
# a token up to this much before the last stage's end still belongs to that microbatch.
CLOCK_SLACK_S = 1e-4
# A stage's turnaround is taken from at least this many back-to-back iterations (else 0): a
# pipeline that never had two microbatches in flight (vLLM at low load) shows only a stray few.
MIN_TURNAROUND_GAPS = 20


class RecordsProfileError(ValueError):
    """The run folder cannot give a profile; the message names the file and field."""


@dataclass(frozen=True, slots=True)
class GapEstimate:
    """One hand-off cost estimated from gaps between records."""

    seconds: float  # the estimate (median) used in the profile
    samples: int  # gaps it is taken from
    p10_s: float  # spread of those gaps
    p90_s: float

    def describe(self) -> str:
        if not self.samples:
            return "no usable gap"
        return (
            f"median {self.seconds * 1e3:.3f} ms of {self.samples} gaps "
            f"(p10 {self.p10_s * 1e3:.3f}, p90 {self.p90_s * 1e3:.3f} ms)"
        )


@dataclass(frozen=True, slots=True)
class RecordsProfile:
    """The profile and how well it matches the records it came from."""

    profile: Profile
    stage_fits: tuple[StageFit, ...]
    stage_median_ape: tuple[float, ...]  # per stage: median |predicted - recorded| / recorded
    num_iterations: tuple[int, ...]  # per stage: iterations fitted
    num_outliers: tuple[int, ...]  # per stage: iterations dropped as outliers
    token_return: GapEstimate
    cycle_gap: GapEstimate  # token return + host overhead
    link_gaps: int  # stage hand-off gaps the link was fitted on
    turnaround: tuple[GapEstimate, ...]  # per stage (stage 0: none measured)
    notes: tuple[str, ...]

    def summary_lines(self) -> list[str]:
        """What the CLI prints."""
        p = self.profile
        lines = [
            f"{p.model.name} pp={p.pp} tp={p.tp} recorded by {p.provenance['engine']} on {p.gpu}: "
            f"KV pool {p.kv_capacity_tokens:,} tokens, page {p.page_size}"
        ]
        for i, (stage, fit) in enumerate(zip(p.stages, self.stage_fits, strict=True)):
            head = f", LM head {fit.sampled_s * 1e3:.3f} ms/sampled row" if stage.lm_head is not None else ""
            lines.append(
                f"stage {i} ({stage.num_layers} layers): {self.num_iterations[i]} iterations "
                f"({self.num_outliers[i]} outliers dropped), table {fit.table.at(1) * 1e3:.2f} ms @1 .. "
                f"{fit.table.at(fit.table.tokens[-1]) * 1e3:.1f} ms @{fit.table.tokens[-1]} tokens{head}; "
                f"median error {self.stage_median_ape[i]:.1%}, mean {fit.mape:.1%}"
            )
        lines.append(
            f"host overhead {p.host_overhead_s * 1e3:.3f} ms/launch; token return "
            f"{p.token_return_s * 1e3:.3f} ms; link {p.link.latency_s * 1e3:.3f} ms + "
            f"{_bandwidth_text(p.link.bandwidth_bytes_per_s)} ({self.link_gaps} gaps)"
        )
        if p.pp > 1:
            lines.append(
                "stage turnaround "
                + ", ".join(
                    f"{t * 1e3:.3f} ms" + (f" ({est.samples} gaps)" if i else " (in host overhead)")
                    for i, (t, est) in enumerate(zip(p.stage_turnaround_s, self.turnaround, strict=True))
                )
            )
        lines.extend(f"note: {n}" for n in self.notes)
        return lines


def _bandwidth_text(bw: float) -> str:
    return "no per-byte cost seen" if bw >= UNSEEN_BANDWIDTH_BYTES_PER_S else f"{bw / 1e9:.3f} GB/s"


def sampled_rows(rec: IterationRecord) -> int:
    """Rows the last stage sampled: the recorded count, else the decode count (a lower bound:
    a prompt's last chunk samples too)."""
    return rec.num_sampled if rec.num_sampled >= 0 else rec.num_decode_reqs


def profile_from_records(
    run_dir: str | Path,
    *,
    model: ModelShape | None = None,
    name: str | None = None,
    created_at: str | None = None,
) -> RecordsProfile:
    """Fit a profile to the run folder ``run_dir`` (module docstring). ``model`` replaces (or
    stands in for a missing) ``setup.model``. Raises FileNotFoundError naming a missing file,
    RecordsProfileError (a ValueError) naming a missing or unusable field."""
    run_dir = Path(run_dir)
    run = read_run(run_dir)
    setup = RunSetup.from_summary(run.summary, run_dir / SUMMARY)
    return profile_from_run(run, setup, source=str(run_dir), model=model, name=name, created_at=created_at)


def _structure(shape: ModelShape) -> tuple[int, ...]:
    """What sets a model's costs: layers, widths and heads (not its name, dtype or context)."""
    return (shape.num_layers, shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.intermediate_size)


def _describe(shape: ModelShape) -> str:
    return f"{shape.num_layers} layers, hidden {shape.hidden_size}, {shape.num_heads} heads"


def profile_from_run(
    run: RunFiles,
    setup: RunSetup,
    *,
    source: str,
    model: ModelShape | None = None,
    name: str | None = None,
    created_at: str | None = None,
) -> RecordsProfile:
    """:func:`profile_from_records` on a run already read."""
    notes: list[str] = []
    shape = model or setup.model
    if shape is None:
        raise RecordsProfileError(
            f"{source}/{SUMMARY}: setup.model is null (the executor did not record the "
            "model's shape): give the model (--model DIR_OR_NAME)"
        )
    if model is not None and setup.model is not None and model != setup.model:
        recorded = setup.model
        if _structure(model) != _structure(recorded):  # another model: its costs would be wrong
            raise RecordsProfileError(
                f"{source}/{SUMMARY}: the run served {recorded.name} ({_describe(recorded)}); the "
                f"model given is {model.name} ({_describe(model)}): fit the run's own model (no "
                f"--model), or record a run of {model.name}"
            )
        notes.append(f"model shape from the caller ({model.name}), not the run's setup ({recorded.name})")
    pp = setup.pp
    if not run.iterations:
        raise RecordsProfileError(f"{source}/{ITERATIONS}: no iterations recorded")
    by_stage = _by_stage(run.iterations, pp, source)
    layers = setup.layers_per_stage
    if layers is None or sum(layers) != shape.num_layers:
        layers = _even_split(shape.num_layers, pp)
        notes.append(f"layers per stage not recorded (or not summing to the model's): assumed {list(layers)}")
    if any(r.num_sampled < 0 for r in by_stage[pp - 1]):
        notes.append("sampled rows not recorded: the LM head is fitted on the decode count (a lower bound)")

    fits, median_ape, counts, outliers = [], [], [], []
    for s in range(pp):
        fit, used, dropped, med = _fit_stage_records(by_stage[s], last=s == pp - 1, source=source, stage=s)
        fits.append(fit)
        counts.append(used)
        outliers.append(dropped)
        median_ape.append(med)

    top = min(fit.table.tokens[-1] for fit in fits)
    notes.append(
        f"stage tables cover the recorded microbatch sizes, 1 .. {top} tokens; larger microbatches "
        "are extrapolated along the last segment (record a run with the sizes you will simulate)"
    )
    dtype_bytes = DTYPE_BYTES.get(setup.dtype or "", shape.dtype_bytes)
    act_bytes = shape.hidden_size * dtype_bytes
    link, link_gaps, link_note = _fit_link(by_stage, act_bytes)
    turnaround = (_estimate([]),) + tuple(
        _turnaround(by_stage[s - 1], by_stage[s], link.latency_s) for s in range(1, pp)
    )
    turnaround_s = [0.0] * pp
    for s, est in enumerate(turnaround[1:], start=1):
        if est.samples >= MIN_TURNAROUND_GAPS:
            turnaround_s[s] = est.seconds
        else:
            notes.append(
                f"stage {s}: {est.samples} back-to-back iterations with their input waiting "
                f"(fewer than {MIN_TURNAROUND_GAPS}): turnaround 0 (not measurable here)"
            )
    token_return = _token_return(by_stage[pp - 1], run.records)
    cycle = _cycle_gap(by_stage[0], by_stage[pp - 1])
    if pp == 1:
        host_s, return_s = cycle.seconds, 0.0
    else:
        return_s = token_return.seconds
        host_s = max(cycle.seconds - return_s, 0.0)
    if not cycle.samples:
        notes.append("no decode cycle with an idle first stage: host overhead 0 (not measurable here)")
    if pp > 1 and not token_return.samples:
        notes.append(f"no token time after a last-stage end in {REQUESTS}: token return 0 (not measurable)")

    stages = tuple(
        StageCost(
            num_layers=layers[s],
            linear=fit.table,
            attn_past_x_pre_s=fit.attn_past_x_pre_s,
            attn_pre_sq_s=fit.attn_pre_sq_s,
            attn_dec_ctx_s=fit.attn_dec_ctx_s,
            fixed_s=0.0,
            embedding_s_per_token=0.0,
            lm_head=LinearTable((1,), (fit.sampled_s,)) if s == pp - 1 else None,
        )
        for s, fit in enumerate(fits)
    )
    engine = setup.engine
    provenance = {
        "source": "records",
        "tool": "fastpp.records_profile.profile_from_records",
        "run_dir": source,
        "engine": engine,
        "device": setup.device,
        "policy_of_run": setup.policy,
        "dtype": setup.dtype or f"{shape.dtype_bytes} bytes (model shape)",
        "iterations_fitted_per_stage": json.dumps(counts),
        "outliers_dropped_per_stage": json.dumps(outliers),
        "fit_median_ape_per_stage": json.dumps([round(m, 4) for m in median_ape]),
        "fit_mean_ape_per_stage": json.dumps([round(f.mape, 4) for f in fits]),
        "stage_cost": "per stage, NNLS of its recorded durations on table(N) + ALP terms (+ LM head per "
        "sampled row on the last); table points from the recorded token counts; fixed, "
        "embedding and per-iteration costs are inside the table",
        "link": link_note,
        "token_return": (
            "not used (pp = 1)"
            if pp == 1
            else "first token instant at/after the last stage's end, per sampling microbatch: "
            + token_return.describe()
        ),
        "stage_turnaround": (
            "per stage after the first, its end -> its next start where the next "
            "input had arrived (previous stage ended a link latency before): "
            + "; ".join(f"stage {i}: {t.describe()}" for i, t in enumerate(turnaround) if i)
            if pp > 1
            else "not used (pp = 1)"
        ),
        "host_overhead": (
            "slot cycle gap (last-stage end -> next stage-0 start of the same slot, next "
            "microbatch carrying decodes, stage 0 idle) minus token return: " + cycle.describe()
        ),
        "kv_capacity_and_page": "the run's scheduler (setup.scheduler)",
        "notes": "; ".join(notes) if notes else "none",
        "created_at": created_at or datetime.now(UTC).replace(microsecond=0).isoformat(),
    }
    executor = engine.split()[0] if engine.strip() else "engine"
    tp_text = f"tp{setup.tp}" if setup.tp > 1 else ""
    profile = Profile(
        name=name or _slug(f"records_{executor}_{shape.name}_pp{pp}{tp_text}"),
        kind="measured",
        provenance=provenance,
        gpu=setup.device,
        interconnect=f"{executor} (from records)",
        model=shape,
        pp=pp,
        tp=setup.tp,
        kv_capacity_tokens=setup.scheduler.kv_capacity_tokens,
        page_size=setup.scheduler.page_size,
        token_step=setup.scheduler.token_step,
        host_overhead_s=host_s,
        token_return_s=return_s,
        activation_bytes_per_token=act_bytes,
        link=link,
        stages=stages,
        stage_turnaround_s=tuple(turnaround_s),
    )
    return RecordsProfile(
        profile,
        tuple(fits),
        tuple(median_ape),
        tuple(counts),
        tuple(outliers),
        token_return,
        cycle,
        link_gaps,
        turnaround,
        tuple(notes),
    )


# ------------------------------------------------------------------------------ stage costs


def _by_stage(iterations: Sequence[IterationRecord], pp: int, source: str) -> list[list[IterationRecord]]:
    by_stage: list[list[IterationRecord]] = [[] for _ in range(pp)]
    for rec in iterations:
        if not 0 <= rec.stage < pp:
            raise RecordsProfileError(
                f"{source}/{ITERATIONS}: an iteration of stage {rec.stage} in a run with pp={pp} (setup.pp)"
            )
        if rec.num_tokens > 0:
            by_stage[rec.stage].append(rec)
    for s, recs in enumerate(by_stage):
        if len(recs) < MIN_ITERATIONS_PER_STAGE:
            raise RecordsProfileError(
                f"{source}/{ITERATIONS}: {len(recs)} iterations of stage {s}, need at "
                f"least {MIN_ITERATIONS_PER_STAGE} to fit its costs"
            )
        recs.sort(key=lambda r: (r.started_at, r.mb_id))
    return by_stage


def _features(recs: Sequence[IterationRecord]) -> np.ndarray:
    # [n, 4]: N, sum L_past*L_pre, sum L_pre^2, sum L_dec
    return np.array(
        [[r.num_tokens, r.sum_past_x_pre, r.sum_pre_sq, r.sum_dec_ctx] for r in recs], dtype=np.float64
    )


def _fit_stage_records(
    recs: Sequence[IterationRecord], *, last: bool, source: str, stage: int
) -> tuple[StageFit, int, int, float]:
    """Fit one stage; returns the fit, iterations used, outliers dropped, median APE (on the
    iterations used)."""
    timed = [r for r in recs if r.duration_s > 0]
    if len(timed) < MIN_ITERATIONS_PER_STAGE:
        raise RecordsProfileError(
            f"{source}/{ITERATIONS}: stage {stage} has {len(timed)} iterations with a "
            f"positive duration, need {MIN_ITERATIONS_PER_STAGE}"
        )
    X = _features(timed)
    y = np.array([r.duration_s for r in timed])
    S = np.array([sampled_rows(r) for r in timed], dtype=np.float64) if last else None
    points = table_points(X[:, 0].astype(int))
    fit = fit_stage(X, y, points, S)
    rel = (fit.predict(X, S) - y) / y
    med = np.median(rel)
    mad = np.median(np.abs(rel - med)) * 1.4826
    # drop the worst iterations beyond OUTLIER_MADS, at most MAX_OUTLIER_SHARE of them, and refit
    order = np.argsort(-np.abs(rel - med))[: int(MAX_OUTLIER_SHARE * len(y))]
    keep = np.ones(len(y), dtype=bool)
    keep[[i for i in order if abs(rel[i] - med) > max(OUTLIER_MADS * mad, OUTLIER_FLOOR)]] = False
    if not keep.all():
        Xk = X[keep]
        kept_points = table_points(Xk[:, 0].astype(int))
        if kept_points[-1] < points[-1]:  # the table still reaches every recorded N
            kept_points = (*kept_points, points[-1])
        fit = fit_stage(Xk, y[keep], kept_points, None if S is None else S[keep])
    used = int(keep.sum())
    ape = np.abs(fit.predict(X[keep], None if S is None else S[keep]) - y[keep]) / y[keep]
    return fit, used, len(y) - used, float(np.median(ape))


def _even_split(num_layers: int, pp: int) -> tuple[int, ...]:
    base, extra = divmod(num_layers, pp)
    return tuple(base + (1 if s < extra else 0) for s in range(pp))


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-")


# ------------------------------------------------------------------------------ hand-offs


def _estimate(gaps: Sequence[float]) -> GapEstimate:
    if not gaps:
        return GapEstimate(0.0, 0, 0.0, 0.0)
    a = np.asarray(gaps)
    return GapEstimate(float(np.median(a)), len(a), float(np.quantile(a, 0.1)), float(np.quantile(a, 0.9)))


def _fit_link(by_stage: list[list[IterationRecord]], act_bytes: int) -> tuple[LinkCost, int, str]:
    """Alpha-beta of the stage hand-offs where the receiving stage was idle (module docstring)."""
    pp = len(by_stage)
    if pp == 1:
        return LinkCost(0.0, UNSEEN_BANDWIDTH_BYTES_PER_S), 0, "not used (pp = 1)"
    sizes, gaps = [], []
    for s in range(pp - 1):
        for r, sent, prev_end in _handoffs(by_stage[s], by_stage[s + 1]):
            if prev_end <= sent:
                sizes.append(r.num_tokens * act_bytes)
                gaps.append(max(r.started_at - sent, 0.0))
    if not gaps:
        return (
            LinkCost(0.0, UNSEEN_BANDWIDTH_BYTES_PER_S),
            0,
            "no hand-off with an idle receiving stage: assumed free",
        )
    b = np.asarray(sizes, dtype=np.float64)
    g = np.asarray(gaps)
    latency, per_byte = _robust_line(b, g)
    bandwidth = (
        UNSEEN_BANDWIDTH_BYTES_PER_S if per_byte <= 1.0 / UNSEEN_BANDWIDTH_BYTES_PER_S else 1.0 / per_byte
    )
    note = (
        f"alpha-beta fit of {len(g)} stage hand-off gaps (receiving stage idle): latency "
        f"{latency * 1e3:.4f} ms, {_bandwidth_text(bandwidth)}; gap median {np.median(g) * 1e3:.4f} ms, "
        f"p90 {np.quantile(g, 0.9) * 1e3:.4f} ms"
    )
    return LinkCost(latency, bandwidth), len(g), note


def _handoffs(
    sender: Sequence[IterationRecord], receiver: Sequence[IterationRecord]
) -> list[tuple[IterationRecord, float, float]]:
    """For each receiver iteration (in start order, as ``_by_stage`` keeps them) whose microbatch
    the sender ran: (that iteration, the sender's end of it, the receiver's previous end)."""
    ends = {r.mb_id: r.finished_at for r in sender}
    out, prev_end = [], -math.inf
    for r in receiver:
        sent = ends.get(r.mb_id)
        if sent is not None:
            out.append((r, sent, prev_end))
        prev_end = max(prev_end, r.finished_at)
    return out


def _turnaround(
    sender: Sequence[IterationRecord], stage: Sequence[IterationRecord], link_s: float
) -> GapEstimate:
    """Median of (start - previous end) of ``stage``'s iterations whose input had arrived by that
    previous end: ``sender`` (the stage before) ended it ``link_s`` earlier."""
    return _estimate(
        [
            max(r.started_at - prev_end, 0.0)
            for r, sent, prev_end in _handoffs(sender, stage)
            if sent + link_s <= prev_end
        ]
    )


def _robust_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Non-negative intercept and slope of y over x, refitted once without outliers."""
    scale = max(float(x.max()), 1.0)
    A = np.column_stack([np.ones_like(x), x / scale])
    coef = nnls(A, y)
    res = y - A @ coef
    mad = np.median(np.abs(res - np.median(res))) * 1.4826
    keep = np.abs(res - np.median(res)) <= max(OUTLIER_MADS * mad, 1e-12)
    if 2 <= keep.sum() < len(y):
        coef = nnls(A[keep], y[keep])
    return float(coef[0]), float(coef[1] / scale)


def _token_instants(records: Sequence[RequestRecord]) -> list[float]:
    return sorted({t for r in records for t in r.token_times})


def _token_return(last: Sequence[IterationRecord], records: Sequence[RequestRecord]) -> GapEstimate:
    """Median delay from a sampling microbatch's last-stage end to the next token instant."""
    instants = _token_instants(records)
    if not instants:
        return _estimate([])
    ends = sorted(r.finished_at for r in last if sampled_rows(r) > 0)
    gaps = []
    for k, end in enumerate(ends):
        i = bisect.bisect_left(instants, end - CLOCK_SLACK_S)
        if i == len(instants):
            continue
        t = instants[i]
        # the instant must come before the next microbatch's end: otherwise this microbatch's
        # tokens were not recorded (e.g. its requests' records are missing) and t is another's
        if k + 1 < len(ends) and t > ends[k + 1]:
            continue
        gaps.append(max(t - end, 0.0))
    return _estimate(gaps)


def _cycle_gap(first: Sequence[IterationRecord], last: Sequence[IterationRecord]) -> GapEstimate:
    """Median of (stage-0 start of the slot's next microbatch - last-stage end), where that next
    microbatch carried decodes and stage 0 was idle across the gap."""
    last_end = {r.mb_id: r.finished_at for r in last}
    by_slot: dict[int, list[IterationRecord]] = defaultdict(list)
    for r in first:
        by_slot[r.slot].append(r)
    starts = [r.started_at for r in first]  # first is in start order
    ends_before: list[float] = list(np.maximum.accumulate([r.finished_at for r in first]))
    gaps = []
    for recs in by_slot.values():
        recs.sort(key=lambda r: r.mb_id)
        for cur, nxt in zip(recs, recs[1:], strict=False):
            end = last_end.get(cur.mb_id)
            if end is None or nxt.num_decode_reqs == 0 or sampled_rows(cur) == 0:
                continue
            # stage 0's iterations that started before nxt must all have ended by `end`
            i = bisect.bisect_left(starts, nxt.started_at)
            busy_until = ends_before[i - 1] if i > 0 else -math.inf
            if busy_until > end or nxt.started_at < end:
                continue
            gaps.append(nxt.started_at - end)
    return _estimate(gaps)


# ------------------------------------------------------------------------------ checking


def iteration_errors(profile: Profile, iterations: Sequence[IterationRecord]) -> list[dict]:
    """Per stage: how the profile's stage cost predicts each recorded iteration. Rows with
    ``stage``, ``n``, ``median_ape``, ``mean_ape``, ``p90_ape`` and ``median_bias`` (median of
    (predicted - recorded) / recorded: > 0 means the profile is slow)."""
    out = []
    for s, stage in enumerate(profile.stages):
        recs = [r for r in iterations if r.stage == s and r.num_tokens > 0 and r.duration_s > 0]
        if not recs:
            out.append(
                {
                    "stage": s,
                    "n": 0,
                    "median_ape": math.nan,
                    "mean_ape": math.nan,
                    "p90_ape": math.nan,
                    "median_bias": math.nan,
                }
            )
            continue
        pred = np.array(
            [
                stage.time_s(r.num_tokens, sampled_rows(r), r.sum_past_x_pre, r.sum_pre_sq, r.sum_dec_ctx)
                for r in recs
            ]
        )
        y = np.array([r.duration_s for r in recs])
        rel = (pred - y) / y
        out.append(
            {
                "stage": s,
                "n": len(recs),
                "median_ape": float(np.median(np.abs(rel))),
                "mean_ape": float(np.mean(np.abs(rel))),
                "p90_ape": float(np.quantile(np.abs(rel), 0.9)),
                "median_bias": float(np.median(rel)),
            }
        )
    return out

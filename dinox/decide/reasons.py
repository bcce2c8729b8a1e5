"""The decision in words: why this verdict (the reason line every output leads with), the warning an unstable
best trial carries, and the error for a store where nothing was measured. decide.verdict decides; this says it."""

from __future__ import annotations

import math
from collections import Counter

from dinox import record as rec
from dinox.contract import one_line
from dinox.decide.budget import Budget, DecisionError, fmt_cost, fmt_days
from dinox.decide.types import ModelVerdict
from dinox.spec import params
from dinox.store.trial_record import IPS_WINDOWS, TrialRecord

# Statuses that say "it did not fit": a sweep of only these has an answer (nothing fits), not a failure.
NO_FIT = ("oom", "skipped")


def status_summary(records: list[TrialRecord]) -> str:
    """`5 trials: error 4, crashed 1`."""
    counts = Counter(r.status or "unknown" for r in records)
    return f"{len(records)} trial{'s' if len(records) != 1 else ''}: " + ", ".join(
        f"{k} {v}" for k, v in counts.most_common()
    )


def check_something_measured(records: list[TrialRecord]) -> None:
    if any(r.status == "ok" for r in records) or all(r.status in NO_FIT for r in records):
        return
    errors = Counter(one_line(r.tags.get(rec.ERROR, ""), 200) for r in records if r.status not in NO_FIT)
    error, n = errors.most_common(1)[0]
    commonest = f"; the commonest error ({n}x): {error}" if error else ""
    raise DecisionError(f"nothing was measured ({status_summary(records)}){commonest}")


def reason(
    records: list[TrialRecord],
    models: list[ModelVerdict],
    recommended: ModelVerdict | None,
    unsettled: list[ModelVerdict],
    budget: Budget,
    needed: float,
) -> str:
    per_device = len({mv.device for mv in models}) > 1

    def where(mv: ModelVerdict) -> str:
        return f"{mv.label} on {mv.device}" if per_device else mv.label

    if recommended is not None:
        span = recommended.span
        assert span is not None
        cost = f", costing {fmt_cost(recommended.cost)}" if recommended.cost is not None else ""
        return (
            f"{recommended.label} is the largest model that finishes {budget.describe()}"
            f"{f', on {recommended.device}' if per_device else ''}: forecast {span.forecast_ips:.1f} "
            f"{recommended.best.forecast_unit} -> {fmt_days(span.days)} days{cost}; even at the slowest "
            f"{recommended.range_ends} "
            f"({span.slow_ips:.1f} img/s, {fmt_days(span.days_slow)} days) "
            f"{fmt_days(recommended.margin_days or 0.0)} days to spare"
        )
    if unsettled:
        mv = unsettled[0]
        span = mv.span
        assert span is not None
        return (
            f"not settled: {where(mv)} would finish {budget.describe()} at its forecast, {span.forecast_ips:.1f} "
            f"{mv.forecast_unit} -> {fmt_days(span.days)} days, but {mv.unsettled_why}"
        )
    if not any(r.status == "ok" for r in records):
        tried = sorted({r.batch_size for r in records if r.batch_size is not None})
        smallest = f"; the smallest batch tried was {tried[0]}" if tried else ""
        return (
            f"nothing fits: every configuration ran out of memory ({status_summary(records)}){smallest}. "
            "Try a smaller batch.size (or auto), model.grad_checkpointing, bf16-mixed or a larger device"
        )
    measured = [mv for mv in models if mv.span is not None]
    if not measured:
        return "no trial qualifies: none is ok within the policy (see each model's statuses and exclusions)"
    fastest = max(measured, key=lambda mv: mv.span.fast_ips)  # type: ignore[union-attr]
    fs = fastest.span
    assert fs is not None
    epochs = f", {fastest.epochs_in_budget:.1f} epochs in the budget" if fastest.epochs_in_budget else ""
    in_time = [mv for mv in measured if mv.over_cost and mv.days <= budget.days]
    money = f"; {where(in_time[0])} meets the deadline but {in_time[0].over_cost}" if in_time else ""
    return (
        f"no model finishes {budget.describe()}, even at the fastest window measured; it needs {needed:.1f} "
        f"{IPS_WINDOWS}. The fastest, {where(fastest)}, reaches {fs.fast_ips:.1f} img/s at its fastest window "
        f"-> {fmt_days(fs.days_fast)} days (forecast {fs.forecast_ips:.1f} {IPS_WINDOWS}, "
        f"{fmt_days(fs.days)} days){epochs}{money}"
    )


def unstable_warning(recommended: ModelVerdict | None) -> str:
    """An unstable best trial: the GO holds at its slowest window, but its forecast moved between windows."""
    best = recommended.best if recommended is not None else None
    if best is None or not best.unstable:
        return ""
    spread = f"differ by {best.spread:.0%}" if best.spread is not None else "disagree"
    return (
        f"the recommended trial's timed windows {spread}: the GO holds at the slowest of them, but its forecast "
        "is uncertain; `dinox run SPEC --remeasure-unsettled` on a quiet machine narrows it"
    )


# A timed window shorter than this on an accelerator is mostly its edges: each window synchronises the device at
# both ends and starts on a drained loader queue. Measured on an H200 (docs/evidence.md, "The third GPU"): the
# quickstart's 0.16 s windows forecast real training 13.6 % pessimistic; with a ResNet-50's 0.5-0.6 s windows and
# 40-step quickstart ones (~1.4 s), four untied slices held within 5 %. The note asks for a second (TARGET), with
# room. A CPU's windows block on every step: no note there.
SHORT_WINDOW_S = 0.5
TARGET_WINDOW_S = 1.0


def short_windows_note(recommended: ModelVerdict | None, records: list[TrialRecord]) -> str:
    """The recommended trial's timed windows were short for its accelerator: the bench_steps that make a second."""
    best = recommended.best if recommended is not None else None
    record = next((r for r in records if best is not None and r.run_id == best.run_id), None)
    if record is None or record.tags.get(rec.DEVICE, "cpu").split(":")[0] in ("cpu", ""):
        return ""
    seconds, windows = record.metrics.get(rec.WINDOW_S), record.metrics.get(rec.WINDOWS)
    steps = record.param_int(params.MEASURE_BENCH_STEPS)
    if not seconds or not windows or not steps or seconds / windows >= SHORT_WINDOW_S:
        return ""
    each = seconds / windows
    enough = math.ceil(steps * TARGET_WINDOW_S / each)
    return (
        f"the recommended trial's timed windows lasted {each:.2f} s each on {record.tags.get(rec.DEVICE)}: windows "
        f"this short are mostly their synchronised edges (on an H200, 0.16 s windows forecast real training 13.6 % "
        f"pessimistic, windows of 0.5-1.4 s within 5 %); measure.bench_steps: {enough} makes them a second"
    )

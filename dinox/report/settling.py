"""What a decision rests on and what would settle it, as people read it: the headline (and exit 3), each
model's measured range in days, the runs to measure again and the command, ties, verifications, and
report.md's Decision section. Shared by the terminal, the run's Description and report.md (report.text)."""

from __future__ import annotations

import shlex

from dinox.decide.budget import SECONDS_PER_DAY, fmt_cost, fmt_days
from dinox.decide.types import Candidate, ModelVerdict, Tie
from dinox.decide.verdict import Decision
from dinox.spec import params
from dinox.store.trial_record import IPS_P50, IPS_P90, IPS_WINDOWS, SETTLED_WINDOWS, code_span, inert, store_text


def headline(d: Decision) -> str:
    """The verdict and whether the evidence settled it, as every surface says it."""
    if d.shrunk:
        return f"{d.verdict} on SHRUNK trials (exit 3: `dinox run --shrink` measured a small stand-in, not the study)"
    return d.verdict if d.settled else f"{d.verdict} (exit 3: the measurement cannot decide)"


def days_range(mv: ModelVerdict) -> str:
    """The days at the slow and fast ends of what was measured: `12.1-13.0`."""
    s = mv.span
    return f"{fmt_days(s.days_fast)}-{fmt_days(s.days_slow)}" if s is not None else "-"


def model_verdict(mv: ModelVerdict) -> str:
    return mv.verdict or "-"


def verifications(d: Decision) -> list[tuple[ModelVerdict, str]]:
    """Each model whose plan rests on a trial trained for real (dinox verify): what the verification said."""
    out = []
    for mv in d.models:
        for c in (mv.best, *mv.tied) if mv.best is not None else ():
            if c.verified is not None:
                planned = (
                    " (planned with the real rate: outside the windows' range)"
                    if c.windows_ips
                    else " (not planned with, the box having moved: its rate only widens the range)"
                    if c.widened
                    else ""
                )
                out.append((mv, f"{code_span(c.run_name or c.run_id)}: {c.verified.describe()}{planned}"))
    return out


def remeasure_command(d: Decision) -> str:
    return f"dinox run {d.spec_arg} --remeasure-unsettled{' --shrink' if d.shrunk else ''}"


def head_to_head_command(d: Decision) -> str:
    return f"dinox head-to-head {d.spec_arg}"


def unsettled_lines(d: Decision) -> list[str]:
    """What would settle it: the runs to measure again and the command, or why measuring again cannot."""
    if d.settled and not (d.remeasure or d.capped):
        return []
    if d.shrunk:
        return [
            "measured shrunk: this decision tries the pipeline; the study's own figures come from "
            f"{code_span(f'dinox run {d.spec_arg}')} without --shrink, on the machine it will train on"
        ]
    out = []
    if d.remeasure:
        shown = ", ".join(map(code_span, d.remeasure[:6])) + (", ..." if len(d.remeasure) > 6 else "")
        out.append(f"measure again: {shown}: {code_span(remeasure_command(d))}")
    if d.capped:
        shown = ", ".join(map(code_span, d.capped[:6])) + (", ..." if len(d.capped) > 6 else "")
        # A --set that capped them is left out of the command (the advice is to raise it), and said.
        caps = frozenset({params.MEASURE_REPEATS, params.MEASURE_MAX_REPEATS})
        given = [s for s in d.sets if s.partition("=")[0].strip() in caps]
        sets = ", ".join(code_span(f"--set {store_text(s)}") for s in given)
        how = f" (measured with {sets}: leave it out)" if given else ""
        out.append(
            f"{shown}: a spec that allows fewer than {SETTLED_WINDOWS} timed windows (measure.repeats or "
            f"max_repeats) never settles a GO: raise it{how}, then {code_span(f'dinox run {d.spec_words(caps)}')}"
        )
    out += _moved_lines(d)
    if out:
        return out
    if any(mv.unsettled_why.startswith("too few") for mv in d.unsettled):
        command = code_span(f"dinox run {d.spec_arg}")
        return [f"no count of timed windows was recorded: measure it with {command} (3 windows or more)"]
    return [
        "their windows agreed: the budget lies within the measurement's own noise; longer windows "
        "(measure.bench_steps) narrow the range, or plan on the slow end"
    ]


def _moved_lines(d: Decision) -> list[str]:
    """Where an unsettled model's ends were widened by its sweep's move: what would settle it without that."""
    moved = [(mv.span.drift, mv.best.run_id) for mv in d.unsettled if mv.span and mv.span.drift and mv.best]
    if not moved:
        return []
    drift, run_id = moved[0]
    again = code_span(f"dinox run {d.spec_arg} --force")  # a plain run skips the trials the store holds
    verify = code_span(f"dinox verify {d.spec_arg} --run-id {shlex.quote(store_text(run_id))}")
    return [
        f"the sweep moved {drift:.1%} while it ran (its drift check), so each end is widened by that move: {again} "
        f"on a box that holds still measures every trial again in a sweep of its own, or {verify} holds the plan's "
        "trial against real training"
    ]


def excluded_line(d: Decision) -> str:
    """--exclude-unstable: how many trials it left out, and why (the tables below mark each one)."""
    if not d.policy.exclude_unstable:
        return ""
    n = sum(c.excluded.startswith("unstable") for mv in d.models for c in mv.candidates)
    return (
        f"- `--exclude-unstable`: {n} trial{'' if n == 1 else 's'} left out because their timed windows "
        "disagreed beyond measure.unstable_threshold (marked `unstable` in the tables)."
    )


def _boundary_line(c: Candidate, epochs: float | None) -> list[str]:
    """What the forecast charges the schedule's epoch boundaries, where it charges any."""
    if not epochs or c.epoch_boundary_s <= 0:
        return []
    if c.epoch_restart_step_s is not None:
        what = (
            f"the restarted loader's first batch, {c.epoch_start_s:.3g} s, and the step that trains on it, "
            f"{c.epoch_restart_step_s:.3g} s, less a typical step"
        )
    elif c.epoch_start_s > c.epoch_boundary_s:
        what = f"the restarted loader's first batch, {c.epoch_start_s:.3g} s, less the wait a steady fetch already pays"
    else:
        what = "the restarted loader's first batch"
    return [f"- Epoch boundaries, in the days: {epochs:g} x {c.epoch_boundary_s:.3g} s ({what})"]


def decision_section(d: Decision) -> list[str]:
    """What to do: the recommended configuration, what would settle it, or what would make a model fit."""
    b = d.budget
    out: list[str] = ["## Decision", ""]
    if d.recommended is not None and d.recommended.best is not None:
        rec, s, verify = d.recommended, d.recommended.span, f"dinox verify {d.spec_arg}"
        assert s is not None
        out += [f"Proceed with **{inert(rec.label)}** ({params_text(rec.params_m)}):", ""]
        out += [f"- {inert(k)}: {code_span(v)}" for k, v in rec.best.configuration.items()]
        out += _tied_lines(rec, d)
        out += [
            f"- Forecast: {s.forecast_ips:.1f} {rec.best.forecast_unit} -> **{fmt_days(s.days)} days** of the "
            f"{b.days:g}-day "
            f"budget, about {s.forecast_ips * SECONDS_PER_DAY * b.utilization:,.0f} images a day",
            f"- Margin: at the slowest {rec.range_ends}, {s.slow_ips:.1f} img/s -> {fmt_days(s.days_slow)} days "
            f"({fmt_days(rec.margin_days or 0.0)} days to spare); at the fastest, {s.fast_ips:.1f} img/s -> "
            f"{fmt_days(s.days_fast)} days",
            f"- Shown, not planned with: {rec.best.conservative_ips:.1f} {IPS_P90}, {rec.best.median_ips:.1f} "
            f"{IPS_P50}"
            + (f"; {rec.best.tflops:.1f} TFLOPs, MFU {rec.best.mfu:.1%}" if rec.best.mfu is not None else ""),
            *_boundary_line(rec.best, b.epochs),
            *([f"- Routine, in the days: {rec.best.routine.describe()}"] if rec.best.routine.seconds else []),
            *([f"- Device: {inert(rec.device)}"] if rec.device_name else []),
            *([f"- Cost: {fmt_cost(rec.cost)} for the whole schedule"] if rec.cost is not None else []),
            f"- MLflow run: {code_span(rec.best.run_id)}",
            *[f"- Verified: {v}" for mv, v in verifications(d) if mv is rec],
            *([] if rec.best.verified else [f"- Not verified: {code_span(verify)} trains it for real"]),
            "",
        ]
    elif d.unsettled:
        out += ["The measurement cannot decide. For each model it leaves open, what each end of its range says:", ""]
        for mv in d.unsettled:
            s = mv.span
            assert s is not None and mv.best is not None
            out.append(
                f"- **{inert(d.where(mv))}** ({code_span(mv.best.run_name)}): forecast {s.forecast_ips:.1f} "
                f"{mv.best.forecast_unit} -> {fmt_days(s.days)} days; at the slowest {mv.range_ends}, "
                f"{s.slow_ips:.1f} img/s -> "
                f"{fmt_days(s.days_slow)} days ({'GO' if s.days_slow <= b.days else 'NO-GO'}), at the fastest, "
                f"{s.fast_ips:.1f} img/s -> {fmt_days(s.days_fast)} days "
                f"({'GO' if s.days_fast <= b.days else 'NO-GO'}). Unsettled: {inert(mv.unsettled_why)}."
            )
            out += [f"- {line}" for line in head_to_head_lines(mv, d)]
        out.append("")
    else:
        out += ["No model fits the budget, even at the fastest window measured. To make it fit, one of:", ""]
        out.append(f"- reach {d.needed_ips:.1f} {IPS_WINDOWS} for the schedule as it is;")
        fastest = [mv for mv in d.models if mv.span is not None]
        if fastest:
            f = min(fastest, key=lambda mv: mv.days)
            out.append(f"- or grant {fmt_days(f.days)} days for the fastest model, {inert(f.label)};")
            if f.epochs_in_budget is not None:
                out.append(f"- or shorten the schedule to the {f.epochs_in_budget:.1f} epochs the budget buys it.")
        out.append("")
    return out


def head_to_head_lines(mv: ModelVerdict, d: Decision) -> list[str]:
    """What a head-to-head of the leaders settled, or the command that would settle a tie."""
    out = []
    best = mv.best
    if best is not None and best.rematch is not None:
        r = best.rematch
        bouts = "; ".join(b.describe() for b in mv.bouts)
        # Rounds under two OpenMP policies measured two steps: the figure pools the latest's (words of a closed set).
        over = (
            f" over the {r.pooled_rounds} with OMP_WAIT_POLICY={r.policy}, its latest round's"
            if r.pooled_rounds < r.rounds
            else ""
        )
        out.append(
            f"Measured again head to head, {r.rounds} interleaved rounds: {bouts}; the plan takes the rounds' "
            f"figures ({best.measured_ips:.1f} img/s pooled{over}, where the sweep had measured {r.sweep_ips:.1f})"
        )
    if d.contested and mv.lead is d.contested[0]:
        command = head_to_head_command(d)
        out.append(f"Tied: {code_span(command)} measures the tied trials again, interleaved, until their order settles")
    return out


def _tied_lines(mv: ModelVerdict, d: Decision) -> list[str]:
    out = [f"- {line}" for line in head_to_head_lines(mv, d)]
    if not mv.tied:
        return out
    ties, lead = mv.ties(), mv.lead
    assert lead is not None and mv.best is not None
    # Each tie is with the leader (the fastest forecast); the leader's own is with this one, the plan's trial.
    pair = {c.run_id: mv.paired(c).run_id for c in mv.tied}
    overlap = [t for t in ties if t.why == "overlap"]

    def with_this(t: Tie) -> bool:  # the tie is with this one: it is the leader's own, or this one leads
        return t.run_id == lead.run_id or lead is mv.best

    if overlap:
        whose = {with_this(t) for t in overlap}
        whose_s = (
            "this one's"
            if whose == {True}
            else "the leader's"
            if whose == {False}
            else "the leader's, whose own overlaps this one's"
        )
        names = ", ".join(code_span(t.run_name) for t in overlap)
        lines = [
            f"- Tied with {names}: their measured ranges overlap {whose_s}, so the measurement does not say "
            "which is faster"
        ]
    else:
        lines = []

    def other(t: Tie) -> str:  # whom the tie is with
        return "this one" if with_this(t) else "the leader"

    def moved(t: Tie) -> str:
        move = mv.moved[pair[t.run_id]]
        if move.within:
            return (
                f"- Tied with {code_span(t.run_name)}: measured in the same sweep as {other(t)}, which moved while it "
                f"ran ({move.describe()}), and the two lie closer than that move, so their ranges do not say "
                "which is faster"
            )
        return (
            f"- Tied with {code_span(t.run_name)}: measured in another sweep than {other(t)}, and the box moved "
            f"between the two ({move.describe()}), and the two lie closer than that move, so "
            "their ranges do not say which is faster"
        )

    lines += [moved(t) for t in ties if t.why == "moved"]
    lines += [
        f"- Tied with {code_span(t.run_name)}: measured again head to head with {other(t)}, and the rounds did not "
        "order the two"
        for t in ties
        if t.why == "head_to_head"
    ]
    faster = "the leader measured faster, but not surely so" if lead is not mv.best else "none measured faster"
    return [
        *lines,
        f"- The forecast is this one's, the slowest of the tied trials; {faster} (any of them will do)",
        *out,
    ]


def params_text(params_m: float | None) -> str:
    return f"{params_m:.1f} M parameters" if params_m is not None else "parameter count not recorded"

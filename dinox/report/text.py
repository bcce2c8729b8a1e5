"""The decision as people read it: the terminal summary and report.md (``report_json`` is what programs read).
Pure rendering of a Decision; no MLflow, no policy."""

from __future__ import annotations

from dinox.decide.budget import Budget, fmt_cost, fmt_days
from dinox.decide.types import Candidate, ModelVerdict, drift_words
from dinox.decide.verdict import Decision
from dinox.report import findings, money
from dinox.report.findings import fmt_settings
from dinox.report.settling import (
    days_range,
    decision_section,
    excluded_line,
    head_to_head_lines,
    headline,
    model_verdict,
    params_text,
    unsettled_lines,
    verifications,
)
from dinox.spec import params
from dinox.store.trial_record import (
    IPS_P50,
    IPS_P90,
    IPS_REAL,
    IPS_WINDOWS,
    REAL_MARK,
    SETTLED_WINDOWS,
    code_span,
    inert,
)


def _fmt_config(config: dict[str, str]) -> str:
    short = {
        params.BATCH_SIZE: "batch",
        params.BATCH_ACCUMULATION: "accum",
        params.BATCH_EFFECTIVE: "effective",
        params.MODEL_GRAD_CHECKPOINTING: "ckpt",
        params.LOADER_NUM_WORKERS: "workers",
        params.LOADER_PIN_MEMORY: "pin",
    }
    return ", ".join(f"{short.get(k, k)}={v}" for k, v in config.items() if v not in ("None",))


def render_terminal(d: Decision) -> str:
    lines = [f"{headline(d)}: {d.reason}"] + ([f"WARNING: {d.unstable}"] if d.unstable else [])
    lines += unsettled_lines(d) + [""]
    width = max(5, *(len(d.where(mv)) for mv in d.models))
    priced = any(mv.cost is not None for mv in d.models)
    header = (
        f"{'model':<{width}} {'params M':>9} {'forecast':>9} {'slowest':>9} {'fastest':>9} {'MFU':>6} "
        f"{'days':>7} {'days range':>12}  "
        + (f"{'cost':>9}  " if priced else "")
        + f"{'verdict':<9} trials   (img/s over the timed windows: all of them, the slowest, the fastest)"
    )
    lines.append(header)
    for mv in d.models:
        b, s = mv.best, mv.span
        statuses = " ".join(f"{k}={v}" for k, v in sorted(mv.statuses.items()))
        mfu = f"{b.mfu:>6.1%}" if b is not None and b.mfu is not None else f"{'-':>6}"
        days = fmt_days(s.days) if s is not None else "-"
        cost = f"{fmt_cost(mv.cost) if mv.cost is not None else '-':>9}  " if priced else ""
        lines.append(
            f"{d.where(mv):<{width}} {_num(mv.params_m, 9, 1)} {_num(s and s.forecast_ips, 9, 1)} "
            f"{_num(s and s.slow_ips, 9, 1)} {_num(s and s.fast_ips, 9, 1)} {mfu} {days:>7} "
            f"{days_range(mv):>12}  {cost}{model_verdict(mv):<9} {statuses}"
            + (f" (tied with {len(mv.tied)}: planned at the slowest)" if mv.tied else "")
            + _real_said(mv)
        )
    lines.append(f"budget: {d.budget.describe()}; needs {d.needed_ips:.1f} {IPS_WINDOWS}")
    if excluded := excluded_line(d):
        lines.append(excluded.removeprefix("- ").replace("`", ""))
    if d.knobs:  # the three biggest effects; report.md has them all
        lines.append("knobs: " + "; ".join(k.describe() for k in d.knobs[:3]))
    if d.cheapest is not None and d.cheapest.cost is not None and (d.cheapest is not d.recommended or d.per_device):
        c = d.cheapest
        lines.append(f"cheapest in time: {d.where(c)}, {fmt_days(c.days)} days for {fmt_cost(c.cost)}")  # type: ignore[arg-type]
    if beside := d.loader.io_bound_beside:
        lines.append(
            f"WARNING: io_bound trial(s) measured beside others (--devices), their loaders shared the disk and "
            f"page cache: {', '.join(beside[:3])}{', ...' if len(beside) > 3 else ''}; measure them alone"
        )
    if d.left_out:
        lines.append(
            f"left out {len(d.left_out)} record(s) that cannot be trusted: "
            + "; ".join(f"{run}: {why}" for run, why in d.left_out[:3])
            + ("; ..." if len(d.left_out) > 3 else "")
        )
    lines += [f"note: {n}" for n in d.notes]
    lines += [f"verified: {d.where(mv)}: {v}" for mv, v in verifications(d)]
    lines += [f"leaders: {d.where(mv)}: {x}" for mv in d.models for x in head_to_head_lines(mv, d)]
    return "\n".join(lines)


def render_note(d: Decision) -> str:
    """The decision run's Description in the MLflow UI: the verdict as a sentence and the models as a Markdown
    table the UI wraps to its width (a monospace block of the terminal summary was cut at the right edge)."""
    out = [f"**{inert(headline(d))}**: {inert(d.reason)}", ""]
    out += [f"**Warning:** {inert(d.unstable)}", ""] if d.unstable else []
    out += [inert(line) for line in unsettled_lines(d)] + ([""] if unsettled_lines(d) else [])
    out += [x for mv in d.models for line in head_to_head_lines(mv, d) for x in (inert(line), "")]
    priced = any(mv.cost is not None for mv in d.models)
    out += [
        "| model | forecast img/s | slowest-fastest window | days | days range | "
        + ("cost | " if priced else "")
        + "verdict |",
        "|---|---|---|---|---|" + ("---|" if priced else "") + "---|",
    ]
    for mv in d.models:
        s = mv.span
        cells = [inert(d.where(mv)), _cell(s and s.forecast_ips) + (REAL_MARK if mv.real_forecast else "")]
        real_slow, real_fast = mv.real_ends()
        ends = f"{s.slow_ips:.1f}{REAL_MARK * real_slow}-{s.fast_ips:.1f}{REAL_MARK * real_fast}" if s else "-"
        ends += f" (widened by the sweep's {s.drift:.1%} move)" if s and s.drift else ""
        cells.append(ends)
        cells += [fmt_days(s.days) if s is not None else "-", days_range(mv)]
        if priced:
            cells.append(fmt_cost(mv.cost) if mv.cost is not None else "-")
        cells.append(model_verdict(mv))
        out.append("| " + " | ".join(cells) + " |")
    out += ["", f"Budget: {d.budget.describe()}; needs {d.needed_ips:.1f} {IPS_WINDOWS}. The report: report.html."]
    return "\n".join(out)


def _real_said(mv: ModelVerdict) -> str:
    """Where a figure of its row is not a window's as the header says: real training's rate (a verification
    outside its windows: the forecast planned with it, or an end of the range it widened), or an end widened by
    its sweep's move."""
    ends = [end for end, real in zip(("slowest", "fastest"), mv.real_ends(), strict=True) if real]
    said = ["forecast"] * mv.real_forecast + ends
    real = f" ({' and '.join(said)}: real training's rate, outside its windows)" if said else ""
    drift = mv.span.drift if mv.span is not None else 0.0
    return real + (f" (slowest and fastest: {drift_words(drift)})" if drift else "")


def _policy_line(d: Decision) -> str:
    """report.md's policy bullet: what counts, the forecast, the verdict's range, ties and head-to-heads."""
    return (
        f"- Policy: only `ok` trials count; peak reserved memory at most {d.policy.max_memory_share:.0%} of the "
        f"device. The forecast is {IPS_WINDOWS}, images over all the timed windows' wall time; the verdict is "
        f"read over the range the windows measured: GO where the budget holds at the slowest window (with at "
        f"least {SETTLED_WINDOWS} windows), NO-GO where it fails at the fastest, UNSETTLED in between (exit 3); "
        "a sweep whose drift check shows it moved while it ran has each end of its trials widened by that move. "
        "Trials whose ranges overlap the fastest one's are tied with it (as are those closer than the box moved "
        "between their two sweeps, where the store shows a move, or while their one sweep ran, where its drift "
        "check shows one), and the plan takes the slowest of them, the "
        "trial recommended; "
        "trials measured again head to head (`dinox head-to-head`) are planned with their rounds and ordered by "
        f"them. {IPS_P90} and {IPS_P50} (images per optimizer step / the p90 and p50 step time) are shown, not planned "
        "with" + (f"; effective batch {d.policy.effective_batch} only" if d.policy.effective_batch else "") + "."
    )


def _role(mv: ModelVerdict, c: Candidate) -> str:
    """A trial's part in its model's plan: the best, or in a tie the trial planned with and the leader."""
    if c is mv.best:
        return "**planned** (the slowest of the tie)" if mv.tied else "**best**"
    return ("tied, leads" if c is mv.lead else "tied") if c in mv.tied else ""


def _cell(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


def _num(value: float | None, width: int, digits: int) -> str:
    return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def render_markdown(d: Decision, plots: list[str]) -> str:
    b = d.budget
    out = [f"# Throughput decision: {headline(d)}", ""]
    out += ["## Summary", "", f"**{headline(d)}.** {inert(d.reason)}.", ""]
    out += [x for line in unsettled_lines(d) for x in (f"> **{line}**", "")]  # one quote each, never run together
    if d.unstable:
        out += [f"> **Warning:** {d.unstable}.", ""]
    excluded = excluded_line(d)
    out += [
        f"- Budget: {b.describe()} = {b.images_needed:,.0f} images, which needs **{d.needed_ips:.1f} {IPS_WINDOWS}**.",
        _policy_line(d),
        *([excluded] if excluded else []),
    ]
    if d.sources:
        out.append(f"- Trials from: {', '.join(map(inert, d.sources))}.")
    out.append("")
    out += decision_section(d)
    out += money.sections(d)
    out += ["## Models", ""]
    for mv in d.models:
        out += _model_section(mv, b, inert(d.where(mv)))
    out += findings.profile_section(d)
    out += findings.knobs_section(d.knobs, d.combined)
    out += findings.loader_section(d.loader, d.policy.knee_tolerance)
    out += findings.memory_section(d.memory)
    if d.scaling:
        out += [
            "## Scaling",
            "",
            "Global images/s of each multi-device trial against N x the same configuration on one device.",
            "",
            "| trial | model | devices | img/s | one device | efficiency |",
            "|---|---|---|---|---|---|",
        ]
        out += [
            f"| {inert(row.run)} | {inert(row.model)} | {row.gpus} | {row.images_per_s:.1f} | "
            f"{row.single_images_per_s:.1f} | {row.efficiency:.0%} |"
            for row in d.scaling
        ]
        out.append("")
    if plots:
        out += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    if d.left_out:
        out += [
            "## Records left out",
            "",
            "These runs carry figures no real trial has (not finite, not positive, "
            "or physically impossible), so the decision does not use them:",
            "",
        ]
        out += [f"- {code_span(run)}: {inert(why)}" for run, why in d.left_out] + [""]
    if d.notes:
        out += ["## Notes", ""] + [f"- {inert(n)}" for n in d.notes] + [""]
    return "\n".join(out)


def _model_section(mv: ModelVerdict, b: Budget, title: str) -> list[str]:
    statuses = inert(", ".join(f"{v} {k}" for k, v in sorted(mv.statuses.items())))
    out = [
        f"### {title}: {model_verdict(mv)}",
        "",
        f"{params_text(mv.params_m)}; {mv.trials} trials ({statuses}).",
        "",
    ]
    if mv.span is not None:
        s = mv.span
        line = (
            f"Forecast: {s.forecast_ips:.1f} {mv.forecast_unit} -> "
            f"**{fmt_days(s.days)} days** (measured range "
            f"{s.slow_ips:.1f}-{s.fast_ips:.1f} img/s -> {days_range(mv)} days)"
            + (f", planned at the slowest of {len(mv.tied) + 1} tied trials" if mv.tied else "")
        )
        if mv.unsettled_why:
            line += f"; unsettled: {inert(mv.unsettled_why)}."
        elif s.days_slow <= b.days:
            line += f", {fmt_days(mv.margin_days or 0.0)} days within the budget at the slowest {mv.range_ends}."
        elif s.days_fast > b.days:
            line += f", {fmt_days(s.days_fast - b.days)} days over the budget even at the fastest window"
            line += (
                f"; the budget buys {mv.epochs_in_budget:.1f} epochs."
                if mv.epochs_in_budget is not None
                else f"; the budget buys {mv.images_in_budget:,.0f} images."
            )
        if mv.cost is not None:
            line += f" The schedule costs {fmt_cost(mv.cost)} on {inert(mv.device)}."
        if mv.over_cost:
            line += f" {'NO-GO on cost' if mv.verdict == 'NO-GO' else 'At the slowest window'}: {inert(mv.over_cost)}."
        out += [line, ""]
    elif mv.candidates:
        out += ["No trial qualifies under the policy.", ""]
    else:
        out += ["No trial finished ok.", ""]
    out += _candidates_table(mv)
    for ob in mv.oom:
        fit = f"largest batch that fit: {ob.largest_ok}" if ob.largest_ok is not None else "no batch fit"
        settings = inert(fmt_settings(ob.settings))
        out.append(f"- OOM boundary ({settings}): {fit}; smallest that did not: {ob.smallest_oom}")
    if mv.oom:
        out.append("")
    return out


def _candidates_table(mv: ModelVerdict) -> list[str]:
    """One row per ok trial; columns only for what differs between them, what they share said once."""
    if not mv.candidates:
        return []
    keys = list(dict.fromkeys(k for c in mv.candidates for k in c.configuration))
    varying = [k for k in keys if len({c.configuration.get(k) for c in mv.candidates}) > 1]
    common = {k: mv.candidates[0].configuration.get(k) for k in keys if k not in varying}
    out = []
    if common:
        out += ["Common to these trials: " + ", ".join(code_span(f"{k}={v}") for k, v in common.items()) + ".", ""]
    columns = [*map(code_span, varying), IPS_WINDOWS, "windows (slowest-fastest)", IPS_P90, "MFU", "days", "mem"]
    columns += ["bound", "note"]
    out += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for c in mv.candidates:
        notes = [c.excluded or _role(mv, c)]
        if c.verified is not None:
            notes.append(c.verified.describe())
        if c.unstable and not c.excluded:
            notes.append(f"unstable (windows differ by {c.spread:.0%})" if c.spread is not None else "unstable")
        cells = [inert(c.configuration.get(k, "")) for k in varying]
        count = f"{c.windows}: " if c.windows is not None else ""
        real = c.verified.images_per_s if c.widened and c.verified is not None else None  # an end, not a window
        slow, fast = (f"{x:.2f}{REAL_MARK * (x == real)}" for x in c.window_range)
        if c.drift:
            notes.append(f"ends read {c.slow_ips:.2f}-{c.fast_ips:.2f}: {drift_words(c.drift)}")
        cells += [
            f"{c.measured_ips:.2f}" + (REAL_MARK if c.forecast_unit == IPS_REAL else ""),
            f"{count}{slow}-{fast}",
            f"{c.conservative_ips:.2f}",
            f"{c.mfu:.1%}" if c.mfu is not None else "-",
            fmt_days(c.days),
            f"{c.memory_share:.0%}" if c.memory_share is not None else "-",
            inert(f"{c.bound} ({c.bound_evidence})" if c.bound_evidence else c.bound),
            "; ".join(n for n in notes if n),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return [*out, ""]

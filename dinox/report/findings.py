"""What the trials found beside the verdict, as report.md's sections: where the recommended step's time goes
(its profile), what each knob bought, the input pipeline, and memory predicted against measured. Pure
rendering of a Decision's findings (``report.text`` places them)."""

from __future__ import annotations

from dinox.decide.checks import MemoryCheck
from dinox.decide.knobs import Combination, KnobEffect
from dinox.decide.loader_findings import LoaderFindings
from dinox.decide.verdict import Decision
from dinox.store.profile_table import markdown as profile_markdown
from dinox.store.trial_record import IPS_WINDOWS, code_span, inert


def fmt_settings(settings: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items()) or "all trials"


def profile_section(d: Decision) -> list[str]:
    """The recommended trial's measure.profile tables (an unsettled decision's leading one): where its step's
    time goes."""
    mv = d.recommended or (d.unsettled[0] if d.unsettled else None)
    if mv is None or mv.best is None:
        return []
    out = ["## Where the recommended step's time goes", ""]
    if mv.best.profile is None:
        # The run's name is the store's (any tool writes it) and this is a command a user pastes: only dinox's own
        # trial number, as the name starts, goes into it.
        number = mv.best.run_name.split(" ")[0]
        which = number if number.isascii() and number.isdigit() else "N"
        also = "" if which != "N" else " (N: its number, as dinox names its runs)"
        line = f"Not profiled: {code_span(f'dinox run {d.spec_arg} --profile {which}')} traces this trial{also}"
        return out + [line + " (measure.profile: true for every trial).", ""]  # a code span, as report.md's others
    out += [f"Trial {inert(mv.best.run_name)} (run {code_span(mv.best.run_id)}).", ""]
    return out + profile_markdown(mv.best.profile)


MAX_KNOB_ROWS = 30  # the biggest effects; decision.json keeps every row


def knobs_section(knobs: list[KnobEffect], combined: list[Combination]) -> list[str]:
    """The breakdown the field reports guessed at, measured: each varied param, what changing it did."""
    if not knobs:
        return []
    out = [
        "## What each knob bought, measured",
        "",
        f"Pairs of trials equal in everything but one param; the ratio is the change's {IPS_WINDOWS} over the "
        "trial without it (median, and the range over the pairs). A change inside the pair's own noise (the "
        "larger spread of its two trials' timed windows, and for trials from two sweeps the box moved between, "
        "or of one sweep its drift check shows moved, that move), or between two trials whose ranges the verdict "
        "reads as tied, is said to be within noise, not given a number.",
        "",
        "| change | ratio | range | pairs | peak memory | status changes |",
        "|---|---|---|---|---|---|",
    ]
    for k in knobs[:MAX_KNOB_ROWS]:
        ratio = k.unapplied or (
            "within noise" if k.within_noise else (f"{k.ratio:.2f}x" if k.ratio is not None else "-")
        )
        span = f"{min(k.ratios):.2f}-{max(k.ratios):.2f}x" if k.ratios else "-"
        memory = f"{k.memory:+.2f} GiB" if k.memory is not None else "-"
        statuses = ", ".join(f"{n} {c}" for c, n in sorted(k.statuses.items())) or "-"
        change = f"{code_span(k.field)} {inert(k.before)} -> {inert(k.after)}"
        out.append(f"| {change} | {ratio} | {span} | {k.pairs} | {memory} | {statuses} |")
    if len(knobs) > MAX_KNOB_ROWS:
        out += ["", f"... and {len(knobs) - MAX_KNOB_ROWS} smaller changes (decision.json has them all)."]
    if combined:
        out += [
            "",
            "Several changed at once, against the product of their single effects: the median over the pairs that "
            "made those changes (do the speedups multiply? where every pair lies within its own noise of the "
            "product, as for one knob, they do as far as these trials can tell):",
            "",
            "| changes | measured | product of the single effects | multiply? |",
            "|---|---|---|---|",
        ]
        out += [
            f"| {inert('; '.join(c.changes))} | {_measured(c)} | {c.product:.2f}x | "
            f"{'within noise' if c.multiplies else f'no: {c.measured / c.product:.2f}x the product'} |"
            for c in combined[:12]
        ]
    return [*out, ""]


def _measured(c: Combination) -> str:
    """The median ratio, and with several pairs their range: `1.46x (1.32-1.60x, 2 pairs)`."""
    n = len(c.ratios)
    return f"{c.measured:.2f}x" + (f" ({min(c.ratios):.2f}-{max(c.ratios):.2f}x, {n} pairs)" if n > 1 else "")


def memory_section(checks: list[MemoryCheck]) -> list[str]:
    if not checks:
        return []
    out = ["## Memory: predicted before the sweep, measured in it", ""]
    out += [
        "Predicted device memory (`dinox plan`: weights, gradients, optimizer state, saved activations, the "
        "batch; on the CPU the process too) beside the measured peak (CUDA: peak allocated; CPU: the trial "
        "process's peak resident set).",
        "",
    ]
    out += [
        "| trial | model | batch | predicted GiB | measured GiB | measured / predicted | status | predicted OOM |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        measured = f"{c.measured_gb:.2f}" if c.measured_gb is not None else "-"
        ratio = f"{c.ratio:.2f}" if c.ratio is not None else "-"
        out.append(
            f"| {inert(c.run)} | {inert(c.model)} | {c.batch if c.batch is not None else '-'} | {c.predicted_gb:.2f} | "
            f"{measured} | {ratio} | {c.status} | {'yes' if c.predicted_oom else 'no'} |"
        )
    hits = sum(c.predicted_oom == (c.status == "oom") for c in checks)
    out += ["", f"The OOM prediction matched the outcome in {hits} of {len(checks)} trials.", ""]
    return out


def loader_section(f: LoaderFindings, tolerance: float) -> list[str]:
    if not (f.knees or f.pin or f.io_bound or f.host_bound or f.encodings):
        return []
    out = ["## Input pipeline", ""]
    if f.knees:
        out += [
            f"Worker knee (fewest workers within {tolerance:.0%} of the best throughput, all else equal). "
            '"Loader alone" is what the input pipeline delivers with the model idle (`loader_images_per_s`): '
            "where it is close to the step's rate, the loader sets the pace.",
            "",
        ]
        out += [
            "| settings | knee | best | best img/s | img/s by workers | loader alone by workers |",
            "|---|---|---|---|---|---|",
        ]
        for k in f.knees:
            curve = ", ".join(f"{w}: {ips:.0f}" for w, ips in k.points)
            ceiling = ", ".join(f"{w}: {ips:.0f}" for w, ips in k.loader_points) or "-"
            out.append(
                f"| {inert(fmt_settings(k.settings))} | {k.knee_workers} | {k.best_workers} | {k.best_ips:.1f} | "
                f"{curve} | {ceiling} |"
            )
        out.append("")
    if f.pin:
        out += [f"{f.pin_summary[0].upper()}{f.pin_summary[1:]}.", ""]
    for e in f.encodings:
        rates = ", ".join(
            f"{layout} {ips:.1f} img/s"
            + (f" (loader alone {alone:.0f})" if (alone := e.loader_images_per_s.get(layout)) else "")
            for layout, ips in sorted(e.images_per_s.items())
        )
        out += [f"Shard encodings ({inert(fmt_settings(e.settings))}): {inert(rates)}.", ""]
    if f.io_bound:
        shown = inert(", ".join(f"{n} ({ips:.0f} img/s{f', {y}' if y else ''})" for n, _m, ips, y in f.io_bound))
        out += [f"io_bound trials ({len(f.io_bound)}): {shown}.", ""]
    if f.io_bound_beside:
        out += [
            f"> **Warning:** {len(f.io_bound_beside)} io_bound trial(s) were measured beside other trials "
            f"(`dinox run --devices`): {inert(', '.join(f.io_bound_beside))}. Each had cores of its own, but the disk, "
            "the page cache and memory bandwidth were shared: measure them alone before trusting their loader "
            "figures.",
            "",
        ]
    if f.host_bound:
        shown = inert(", ".join(f"{n} ({ips:.0f} img/s)" for n, _m, ips in f.host_bound))
        out += [
            f"host_bound trials ({len(f.host_bound)}): {shown}. The device waits on Python and kernel launches, "
            "not on data: a larger batch, `model.compile` or CUDA graphs are what move these.",
            "",
        ]
    return out

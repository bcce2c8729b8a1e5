"""The decision's PNG plots: throughput against physical batch (OOM marked), days against the budget, and
throughput against loader workers. Pure rendering of a Decision and its records; no MLflow."""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only: no display on a GPU box or in CI
# Names from the store are plain text: a "$" in a model or device name would start mathtext (and "m$^{$"
# crashed the decision).
matplotlib.rcParams["text.parse_math"] = False

import matplotlib.pyplot as plt  # noqa: E402

from dinox.decide.budget import fmt_cost, fmt_days  # noqa: E402
from dinox.decide.grouping import device_label, device_of, model_key, only_device  # noqa: E402
from dinox.decide.types import Candidate, ModelVerdict  # noqa: E402
from dinox.decide.verdict import Decision  # noqa: E402
from dinox.spec import params  # noqa: E402
from dinox.store.throughput_figure import Dot, Name, batch_axis, draw_series, name_dots  # noqa: E402
from dinox.store.trial_record import IPS_WINDOWS, TrialRecord  # noqa: E402
from dinox.writes import write_whole  # noqa: E402


def write_plots(d: Decision, records: list[TrialRecord], out: Path) -> list[Path]:
    paths = [_throughput_vs_batch(d, records, out / "throughput_vs_batch.png"), _days(d, out / "days_vs_budget.png")]
    if d.loader.knees:
        paths.append(_workers(d, out / "throughput_vs_workers.png"))
    if any(k.ratio is not None for k in d.knobs):
        paths.append(_knobs(d, out / "knobs.png"))
    return paths


def _knobs(d: Decision, path: Path) -> Path:
    """One bar per change: its median ratio, a line over its range, grey where it is within noise, and the
    batches it put out of memory written beside it."""
    shown = [k for k in d.knobs if k.ratio is not None][:15]
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.45 * len(shown) + 1.4)))
    labels = [_short(f"{k.field} {k.before} -> {k.after}", 55) for k in shown]
    ratios = [k.ratio for k in shown]
    colors = ["lightgrey" if k.within_noise else ("tab:green" if k.ratio >= 1 else "tab:red") for k in shown]
    ax.barh(labels, [r - 1 for r in ratios], left=1, color=colors)  # type: ignore[operator]
    for i, k in enumerate(shown):
        ax.hlines(i, min(k.ratios), max(k.ratios), color="black", linewidth=1.5)
        note = "within noise" if k.within_noise else f"{k.ratio:.2f}x"
        note += f", {k.pairs} pair{'s' if k.pairs > 1 else ''}"
        note += "".join(f", {n} {c}" for c, n in sorted(k.statuses.items()))
        ax.text(max(max(k.ratios), 1.0), i, f"  {note}", va="center", fontsize=8)
    ax.axvline(1.0, color="black", linewidth=0.8)
    hi = max(max(k.ratios) for k in shown)
    lo = min(min(k.ratios) for k in shown)
    ax.set_xlim(min(lo, 1.0) - 0.05, max(hi, 1.0) + (hi - min(lo, 1.0)) * 0.6 + 0.1)  # room for the notes
    ax.set_xlabel(f"ratio of {IPS_WINDOWS}, the change over the trial without it (bar: median; line: range over pairs)")
    ax.set_title("What each knob bought, measured (grey: within the trials' own noise)")
    ax.invert_yaxis()
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, path)


def _throughput_vs_batch(d: Decision, records: list[TrialRecord], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(9, 5.5))
    failed = _failed_batches(records)
    values: list[float] = []
    names: list[Name] = []
    for mv in d.models:
        (line,) = ax.plot([], [])
        color = line.get_color()
        values += draw_series(ax, [_dot(c) for c in mv.candidates], color, _name(d, mv, 60), names)
        for status, marker, y in (("oom", "x", 0.05), ("skipped", "|", 0.05)):
            sizes = failed[status].get((mv.key, mv.device), [])
            if sizes:  # at the foot of the axes whatever the scale: no throughput to draw
                ax.scatter(
                    sizes, [y] * len(sizes), marker=marker, s=70, color=color, transform=ax.get_xaxis_transform()
                )
        if not mv.candidates and (failed["oom"].get((mv.key, mv.device)) or failed["skipped"].get((mv.key, mv.device))):
            ax.plot([], [], marker="o", color=color, label=_name(d, mv, 60))
    if values:  # what the glyphs are, in the plot itself
        ax.scatter([], [], color="grey", alpha=0.6, s=18, label=f"a trial: {IPS_WINDOWS} (what decide plans with)")
        # A verification outside a trial's windows widened its range (Candidate.widened): the bar says so.
        widened = any(c.widened for mv in d.models for c in mv.candidates)
        ax.vlines(
            [],
            [],
            [],
            color="grey",
            alpha=0.5,
            linewidth=2,
            label=f"its timed windows, slowest to fastest ({IPS_WINDOWS})"
            + ("; widened to real training's rate where dinox verify fell outside them" if widened else ""),
        )
    if any(failed["oom"].values()):
        ax.scatter([], [], marker="x", color="black", label="out of memory (at the foot)")
    if any(failed["skipped"].values()):
        ax.scatter([], [], marker="|", color="black", label="skipped: pruned after an OOM (at the foot)")
    _needed_line(ax, d.needed_ips, values)
    sizes = sorted(
        {int(c.configuration.get(params.BATCH_SIZE, 0)) for mv in d.models for c in mv.candidates}
        | {b for by in failed.values() for bs in by.values() for b in bs} - {0}
    )
    if sizes:
        batch_axis(ax, sizes)
    if not values:  # nothing ran ok: the axis shows the target from zero, the marks say why
        ax.set_ylim(0, d.needed_ips * 1.3)
        what = "no configuration fit in memory" if sizes else "no trial to draw"
        ax.text(0.5, 0.5, what, transform=ax.transAxes, ha="center", va="center", color="grey")
    ax.set_ylabel("images/s")
    ax.set_title("Throughput against physical batch")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    name_dots(fig, ax, names)
    return _save(fig, path)


def _failed_batches(records: list[TrialRecord]) -> dict[str, dict[tuple[str, str], list[int]]]:
    """Batch sizes that ran out of memory or were pruned, per model key and device (as ModelVerdict.device)."""
    out: dict[str, dict[tuple[str, str], list[int]]] = {"oom": defaultdict(list), "skipped": defaultdict(list)}
    default = only_device(records)
    for r in records:
        if r.status in out and r.batch_size is not None:
            out[r.status][(model_key(r)[0], device_label(*device_of(r, default)))].append(r.batch_size)
    return out


def _dot(c: Candidate) -> Dot:
    return Dot(
        int(c.configuration.get(params.BATCH_SIZE, 0)),
        c.measured_ips,
        c.window_min_ips,
        c.window_max_ips,
        c.configuration,
    )


def _name(d: Decision, mv: ModelVerdict, limit: int) -> str:
    """A series' name: the model, cut to fit, and its device where the trials came from several."""
    return f"{_short(mv.label, limit - 30)} on {_short(mv.device, 27)}" if d.per_device else _short(mv.label, limit)


def _needed_line(ax, needed: float, values: list[float]) -> None:
    """The throughput the schedule needs: a line when it sits near the data, else an arrow at the edge, so a
    far-off target does not squash the measured points against one side."""
    label = f"needed: {needed:.1f} {IPS_WINDOWS}"
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 20:
        ax.set_yscale("log")  # models decades apart: each stays readable
        # Plain numbers: the default log labels are mathtext ($10^{2}$), which parse_math=False prints raw.
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _pos: f"{v:g}"))
    if not positive:
        ax.axhline(needed, color="grey", linestyle="--", label=label)
        return
    lo, hi = min(positive), max(positive)
    far_above, far_below = needed > 3 * hi, needed < lo / 3
    if not (far_above or far_below):
        ax.axhline(needed, color="grey", linestyle="--", label=label)
        return
    y, va, arrow = (0.97, "top", "\u2191") if far_above else (0.03, "bottom", "\u2193")
    ax.text(
        0.99,
        y,
        f"{arrow} {label} ({needed / hi:.0f}x the fastest)" if far_above else f"{arrow} {label}",
        transform=ax.transAxes,
        ha="right",
        va=va,
        fontsize=8,
        color="dimgrey",
    )


def _short(label: str, limit: int = 60) -> str:
    return label if len(label) <= limit else label[: limit - 3] + "..."


_LABEL_BOX = {"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1}  # readable across the budget line


def _days(d: Decision, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(12 if d.per_device else 10, max(2.8, 0.6 * len(d.models) + 1.6)))
    labels = [_name(d, mv, 60 if d.per_device else 45) for mv in d.models]
    # A bar from the fast end to the slow end of what was measured (no clean bar where the windows disagree),
    # a tick at the forecast; the colour is the verdict, amber where the range straddles the budget; grey
    # on shrunk trials, whose verdict is about a stand-in (no green bar a glance takes for the study's).
    colour = {} if d.shrunk else {"GO": "tab:green", "NO-GO": "tab:red", "UNSETTLED": "tab:orange"}
    slow = [mv.span.days_slow if mv.span else 0.0 for mv in d.models]
    fast = [mv.span.days_fast if mv.span else 0.0 for mv in d.models]
    xmax = max([*slow, d.budget.days])
    # A range too narrow to see still gets a sliver, so every measured model shows its colour.
    widths = [max(s - f, xmax * 0.004) if s else 0.0 for s, f in zip(slow, fast, strict=True)]
    ax.barh(labels, widths, left=fast, height=0.5, color=[colour.get(mv.verdict or "", "grey") for mv in d.models])
    forecast = [(i, mv.days) for i, mv in enumerate(d.models) if mv.span]
    ax.scatter([x for _, x in forecast], [i for i, _ in forecast], marker="|", s=300, color="black", zorder=3)
    for i, mv in enumerate(d.models):
        cost = f", cost {fmt_cost(mv.cost)}" if mv.cost is not None else ""
        at = " at real training's rate" if mv.real_forecast else ""
        text = (
            f" {fmt_days(fast[i])}-{fmt_days(slow[i])} days, forecast {fmt_days(mv.days)}{at} ({mv.verdict}"
            f"{', shrunk' if d.shrunk else ''}){cost}"
            if mv.span
            else " no qualifying trial"
        )
        ax.text(fast[i] + widths[i] + xmax * 0.01, i, text, va="center", fontsize=8, bbox=_LABEL_BOX)
    unit = "day" if d.budget.days == 1 else "days"
    ax.axvline(d.budget.days, color="black", linestyle="--", label=f"budget: {d.budget.days:g} {unit}")
    real = any(mv.real_forecast for mv in d.models)
    tick = "forecast: all windows, or real training's rate (dinox verify)" if real else "forecast (all windows)"
    ax.scatter([], [], marker="|", s=120, color="black", label=tick)
    priced = any(mv.cost is not None for mv in d.models)
    ax.set_xlim(0, xmax * (1.7 if priced else 1.5))  # room for the annotations
    widened = real or any(any(mv.real_ends()) for mv in d.models)  # an end is a verification's real rate
    ends = "rate in windows or real training" if widened else "timed window"
    drift = max((mv.span.drift for mv in d.models if mv.span), default=0.0)
    moved = f"\neach end widened by the {drift:.1%} their sweep moved while it ran" if drift else ""
    ax.set_xlabel(f"days for the schedule\nbar: from the fastest to the slowest {ends} of the plan's trials{moved}")
    settled = " on SHRUNK trials (not the study's)" if d.shrunk else "" if d.settled else " (not settled)"
    ax.set_title(f"{d.verdict}{settled}: {d.budget.describe()}", fontsize=10)
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, path)


def _workers(d: Decision, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 5))
    colours = []
    for k in d.loader.knees[:12]:  # more lines than that is unreadable; the report's table has them all
        label = ", ".join(f"{key.rsplit('.', 1)[-1]}={v}" for key, v in k.settings.items()) or "all trials"
        (line,) = ax.plot([w for w, _ in k.points], [ips for _, ips in k.points], marker="o", label=_short(label))
        colours.append(line.get_color())
        if k.loader_points:  # what the loader alone delivers: where the step's curve meets it, the loader paces
            ax.plot(
                [w for w, _ in k.loader_points],
                [ips for _, ips in k.loader_points],
                linestyle="--",
                marker=".",
                color=line.get_color(),
                alpha=0.7,
            )
        knee_ips = dict(k.points)[k.knee_workers]
        ax.scatter([k.knee_workers], [knee_ips], s=160, facecolors="none", edgecolors=line.get_color())
    shown = d.loader.knees[:12]
    if any(k.loader_points for k in shown):
        ax.plot([], [], linestyle="--", marker=".", color="grey", label="the loader alone (loader_images_per_s)")
        _clip_loader(ax, shown, colours)
    workers = sorted({w for k in shown for w, _ in (*k.points, *k.loader_points)})
    ax.set_xticks(workers, [str(w) for w in workers])  # the worker counts measured: whole numbers only
    ax.set_xlabel("DataLoader workers")
    ax.set_ylabel(IPS_WINDOWS)
    ax.set_title("Throughput against workers (circle: the knee; dashed: the loader alone, \u2191 off the scale)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _clip_loader(ax, shown, colours: list[str]) -> None:
    """The axis is the trials': a loader alone 100x faster than the step (a log axis squashed the trials into
    a line) is drawn at the top edge with an arrow and its figure, not to scale; the figures at one worker
    count stacked downwards, fastest first, each in its line's colour (one on top of another was unreadable)."""
    top = 1.35 * max(ips for k in shown for _, ips in k.points)
    ax.set_ylim(0, top)
    off: dict[int, list[tuple[float, str]]] = {}
    for k, colour in zip(shown, colours, strict=True):
        for w, ips in k.loader_points:
            if ips > top:
                off.setdefault(w, []).append((ips, colour))
    left, right = ax.get_xlim()
    edge = 0.05 * (right - left)
    for w, figures in off.items():
        # At the axis's edges the text leans inwards, so it is not cut off at the frame.
        ha = "left" if w <= left + edge else "right" if w >= right - edge else "center"
        for j, (ips, colour) in enumerate(sorted(figures, reverse=True)):
            ax.annotate(
                f"\u2191 {ips:,.0f}",
                (w, top),
                xytext=(0, -10 - 9 * j),
                textcoords="offset points",
                ha=ha,
                fontsize=7,
                color=colour,
            )


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    png = io.BytesIO()  # savefig(path) would write through a link planted at path
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    write_whole(path, png.getvalue())
    return path

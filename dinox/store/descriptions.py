"""What the MLflow UI shows of a sweep without a click: each trial's one-line description, the parent run's
Markdown description (the trials ranked by throughput), its summary metrics and a throughput plot.

MLflow shows a run's `mlflow.note.content` tag as its Description; summary metrics sort and compare in the
runs table like any other metric. Pure functions of the sweep's rows (results.csv's rows); of MLflow only its
tag limit, which the parent's Description is kept within.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

from dinox import record as rec
from dinox.spec import params
from dinox.store import profile_table
from dinox.store.throughput_figure import Dot, Name, batch_axis, draw_series, import_plotting, name_dots
from dinox.store.trial_record import IPS_P90, IPS_WINDOWS, inert, measured_range, ranges_overlap, store_text

NOTE_TAG = "mlflow.note.content"
THROUGHPUT_PLOT = "throughput_vs_batch.png"  # the parent run's plot, drawn into the sweep's folder
UNSETTLED_WHY = "their timed windows disagreed beyond measure.unstable_threshold, so their figures may move"


def unsettled(metrics: dict[str, float], unstable: bool) -> str:
    """ "" for a trial whose timed windows agreed, else what they spanned: its figure is not settled."""
    m = metrics
    if not unstable or rec.IMAGES_PER_S_MIN not in m:
        return ""
    return f"unsettled: windows {m[rec.IMAGES_PER_S_MIN]:.1f}-{m[rec.IMAGES_PER_S_MAX]:.1f} img/s"


def trial_body(
    status: str, bound: str, metrics: dict[str, float], error: str, tags: dict[str, str] | None = None
) -> str:
    """A trial's result in one line: what the sweep prints after its index, and the run's description. The
    bound comes with the costs it was read from (dinox.bound_evidence), and an unsettled figure says so."""
    m, tags = metrics, tags or {}
    if status != "ok" or rec.IMAGES_PER_S not in m:
        return error[:200] or status
    doubt = unsettled(m, tags.get(rec.UNSTABLE) == "true")
    why = tags.get(rec.BOUND_EVIDENCE, "")
    # What the trial cost beside what it timed: its start-up, set-up, warm-up, ablation and epoch start are the rest.
    timed = f" (timed windows {m[rec.WINDOW_S]:.1f}s of it)" if rec.WINDOW_S in m else ""
    return (
        f"{m[rec.IMAGES_PER_S]:.1f} {IPS_WINDOWS}{f' ({doubt})' if doubt else ''}, step p50 {m[rec.STEP_S_P50]:.3f}s "
        f"p90 {m[rec.STEP_S_P90]:.3f}s, {bound}{f' ({why})' if why else ''}, "
        f"peak {m.get(rec.PEAK_MEM_RESERVED_GB, 0):.2f} GiB, trial {m.get(rec.TRIAL_WALL_S, 0):.1f}s{timed}"
    )


def trial_note(
    label: str,
    status: str,
    bound: str,
    metrics: dict[str, float],
    error: str,
    tags: dict[str, str] | None = None,
    run_id: str = "",
) -> str:
    """The trial run's description: its line, and under it measure.profile's tables with a link to the trace
    (MLflow's own artifact download, relative to the UI's root)."""
    body = trial_body(status, bound, metrics, error, tags)
    note = f"**{_md(status)}** {_md(label)}: {_md(body)}"
    summary = profile_table.ProfileSummary.parse((tags or {}).get(rec.PROFILE))
    if summary is None:
        return note
    link = f"get-artifact?path={quote(profile_table.TRACE_ARTIFACT, safe='')}&run_uuid={run_id}" if run_id else ""
    return "\n".join([note, "", *profile_table.markdown(summary, link)])


def sweep_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """What a user compares first in the runs table: the best trial's images/s (decide's figure), its median
    step and peak memory, how many ok trials were unsettled, and trials_<status> counts."""
    out = {f"{rec.TRIALS_PREFIX}{k}": float(v) for k, v in Counter(str(r["status"]) for r in rows).items()}
    ok = [r for r in rows if r["status"] == "ok" and rec.IMAGES_PER_S in r]
    if ok:
        best = max(ok, key=lambda r: float(r[rec.IMAGES_PER_S]))
        out[rec.BEST_IMAGES_PER_S] = float(best[rec.IMAGES_PER_S])
        for name, key in ((rec.BEST_STEP_S_P50, rec.STEP_S_P50), (rec.BEST_PEAK_MEM_GB, rec.PEAK_MEM_RESERVED_GB)):
            if best.get(key) not in (None, ""):
                out[name] = float(best[key])
        out[rec.UNSETTLED_TRIALS] = float(sum(str(r.get("unstable")) == "true" for r in ok))
    return out


def sweep_note(name: str, rows: list[dict[str, Any]], resumed: int = 0, drift: str = "", moved: float = 0.0) -> str:
    """The parent run's description: counts, then a compact table of every trial in decide's order (the forecast
    over the timed windows; failures last, with what stopped them), then what the drift check said (`drift`,
    dinox.sweep.drift's line, and `moved`, the gap it showed); each trial's own description holds its bound's
    evidence."""
    counted = Counter(str(r["status"]) for r in rows)
    counts = ", ".join(f"{v} {k}" for k, v in sorted(counted.items(), key=lambda kv: (-kv[1], kv[0])))
    shaky = sum(1 for r in rows if r["status"] == "ok" and str(r.get("unstable")) == "true")
    lines = [
        f"**{_md(name)}**: {len(rows)} trial{'s' if len(rows) != 1 else ''} measured ({counts or 'none'})"
        + (f", {resumed} already recorded" if resumed else "")
        + (f", {shaky} of the ok ones unsettled" if shaky else "")
        + ".",
        "",
    ]
    # Ranked as `dinox decide` ranks: by the forecast, images over all the timed windows' wall time.
    ranked = sorted(rows, key=lambda r: (r["status"] != "ok", -float(r.get(rec.IMAGES_PER_S) or 0.0)))
    if ranked and (best := ranked[0])["status"] == "ok" and rec.IMAGES_PER_S in best:
        steady = "its timed windows unsettled" if str(best.get("unstable")) == "true" else "its timed windows agreed"
        lines += [
            f"Best by its forecast: **{_md(best['label'])}**, {float(best[rec.IMAGES_PER_S]):.1f} {IPS_WINDOWS}"
            f"{_window_range(best)}, {_md(best.get('bound') or '-')}, {steady}. `dinox decide` reads the verdict over "
            "the windows' range." + _tied_line(_tied_with(best, ranked[1:], moved), moved),
            "",
        ]
    lines += [
        f"| # | trial | {IPS_WINDOWS} | slowest-fastest window | {IPS_P90} | bound | peak GiB |",
        "|---|---|---|---|---|---|---|",
    ]
    table: list[str] = []
    for i, r in enumerate(ranked, 1):
        ok = r["status"] == "ok" and rec.IMAGES_PER_S in r
        p90 = p90_images_per_s(r)
        ips = f"{float(r[rec.IMAGES_PER_S]):.1f}" if ok else f"{_md(r['status'])}: {_md(_cut(r))}"
        if ok and str(r.get("unstable")) == "true" and rec.WINDOW_SPREAD in r:
            ips += f" (unsettled: {float(r[rec.WINDOW_SPREAD]):.0%} apart)"
        span = _window_range(r).strip(" ()") if ok else "-"
        p90_text = f"{p90:.1f}" if ok and p90 is not None else "-"
        peak = f"{float(r[rec.PEAK_MEM_RESERVED_GB]):.2f}" if rec.PEAK_MEM_RESERVED_GB in r else "-"
        bound = _md(r.get("bound") or "-")
        table.append(f"| {i} | {_md(r['label'])} | {ips} | {span or '-'} | {p90_text} | {bound} | {peak} |")
    tail = ["", f"Unsettled: {UNSETTLED_WHY}."] if shaky else []
    if drift:
        tail += ["", _md(drift[:1].upper() + drift[1:])]
    return "\n".join(_fitting(lines, table, tail))


def _tied_with(best: dict[str, Any], others: list[dict[str, Any]], moved: float) -> list[dict[str, Any]]:
    """The ok trials of the best's model whose ranges share a rate with its range, each fast end raised by the
    sweep's move: decide's ties (dinox.store.trial_record.ranges_overlap), so the note never names a best that
    decide plans below."""
    own = measured_range(best)
    if own is None:
        return []
    return [
        r
        for r in others
        if r["status"] == "ok"
        and r.get(params.MODEL_NAME) == best.get(params.MODEL_NAME)
        and (theirs := measured_range(r)) is not None
        and ranges_overlap(own, theirs, moved)
    ]


def _tied_line(tied: list[dict[str, Any]], moved: float) -> str:
    if not tied:
        return ""
    names = ", ".join(f"**{_md(r['label'])}**" for r in tied[:3]) + (
        f" and {len(tied) - 3} more" if len(tied) > 3 else ""
    )
    counted = f", each fast end raised by the {moved:.1%} the sweep moved while it ran" if moved else ""
    return (
        f" Tied by their ranges with {names}{counted}: `dinox decide` plans at the slowest of them, and "
        "`dinox head-to-head` measures them again, interleaved, until their order settles."
    )


# What MLflow keeps of a tag (it cuts a longer one off wherever the limit falls, with a warning in the sweep's
# log), less room for the lines a head-to-head adds to the parent's Description later (readback.note_on_parents).
SWEEP_NOTE_LIMIT = MAX_TAG_VAL_LENGTH - 1000


def _fitting(head: list[str], table: list[str], tail: list[str]) -> list[str]:
    """The Description within SWEEP_NOTE_LIMIT: where the table would run past it (the drift check's line and the
    table's end cut off), a sweep of many trials keeps its best rows and a row saying how many more
    results.csv holds."""
    whole = [*head, *table, *tail]
    if len("\n".join(whole)) <= SWEEP_NOTE_LIMIT:
        return whole

    def more(n: int) -> str:
        return f"| | {n} more trial{'s' if n != 1 else ''}: results.csv, an artifact of this run | | | | | |"

    room = SWEEP_NOTE_LIMIT - len("\n".join([*head, more(len(table)), *tail]))
    kept = 0
    while kept < len(table) and len(table[kept]) + 1 <= room:  # each row adds itself and a newline
        room -= len(table[kept]) + 1
        kept += 1
    return [*head, *table[:kept], more(len(table) - kept), *tail]


HEAD_TO_HEAD = "Head-to-head "  # how each head-to-head's line on a parent's Description starts
EARLIER = "Earlier head-to-heads: "  # the count the oldest of them give way to


def head_to_head_line(group: str, rounds: int, names: str, settled: bool, planned: float) -> str:
    """The line a head-to-head adds to the Description of each sweep whose trials it measured again."""
    words = "settled" if settled else "still tied, planned at the slower"
    return (
        f"{HEAD_TO_HEAD}{group}: {rounds} interleaved rounds of {names}, {words}: best_images_per_s is now "
        f"{planned:.1f} img/s, pooled over the rounds (`dinox decide` plans with it)."
    )


def with_line(note: str, line: str) -> str:
    """A parent's Description with a head-to-head's line added, within what MLflow keeps of a tag: the sweep's
    own note left room for a few (SWEEP_NOTE_LIMIT); past them the oldest head-to-head lines give way to a count
    of them, so the newest line and the sweep's table are never the part cut off."""
    parts = note.rstrip().split("\n\n") if note.strip() else []
    earlier = 0
    if parts and (count := re.fullmatch(rf"{EARLIER}(\d+), .*", parts[-1])):
        earlier = int(count[1])
        parts.pop()

    def joined() -> str:
        gone = [f"{EARLIER}{earlier}, each a run of its own (dinox.role = head_to_head)."] if earlier else []
        return "\n\n".join([*parts, line, *gone])

    while len(joined()) > MAX_TAG_VAL_LENGTH:
        oldest = next((i for i, p in enumerate(parts) if p.startswith(HEAD_TO_HEAD)), None)
        if oldest is None:  # nothing of ours left to drop: MLflow cuts the end, as it would have anyway
            break
        del parts[oldest]
        earlier += 1
    return joined()


def _md(value: object) -> str:
    """A value from the spec, a trial or the store, inert in the Description MLflow renders as Markdown."""
    return inert(store_text(str(value)))


def _window_range(r: dict[str, Any]) -> str:
    """` (windows 150.2-171.9 img/s)`, or "" without both ends."""
    if rec.IMAGES_PER_S_MIN not in r or rec.IMAGES_PER_S_MAX not in r:
        return ""
    return f" (windows {float(r[rec.IMAGES_PER_S_MIN]):.1f}-{float(r[rec.IMAGES_PER_S_MAX]):.1f} img/s)"


def p90_images_per_s(r: dict[str, Any]) -> float | None:
    """A result row's conservative figure, the one decide plans with: images per optimizer step / p90 step
    time (the parent's table and the ladder's read it)."""
    step, images = r.get(rec.STEP_S_P90), r.get(params.BATCH_EFFECTIVE)
    if step is None or images is None or not float(step) > 0:
        return None
    return float(images) / float(step)


def _cut(r: dict[str, Any]) -> str:
    return str(r.get("error") or "")[:80]


def throughput_plot(rows: list[dict[str, Any]], path: Path, param_keys: set[str]) -> Path | None:
    """img/s (windows) against physical batch as decide's report draws it (dinox.store.throughput_figure); None
    when fewer than two batch sizes ran ok. `param_keys`: which of a row's columns are the trial's params (the
    rest are its metrics and status): what else a dot varied is read from them."""
    ok = [r for r in rows if r["status"] == "ok" and rec.IMAGES_PER_S in r and r.get(params.BATCH_SIZE)]
    dots = [_dot(r, param_keys) for r in ok]
    sizes = sorted({d.batch for d in dots})
    if len(sizes) < 2:
        return None  # one batch size is no curve (and matplotlib costs a second of every short sweep)
    plt = import_plotting()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    names: list[Name] = []
    for model in sorted({str(d.configuration.get(params.MODEL_NAME)) for d in dots}):
        (line,) = ax.plot([], [])
        mine = [d for d in dots if str(d.configuration.get(params.MODEL_NAME)) == model]
        draw_series(ax, mine, line.get_color(), model, names)
    batch_axis(ax, sizes)
    bars = any(d.high is not None and d.low is not None and d.high > d.low for d in dots)
    ax.set_ylabel(f"{IPS_WINDOWS}" + (" (bar: timed windows' min-max)" if bars else ""))
    ax.set_title("This sweep: throughput against physical batch (best per batch joined)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    name_dots(fig, ax, names)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _dot(r: dict[str, Any], param_keys: set[str]) -> Dot:
    low, high = r.get(rec.IMAGES_PER_S_MIN), r.get(rec.IMAGES_PER_S_MAX)
    spread = (float(low), float(high)) if low is not None and high is not None else (None, None)
    configuration = {k: v for k, v in r.items() if k in param_keys}
    return Dot(int(r[params.BATCH_SIZE]), float(r[rec.IMAGES_PER_S]), *spread, configuration)

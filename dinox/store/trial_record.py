"""A trial as read back from the tracking store: the record docs/record.md describes, nothing more.

Runs logged by another tool with the same names (params ``batch.size``, metrics ``images_per_s``, tag
``dinox.status`` ...) read the same way, so ``decide`` works on them too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from dinox import record as rec
from dinox.spec import params

# A trial's three throughputs, named the same way wherever they appear (sweep lines, terminal, report, plots,
# docs): measured over the timed windows (the forecast), and from the p90 and p50 step times (shown only).
IPS_WINDOWS = "img/s (windows)"
IPS_P90 = "img/s (p90 step)"
IPS_P50 = "img/s (p50 step)"
# ... and the forecast where real training (dinox verify) ran outside the windows' range and replaced it.
REAL_MARK = " (real training)"  # beside a figure in an img/s (windows) column that is real training's instead
IPS_REAL = f"img/s{REAL_MARK}"

# The fewest timed windows whose range a verdict may rest on (docs/measuring.md says where the rule comes
# from): torch.utils.benchmark judges a spread only past 3 samples, and one or two windows leave no measured
# slow end. measure.min_repeats defaults to this (tests/test_record.py holds the two together).
SETTLED_WINDOWS = 3


# Where the trials say nothing of their own noise (one window each), a change this small is called noise.
DEFAULT_NOISE = 0.02


def pair_noise(*spreads: float | None) -> float:
    """The noise a change between two trials must stand out of: the larger of their windows' spreads."""
    known = [s for s in spreads if s is not None]
    return max(known) if known else DEFAULT_NOISE


def measured_spread(metrics: Mapping[str, object]) -> float | None:
    """A trial's window spread where it measured one: a single window's 0 is no noise measured, not none."""
    try:
        spread, windows = metrics.get(rec.WINDOW_SPREAD), metrics.get(rec.WINDOWS)
        if spread in (None, "") or (windows not in (None, "") and float(windows) < 2):  # type: ignore[arg-type]
            return None
        return float(spread)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def measured_range(metrics: Mapping[str, object]) -> tuple[float, float] | None:
    """A trial's slowest and fastest timed window, images/s, where two or more ran (one window is no range)."""
    try:
        lo, hi, windows = (float(metrics[k]) for k in (rec.IMAGES_PER_S_MIN, rec.IMAGES_PER_S_MAX, rec.WINDOWS))  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError):
        return None
    return (lo, hi) if windows >= 2 and 0 < lo <= hi < math.inf else None


def ranges_overlap(a: tuple[float, float], b: tuple[float, float], slack: float = 0.0) -> bool:
    """Two measured ranges (slowest, fastest) share a rate once each fast end is raised by `slack` (the box's
    move while or between which they were measured): which of the two is faster is not settled. decide's ties
    read it, and so does every pair its knob table and the sweep's ladder call a change (within_noise)."""
    (lo, hi), (other_lo, other_hi) = a, b
    return lo <= other_hi * (1 + slack) and other_lo <= hi * (1 + slack)


def within_noise(
    ratio: float, noise: float, ranges: tuple[tuple[float, float] | None, ...] = (), slack: float = 0.0
) -> bool:
    """One rule for "this change did nothing the trials can tell", for decide's knob table and the sweep's
    ladder alike: the ratio inside the pair's own noise (`noise`, its trials' larger spread, or `slack`, the
    box's move while or between which the two were measured), or the pair's two measured ranges (`ranges`,
    where both are known) sharing a rate, each fast end raised by `slack`, as decide's ties read them. A
    pair decide calls tied is never a knob's speedup: `dinox run specs/resnet50_ladder.yaml --shrink` here, its
    sweep moved 12.9 % while it ran, printed compile 1.20x (out of a noise of 12.9 %) where decide tied the two
    rungs by their ranges (81.3-91.6 and 99.7-106.9 img/s, each fast end raised by that move)."""
    if abs(ratio - 1) <= max(noise, slack):
        return True
    return len(ranges) == 2 and None not in ranges and ranges_overlap(*ranges, slack=slack)  # type: ignore[arg-type]


def no_effect(tags: dict[str, str]) -> str:
    """What the trial measured instead of what was asked (dinox.note: "tf32 has no effect on cpu; ..."), as
    a short label ("no effect on cpu"), or ""."""
    note = tags.get(rec.NOTE, "")
    return note.split(";")[0].split(" has ", 1)[-1] if " has no effect on " in note else ""


def store_text(text: str) -> str:
    """A string from the tracking store as dinox shows it anywhere: one printable line. Any tool can write a
    run; a newline in a name would start a heading or end a table row in the report, a control character
    (U+202E turns text around) reaches the terminal, and a `|` ends a Markdown table cell: those become a space,
    and `|` the look-alike `¦`. What is left is escaped where it is shown (report.html renders no raw HTML)."""
    if text.isprintable() and "|" not in text:
        return text
    chars = (c if c.isprintable() else " " for c in text)
    return "".join(chars).replace("|", "¦")


def inert(text: str) -> str:
    """Store text inert in Markdown (the UI's descriptions, report.md): no tags, no emphasis, no code, no links
    (`|` is `¦` already, through store_text). What cannot open anything is left as typed, so the file reads
    as well as the page: `->` (a lone `>` opens nothing mid-line) and `vit_large_patch14` (an `_` between two
    letters or digits never opens or closes emphasis, in CommonMark as in Python-Markdown)."""
    text = text.replace("&", "&amp;").replace("<", "&lt;")
    # `~~` strikes text through in the MLflow UI (showdown's GitHub flavour); Python-Markdown keeps a `\~` as
    # typed, so an entity, which both render as the character.
    return _TILDES.sub("&#126;", _MARKUP.sub(r"\\\g<0>", text))


# Backslash-escaped by inert: these anywhere, and an `_` unless a letter or digit stands on each side of it.
_MARKUP = re.compile(r"[\\`*\[\]]|(?<![^\W_])_|_(?![^\W_])")
_TILDES = re.compile(r"~(?=~)|(?<=~)~")


def code_span(text: str) -> str:
    """Text as one Markdown code span that nothing in it can end early (a run name or a `--set` value with a
    backtick): fenced by one backtick more than its longest run of them, and padded where it starts or ends with
    one (CommonMark's code spans; Python-Markdown reads them the same)."""
    if not text:
        return ""
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    pad = " " if text[0] == "`" or text[-1] == "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


@dataclass(frozen=True)
class TrialRecord:
    run_id: str
    experiment_id: str
    run_name: str = ""
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return self.tags.get(rec.STATUS, "")

    def param_int(self, name: str) -> int | None:
        """An integer param, or None when absent or not an integer ("inf", "1e400", "2.5", "abc")."""
        value = self.params.get(name)
        if value in (None, "", "None"):
            return None
        try:
            number = float(value)  # type: ignore[arg-type]
        except ValueError:
            return None
        return int(number) if math.isfinite(number) and number.is_integer() else None

    def param_bool(self, name: str) -> bool | None:
        value = self.params.get(name)
        return None if value is None else value.strip().lower() in ("true", "1", "yes")

    @property
    def bound_evidence(self) -> str:
        """The costs the bound was read from, as the trial's line printed them; a record from before
        dinox.bound_evidence: its windows' loader cost."""
        if rec.BOUND_EVIDENCE in self.tags:
            return self.tags[rec.BOUND_EVIDENCE]
        cost = self.metrics.get(rec.LOADER_COST)
        return f"loader {cost:.0%} (windows)" if cost is not None and math.isfinite(cost) else ""

    @property
    def epoch_boundary_s(self) -> float:
        """What each epoch boundary adds to a run, as decide and verify charge it; a record from before
        epoch_boundary_s: the restart's whole first batch (epoch_start_s), which errs high."""
        m = self.metrics
        return m.get(rec.EPOCH_BOUNDARY_S, m.get(rec.EPOCH_START_S, 0.0))

    @property
    def few_windows(self) -> bool:
        """An ok trial with too few timed windows to show a spread: decide never calls GO on one."""
        windows = self.metrics.get(rec.WINDOWS)
        return self.status == "ok" and windows is not None and windows < SETTLED_WINDOWS

    @property
    def capped(self) -> bool:
        """Its spec allows fewer windows than a GO needs (measure.repeats: 1, "a quick look"): measuring it
        again gives as few."""
        most = self.param_int(params.MEASURE_REPEATS) or self.param_int(params.MEASURE_MAX_REPEATS)
        return most is not None and most < SETTLED_WINDOWS

    @property
    def unsettled(self) -> bool:
        """An ok trial whose figure measuring it again may settle: its windows disagreed (dinox.unstable), or
        fewer ran than its spec allows and a GO needs. `dinox run --remeasure-unsettled` measures these."""
        if self.status != "ok":
            return False
        return self.tags.get(rec.UNSTABLE) == "true" or (self.few_windows and not self.capped)

    @property
    def batch_size(self) -> int | None:
        return self.param_int(params.BATCH_SIZE)

    @property
    def effective_batch(self) -> int | None:
        """Images per optimizer step: the logged value, else size x accumulation x gpus."""
        effective = self.param_int(params.BATCH_EFFECTIVE)
        if effective is not None:
            return effective
        size = self.batch_size
        if size is None:
            return None
        return size * (self.param_int(params.BATCH_ACCUMULATION) or 1) * (self.param_int(params.HARDWARE_GPUS) or 1)


# Figures no real trial has: a step shorter than a microsecond or longer than the longest trial dinox runs
# (30 days; MLflow stores an infinite metric as the largest float), more than 10^7 images/s per device.
MIN_STEP_S = 1e-6
MAX_STEP_S = 30 * 86400.0
MAX_IMAGES_PER_S_PER_DEVICE = 1e7
# ... and fewer than one image in that longest trial: a timed window's rate no real trial has.
MIN_IMAGES_PER_S = 1 / MAX_STEP_S


def plausible_rate(images_per_s: float, gpus: int = 1) -> bool:
    """A rate some real timed window could have run at: finite, at least one image in the longest trial, at
    most 10^7 images/s per device. A window's rate outside it reaches no division or figure."""
    return math.isfinite(images_per_s) and MIN_IMAGES_PER_S <= images_per_s <= MAX_IMAGES_PER_S_PER_DEVICE * gpus


def record_problem(r: TrialRecord) -> str | None:
    """Why a record cannot be trusted (another tool logged it, or a store was edited), or None. Checked
    before any policy: a NaN throughput, a negative batch or an infinite step time must never reach a
    verdict, a division or a plot."""
    for name in (params.BATCH_SIZE, params.BATCH_ACCUMULATION, params.BATCH_EFFECTIVE, params.HARDWARE_GPUS):
        if name in r.params and r.params[name] not in ("", "None") and not (r.param_int(name) or 0) > 0:
            return f"{name} {r.params[name]!r} is not a positive integer"
    if r.status in ("ok", "oom") and r.batch_size is None:
        return "no batch.size"
    m, gpus = r.metrics, r.param_int(params.HARDWARE_GPUS) or 1
    for name in (rec.IMAGES_PER_S, rec.STEP_S_P50, rec.STEP_S_P90, rec.DEVICE_MEM_TOTAL_GB):
        if name in m and not (math.isfinite(m[name]) and m[name] > 0):
            return f"{name} {m[name]!r} is not a finite positive number"
    boundary = (rec.EPOCH_START_S, rec.EPOCH_BOUNDARY_S)
    for name in (rec.PEAK_MEM_RESERVED_GB, rec.PEAK_MEM_ALLOCATED_GB, rec.PARAMS_M, *boundary):
        if name in m and not (math.isfinite(m[name]) and m[name] >= 0):
            return f"{name} {m[name]!r} is not a finite number >= 0"
    if r.status != "ok":
        return None
    if rec.IMAGES_PER_S not in m:
        return "an ok trial without images_per_s"
    for name in boundary:
        if m.get(name, 0.0) > MAX_STEP_S:
            return f"{name} {m[name]:.3g} is longer than any trial"
    if m[rec.IMAGES_PER_S] > MAX_IMAGES_PER_S_PER_DEVICE * gpus:
        return f"images_per_s {m['images_per_s']:.3g} is more than 10^7 per device"
    for name in (rec.IMAGES_PER_S_MIN, rec.IMAGES_PER_S_MAX):
        if name in m and not plausible_rate(m[name], gpus):
            return f"{name} {m[name]!r} is no timed window's rate"
    for name in (rec.STEP_S_P50, rec.STEP_S_P90):
        if name in m and m[name] < MIN_STEP_S:
            return f"{name} {m[name]:.3g} s is shorter than a microsecond"
        if name in m and m[name] > MAX_STEP_S:
            return f"{name} {m[name]:.3g} s is longer than 30 days"
    return None

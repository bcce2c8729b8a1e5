"""What holds a step back, from what was measured: the bound label, the rule that gave it, and the costs as the
label read them, in words. No torch.

Three rules, the first whose measurements exist:
- ``ablation`` (every device): what each stage of the input, the loader and the copies to the device, costs
  a step, as an interval from two kinds of evidence that noise moves in different ways:
  - the rounds: each timed window is followed by a window without the loader and one without the copies
    either, back to back; a round's cost is 1 - images/s with the stage / images/s without it. The range of
    the rounds' costs (the outermost dropped from four rounds up) is what the windows can tell apart.
  - direct evidence. The stage alone (the loader alone, the copies alone): a stage cannot feed faster than
    it runs by itself, so it costs at least 1 - alone / without; and a stage in series with the step (the
    copies; a loader with 0 workers) cannot cost more than all of its time added to every step's, with /
    alone (loader workers can: they crowd the step's cores). A trial that ran faster than its loader alone
    refutes that
    measurement (it is then not used, and the record says so). And what the stage held the timed steps up:
    the device idle while the host waited on the loader, the copies' spans on the compute stream; without
    the stage a step is at least that much shorter.
  Two corrections for a box whose speed moves while it is measured (a busy neighbour): a round that says
  the stage costs less than nothing (-18 %) measured noise of that size, and the same noise can hide a cost
  as large (the rounds then reach +18 %); and the stage alone ran at another moment than the windows it is
  compared with, so its floor and cap move by as much as the timed windows' own rates moved (their spread).
  A stage the rounds alone put at or above the threshold, beyond its direct evidence, binds only on three
  rounds (BIND_ROUNDS): two that agree may have met the box's move the same way.
  Where the rounds and the direct evidence agree, the interval is their overlap; where they do not, the
  direct evidence's (a busy neighbour cannot make the loader alone faster than the step needs, nor 100x
  slower, nor the timed steps' own waits vanish).
  A stage whose whole interval is at or above the threshold binds (io_bound, transfer_bound); one whose whole
  interval is below it does not; one that straddles it leaves the label ``inconclusive``. With neither
  binding and both known, on a device with a timeline of its own: host_bound when the device still idles in
  the compute-only windows (Python, launches, a sync in the model), or when more than half of a
  forward/backward does not shrink at half the batch (``fixed_share``) while the device ran dry at each
  step's end (``host_ahead_steps`` below 0.1; a device with work queued, 0.25 of a step or more, is
  under-occupied at half the batch, not starved; between, inconclusive); else compute_bound.
- ``device_events`` (CUDA/MPS without ablation windows): the device's idle share at the step's markers.
  Idle time spent while the host was blocked on the loader makes it io_bound, other idle host_bound; copy
  spans make it transfer_bound.
- ``host_timers`` (the CPU without ablation windows): the share of each step the host waits on the loader
  or copies.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Literal

from dinox import record as rec
from dinox.contract import Bound

Rule = Literal["ablation", "device_events", "host_timers"]
# More than half of a forward/backward's device time independent of the batch: kernel launches and Python set
# its pace (at the same time the device runs half the work in nearly the same time), not the device.
FIXED_SHARE_HOST_BOUND = 0.5
# The host's lead over the device at a step's end (the device's queued work, in steps) separates a starved
# device from an under-occupied one. A host that sets the pace leaves nothing queued: its last kernels end
# moments after they are enqueued (the built host-bound case on an H100: -3 us). A device with work queued is
# fed; its batch-independent forward is its own (half the batch does not fill it), not the host's launches.
# A whole step ahead is the wrong gate: where a step launches more kernels than the driver's launch queue
# holds, the host blocks in the launch before it gets there. On the first H100 a compute-bound ResNet-50 (bf16,
# batch 128, as fast as its hand loop) led by 0.49 and 0.85 steps with a fixed share of 0.55 and 0.37.
HOST_STARVED_STEPS = 0.1  # below: the device ran dry at each step's end (the update's kernels may still be queued)
HOST_FED_STEPS = 0.25  # at or above: work queued; between: the evidence cannot tell


@dataclass(frozen=True)
class Interval:
    """What a stage costs a step, at least `low` and at most `high` (a share of the step; below 0 is noise);
    `source`: windows, ceiling, or both."""

    low: float
    high: float
    source: str

    def binds(self, threshold: float) -> bool | None:
        """True: the stage costs at least the threshold; False: less; None: the evidence cannot tell."""
        if self.low >= threshold:
            return True
        return False if self.high < threshold else None


@dataclass(frozen=True)
class Stage:
    """One stage of the input (the loader; the copies), measured: images/s with it and without it, pooled over
    the rounds (without it: None where no round ran, the timed steps having decided the label by themselves;
    with it, for the copies then: at most what the step could run without the loader); each round's cost;
    images/s of the stage alone (None: not measured); and the share of the timed steps it held the device up
    (the device idle while the host waited on the loader; the copies' own spans on the compute stream):
    without the stage the step is at least that much shorter."""

    with_rate: float
    without_rate: float | None
    rounds: tuple[float, ...] = ()
    alone: float | None = None
    held: float | None = None
    # The stage's work runs in series with the step's (a loader with 0 workers; the copies): then its cost is
    # at most its own time. Loader workers are other processes: beside the step they cost more than their own
    # CPU time where they crowd its cores (2 workers beside 2 torch threads on 2 cores: 14 % here, for a
    # loader alone 40x the step's rate), so there the stage alone caps nothing.
    serial: bool = True
    # How far the timed windows' rates moved ((fastest - slowest) / median): the stage alone ran at another
    # moment than the windows it is compared with, so what it allows is uncertain by as much.
    drift: float = 0.0

    @property
    def cost(self) -> float | None:
        """The windows' cost: 1 - with / without, the pooled rates (the record's loader_cost, transfer_cost); None
        without a round."""
        return None if self.without_rate is None else 1.0 - self.with_rate / self.without_rate

    def ceiling(self, tolerance: float) -> tuple[float, float] | None:
        """(at least, at most) what the stage alone allows, or None where it was not measured or the trial ran
        faster than it by more than `tolerance` (the stage-alone window was slowed: it is no evidence). The
        most is unbounded for a stage that does not run in series with the step."""
        if not self.alone or self.with_rate * (1.0 - tolerance) > self.alone * (1.0 + self.drift):
            return None
        moved = 1.0 + self.drift
        floor = 1.0 - self.alone * moved / self.without_rate if self.without_rate is not None else -math.inf
        return floor, self.with_rate * moved / self.alone if self.serial else math.inf

    def bounds(self, tolerance: float) -> tuple[float, float] | None:
        """What the direct evidence allows, (at least, at most): the stage alone's floor and cap and the share it
        held the timed steps up. None when there is none; where they disagree, the span between them."""
        ceiling = self.ceiling(tolerance)
        lows = [b for b in (ceiling[0] if ceiling else None, self.held) if b is not None]
        if not lows and ceiling is None:
            return None
        low, high = max(lows, default=-math.inf), ceiling[1] if ceiling else math.inf
        return (low, high) if low <= high else (high, low)

    def interval(self, tolerance: float) -> Interval:
        """To a hundredth of a percent: the label reads the figures the line prints, not more digits."""
        costs = sorted(self.rounds) or ([] if self.cost is None else [self.cost])
        if len(costs) >= 4:
            costs = costs[1:-1]
        low, high = (costs[0], costs[-1]) if costs else (0.0, 1.0)
        if self.rounds:
            # A round compares its timed window with windows run moments later: the box moved by as much as
            # the timed windows' rates did (their spread), and a few rounds' range need not show it. The same
            # margin stops the rounds early (rounds_decided), so a label they stopped on reads the same here.
            low, high = low - self.drift, high + self.drift
        high = max(high, -low)  # a cost below zero is noise of that size, which can hide as large a cost
        if len(self.rounds) < MIN_ROUNDS and (self.rounds or not costs):
            # One round cannot show its own noise, and none shows nothing: it bounds nothing, and the stage
            # costs what the direct evidence allows, within what any stage can cost (nothing to all of a step).
            low, high = min(low, 0.0), max(high, 1.0)
        direct = self.bounds(tolerance)
        floor, cap = direct if direct is not None else (-math.inf, math.inf)
        if 0 < len(self.rounds) < BIND_ROUNDS and low >= tolerance > floor:
            # A stage that binds on the rounds' word alone, beyond all its direct evidence shows (the steps'
            # own waits on it, its rate alone): two rounds that agree may share the box's move instead. On a
            # busy box (CI, 2026-12-01) a compute-bound ResNet-18 with 2 workers that waited 1.5 % of each step
            # on a loader 180x its rate read loader 32 % in both of its two rounds, and io_bound. Such a claim
            # stands only on a third round; until then, at least what the direct evidence shows.
            low = max(floor, 0.0)
        if direct is None:
            return Interval(round(low, 4), round(high, 4), "windows")
        if max(low, floor) <= min(high, cap):
            return Interval(round(max(low, floor), 4), round(min(high, cap), 4), "windows and direct")
        # The windows say what the direct evidence rules out: their noise. The direct bounds, an open side
        # closed where the windows point (they lie beyond it).
        clamp = lambda x: min(cap, max(floor, x))  # noqa: E731
        low, high = floor if math.isfinite(floor) else clamp(low), cap if math.isfinite(cap) else clamp(high)
        return Interval(round(low, 4), round(high, 4), "direct")


@dataclass(frozen=True)
class Evidence:
    """Mean seconds per optimizer step, and the ablation's stages; None where not measured."""

    period: float
    data: float  # host blocked in next(loader)
    copy: float  # copy spans
    idle: float | None = None  # device idle at the markers (a device with its own timeline)
    idle_loading: float | None = None  # ... of which the host was blocked on the loader
    loader: Stage | None = None
    copies: Stage | None = None
    compute_only_idle_share: float | None = None  # device idle share in the compute-only windows
    fixed_share: float | None = None  # share of forward/backward time that does not shrink at half the batch
    host_ahead: float | None = None  # the host's lead over the device in the compute-only windows, in steps


def classify(e: Evidence, threshold: float) -> tuple[Bound, Rule]:
    if e.loader is not None and e.copies is not None:
        loader, copies = e.loader.interval(threshold).binds(threshold), e.copies.interval(threshold).binds(threshold)
        if loader:
            return "io_bound", "ablation"
        if copies:
            return "transfer_bound", "ablation"
        if loader is None or copies is None:
            return "inconclusive", "ablation"
        if e.compute_only_idle_share is not None and e.compute_only_idle_share >= threshold:
            return "host_bound", "ablation"
        if e.fixed_share is not None and e.fixed_share >= FIXED_SHARE_HOST_BOUND:
            if e.host_ahead is None or e.host_ahead < HOST_STARVED_STEPS:
                return "host_bound", "ablation"
            if e.host_ahead < HOST_FED_STEPS:
                return "inconclusive", "ablation"
        return "compute_bound", "ablation"
    if e.idle is not None and e.period > 0:
        if e.idle / e.period >= threshold:
            loading = (e.idle_loading or 0.0) / e.idle if e.idle else 0.0
            return ("io_bound" if loading >= 0.5 else "host_bound"), "device_events"
        if e.copy / e.period >= threshold:
            return "transfer_bound", "device_events"
        return "compute_bound", "device_events"
    data_share, copy_share = e.data / e.period, e.copy / e.period
    if max(data_share, copy_share) < threshold:
        return "compute_bound", "host_timers"
    return ("io_bound" if data_share >= copy_share else "transfer_bound"), "host_timers"


# Ablation rounds spent at least before the rounds can stop early: two give a range, so a stage the rounds
# disagree on can still say "inconclusive". Fewer bound nothing (Stage.interval).
MIN_ROUNDS = 2
# Rounds a stage needs to bind on their word alone, where its direct evidence does not reach the threshold by
# itself: the fewest samples whose spread torch.utils.benchmark judges (more than 3 there; dinox's settled
# range, SETTLED_WINDOWS, takes 3 windows). Two rounds may show a stage costing nothing; a cost they alone see,
# both of them moved the same way, is not yet one (Stage.interval).
BIND_ROUNDS = 3


def rounds_decided(timed: list[float], no_loader: list[float], compute: list[float], threshold: float) -> bool:
    """Whether the ablation rounds so far (images/s of each timed window and of the no-loader and compute-only
    windows after it) already put both stages' costs on one side of the threshold, with the timed windows'
    spread to spare: more rounds could not change the label, so the later timed windows run without theirs.
    The stage-alone evidence measured after the rounds still narrows (or overrules) the interval."""
    if len(no_loader) < MIN_ROUNDS:
        return False
    margin = (max(timed) - min(timed)) / statistics.median(timed)
    stages = [[1.0 - t / n for t, n in zip(timed, no_loader, strict=False)]]
    if compute:  # none: the copies were decided by their own evidence (copies_decided), their rounds not run
        stages.append([1.0 - n / c for n, c in zip(no_loader, compute, strict=False)])
    for costs in stages:
        iv = Stage(1.0, 1.0, tuple(costs)).interval(threshold)
        if iv.low - margin < threshold <= iv.high + margin:
            return False
    return True


# How far under the threshold the copies' own cap must lie for the rounds to skip their compute-only windows:
# the later no-loader windows and the timed windows' spread move the cap the label finally reads, and a cap
# that rose past the threshold would leave the label inconclusive with no compute-only window to settle it.
COPIES_SPARE = 0.5


def copies_decided(no_loader: float, copies_alone: float | None, threshold: float) -> bool:
    """Whether the copies' own evidence decides their stage, so that the rounds need no compute-only window
    (asked after the first round's no-loader window, on the host's clock only, where that window tells nothing
    else: on a device with its own timeline it also shows the device idling, host_bound). The copies run in
    series with the step: they cost at most what their time adds to a step without the loader, no_loader /
    alone (Stage.ceiling); at most COPIES_SPARE of the threshold, no compute-only window could make them bind."""
    return bool(copies_alone) and no_loader / copies_alone < COPIES_SPARE * threshold  # type: ignore[operator]


def direct_decided(
    with_rate: float,
    drift: float,
    held: float | None,
    loader_alone: float | None,
    copies_alone: float | None,
    threshold: float,
) -> bool:
    """Whether what the timed steps showed by themselves already decides the label, so that more rounds could
    not change it: Stage.interval keeps a stage's interval within its direct bounds whatever the rounds say.

    - `held`: the share of a timed step the loader held it up (the device idle while the host waited in
      next(loader)). Without the loader each step is at least that much shorter: at or above the threshold the
      loader binds (io_bound) whatever the rounds say.
    - `loader_alone` (only where the loader runs in series with the step, in its one process, on the host's
      clock, where every call is synchronous; else None): then the loader costs at most with / alone, and the
      copies at most what they cost without the loader (a rate at most with / (1 - the loader's cap)) over
      their rate alone. Both caps below the threshold: neither stage binds, and on the host's clock nothing is
      left for the label to read (compute_bound).

    `drift`: the timed windows' spread, kept to spare on both sides (later windows move the figures by as
    much). For a serial loader it is asked after the first timed window and the copies alone, before any
    round: where it decides, no round runs, and the stages' intervals are the direct evidence's (step_metrics:
    the copies then run at most as fast as the step could without the loader, with / (1 - the loader's
    cap)), which is what decided here. Others run a round first (step_metrics.decided)."""
    moved = 1.0 + drift
    if held is not None and held / moved >= threshold:
        return True
    if not loader_alone or not copies_alone:
        return False
    loader_cap = with_rate * moved / loader_alone
    if loader_cap * moved >= threshold:
        return False
    copies_cap = with_rate / (1.0 - loader_cap) * moved / copies_alone
    return copies_cap * moved < threshold


def fixed_share(full_span: float, part_span: float, part: float = 0.5) -> float:
    """The batch-independent share of a forward/backward, from its device time at the full batch and at `part`
    of it, under time = fixed + per-image x batch: (part_span - part x full) / (1 - part) / full, in [0, 1]."""
    if full_span <= 0 or not 0 < part < 1:
        return 0.0
    return min(1.0, max(0.0, (part_span - part * full_span) / (1.0 - part) / full_span))


def share(value: float, threshold: float) -> str:
    """A share as a percentage: whole percents, or within a point of the threshold the fewest decimals (one or
    two: the interval is kept to hundredths) that leave it on the threshold's side the label read it on:
    10.5%, not 10.50%; 9.96%, never 10.0%."""
    if abs(value - threshold) >= 0.01:
        return f"{value:.0%}"
    text = f"{value:.1%}"
    return text if (float(text[:-1]) / 100 >= threshold) == (value >= threshold) else f"{value:.2%}"


def span(low: float, high: float, threshold: float) -> str:
    """A cost interval in words: below zero is noise, not a figure ("≤3%", "~0%", "72%", "5-40%", "≥56%")."""
    low, high = max(0.0, low), max(0.0, high)
    if high < min(0.005, threshold) or share(high, threshold) == "0%":  # "~0%", not "≤0%"
        return "~0%"
    if low < min(0.005, threshold):
        return f"≤{share(high, threshold)}"
    if high - low < 0.02 and (low >= threshold or high < threshold):  # never blur an interval across the threshold
        return share((low + high) / 2, threshold)
    if high >= 0.995:  # bounded from below only (the loader held the steps up 56 %): "≥56%", not "56-100%"
        return f"≥{share(low, threshold)}"
    return f"{share(low, threshold)[:-1]}-{share(high, threshold)}"


def explain(metrics: dict[str, float], threshold: float) -> str:
    """The ablation's costs as the label read them ("loader 72-80%, copies ≤1%"); "" without ablation windows."""
    m = metrics
    if rec.LOADER_COST_LOW not in m or rec.TRANSFER_COST_LOW not in m:
        return ""
    loader = span(m[rec.LOADER_COST_LOW], m[rec.LOADER_COST_HIGH], threshold)
    copies = span(m[rec.TRANSFER_COST_LOW], m[rec.TRANSFER_COST_HIGH], threshold)
    why = f"loader {loader}, copies {copies}"
    # Where the forward's fixed part could make it host_bound, the lead that decided (or could not).
    if m.get(rec.FIXED_SHARE, 0.0) >= FIXED_SHARE_HOST_BOUND and rec.HOST_AHEAD_STEPS in m:
        why += f", fixed {m[rec.FIXED_SHARE]:.0%} at lead {m[rec.HOST_AHEAD_STEPS]:.2f} step"
    return why

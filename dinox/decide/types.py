"""The verdict's types: the policy a decision applies, each trial as a candidate, each model's verdict. Plain
dataclasses that decide builds and money, the report and the plots read."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from dinox.decide.budget import DecisionError
from dinox.decide.grouping import device_label
from dinox.decide.head_to_head import Bout
from dinox.decide.occasions import Move
from dinox.decide.routine import RoutineCost
from dinox.store.profile_table import ProfileSummary
from dinox.store.trial_record import IPS_REAL, IPS_WINDOWS, ranges_overlap

# GO: the budget holds at the slow end of what was measured; NO-GO: it fails even at the fast end; UNSETTLED:
# the measured range straddles the budget, or too few windows ran to call any range measured.
Verdict = Literal["GO", "NO-GO", "UNSETTLED"]
# Why a trial is tied with a model's best: a head-to-head of the two left their order open, their ranges lie
# closer than the box moved (between the two sweeps that measured them, or while their one sweep ran), or their
# measured ranges share a rate.
TieWhy = Literal["head_to_head", "moved", "overlap"]


def drift_words(drift: float) -> str:
    """What a range's ends are where its sweep moved while it ran, read after "the slowest" or "the fastest"."""
    return f"window measured, widened by the {drift:.1%} its sweep moved while it ran"


@dataclass(frozen=True)
class Tie:
    """One trial tied with a model's leader (the leader: with its best), and why the measurement cannot order
    the two."""

    run_id: str
    run_name: str
    why: TieWhy
    detail: str  # the evidence in plain words (no Markdown): the rounds, the move, or the two ranges


@dataclass(frozen=True)
class Policy:
    max_memory_share: float = 0.90
    effective_batch: int | None = None
    knee_tolerance: float = 0.05
    exclude_unstable: bool = False  # True: a trial whose timed windows disagree is not recommended

    def __post_init__(self) -> None:
        problems = []
        if not (math.isfinite(self.max_memory_share) and 0 < self.max_memory_share <= 1):
            problems.append(("max_memory_share", f"must be in (0, 1], got {self.max_memory_share}"))
        if not (math.isfinite(self.knee_tolerance) and 0 <= self.knee_tolerance < 1):
            problems.append(("knee_tolerance", f"must be in [0, 1), got {self.knee_tolerance}"))
        if self.effective_batch is not None and self.effective_batch <= 0:
            problems.append(("effective_batch", f"must be a positive integer, got {self.effective_batch}"))
        if problems:
            raise DecisionError("; ".join(f"policy.{f}: {m}" for f, m in problems), problems)


@dataclass
class Candidate:
    """One ok trial as the policy sees it."""

    run_id: str
    run_name: str
    configuration: dict[str, str]
    effective_batch: int
    conservative_ips: float  # images per optimizer step / p90 step time: shown, no longer planned with
    median_ips: float  # ... / p50 step time
    measured_ips: float  # images_per_s over the timed windows (all images / all wall): the forecast's rate
    memory_share: float | None  # peak reserved / device memory
    bound: str
    days: float  # the schedule at measured_ips: the forecast
    excluded: str = ""  # why the policy does not recommend it; "" when it qualifies
    mfu: float | None = None  # model FLOPs utilisation over the timed windows
    tflops: float | None = None
    spread: float | None = None  # (fastest - slowest) / median window throughput
    unstable: bool = False
    loader_cost: float | None = None  # 1 - images/s / images/s without the loader (the ablation windows)
    bound_evidence: str = ""  # the costs the bound was read from ("loader 72-80%, copies ≤1%")
    window_min_ips: float | None = None  # the slowest and fastest timed window, images/s
    window_max_ips: float | None = None
    profile: ProfileSummary | None = None  # measure.profile's summary, where the trial was traced
    windows: int | None = None  # timed windows measured (None: a record from before the count was kept)
    days_slow: float = math.inf  # the schedule at the slowest window's rate: the verdict's margin
    days_fast: float = math.inf  # ... at the fastest window's rate
    epoch_start_s: float = 0.0  # an epoch boundary measured apart: the restarted loader's first batch
    epoch_restart_step_s: float | None = None  # with workers: the step that trained on it (None: not timed)
    epoch_boundary_s: float = 0.0  # what a boundary adds to the run, paid once an epoch on top of the rate
    routine: RoutineCost = RoutineCost()  # the run's checkpoints and evaluation passes over the schedule
    verified: Verification | None = None  # real training of this trial (dinox verify), where it ran
    windows_ips: float | None = None  # the windows' own rate, where a verification outside them replaced it
    widened: bool = False  # its range widened to a verification's rate outside it (replaced or, moved, not)
    rematch: Rematch | None = None  # measured again head to head: its rounds replaced the sweep's figures
    sweep: str = ""  # the sweep (parent run) that measured it: ranges from two sweeps order them only if
    # the box did not move between them (dinox.decide.occasions)
    # How far its sweep moved while it ran beyond what the windows spread (Move.gap of the sweep's drift check):
    # its ends are widened by it, as the box may meet real training at the pace of either end of the sweep. 0.0
    # where the sweep held still, and where rounds of a head-to-head (their spread holds the box's drift over
    # every round) or real training (a verification on a box that held still) replaced the sweep's figures.
    drift: float = 0.0
    # The trial measured again at its sweep's end (the drift check that showed the move), slowest and fastest
    # window: its ends cover those windows too, as they are its own measurements. None for every other trial.
    checked: tuple[float, float] | None = None
    # What OpenMP's waiting threads did in the measurement its forecast comes from (dinox.omp_wait_policy's
    # text): the trial's, its head-to-head's latest rounds', or the verification's whose rate replaced them.
    # `dinox verify` trains with it, so the slice is the step the forecast measured. "" where not recorded.
    omp_wait_policy: str = ""

    @property
    def rates(self) -> tuple[float, float, float]:
        """(forecast, slow end, fast end), images/s."""
        return self.measured_ips, self.slow_ips, self.fast_ips

    @property
    def forecast_unit(self) -> str:
        """What its forecast's rate is, as printed beside it: the timed windows', or real training's where a
        verification outside the windows' range replaced it."""
        return IPS_REAL if self.windows_ips is not None else IPS_WINDOWS

    @property
    def range_ends(self) -> str:
        """What its slowest and fastest rate are of: its timed windows, widened to real training's rate where a
        verification fell outside them, or by the move of the sweep that measured them."""
        if self.widened:
            return "rate measured in windows or real training"
        return drift_words(self.drift) if self.drift else "window measured"

    @property
    def window_range(self) -> tuple[float, float]:
        """Its slowest and fastest timed window (real training's rate among them where a verification widened
        them), as measured: what the tables show and ties are read from, without the sweep's move."""
        return (
            min(self.window_min_ips or self.measured_ips, self.measured_ips),
            max(self.window_max_ips or self.measured_ips, self.measured_ips),
        )

    @property
    def slow_ips(self) -> float:
        """The slow end the verdict reads: the slowest window, slowed by the sweep's move (and no faster than
        its drift check's slowest window, where this trial is the one measured again)."""
        slow = self.window_range[0] / (1 + self.drift)
        return min(slow, self.checked[0]) if self.checked else slow

    @property
    def fast_ips(self) -> float:
        fast = self.window_range[1] * (1 + self.drift)
        return max(fast, self.checked[1]) if self.checked else fast

    @property
    def occasion_range(self) -> tuple[float, float]:
        """Its range as the sweep measured it, to set beside another trial's from the same sweep: a
        head-to-head's rounds replace the plan's figures, but their spread holds the box's drift over every
        round, which one sweep measurement of another trial cannot be held against."""
        return self.rematch.sweep_range if self.rematch is not None else self.window_range

    def overlaps(self, other: Candidate, slack: float = 0.0) -> bool:
        """The two measured ranges share a rate: which of the two is faster is not settled. `slack`: each range's
        fast end raised by that share first (the box's move while their sweep ran)."""
        return ranges_overlap(self.occasion_range, other.occasion_range, slack)


@dataclass(frozen=True)
class Rematch:
    """A trial measured again head to head (`dinox head-to-head`): its rounds' figures are the plan's."""

    group: str  # the head-to-head's id (dinox.head_to_head)
    rounds: int
    sweep_ips: float  # the sweep's own figure, which the rounds replaced
    sweep_range: tuple[float, float]  # the sweep's slowest and fastest window (what ties are read from)
    # The rounds the plan's figure pools: those under its latest round's OpenMP policy (`policy`, the word), all of
    # them unless the box crossed dinox's busy line mid head-to-head (HeadToHead.planning).
    pooled_rounds: int = 0
    policy: str = ""


@dataclass(frozen=True)
class Verification:
    """A `dinox verify` of the trial: real training's rate over its slice and how far the forecast was off."""

    run_id: str
    images_per_s: float
    error: float  # (forecast - real) / real for the slice: + pessimistic
    tolerance: float = 0.05
    moved: bool = False  # the box was not as the trial found it, or moved during the slice (dinox.verify_moved)

    def describe(self) -> str:
        word = "held within" if abs(self.error) <= self.tolerance else "off by"
        moved = "; the box moved, by its check windows or the slice's own quarters" if self.moved else ""
        return (
            f"{'undecided: ' if self.moved else ''}forecast {word} {abs(self.error):.1%} (verify run {self.run_id}: "
            f"{self.images_per_s:.1f} img/s real{moved})"
        )


@dataclass
class Span:
    """What a model's plan rests on: the forecast (the expected rate, over all timed windows) and the range
    the verdict is read over (its slowest and fastest window), each with the days (and cost) it gives."""

    forecast_ips: float
    slow_ips: float
    fast_ips: float
    days: float
    days_slow: float
    days_fast: float
    cost: float | None = None
    cost_slow: float | None = None
    cost_fast: float | None = None
    # The most the sweeps behind it moved while they ran, by which the slow and fast ends were widened
    # (Candidate.drift); 0.0 where they held still.
    drift: float = 0.0


@dataclass
class OomBoundary:
    """For one memory configuration of a model: the largest batch that fit and the smallest that did not."""

    settings: dict[str, str]
    largest_ok: int | None
    smallest_oom: int | None


@dataclass
class ModelVerdict:
    key: str  # model.name plus its kwargs
    name: str
    kwargs: dict[str, str]
    params_m: float | None
    trials: int
    statuses: dict[str, int]
    candidates: list[Candidate]
    oom: list[OomBoundary]
    best: Candidate | None = None  # the configuration recommended: the leader, or the slowest of its tie
    verdict: Verdict | None = None  # None: no trial qualifies
    unsettled_why: str = ""  # why the verdict is UNSETTLED: too few windows, or a range that straddles the budget
    # Qualifying trials whose measured range overlaps the leader's (or that a head-to-head with it left
    # unsettled): not told apart by the measurement, so the plan takes the slowest of them, `best` (the best
    # of noisy figures is biased high: the winner's curse); the leader, when not `best`, is one of these.
    tied: list[Candidate] = field(default_factory=list)
    # The fastest of `best` and `tied` by its forecast: each tie is measured against it (`best` itself when
    # nothing is tied).
    lead: Candidate | None = None
    # Of the tied trials, those tied by the box's move alone (between their sweeps, or while their one sweep ran):
    # their ranges lie apart, but closer than the move.
    moved: dict[str, Move] = field(default_factory=dict)
    # Where the leaders were measured again head to head: the leader against each other trial of its rounds.
    bouts: list[Bout] = field(default_factory=list)
    span: Span | None = None  # best's forecast, the slowest window of best and tied, the leader's fastest
    margin_days: float | None = None
    epochs_in_budget: float | None = None
    images_in_budget: float | None = None
    device_name: str = ""  # the device that measured these trials (dinox.device_name)
    devices: int = 1  # how many of it each trial used (hardware.gpus)
    cost: float | None = None  # the whole schedule on the best trial's devices; None without a price
    over_cost: str = ""  # why the cost rules it out (budget.max_cost); "" when it does not

    @property
    def forecast_unit(self) -> str:
        """What its forecast's rate is (`best`'s): the timed windows', or real training's."""
        return self.best.forecast_unit if self.best is not None else IPS_WINDOWS

    @property
    def range_ends(self) -> str:
        """What the ends of its span are of: see Candidate.range_ends; real training's too where a verification
        widened the range of `best` or of the tied trial whose end the span takes (`real_ends`)."""
        if any(self.real_ends()):
            return "rate measured in windows or real training"
        if self.span is not None and self.span.drift:
            return drift_words(self.span.drift)
        return self.best.range_ends if self.best is not None else "window measured"

    def real_ends(self) -> tuple[bool, bool]:
        """Whether its span's slowest / fastest end is real training's rate (a verification outside a trial's
        windows widened its range), not a timed window's: a table of windows says so beside it."""
        real = {c.verified.images_per_s for c in self.candidates if c.widened and c.verified is not None}
        if self.span is None or not real:
            return False, False
        return self.span.slow_ips in real, self.span.fast_ips in real

    @property
    def real_forecast(self) -> bool:
        """Its forecast is real training's rate (a verification of `best` outside its windows), not the windows'."""
        return self.forecast_unit == IPS_REAL

    def paired(self, c: Candidate) -> Candidate:
        """The trial beside the leader in `c`'s tie (the leader's bouts and moves are keyed by it): `best` for the
        leader itself, else `c`."""
        return self.best if c is self.lead and self.best is not None else c

    def ties(self) -> list[Tie]:
        """Each tied trial and why it is tied with the leader (the leader itself: with `best`), as decision.json
        and report.md say it."""
        if self.best is None or self.lead is None:
            return []
        lead, bouts = self.lead, {b.other: b for b in self.bouts}
        out = []
        for c in self.tied:
            name, other = c.run_name or c.run_id, self.paired(c)
            if other.run_id in bouts:
                b = bouts[other.run_id]
                why: TieWhy = "head_to_head"
                detail = f"measured again head to head: {b.won} rounds to {b.lost}, not settled"
            elif other.run_id in self.moved:
                m = self.moved[other.run_id]
                why = "moved"
                detail = m.describe(str)
            else:
                (lo, hi), (c_lo, c_hi) = lead.occasion_range, other.occasion_range
                why = "overlap"
                detail = f"measured ranges {c_lo:.1f}-{c_hi:.1f} and {lo:.1f}-{hi:.1f} img/s share a rate"
            if other is c and lead is not self.best:
                detail += f" (with the leader, {lead.run_name or lead.run_id})"
            out.append(Tie(c.run_id, name, why, detail))
        return out

    @property
    def go(self) -> bool:
        """A settled GO: the budget holds at the slow end of what was measured."""
        return self.verdict == "GO"

    @property
    def days(self) -> float:
        """The forecast's days (math.inf where nothing qualifies)."""
        return self.span.days if self.span is not None else math.inf

    @property
    def ips(self) -> float | None:
        """The forecast's images/s."""
        return self.span.forecast_ips if self.span is not None else None

    @property
    def label(self) -> str:
        if not self.kwargs:
            return self.name
        return f"{self.name} ({', '.join(f'{k}={v}' for k, v in sorted(self.kwargs.items()))})"

    @property
    def device(self) -> str:
        return device_label(self.device_name, self.devices)

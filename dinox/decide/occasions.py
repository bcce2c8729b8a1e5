"""Which sweeps' ranges can be set side by side. Two trials' measured ranges order them only where both show the
box as it was when each was measured alike: within one sweep, or in two sweeps between which the store shows
no move. A trial measured ok in both, whose windows in the one share no rate with its windows in the other,
is such a move: the box (or what ran beside it) changed between the sweeps, and a range from each is a
figure of two different machines.

Found after `dinox run --remeasure-unsettled` (issue 33): trial 5 measured 194.7-225.5 img/s in the first
sweep and 145.7-189.4 four minutes later, and decide ranked the first sweep's trial 6 (193.3-212.0) above it
by their disjoint ranges, a winner chosen by the box's move. A record of one window has no measured spread
and shows no move: two such figures always differ.

Within one sweep the same holds between its first trial and its last: `dinox run` measures its first ok trial
again once the last is done (dinox.sweep.drift, kept on that trial's run as rec.DRIFT_CHECK). Where the two
ranges share no rate the sweep moved while it ran.

Either way a pair of trials closer than the move (Move.noise) is not ordered by their ranges
(dinox.decide.candidates.moved_apart); a pair further apart still is: a box that moved 3 % does not make a
trial measured 30 % faster an open question.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from dinox import record as rec
from dinox.contract import DriftCheck, range_gap
from dinox.spec import params
from dinox.store.trial_record import TrialRecord, code_span, measured_range, plausible_rate, ranges_overlap

# The latest runs of one trial compared with each other: a store holding thousands of runs of one trial (another
# tool's, or a hostile one) is not compared all against all.
MAX_RUNS = 50


@dataclass(frozen=True)
class Move:
    """One trial measured in two sweeps (or at a sweep's start and end: its drift check) with windows that share
    no rate."""

    trial: str  # the trial's run name as decide shows it
    sweeps: frozenset[str]  # the two sweeps' parent run ids; one, for a move within a sweep (its drift check)
    before: tuple[float, float]  # its slowest and fastest window in the earlier sweep (or measurement), images/s
    after: tuple[float, float]  # ... in the later one

    @property
    def within(self) -> bool:
        """A move while one sweep ran, shown by its drift check."""
        return len(self.sweeps) == 1

    @property
    def size(self) -> float:
        """How far the box moved, as a ratio's distance from 1: the trial's mid-range rate in one sweep over its
        mid-range rate in the other. A change between trials of the two sweeps is noise up to this."""
        (a, b), (c, d) = self.before, self.after
        return abs((a + b) / (c + d) - 1)

    @property
    def gap(self) -> float:
        """The least it moved beyond what each measurement's windows spread (dinox.contract.range_gap): within
        one sweep, its trials' ranges closer than this are tied, and a knob's change inside it is noise."""
        return range_gap(self.before, self.after)

    @property
    def noise(self) -> float:
        """What a change between trials measured across the move must stand out of, beside their windows'
        spreads: a move between sweeps, its size (each sweep a machine of its own); within a sweep, its gap
        (the windows' spreads already hold the rest, and a first trial caught warming up is not the sweep)."""
        return self.gap if self.within else self.size

    def describe(self, name: Callable[[str], str] = code_span) -> str:
        """In words, the trial named by `name` (a Markdown code span, or `str` for plain text)."""
        (a, b), (c, d) = self.before, self.after
        if self.within:
            return (
                f"{name(self.trial)} ran {a:.1f}-{b:.1f} img/s at the sweep's start and {c:.1f}-{d:.1f} when measured "
                f"again at its end, {self.gap:.1%} apart"
            )
        return (
            f"{name(self.trial)} ran {a:.1f}-{b:.1f} img/s in the earlier sweep and {c:.1f}-{d:.1f} in the later, "
            f"{self.size:.1%} apart by their mid-ranges"
        )


def moves(records: list[TrialRecord]) -> dict[frozenset[str], Move]:
    """The moves between sweeps these records show, by the pair of sweeps; `records` oldest first (a trial's
    superseded runs, then its latest). The first move found between two sweeps is the one named."""
    runs: dict[tuple[str, str, str], list[tuple[str, tuple[float, float], str]]] = defaultdict(list)
    for r in records:
        sweep, window = r.tags.get(rec.PARENT_RUN, ""), measured_range(r.metrics)
        if r.status == "ok" and sweep and window is not None:
            key = (r.tags.get(rec.TRIAL_ID) or r.run_id, r.tags.get(rec.DEVICE_NAME, ""), _gpus(r))
            runs[key].append((sweep, window, r.run_name or r.run_id))
    found: dict[frozenset[str], Move] = {}
    for every in runs.values():
        measured = every[-MAX_RUNS:]
        for i, (sweep, (lo, hi), _name) in enumerate(measured):
            for later, (later_lo, later_hi), later_name in measured[i + 1 :]:
                pair = frozenset((sweep, later))
                if len(pair) == 2 and pair not in found and not ranges_overlap((lo, hi), (later_lo, later_hi)):
                    found[pair] = Move(later_name, pair, (lo, hi), (later_lo, later_hi))
    for r in records:
        if (move := _within(r)) is not None:
            found.setdefault(move.sweeps, move)
    return found


def _within(r: TrialRecord) -> Move | None:
    """The move its sweep's drift check shows, where this record carries one whose range shares no rate with
    its own."""
    check = DriftCheck.parse(r.tags.get(rec.DRIFT_CHECK))
    sweep, own = r.tags.get(rec.PARENT_RUN, ""), measured_range(r.metrics)
    if check is None or r.status != "ok" or not sweep or own is None:
        return None
    gpus = r.param_int(params.HARDWARE_GPUS) or 1
    if not all(plausible_rate(x, gpus) for x in (check.slow_ips, check.fast_ips)):
        return None  # a rate no window ran (another tool's tag, or an edited store) shows no move
    again = (check.slow_ips, check.fast_ips)
    return Move(r.run_name or r.run_id, frozenset((sweep,)), own, again) if range_gap(own, again) else None


def between(a: TrialRecord, b: TrialRecord, found: dict[frozenset[str], Move]) -> Move | None:
    """The move between the sweeps two records were measured in (or while their one sweep ran), if the store
    shows one."""
    pair = frozenset((a.tags.get(rec.PARENT_RUN, ""), b.tags.get(rec.PARENT_RUN, "")))
    return found.get(pair) if "" not in pair else None


def _gpus(r: TrialRecord) -> str:
    return r.params.get(params.HARDWARE_GPUS, "1")

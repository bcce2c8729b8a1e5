"""The sweep's drift check: once its last trial is done, its first ok trial is measured again (timed windows
only, forked from the same fork server, on the same lane), and the figure is kept in the journal, then on that
trial's run (rec.DRIFT_CHECK) for decide to read (dinox.decide.occasions); `dinox sync` writes it there where
the store failed.

Why: trials of one sweep are measured minutes apart, and the box moves in between by more than the difference
a close pair shows. In issue 33's quickstart (2026-11-29, round 2) the sweep put 2 workers above 0 workers by
ranges that did not overlap, where two head-to-heads had put 0 workers ahead in 5 rounds of 5: the sweep's
ranges had ordered the box's drift, not the trials. One trial measured at the sweep's start and again at its
end is the spread of the whole sweep's time; where its two ranges share no rate, decide does not order the
sweep's trials by ranges closer than the gap between those two (dinox.contract.range_gap).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from dinox import record as rec
from dinox.contract import DriftCheck, TrialResult, one_line, range_gap
from dinox.isolate import runner
from dinox.plan.grid import Trial
from dinox.sweep.lanes import Lane


@dataclass(frozen=True)
class First:
    """The sweep's first trial measured ok with a range (two or more windows): the one checked again."""

    trial: Trial
    result_id: str  # its result's in the journal, where the check is kept first (dinox sync logs it from there)
    run_id: str | None  # None where the store was down when the trial was recorded
    slow_ips: float
    fast_ips: float
    ended: float  # time.time() once it was recorded

    @classmethod
    def of(cls, trial: Trial, result_id: str, run_id: str | None, result: TrialResult) -> First | None:
        m = result.metrics
        lo, hi = m.get(rec.IMAGES_PER_S_MIN), m.get(rec.IMAGES_PER_S_MAX)
        if result.status != "ok" or m.get(rec.WINDOWS, 0) < 2 or not lo or not hi:
            return None
        return cls(trial, result_id, run_id, lo, hi, time.time())


def measure_again(first: First, folder: Path, lane: Lane) -> tuple[DriftCheck | None, str]:
    """The check, or None and why there is none (the child ended other than ok, or with too few windows)."""
    outcome = runner.run_trial(first.trial.windows_only(), folder, server=lane.server, env=lane.env)
    r, m = outcome.result, outcome.result.metrics
    if r.status != "ok":
        return None, f"it ended {r.status}: {one_line(r.error, 200)} (its log: {outcome.log_path})"
    ips = m.get(rec.IMAGES_PER_S, 0.0)
    check = DriftCheck(
        ips,
        m.get(rec.IMAGES_PER_S_MIN, ips),
        m.get(rec.IMAGES_PER_S_MAX, ips),
        int(m.get(rec.WINDOWS, 1)),
        round(time.time() - first.ended, 1),
    )
    if DriftCheck.parse(check.to_json()) is None:
        return None, f"its windows gave no range ({check.windows} window(s), {ips:.1f} img/s)"
    return check, ""


def moved(first: First, check: DriftCheck) -> float:
    """How far the box moved while the sweep ran, beyond what each measurement's windows spread (0.0: it held)."""
    return range_gap((first.slow_ips, first.fast_ips), (check.slow_ips, check.fast_ips))


def describe(first: First, check: DriftCheck) -> str:
    """The terminal's line: what the check measured, beside the trial's own range, and what decide makes of it."""
    again = f"{check.slow_ips:.1f}-{check.fast_ips:.1f} img/s {check.seconds_after:.0f} s later"
    own = f"{first.slow_ips:.1f}-{first.fast_ips:.1f}"
    gap = moved(first, check)
    name = first.trial.run_name
    if not gap:
        return f"drift check: {name} ran {again}, within its own {own}: the box held while the sweep ran"
    return (
        f"drift check: {name} ran {again}, {gap:.1%} outside its own {own}: the box moved while the sweep ran, "
        "and `dinox decide` does not order this sweep's trials by ranges closer than that"
    )

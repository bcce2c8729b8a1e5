"""The step `dinox verify`'s slice trains: the one its forecast measured. The trial at the batch its record
measured, on the trial's cores and with its torch threads (or every core, where the forecast is head-to-head
rounds', which ran so), its OpenMP threads waiting as where the forecast was measured. Each rule reads the
trial's record and the forecast and returns what the child is given; those of cores and threads also a line for
the terminal (numbers and words of closed sets only, never the store's text). Pure: no MLflow, no child."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from dinox import record as rec
from dinox.errors import escaped
from dinox.isolate import contention
from dinox.isolate.slots import MAX_CORE, format_cores, parse_cores
from dinox.plan.grid import Trial
from dinox.store.trial_record import TrialRecord
from dinox.verify.outcome import Forecast

NO_BATCH = "a batch.size auto trial without the batch its search found (the trial run's batch.size param)"


def as_measured(trial: Trial, record: TrialRecord) -> Trial | None:
    """The trial at the batch its record measured: a `batch.size: auto` trial's is the one its search found (the
    spec has none); None where the record does not say it."""
    if not trial.spec.batch.auto:
        return trial
    size = record.batch_size
    return None if size is None else dataclasses.replace(trial, spec=trial.spec.with_batch(size))


def held_policy(record: TrialRecord, forecast: Forecast) -> tuple[str, bool]:
    """The OpenMP policy the slice trains with (dinox.omp_wait_policy's text), and whether it is the forecast's
    rather than the trial's: a head-to-head's rounds (or a verification a decision planned with) may have run
    under another policy than the trial's sweep, and the slice trains the step its forecast measured."""
    trials = record.tags.get(rec.OMP_WAIT_POLICY, "")
    if contention.policy_of(forecast.omp_policy) not in ("", contention.policy_of(trials)):
        return forecast.omp_policy, True
    return trials, False


def held_cores(record: TrialRecord, forecast: Forecast, usable: list[int]) -> tuple[list[int], str]:
    """The cores the slice trains on ([]: every core, as a trial measured one at a time did) and a line saying so
    ("" where there is nothing to say). A trial `dinox run --devices` held to a share of the cores (dinox.cores)
    measured its step on that share, at most one torch thread a core: the slice trains on as many, the same
    ones where this process may use them; but a forecast of head-to-head rounds (never held) is of every core's
    step. Only numbers reach the line, never the store's text."""
    text = record.tags.get(rec.CORES, "")
    try:
        cores = parse_cores(text)
    except ValueError:
        return [], "its trial's cores (dinox.cores) cannot be read: the slice trains on every core this process may use"
    if not cores:
        return [], ""
    fewer = len(usable) < len(cores)  # this process may use fewer (a cgroup, taskset): another step, said
    if set(usable) <= set(cores) and not fewer:
        return [], ""
    if forecast.rounds:
        return [], (
            f"its trial ran held to {len(cores)} of the cores (dinox run --devices), its forecast's head-to-head "
            "rounds on every core: the slice trains on every core, the step the rounds measured"
        )
    held = cores if set(cores) <= set(usable) else usable[: len(cores)]
    beside = _count(record.tags.get(rec.CONCURRENT_TRIALS, "")) - 1
    others = f", beside {beside} other trial{'s' * (beside != 1)} it no longer has" if beside > 0 else ""
    step = (
        f"only {len(usable)} here (this process's cores): another step than the trial measured"
        if fewer
        else "at most one torch thread a core, the step the trial measured"
    )
    return held, (
        f"its trial ran held to {len(cores)} of the cores (dinox run --devices: {format_cores(cores)}){others}: the "
        f"slice trains on {format_cores(held)}, {step}"
    )


def held_threads(record: TrialRecord, forecast: Forecast, parent: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """OMP_NUM_THREADS for the slice's child, and a line where there is something to say. The trial's torch
    threads (dinox.torch_threads: what its shell's OMP_NUM_THREADS, or torch's default there, gave it), so a
    shell that sets none now, or a sweep's that set one, does not train another step. Not for a forecast of
    head-to-head rounds (they record none) nor for ranks (each takes its share of the cores, as the trial's
    did); a setting of the user's now is theirs, said where it differs."""
    text = record.tags.get(rec.TORCH_THREADS, "")
    ranks = record.tags.get(rec.WORLD_SIZE, "1") != "1"
    if forecast.rounds or ranks or not _whole(text) or not 0 < int(text) < MAX_CORE:
        return {}, ""
    mine = parent.get("OMP_NUM_THREADS")
    if mine is None:
        return {"OMP_NUM_THREADS": text}, ""
    if mine.strip() == text:
        return {}, ""
    return {}, (
        f"OMP_NUM_THREADS={escaped(mine[:20])} here, its trial ran {text} torch thread{'s' * (text != '1')}: the "
        "slice trains with yours, another step than the forecast's (unset it to train the trial's)"
    )


def _whole(text: str) -> bool:
    """A store's text that is a whole number in ASCII digits (str.isdigit also takes "²", which int refuses)."""
    return text.isascii() and text.isdigit()


def _count(text: str) -> int:
    return int(text) if _whole(text) else 0

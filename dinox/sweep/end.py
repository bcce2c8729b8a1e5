"""How a sweep ends: finished (the parent run closed with its summary, plot and note), or aborted by an
interrupt or a full workdir (every run still open marked KILLED, the parent KILLED or FAILED)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from dinox.contract import one_line
from dinox.errors import WorkdirError
from dinox.plan.grid import Trial
from dinox.store import descriptions
from dinox.store.journal import Journal
from dinox.store.recorder import SweepRecorder, result_summary
from dinox.sweep.best_effort import BestEffortStore
from dinox.sweep.flights import Flights
from dinox.sweep.interrupts import ClosingInterrupted, Interrupted, signals_ignored, signals_noted, signals_raise
from dinox.sweep.outputs import SweepReport


class Sweep(Protocol):
    """What ending a sweep reads of it (``dinox.sweep.run.Sweep``, from its construction on)."""

    name: str
    t0: float
    trials: list[Trial]
    report: SweepReport
    recorder: SweepRecorder
    journal: Journal | None
    store: BestEffortStore
    flights: Flights
    csv_path: Path
    echo: Callable[[str], None]


def finish(sweep: Sweep, stopped: str = "", noted: list[str] | None = None) -> None:
    """The sweep ran to its end: the journal says so, the parent run gets the CSV, spec, plot, note and summary.
    A signal meanwhile (or before, once every trial was recorded: `stopped` says which, or `noted`, the signals
    the caller's own signals_noted caught, which this call goes on filling) costs only the plot: the journal line
    and the parent's close are never cut short (a Ctrl-C must not leave the parent RUNNING; one that comes during
    them is kept for after), then ClosingInterrupted says what was done."""
    journal = sweep.journal
    assert journal is not None, "a sweep finishes only after its workdir is there"
    noted = noted if noted is not None else []
    with signals_noted(noted):  # the journal holds the parent's close first, as a trial's result
        report = sweep.report
        rows, summary = report.rows, result_summary(report.results)
        note = descriptions.sweep_note(sweep.name, rows, len(report.resumed), report.drift, report.drift_gap)
        extra = {"note": note, "metrics": descriptions.sweep_metrics(rows)}
        _quietly(lambda: journal.sweep_end("FINISHED", note=note, metrics=extra["metrics"]))
    d = sweep.report.sweep_dir
    artifacts = [sweep.csv_path, d / "spec.yaml", d / "spec.normalized.yaml"]
    plot = None
    try:
        if not stopped and not noted:
            with signals_raise():
                keys = {k for t in sweep.trials for k in t.spec.flat_params()}
                plot = descriptions.throughput_plot(sweep.report.rows, d / descriptions.THROUGHPUT_PLOT, keys)
    except (KeyboardInterrupt, Interrupted) as e:
        stopped = str(e) if isinstance(e, Interrupted) else "interrupted by SIGINT"
    except Exception as e:  # noqa: BLE001 - a picture never costs the sweep its record
        sweep.echo(f"warning: no throughput plot for the parent run ({one_line(str(e), 200)})")
    with signals_noted(noted):
        if sweep.store.call(
            sweep.recorder.close_sweep, "FINISHED", summary, [*artifacts, *([plot] if plot else [])], "", extra
        )[0]:
            journal.sweep_closed()
        sweep.report.wall_s = time.time() - sweep.t0
    stopped = stopped or (f"interrupted by {noted[0]}" if noted else "")
    if stopped:
        raise ClosingInterrupted(stopped, sweep.recorder.adopted, plotted=plot is not None)


def abort(sweep: Sweep, status: str, reason: str) -> int:
    """Close what is open, so nothing stays RUNNING; how many trials in flight were marked KILLED. Further
    signals wait until that is done: a second Ctrl-C must not leave runs RUNNING."""
    killed = 0
    with signals_ignored():
        journal, store = sweep.journal, sweep.store
        if journal is not None:
            _quietly(lambda: journal.sweep_end(status, reason))
        for flight in sweep.flights:
            flight.stop_monitor()
            if flight.run_id and not flight.closed:
                store.call(sweep.recorder.kill_trial, flight.run_id, reason)
                killed += 1
        summary = result_summary(sweep.report.results)
        sweep_dir = sweep.report.sweep_dir
        artifacts = [sweep_dir / "results.csv", sweep_dir / "spec.yaml"] if journal is not None else []
        if store.call(sweep.recorder.close_sweep, status, summary, artifacts, reason)[0] and journal is not None:
            _quietly(journal.sweep_closed)
    return killed


def _quietly(write: Callable[[], None]) -> None:
    # At the end of a sweep (or after the workdir failed) a journal line that cannot be written only
    # means `dinox sync` closes the parent run later.
    with contextlib.suppress(WorkdirError):
        write()

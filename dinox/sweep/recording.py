"""One trial's record, in the order that loses nothing: its run opened in MLflow and the run's id journaled at
once (a store failure later never leads to a second run for the same result), its result journaled, then
logged to MLflow (confirmed by reading it back), then its row in results.csv."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dinox.contract import DriftCheck, TrialResult
from dinox.errors import WorkdirError
from dinox.plan import footprint
from dinox.plan.footprint import Estimates
from dinox.store import descriptions
from dinox.store.journal import Journal
from dinox.store.recorder import SweepRecorder
from dinox.sweep.best_effort import BestEffortStore
from dinox.sweep.flights import InFlight
from dinox.sweep.outputs import SweepReport, row, write_csv
from dinox.sweep.prune import Pruner


@dataclass
class TrialBook:
    """Where a sweep's trials are recorded, once its workdir (the journal, results.csv) is there."""

    recorder: SweepRecorder
    journal: Journal
    store: BestEffortStore
    report: SweepReport
    csv_path: Path
    pruner: Pruner
    estimates: Estimates

    def open(self, flight: InFlight, role: str = "trial") -> None:
        """The trial's run, opened once, its params logged."""
        _ok, flight.run_id = self.store.call(self.recorder.open_trial, flight.trial, flight.result_id, role)
        if flight.run_id is not None:
            self.journal.opened(flight.result_id, flight.run_id)
            self.store.call(self.recorder.log_params, flight.run_id, flight.trial)

    def record(self, flight: InFlight, result: TrialResult, log_path: Path | None) -> None:
        """Journal first, then MLflow, then the CSV; the pruner learns the outcome."""
        trial = flight.trial
        footprint.annotate(result, None if trial.spec.batch.auto else self.estimates.memory(trial.spec))
        try:
            self.journal.result(flight.result_id, trial, result, flight.run_id, str(log_path or ""))
        except WorkdirError:
            # Nowhere to keep it locally. A result the child wrote still goes to the store; a crash or a
            # timeout the parent inferred may be the full disk's doing, so that run is KILLED instead.
            if result.status not in ("crashed", "timeout"):
                self._log(flight, result, log_path, journal=False)
            raise
        result.tags[descriptions.NOTE_TAG] = descriptions.trial_note(
            trial.label, result.status, result.bound, result.metrics, result.error, result.tags, flight.run_id or ""
        )
        self._log(flight, result, log_path, journal=True)
        self.report.rows.append(row(trial, flight.run_id or "", result))
        self.report.results.append(result)
        try:
            write_csv(self.csv_path, self.report.rows)
        except OSError as e:
            raise WorkdirError(e.errno, f"cannot write {self.csv_path}: {e.strerror or e}") from e
        if not trial.spec.batch.auto:
            self.pruner.observe(trial.spec.flat_params(), trial.spec.size, result.status, flight.run_id or "")

    def drift_check(self, result_id: str, run_id: str | None, check: DriftCheck) -> None:
        """The sweep's drift check, in the same order: journaled, then on its trial's run (where the store gave
        that trial one), then marked logged; `dinox sync` writes what the store did not take."""
        self.journal.drift_check(result_id, check)
        if run_id is None:
            return
        logged, _ = self.store.call(self.recorder.tag_drift_check, run_id, check)
        if logged:
            self.journal.drift_logged(result_id)

    def _log(self, flight: InFlight, result: TrialResult, log_path: Path | None, journal: bool) -> None:
        if flight.run_id is None:  # opening failed: the store may hold the run anyway; never open a second
            _ok, flight.run_id = self.store.call(self.recorder.run_for, flight.trial, flight.result_id, None)
        if flight.run_id is None:
            return
        logged, _ = self.store.call(self.recorder.close_trial, flight.run_id, flight.trial, result, log_path)
        if logged:
            flight.closed = True
            if journal:
                self.journal.logged(flight.result_id, flight.run_id)

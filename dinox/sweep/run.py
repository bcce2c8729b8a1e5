"""Orchestrate one sweep: trials -> child processes -> results -> MLflow, with a local journal first.

This module only sequences the others. Every result goes to the sweep's journal (results.jsonl) and
results.csv the moment it is known; MLflow comes second. When the tracking store fails mid-sweep, the
sweep goes on, says so, and ``dinox sync`` logs what is missing once the store is back. Trials the
experiment already holds with a final status are skipped (resume), and larger batches of a configuration
that ran out of memory are recorded as skipped without running (pruning).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from dinox import record as rec
from dinox.contract import COST_FILE, FINAL, ProcessRef, TrialResult, one_line
from dinox.errors import WorkdirError
from dinox.isolate import contention, runner
from dinox.isolate.forkserver import ForkServer
from dinox.isolate.slots import DevicesError, Request
from dinox.plan.footprint import Estimates
from dinox.plan.grid import Trial, trial_id
from dinox.plan.machine import DeviceMissing, missing_message
from dinox.spec.file import SpecDocument
from dinox.store import throughput_figure
from dinox.store.backend import configure_client, shown_uri
from dinox.store.journal import Journal
from dinox.store.recorder import SweepRecorder
from dinox.store.trial_record import TrialRecord
from dinox.sweep import drift, end
from dinox.sweep.batch_search import BatchSearch, killed_for_memory, probe_spec
from dinox.sweep.best_effort import BestEffortStore
from dinox.sweep.flights import Flights, InFlight
from dinox.sweep.interrupts import Interrupted, SweepStopped, signals_ignored, signals_noted, signals_raise
from dinox.sweep.lanes import Lane, Lanes, Stopping, side_by_side
from dinox.sweep.outputs import SweepReport, describe, ladder_lines, write_sweep_files
from dinox.sweep.progress import Progress
from dinox.sweep.prune import Pruner
from dinox.sweep.recording import TrialBook
from dinox.writes import write_whole


@dataclass(frozen=True, kw_only=True)
class SweepOptions:
    force: bool = False
    prune: bool = True
    skip_predicted_oom: bool = False
    shard: str = ""  # "i/N" when this process runs one slice of the sweep
    isolation: Literal["fork", "spawn"] = "fork"
    system_metrics: bool = True
    live: bool = False  # a progress bar (a terminal) instead of plain lines only
    devices: Request | None = None  # --devices: trials side by side, each on its own slots
    remeasure_unsettled: bool = False  # an ok trial tagged unstable is not done: measure it again
    again: frozenset[str] = frozenset()  # trial ids measured again even where recorded (--profile)


def run_sweep(
    doc: SpecDocument,
    trials: list[Trial],
    recorder: SweepRecorder,
    workdir: Path,
    options: SweepOptions = SweepOptions(),
    echo: Callable[[str], None] = print,
    server: ForkServer | None = None,
    on_spawn: Callable[[Trial, int], None] | None = None,
) -> SweepReport:
    """Measure every trial and record it; see the module docstring. Raises TrackingError when the store is
    unusable at the start, WorkdirError when the workdir cannot be written, Interrupted on SIGTERM/SIGINT.
    With isolation fork, `server` is a fork server the caller started early (one is started if not)."""
    if server is None and options.isolation == "fork":
        server = ForkServer()
    if server is not None:
        server.start()  # its imports overlap with opening the sweep in MLflow
    try:
        return Sweep(doc, trials, recorder, workdir, echo, on_spawn, options, server).run()
    finally:
        if server is not None:
            with signals_ignored():  # a Ctrl-C here would land after the sweep closed, and say otherwise
                server.close()


class Sweep:
    """One `dinox run`: opens the sweep, then for each trial resolves its batch, measures it and records it,
    then closes the sweep. Every result reaches the journal before MLflow; a failure of the store never
    stops the sweep, a failure of the workdir (where trials write their results) does, cleanly."""

    def __init__(
        self,
        doc: SpecDocument,
        trials: list[Trial],
        recorder: SweepRecorder,
        workdir: Path,
        echo: Callable[[str], None],
        on_spawn: Callable[[Trial, int], None] | None,
        options: SweepOptions,
        server: ForkServer | None,
    ):
        self.doc, self.trials, self.recorder, self.workdir = doc, trials, recorder, workdir
        self.progress = Progress(len(trials), echo, options.live)
        self.echo, self.options, self.server = self.progress.line, options, server
        self.t0 = time.time()
        self.name = trials[0].spec.name
        self.flights = Flights(on_spawn)
        # Everything the sweep holds, from the start: the phases below fill it in as the sweep opens (the
        # store, the estimates, the parent run, the workdir), and a sweep stopped in any phase ends cleanly.
        self.report = SweepReport("", "", Path())
        self.recorded: list[TrialRecord] = []  # what the store holds of this experiment already
        self.done: dict[str, TrialRecord] = {}  # trial id -> its final record: not measured again
        self.estimate_dir = workdir / "tmp" / f"estimate-{os.getpid()}"
        self.estimates = Estimates.parse(None, "not estimated yet")
        self.lanes: Lanes | None = None
        self.parent = ""  # the parent run, once opened
        self.journal: Journal | None = None  # once the workdir is there
        self.store = BestEffortStore(recorder, None, self.echo, self.report)
        self.csv_path = Path()
        self.pruner = Pruner()
        self.book: TrialBook | None = None  # where each trial is recorded, once the workdir is there
        self.lane = Lane((), server)  # where trials run one at a time (the one slot of --devices, if given)
        self.first: drift.First | None = None  # the first trial measured ok here: the drift check's
        self.measured_ok = 0  # trials measured ok by this sweep (not resumed)

    # --- the whole sweep ----------------------------------------------------------------------------

    def run(self) -> SweepReport:
        try:
            return self._run()
        finally:
            with signals_ignored():
                self.progress.close()

    def _run(self) -> SweepReport:
        self._setup_store()  # a store down at the start: TrackingError, nothing has run
        if self._nothing_left():
            return self.report
        if self.server is not None and len({t.spec.batch.size for t in self.trials}) > 1:
            # The fork server still imports torch: free here, not at the end. A picture never costs the sweep:
            # an import that fails here fails again at the plot, which says so in a warning line.
            with contextlib.suppress(Exception):
                throughput_figure.import_plotting()
        self._setup_estimates()  # a device the machine lacks: DeviceMissing, no run opened
        self._setup_lanes()
        self._setup_parent()
        # Around the trials' block, a signal is noted, not raised: one that lands after the block hands the default
        # handler back, and before the close takes over, would raise KeyboardInterrupt past this method, and the
        # command would say nothing was recorded (seen once in CI, a Ctrl-C the moment the last trial's line was
        # out). The close honours it instead.
        gap: list[str] = []
        with signals_noted(gap):
            try:
                with signals_raise():
                    self._setup_workdir()
                    self._warn_before_trials()
                    self._setup_resume()
                    self._trials()
                    self._drift_check()
            except (KeyboardInterrupt, Interrupted) as e:
                why = str(e) if isinstance(e, Interrupted) else "interrupted by SIGINT"
                if self._all_recorded():  # after the last trial's record: the sweep is closing, not stopped
                    end.finish(self, stopped=why)
                raise SweepStopped(why, end.abort(self, "KILLED", why), self.recorder.adopted) from None
            except WorkdirError as e:
                e.killed = end.abort(self, "FAILED", f"the sweep stopped: {e}")  # type: ignore[attr-defined]
                raise
            end.finish(self, noted=gap)
        if self.doc.sweep.ladder and not self.doc.sweep.grid:
            for line in ladder_lines(self.doc.sweep.ladder, self.report.rows, self.report.drift_gap):
                self.echo(line)
        return self.report

    def _setup_store(self) -> None:
        o = self.options
        self.recorder.connect(self.name)
        for note in self.recorder.notes:
            self.echo(f"note: {note}")
        self.report.experiment_id = self.recorder.experiment_id
        self._close_orphans()
        self.recorded = [] if o.force and not o.prune else self.recorder.recorded_trials()
        self.done = {} if o.force else {r.tags[rec.TRIAL_ID]: r for r in self.recorded if self._final(r)}

    def _all_recorded(self) -> bool:
        """Every trial has its result recorded (or was recorded before) and none is in flight."""
        done = len(self.report.rows) + len(self.report.resumed)
        return self.journal is not None and done >= len(self.trials) and not any(True for _ in self.flights)

    def _final(self, record: TrialRecord) -> bool:
        """Recorded for good: ok, oom or skipped; an unsettled ok one (windows that disagreed, or too few to show
        a spread) only while not asked to measure it again."""
        unsettled = record.unsettled
        if record.tags[rec.TRIAL_ID] in self.options.again:
            return False
        return record.status in FINAL and not (unsettled and self.options.remeasure_unsettled)

    def _nothing_left(self) -> bool:
        """Every trial already recorded: say so and open no parent run (an empty one would top the runs table).
        Under `mlflow run` the parent exists already and is closed as usual."""
        if self.recorder.parent_run_id or any(t.trial_id not in self.done for t in self.trials):
            return False
        self.report.resumed = [(t, self.done[t.trial_id].status) for t in self.trials]
        for t in self.trials:
            self._echo_recorded(t)
        counts = Counter(status for _t, status in self.report.resumed)
        shaky = self.report.resumed_unsettled
        self.echo(
            f"dinox: nothing left to measure: all {len(self.trials)} trials of {self.name!r} are recorded in "
            f"experiment {self.recorder.experiment_id} ({', '.join(f'{n} {k}' for k, n in counts.items())}"
            f"{f', {shaky} of the ok ones unsettled' if shaky else ''}); --force measures them again"
            + (", --remeasure-unsettled the unsettled ones" if shaky else "")
        )
        return True

    def _setup_parent(self) -> None:
        o = self.options
        self.parent = self.recorder.open_sweep(
            self.name, self.doc.path, len(self.trials), o.shard, shrunk=bool(self.trials[0].spec.shrunk)
        )
        self.report.parent_run_id = self.parent

    def _close_orphans(self) -> None:
        """Earlier sweeps of this experiment whose process is gone (SIGKILL) are closed: their journal synced
        when it is on this host, else their RUNNING runs marked KILLED."""
        from dinox.store.sync import close_orphans

        for note in close_orphans(self.recorder):
            self.echo(f"note: {note}")

    def _setup_workdir(self) -> None:
        sweep_dir = self.workdir / "sweeps" / self.name / f"{time.strftime('%Y%m%d-%H%M%S')}-{self.parent[:8]}"
        self.report.sweep_dir = sweep_dir
        write_sweep_files(sweep_dir, self.doc.text, self.trials)
        if self.estimate_dir.exists():
            os.replace(self.estimate_dir, sweep_dir / "estimate")
            with contextlib.suppress(OSError):
                self.estimate_dir.parent.rmdir()  # the tmp folder, once no other sweep uses it
        configure_client(sweep_dir / "store.log")  # the store libraries' own tracebacks go there, not here
        self.journal = journal = Journal(sweep_dir)
        # The journal names the store as shown: a password is never written to disk (sync asks for it).
        shown, me = shown_uri(self.recorder.uri), ProcessRef.me().tags()
        journal.sweep(shown, self.recorder.experiment_id, self.parent, self.name, me)
        self.store = BestEffortStore(self.recorder, journal, self.echo, self.report)
        self.store.call(self.recorder.tag_sweep_dir, sweep_dir)
        self.csv_path = sweep_dir / "results.csv"
        self.book = TrialBook(
            self.recorder, journal, self.store, self.report, self.csv_path, self.pruner, self.estimates
        )
        n, exp, uri = len(self.trials), self.recorder.experiment_id, shown_uri(self.recorder.uri)
        self.echo(
            f"dinox: {n} trial{'s' if n != 1 else ''} of {self.name!r} -> {uri} (experiment {exp}, "
            f"parent run {self.parent}); local results in {sweep_dir}"
        )

    def _setup_estimates(self) -> None:
        """Parameters, FLOPs and memory of every model, on the meta device, in a child of its own, which also
        says which devices this machine has: a spec that asks for one it lacks stops here."""
        request = Estimates.request([t.spec for t in self.trials])
        data, failure = runner.run_estimate(request, self.estimate_dir, self.server)
        self.estimates = Estimates.parse(data, failure)
        machine = self.estimates.machine
        missing = machine.missing({t.spec.hardware.device for t in self.trials}) if machine is not None else []
        if missing:
            shutil.rmtree(self.estimate_dir, ignore_errors=True)
            line = self.doc.line_of(("hardware", "device"))
            raise DeviceMissing(missing_message(self.doc.path, missing[0], machine.has, line))  # type: ignore[union-attr]

    def _setup_lanes(self) -> None:
        """--devices: the slots trials run on side by side; a machine that lacks them: DeviceMissing."""
        request = self.options.devices
        if request is None:
            return
        try:
            self.lanes = Lanes.resolve(request, self.estimates.machine, self.trials, self.server)
        except DevicesError as e:
            raise DeviceMissing(f"--devices: {e}") from None
        self.echo(f"dinox: {self.lanes.describe()}")

    def _warn_before_trials(self) -> None:
        busy = contention.notice(os.environ)
        if busy:
            self.echo(busy)
        if self.estimates.machine is None:
            why = self.estimates.why_missing(self.trials[0].spec)
            self.echo(f"warning: no memory or FLOPs estimates ({why}); measuring anyway")
            return
        for line in self.estimates.slow_steps(self.trials):
            self.echo(line)
        over = self.estimates.predicted_ooms(self.trials)
        if over and not self.options.skip_predicted_oom:
            self.echo(
                f"note: {len(over)} trial(s) predicted to run out of memory ({', '.join(t.label for t in over[:3])}"
                f"{', ...' if len(over) > 3 else ''}; `dinox plan` shows why); measuring them anyway, "
                "--skip-predicted-oom records them as skipped"
            )

    def _setup_resume(self) -> None:
        if self.options.prune:
            for r in self.recorded:
                self.pruner.observe(r.params, r.batch_size, r.status, r.run_id)

    # --- the trials, one at a time or side by side -----------------------------------------------------

    def _trials(self) -> None:
        lanes = self.lanes
        if lanes is None or len(lanes.slots) == 1:
            self.lane = lanes.lane(lanes.slots) if lanes else self.lane
            for trial in self.trials:
                self._one(trial, self.lane)
            return
        side_by_side(self.trials, lanes, self._slots_for, self._one, self.flights.stop)

    def _slots_for(self, trial: Trial) -> int:
        return 0 if trial.trial_id in self.done else trial.spec.hardware.gpus

    def _one(self, trial: Trial, lane: Lane | None) -> None:
        with self.flights.lock:
            self.progress.phase(trial.label, "start-up")
            try:
                self._measure_or_resume(trial, lane or Lane())
            except Stopping:
                return
            self.progress.advance(trial.label)

    # --- one trial ------------------------------------------------------------------------------------

    def _alone(self) -> bool:
        """Trials run one at a time (no lanes side by side)."""
        return self.lanes is None or len(self.lanes.slots) == 1

    def _follow_the_box(self, trial: Trial) -> None:
        """Trials one at a time: the box read again before each (a neighbour may have come or gone since the
        last reading), and the fork server started again where the children's OpenMP policy must change.
        Side by side, the other lanes' trials are this sweep's own load: the first reading stands."""
        if not self._alone():
            return
        before = f"trial {trial.run_name}"
        line = self.server.follow_the_box(before) if self.server else contention.follow(os.environ, before)
        if line:
            self.echo(line)

    def _measure_or_resume(self, trial: Trial, lane: Lane) -> None:
        if trial.trial_id in self.done:
            self.report.resumed.append((trial, self.done[trial.trial_id].status))
            self._echo_recorded(trial)
            return
        self._follow_the_box(trial)
        search: BatchSearch | None = None
        failure: TrialResult | None = None
        if trial.spec.batch.auto:
            search, failure = self._search_batch(trial, lane)
            size = search.chosen()
            if size is not None and failure is None:
                trial = replace(trial, spec=trial.spec.with_batch(size))
        flight = self.flights.open(trial)  # after any batch search: probes are their own
        self.book.open(flight)
        if flight.run_id is not None and self.options.system_metrics:
            flight.monitor = self.recorder.watch(flight.run_id, lane.gpus_of(trial, self.estimates.machine))
        result, log_path, measured = self._measure(trial, search, failure, lane, flight)
        flight.stop_monitor()
        if self._alone():
            contention.trial_ended(os.environ)  # what the box did meanwhile: the next trial's reading
        if search is not None:
            search.annotate(result)
        self.book.record(flight, result, log_path)
        self.flights.done(flight)
        if measured:
            self.report.trial_loop_s.append(time.time() - flight.started)
        if measured and result.status == "ok":
            self.measured_ok += 1
            self.first = self.first or drift.First.of(trial, flight.result_id, flight.run_id, result)
        self.echo(describe(trial, result))

    def _drift_check(self) -> None:
        """The sweep's first ok trial measured again after its last (dinox.sweep.drift), where this sweep measured
        two or more trials ok, one at a time: side by side, the other lanes are this sweep's own load."""
        first = self.first
        if first is None or self.measured_ok < 2 or not self._alone() or not self.doc.sweep.drift_check:
            return
        self._follow_the_box(first.trial)
        self.progress.phase(first.trial.label, "drift check")
        check, why = drift.measure_again(first, self._trial_dir(first.trial, "-drift"), self.lane)
        if check is None:
            self.report.drift = f"drift check: none, {first.trial.run_name} measured again: {why}"
        else:
            self.book.drift_check(first.result_id, first.run_id, check)
            self.report.drift, self.report.drift_gap = drift.describe(first, check), drift.moved(first, check)
        self.echo(self.report.drift)

    def _echo_recorded(self, trial: Trial) -> None:
        prior = self.done[trial.trial_id]
        unsettled = prior.unsettled
        self.report.resumed_unsettled += unsettled
        again = "--remeasure-unsettled" if unsettled else "--force"
        why = "its timed windows disagreed" if prior.tags.get(rec.UNSTABLE) == "true" else "too few timed windows"
        self.echo(
            f"[{trial.index + 1}/{trial.total}] recorded {trial.label} | {prior.status}"
            f"{f' (unsettled: {why})' if unsettled else ''} in run {prior.run_id}; "
            f"{again} measures it again"
        )

    def _measure(
        self, trial: Trial, search: BatchSearch | None, failure: TrialResult | None, lane: Lane, flight: InFlight
    ) -> tuple[TrialResult, Path | None, bool]:
        """The trial's result, its log, and whether it was measured (not skipped or settled by its search)."""
        spec = trial.spec
        if search is not None and spec.batch.auto:
            return failure or search.nothing_fits(), None, False
        reason = self.pruner.reason(spec) if self.options.prune else None
        plan = self.estimates.memory(spec)
        if reason is None and self.options.skip_predicted_oom and plan is not None and plan.over:
            reason = f"predicted out of memory: {plan.over}; run without --skip-predicted-oom to measure it"
        if reason:
            return TrialResult("skipped", error=reason, marks={"result_written": time.time()}), None, False
        phase = self.flights.locked(lambda text: self.progress.phase(trial.label, text))
        self._hand_cost(trial)
        outcome = self.flights.run_child(self._trial_dir(trial), lane, flight, phase)
        outcome.result.tags.update(lane.tags(flight.concurrent))
        return outcome.result, outcome.log_path, True

    def _hand_cost(self, trial: Trial) -> None:
        """The plan's FLOPs per image beside the trial's files, for the child's TFLOP/s and MFU (or none)."""
        folder, cost = self._trial_dir(trial), self.estimates.cost(trial.spec)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if cost is None:
                (folder / COST_FILE).unlink(missing_ok=True)
            else:
                write_whole(folder / COST_FILE, json.dumps({"flops_per_image": cost.flops_per_image}))
        except OSError as e:
            raise WorkdirError(f"cannot write {folder}: {e.strerror or e}") from None

    def _trial_dir(self, trial: Trial, suffix: str = "") -> Path:
        return self.report.sweep_dir / "trials" / f"{trial.index:03d}-{trial.trial_id}{suffix}"

    # --- batch.size auto --------------------------------------------------------------------------------

    def _search_batch(self, trial: Trial, lane: Lane) -> tuple[BatchSearch, TrialResult | None]:
        """Probe batch sizes for a batch.size auto trial, each probe a process and a run of its own. Returns
        the search and, when a probe ended other than ok or oom, the result the trial gets instead."""
        search = BatchSearch.for_spec(trial.spec)
        self._bound_by_host(trial, search)
        while (size := search.next_size()) is not None:
            spec = probe_spec(trial.spec, size)
            overrides = {**trial.overrides, "batch.size": size}
            probe = Trial(trial.index, trial.total, overrides, spec, trial_id(spec), trial.locations, trial.sets)
            flight = self.flights.open(probe)
            self.book.open(flight, "probe")
            outcome = self.flights.run_child(self._trial_dir(trial, f"-probe{size}"), lane, flight, None, probe=True)
            r = outcome.result
            if flight.run_id is not None:
                flight.closed = self.store.call(self.recorder.close_trial, flight.run_id, probe, r, outcome.log_path)[0]
            self.flights.done(flight)
            self.pruner.observe(spec.flat_params(), size, r.status, flight.run_id or "")
            self.echo(
                f"[{trial.index + 1}/{trial.total}] probe    batch={size:<5} {r.status}"
                + (f" | {r.error[:160]}" if r.status not in ("ok", "oom") else "")
            )
            if r.status not in ("ok", "oom") and not killed_for_memory(r, search):
                failure = TrialResult(
                    r.status, error=one_line(f"batch.size auto: the probe at batch {size} ended {r.status}: {r.error}")
                )
                return search, failure
            search.record(size, r.status == "ok")
        return search, None

    def _bound_by_host(self, trial: Trial, search: BatchSearch) -> None:
        if note := search.bound_by_host(trial.spec, self.estimates):
            self.echo(f"[{trial.index + 1}/{trial.total}] {note}")

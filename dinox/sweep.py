"""Orchestrate one sweep: trials -> child processes -> results -> MLflow, with a local journal first.

This module only sequences the others. Every result goes to the sweep's journal (results.jsonl) and
results.csv the moment it is known; MLflow comes second. When the tracking store fails mid-sweep, the
sweep goes on, says so, and ``dinox sync`` logs what is missing once the store is back. Trials the
experiment already holds with a final status are skipped (resume), and larger batches of a configuration
that ran out of memory are recorded as skipped without running (pruning).
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from dinox import footprint, runner, sweep_summary
from dinox.autobatch import BatchSearch
from dinox.device_check import missing_message
from dinox.footprint import Estimates
from dinox.forkserver import ForkServer
from dinox.grid import Trial, trial_id
from dinox.journal import Journal, WorkdirError, new_result_id
from dinox.lifeline import ProcessRef
from dinox.progress import Progress
from dinox.prune import Pruner
from dinox.result import TrialResult, one_line
from dinox.spec import TrialSpec
from dinox.spec_file import SpecDocument
from dinox.store import configure_client
from dinox.tracking import SweepRecorder, result_summary

FINAL = ("ok", "oom", "skipped")  # statuses a resumed sweep does not measure again
CSV_LEAD = [
    "index",
    "trial_id",
    "run_id",
    "label",
    "status",
    "bound",
    "images_per_s",
    "step_s_p50",
    "step_s_p90",
    "data_s",
    "h2d_s",
    "compute_s",
    "loader_cost",
    "transfer_cost",
    "loader_images_per_s",
    "device_idle_share",
    "peak_mem_allocated_gb",
    "peak_mem_reserved_gb",
    "device_mem_total_gb",
    "host_peak_rss_gb",
    "params_m",
    "error",
]


class DeviceMissing(ValueError):
    """The spec asks for a device kind this machine does not have: bad input, refused before any run."""


class Interrupted(BaseException):
    """SIGTERM / SIGINT. A BaseException, like KeyboardInterrupt, so no `except Exception` swallows it."""

    def __init__(self, signame: str):
        super().__init__(f"interrupted by {signame}")
        self.signame = signame


@dataclass
class SweepReport:
    parent_run_id: str
    experiment_id: str
    sweep_dir: Path
    rows: list[dict[str, object]] = field(default_factory=list)
    results: list[TrialResult] = field(default_factory=list)
    resumed: list[tuple[Trial, str]] = field(default_factory=list)  # (trial, its recorded status)
    store_failures: int = 0
    # Parent-side seconds per measured trial, from opening its run to closing it.
    trial_loop_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    def timeline(self) -> dict[str, float]:
        """Mean seconds per trial by phase; `overhead_s` is what is neither data setup, model build nor steps."""
        measured = [r for r in self.results if "trial_wall_s" in r.metrics]
        n = len(measured)
        if not n:
            return {}
        mean = {
            k: sum(r.metrics.get(k, 0.0) for r in measured) / n
            for k in ("startup_s", "setup_s", "data_setup_s", "build_s", "measure_s", "teardown_s", "trial_wall_s")
        }
        loop = sum(self.trial_loop_s) / len(self.trial_loop_s) if self.trial_loop_s else mean["trial_wall_s"]
        mean["recording_s"] = loop - mean["trial_wall_s"]
        mean["per_trial_s"] = loop
        mean["overhead_s"] = loop - mean["data_setup_s"] - mean["build_s"] - mean["measure_s"]
        return mean


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM (and SIGINT) raise Interrupted in the main thread, so cleanup runs as for Ctrl-C."""

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class _Store:
    """MLflow, best effort: a failed call is reported once per outage and the sweep goes on."""

    def __init__(
        self, recorder: SweepRecorder, journal: Journal | None, echo: Callable[[str], None], report: SweepReport
    ):
        self.recorder, self.journal, self.echo, self.report = recorder, journal, echo, report
        self.down = False

    def call(self, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        try:
            value = fn(*args)
        except Exception as e:  # noqa: BLE001 - any failure of the store: the result is in the journal
            self.report.store_failures += 1
            if not self.down:
                kept = (
                    (
                        f"results stay in {self.journal.path}; run `dinox sync {self.journal.path.parent}` once it "
                        f"is back"
                    )
                    if self.journal is not None
                    else "nothing was measured yet"
                )
                self.echo(f"warning: tracking store {self.recorder.uri} failed ({self.recorder.explain(e)}); {kept}")
            self.down = True
            return False, None
        if self.down:
            self.echo(f"note: tracking store {self.recorder.uri} answers again")
        self.down = False
        return True, value


def _row(trial: Trial, run_id: str, r: TrialResult) -> dict[str, object]:
    row: dict[str, object] = {
        "index": trial.index,
        "trial_id": trial.trial_id,
        "run_id": run_id,
        "label": trial.label,
        "status": r.status,
        "bound": r.bound,
        "error": r.error,
    }
    row.update({k: round(v, 6) for k, v in r.metrics.items()})
    row.update(trial.spec.flat_params())
    return row


def write_csv(path: Path, rows: list[dict[str, object]]) -> None:
    extra = sorted({k for row in rows for k in row} - set(CSV_LEAD))
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_LEAD + extra)
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


def describe(trial: Trial, r: TrialResult) -> str:
    m = r.metrics
    head = f"[{trial.index + 1:>{len(str(trial.total))}}/{trial.total}] {r.status:<8} {trial.label}"
    if "batch_auto_fit" in m and not trial.spec.batch.auto:
        head += f" (batch.size auto -> {trial.spec.size}: {int(m['batch_auto_fit'])} fit, less the margin)"
    return f"{head} | {sweep_summary.trial_body(r.status, r.bound, m, r.error)}"


@dataclass(frozen=True)
class SweepOptions:
    force: bool = False
    prune: bool = True
    skip_predicted_oom: bool = False
    shard: str = ""  # "i/N" when this process runs one slice of the sweep
    isolation: str = "fork"
    system_metrics: bool = True
    live: bool = False  # a progress bar (a terminal) instead of plain lines only


def run_sweep(
    doc: SpecDocument,
    trials: list[Trial],
    *,
    recorder: SweepRecorder,
    workdir: Path,
    echo: Callable[[str], None] = print,
    on_spawn: Callable[[Trial, int], None] | None = None,
    force: bool = False,
    prune: bool = True,
    isolation: str = "fork",
    skip_predicted_oom: bool = False,
    shard: str = "",
    server: ForkServer | None = None,
    system_metrics: bool = True,
    live: bool = False,
) -> SweepReport:
    """Measure every trial and record it; see the module docstring. Raises TrackingError when the store is
    unusable at the start, WorkdirError when the workdir cannot be written, Interrupted on SIGTERM/SIGINT.
    With isolation fork, `server` is a fork server the caller started early (one is started if not)."""
    options = SweepOptions(force, prune, skip_predicted_oom, shard, isolation, system_metrics, live)
    if server is None and isolation == "fork":
        server = ForkServer()
    if server is not None:
        server.start()  # its imports overlap with opening the sweep in MLflow
    try:
        return Sweep(doc, trials, recorder, workdir, echo, on_spawn, options, server).run()
    finally:
        if server is not None:
            server.close()


def _probe_spec(spec: TrialSpec, size: int) -> TrialSpec:
    """A probe: the trial at one physical batch, no accumulation, two optimizer steps (the second holds the
    optimizer state and fresh gradients at once: the steady-state peak)."""
    batch = spec.batch.model_copy(update={"size": size, "effective": None, "accumulation": None})
    measure = spec.measure.model_copy(update={"warmup_steps": 1, "bench_steps": 1, "repeats": 1})
    return spec.model_copy(update={"batch": batch, "measure": measure})


def _annotate(result: TrialResult, spec: TrialSpec, estimates: Estimates, plan: footprint.MemoryPlan | None) -> None:
    """The memory plan next to the measured peaks, and TFLOPs / MFU from the model's FLOPs per image."""
    if plan is not None:
        result.metrics.update(plan.metrics())
        if plan.over:
            result.tags["dinox.predicted_oom"] = plan.over
    cost = estimates.cost(spec)
    if cost is not None and result.status == "ok" and "images_per_s" in result.metrics:
        metrics, tags = footprint.compute_metrics(
            cost,
            result.metrics["images_per_s"],
            result.tags.get("dinox.device_name", ""),
            spec.precision,
            spec.hardware.peak_tflops,
            spec.hardware.gpus,
        )
        result.metrics.update(metrics)
        result.tags.update(tags)


@dataclass
class _InFlight:
    """The trial being measured: what an interrupt or a failure must close."""

    trial: Trial
    result_id: str
    run_id: str | None = None
    closed: bool = False  # its result is in the store: nothing left to kill
    started: float = field(default_factory=time.time)
    monitor: Any = None  # its system metrics, sampled while it runs

    def stop_monitor(self) -> None:
        if self.monitor is not None:
            with contextlib.suppress(Exception):  # the store may be failing: the result matters, not these
                self.monitor.finish()
            self.monitor = None


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
        self.echo, self.on_spawn, self.options, self.server = self.progress.line, on_spawn, options, server
        self.t0 = time.time()
        self.name = trials[0].spec.name
        self.in_flight: _InFlight | None = None

    # --- the whole sweep ----------------------------------------------------------------------------

    def run(self) -> SweepReport:
        try:
            return self._run()
        finally:
            self.progress.close()

    def _run(self) -> SweepReport:
        self._setup_store()  # a store down at the start: TrackingError, nothing has run
        if self._nothing_left():
            return self.report
        self._setup_estimates()  # a device the machine lacks: DeviceMissing, no run opened
        self._setup_parent()
        try:
            with _signals_raise():
                self._setup_workdir()
                self._warn_without_estimates()
                self._setup_resume()
                for trial in self.trials:
                    self._one(trial)
        except (KeyboardInterrupt, Interrupted) as e:
            self._abort("KILLED", str(e) if isinstance(e, Interrupted) else "interrupted by SIGINT")
            raise
        except WorkdirError as e:
            self._abort("FAILED", f"the sweep stopped: {e}")
            raise
        self._finish()
        return self.report

    def _setup_store(self) -> None:
        o = self.options
        self.recorder.connect(self.name)
        for note in self.recorder.notes:
            self.echo(f"note: {note}")
        self.report = SweepReport("", self.recorder.experiment_id, Path())
        self._close_orphans()
        self.recorded = [] if o.force and not o.prune else self.recorder.recorded_trials()
        self.done = {} if o.force else {r.tags["dinox.trial_id"]: r for r in self.recorded if r.status in FINAL}

    def _nothing_left(self) -> bool:
        """Every trial already recorded: say so and open no parent run (an empty one would top the runs table).
        Under `mlflow run` the parent exists already and is closed as usual."""
        if self.recorder.parent_run_id or any(t.trial_id not in self.done for t in self.trials):
            return False
        self.report.resumed = [(t, self.done[t.trial_id].status) for t in self.trials]
        for t in self.trials:
            self._echo_recorded(t)
        counts = Counter(status for _t, status in self.report.resumed)
        self.echo(
            f"dinox: nothing left to measure: all {len(self.trials)} trials of {self.name!r} are recorded in "
            f"experiment {self.recorder.experiment_id} ({', '.join(f'{n} {k}' for k, n in counts.items())}); "
            "--force measures them again"
        )
        return True

    def _setup_parent(self) -> None:
        o = self.options
        self.parent = self.recorder.open_sweep(self.name, self.doc.path, len(self.trials), o.shard)
        self.report.parent_run_id = self.parent

    def _close_orphans(self) -> None:
        """Earlier sweeps of this experiment whose process is gone (SIGKILL) are closed: their journal synced
        when it is on this host, else their RUNNING runs marked KILLED."""
        from dinox.sync import close_orphans

        for note in close_orphans(self.recorder):
            self.echo(f"note: {note}")

    def _setup_workdir(self) -> None:
        sweep_dir = self.workdir / "sweeps" / self.name / f"{time.strftime('%Y%m%d-%H%M%S')}-{self.parent[:8]}"
        self.report.sweep_dir = sweep_dir
        normalized = [
            {
                "index": t.index,
                "trial_id": t.trial_id,
                "sweep_values": t.overrides,
                "spec": t.spec.model_dump(mode="json"),
            }
            for t in self.trials
        ]
        try:
            sweep_dir.mkdir(parents=True, exist_ok=True)
            (sweep_dir / "spec.yaml").write_text(self.doc.text)
            (sweep_dir / "spec.normalized.yaml").write_text(yaml.safe_dump(normalized, sort_keys=False))
        except OSError as e:
            raise WorkdirError(e.errno, f"cannot write {sweep_dir}: {e.strerror or e}") from e
        if self.estimate_dir.exists():
            os.replace(self.estimate_dir, sweep_dir / "estimate")
            with contextlib.suppress(OSError):
                self.estimate_dir.parent.rmdir()  # the tmp folder, once no other sweep uses it
        configure_client(sweep_dir / "store.log")  # the store libraries' own tracebacks go there, not here
        self.journal = Journal(sweep_dir)
        self.journal.sweep(
            self.recorder.uri, self.recorder.experiment_id, self.parent, self.name, ProcessRef.me().tags()
        )
        self.store = _Store(self.recorder, self.journal, self.echo, self.report)
        self.store.call(self.recorder.tag_sweep_dir, sweep_dir)
        self.csv_path = sweep_dir / "results.csv"
        n, exp = len(self.trials), self.recorder.experiment_id
        self.echo(
            f"dinox: {n} trial{'s' if n != 1 else ''} of {self.name!r} -> {self.recorder.uri} (experiment {exp}, "
            f"parent run {self.parent}); local results in {sweep_dir}"
        )

    def _setup_estimates(self) -> None:
        """Parameters, FLOPs and memory of every model, on the meta device, in a child of its own, which also
        says which devices this machine has: a spec that asks for one it lacks stops here."""
        request = Estimates.request([t.spec for t in self.trials])
        self.estimate_dir = self.workdir / "tmp" / f"estimate-{os.getpid()}"
        data, failure = runner.run_estimate(request, self.estimate_dir, self.server)
        self.estimates = Estimates.parse(data, failure)
        machine = self.estimates.machine
        missing = machine.missing({t.spec.hardware.device for t in self.trials}) if machine is not None else []
        if missing:
            shutil.rmtree(self.estimate_dir, ignore_errors=True)
            raise DeviceMissing(missing_message(self.doc.path, missing[0], machine.has))  # type: ignore[union-attr]

    def _warn_without_estimates(self) -> None:
        if self.estimates.machine is None:
            why = self.estimates.why_missing(self.trials[0].spec)
            self.echo(f"warning: no memory or FLOPs estimates ({why}); measuring anyway")

    def _setup_resume(self) -> None:
        self.pruner = Pruner()
        if self.options.prune:
            for r in self.recorded:
                self.pruner.observe(r.params, r.batch_size, r.status, r.run_id)

    def _finish(self) -> None:
        self._journal_quietly(lambda: self.journal.sweep_end("FINISHED"))
        d = self.report.sweep_dir
        artifacts = [self.csv_path, d / "spec.yaml", d / "spec.normalized.yaml"]
        try:
            plot = sweep_summary.throughput_plot(self.report.rows, d / "throughput_vs_batch.png")
        except Exception as e:  # noqa: BLE001 - a picture never costs the sweep its record
            plot = None
            self.echo(f"warning: no throughput plot for the parent run ({one_line(str(e), 200)})")
        rows, summary = self.report.rows, result_summary(self.report.results)
        note = sweep_summary.sweep_note(self.name, rows, len(self.report.resumed))
        extra = {"note": note, "metrics": sweep_summary.sweep_metrics(rows)}
        if self.store.call(
            self.recorder.close_sweep, "FINISHED", summary, [*artifacts, *([plot] if plot else [])], "", extra
        )[0]:
            self.journal.sweep_closed()
        self.report.wall_s = time.time() - self.t0

    def _abort(self, status: str, reason: str) -> None:
        """Close what is open, so nothing stays RUNNING. Further signals wait until that is done: a second
        Ctrl-C must not leave runs RUNNING."""
        old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            journal = getattr(self, "journal", None)
            store = getattr(self, "store", None) or _Store(self.recorder, journal, self.echo, self.report)
            if journal is not None:
                self._journal_quietly(lambda: journal.sweep_end(status))
            flight = self.in_flight
            if flight is not None:
                flight.stop_monitor()
            if flight is not None and flight.run_id and not flight.closed:
                store.call(self.recorder.kill_trial, flight.run_id, reason)
            summary = result_summary(self.report.results)
            sweep_dir = self.report.sweep_dir
            artifacts = [sweep_dir / "results.csv", sweep_dir / "spec.yaml"] if journal is not None else []
            if store.call(self.recorder.close_sweep, status, summary, artifacts, reason)[0] and journal is not None:
                self._journal_quietly(journal.sweep_closed)
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    @staticmethod
    def _journal_quietly(write: Callable[[], None]) -> None:
        # At the end of a sweep (or after the workdir failed) a journal line that cannot be written only
        # means `dinox sync` closes the parent run later.
        with contextlib.suppress(WorkdirError):
            write()

    # --- one trial ------------------------------------------------------------------------------------

    def _one(self, trial: Trial) -> None:
        self.progress.phase(trial.label, "start-up")
        self._measure_or_resume(trial)
        self.progress.advance()

    def _measure_or_resume(self, trial: Trial) -> None:
        if trial.trial_id in self.done:
            self.report.resumed.append((trial, self.done[trial.trial_id].status))
            self._echo_recorded(trial)
            return
        search: BatchSearch | None = None
        failure: TrialResult | None = None
        if trial.spec.batch.auto:
            search, failure = self._search_batch(trial)
            size = search.chosen()
            if size is not None and failure is None:
                trial = replace(trial, spec=trial.spec.with_batch(size))
        flight = self.in_flight = _InFlight(trial, new_result_id())  # after any batch search: probes are their own
        self._open_run(flight)
        if flight.run_id is not None and self.options.system_metrics:
            flight.monitor = self.recorder.watch(flight.run_id)
        result, log_path, measured = self._measure(trial, search, failure)
        flight.stop_monitor()
        if search is not None:
            result.tags["dinox.batch_auto_probes"] = search.describe()
            result.metrics["batch_auto_probes"] = float(len(search.probes))
            if search.fit is not None:
                result.metrics["batch_auto_fit"] = float(search.fit)
        self._record(flight, result, log_path)
        self.in_flight = None
        if measured:
            self.report.trial_loop_s.append(time.time() - flight.started)
        self.echo(describe(trial, result))

    def _echo_recorded(self, trial: Trial) -> None:
        prior = self.done[trial.trial_id]
        self.echo(
            f"[{trial.index + 1}/{trial.total}] recorded {trial.label} | {prior.status} in run "
            f"{prior.run_id}; --force measures it again"
        )

    def _open_run(self, flight: _InFlight, role: str = "trial") -> None:
        """The trial's run, opened once: its id goes to the journal at once, so a store failure later never
        leads to a second run for the same result."""
        _ok, flight.run_id = self.store.call(self.recorder.open_trial, flight.trial, flight.result_id, role)
        if flight.run_id is not None:
            self.journal.opened(flight.result_id, flight.run_id)
            self.store.call(self.recorder.log_params, flight.run_id, flight.trial)

    def _measure(
        self, trial: Trial, search: BatchSearch | None, failure: TrialResult | None
    ) -> tuple[TrialResult, Path | None, bool]:
        """The trial's result, its log, and whether it was measured (not skipped or settled by its search)."""
        spec = trial.spec
        if search is not None and spec.batch.auto:
            result = failure or TrialResult(
                "oom", error=f"batch.size auto: not even batch.auto_min={search.low} fits (probes {search.describe()})"
            )
            return result, None, False
        reason = self.pruner.reason(spec) if self.options.prune else None
        plan = self.estimates.memory(spec)
        if reason is None and self.options.skip_predicted_oom and plan is not None and plan.over:
            reason = f"predicted out of memory: {plan.over}; run without --skip-predicted-oom to measure it"
        if reason:
            return TrialResult("skipped", error=reason, marks={"result_written": time.time()}), None, False
        spawn = (lambda pid, t=trial: self.on_spawn(t, pid)) if self.on_spawn else None
        outcome = runner.run_trial(
            trial,
            self._trial_dir(trial),
            spawn,
            server=self.server,
            on_phase=lambda text: self.progress.phase(trial.label, text),
        )
        return outcome.result, outcome.log_path, True

    def _trial_dir(self, trial: Trial, suffix: str = "") -> Path:
        return self.report.sweep_dir / "trials" / f"{trial.index:03d}-{trial.trial_id}{suffix}"

    def _record(self, flight: _InFlight, result: TrialResult, log_path: Path | None) -> None:
        """Journal first, then MLflow (confirmed by reading it back), then the CSV."""
        trial = flight.trial
        _annotate(
            result, trial.spec, self.estimates, None if trial.spec.batch.auto else self.estimates.memory(trial.spec)
        )
        try:
            self.journal.result(flight.result_id, trial, result, flight.run_id, str(log_path or ""))
        except WorkdirError:
            # Nowhere to keep it locally. A result the child wrote still goes to the store; a crash or a
            # timeout the parent inferred may be the full disk's doing, so that run is KILLED instead.
            if result.status not in ("crashed", "timeout"):
                self._log(flight, result, log_path, journal=False)
            raise
        result.tags[sweep_summary.NOTE_TAG] = sweep_summary.trial_note(
            trial.label, result.status, result.bound, result.metrics, result.error
        )
        self._log(flight, result, log_path, journal=True)
        self.report.rows.append(_row(trial, flight.run_id or "", result))
        self.report.results.append(result)
        try:
            write_csv(self.csv_path, self.report.rows)
        except OSError as e:
            raise WorkdirError(e.errno, f"cannot write {self.csv_path}: {e.strerror or e}") from e
        if not trial.spec.batch.auto:
            self.pruner.observe(trial.spec.flat_params(), trial.spec.size, result.status, flight.run_id or "")

    def _log(self, flight: _InFlight, result: TrialResult, log_path: Path | None, journal: bool) -> None:
        if flight.run_id is None:  # opening failed: the store may hold the run anyway; never open a second
            _ok, flight.run_id = self.store.call(self.recorder.run_for, flight.trial, flight.result_id, None)
        if flight.run_id is None:
            return
        logged, _ = self.store.call(self.recorder.close_trial, flight.run_id, flight.trial, result, log_path)
        if logged:
            flight.closed = True
            if journal:
                self.journal.logged(flight.result_id, flight.run_id)

    # --- batch.size auto --------------------------------------------------------------------------------

    def _search_batch(self, trial: Trial) -> tuple[BatchSearch, TrialResult | None]:
        """Probe batch sizes for a batch.size auto trial, each probe a process and a run of its own. Returns
        the search and, when a probe ended other than ok or oom, the result the trial gets instead."""
        search = BatchSearch.for_spec(trial.spec)
        while (size := search.next_size()) is not None:
            spec = _probe_spec(trial.spec, size)
            probe = Trial(
                trial.index, trial.total, {**trial.overrides, "batch.size": size}, spec, trial_id(spec), trial.locations
            )
            flight = self.in_flight = _InFlight(probe, new_result_id())
            self._open_run(flight, "probe")
            outcome = runner.run_trial(probe, self._trial_dir(trial, f"-probe{size}"), server=self.server)
            r = outcome.result
            if flight.run_id is not None:
                flight.closed = self.store.call(self.recorder.close_trial, flight.run_id, probe, r, outcome.log_path)[0]
            self.in_flight = None
            self.pruner.observe(spec.flat_params(), size, r.status, flight.run_id or "")
            self.echo(
                f"[{trial.index + 1}/{trial.total}] probe    batch={size:<5} {r.status}"
                + (f" | {r.error[:160]}" if r.status not in ("ok", "oom") else "")
            )
            if r.status not in ("ok", "oom"):
                failure = TrialResult(
                    r.status, error=one_line(f"batch.size auto: the probe at batch {size} ended {r.status}: {r.error}")
                )
                return search, failure
            search.record(size, r.status == "ok")
        return search, None

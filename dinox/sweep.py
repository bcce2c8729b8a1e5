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
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from dinox import footprint, runner
from dinox.autobatch import BatchSearch
from dinox.footprint import Estimates
from dinox.forkserver import ForkServer
from dinox.grid import Trial, trial_id
from dinox.journal import Journal, new_result_id
from dinox.prune import Pruner
from dinox.result import TrialResult, one_line
from dinox.spec import SpecDocument, TrialSpec
from dinox.tracking import SweepRecorder, result_summary

FINAL = ("ok", "oom", "skipped")  # statuses a resumed sweep does not measure again
CSV_LEAD = [
    "index", "trial_id", "run_id", "label", "status", "bound", "images_per_s", "step_s_p50", "step_s_p90",
    "data_s", "h2d_s", "compute_s", "peak_mem_allocated_gb", "peak_mem_reserved_gb", "device_mem_total_gb",
    "host_peak_rss_gb", "params_m", "error",
]  # fmt: skip


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
        mean = {k: sum(r.metrics.get(k, 0.0) for r in measured) / n
                for k in ("startup_s", "setup_s", "data_setup_s", "build_s", "measure_s", "teardown_s",
                          "trial_wall_s")}  # fmt: skip
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

    def __init__(self, recorder: SweepRecorder, journal: Journal, echo: Callable[[str], None], report: SweepReport):
        self.recorder, self.journal, self.echo, self.report = recorder, journal, echo, report
        self.down = False

    def call(self, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        try:
            value = fn(*args)
        except Exception as e:  # noqa: BLE001 - any failure of the store: the result is in the journal
            self.report.store_failures += 1
            if not self.down:
                self.echo(f"warning: tracking store {self.recorder.uri} failed ({one_line(str(e), 200)}); "
                          f"results stay in {self.journal.path}; run `dinox sync {self.journal.path.parent}` "
                          f"once it is back")  # fmt: skip
            self.down = True
            return False, None
        if self.down:
            self.echo(f"note: tracking store {self.recorder.uri} answers again")
        self.down = False
        return True, value


def _row(trial: Trial, run_id: str, r: TrialResult) -> dict[str, object]:
    row: dict[str, object] = {
        "index": trial.index, "trial_id": trial.trial_id, "run_id": run_id, "label": trial.label,
        "status": r.status, "bound": r.bound, "error": r.error,
    }  # fmt: skip
    row.update({k: round(v, 6) for k, v in r.metrics.items()})
    row.update(trial.spec.flat_params())
    return row


def _search_batch(trial: Trial, sweep_dir: Path, store: _Store, recorder: SweepRecorder, pruner: Pruner,
                  server: ForkServer | None, echo: Callable[[str], None],
                  ) -> tuple[BatchSearch, TrialResult | None]:  # fmt: skip
    """Probe batch sizes for a batch.size auto trial, each probe a process and a run of its own. Returns the
    search and, when a probe ended other than ok or oom, the result the trial gets instead of a measurement."""
    search = BatchSearch.for_spec(trial.spec)
    while (size := search.next_size()) is not None:
        spec = _probe_spec(trial.spec, size)
        probe = Trial(trial.index, trial.total, {**trial.overrides, "batch.size": size}, spec, trial_id(spec),
                      trial.locations)  # fmt: skip
        _ok, run_id = store.call(recorder.open_trial, probe, new_result_id(), "probe")
        try:
            outcome = runner.run_trial(probe, sweep_dir / "trials" / f"{trial.index:03d}-{trial.trial_id}-probe"
                                       f"{size}", server=server)  # fmt: skip
        except (KeyboardInterrupt, Interrupted) as e:
            if run_id is not None:  # the probe's run must not stay RUNNING
                store.call(recorder.kill_trial, run_id, str(e) or "interrupted by SIGINT")
            raise
        r = outcome.result
        if run_id is not None:
            store.call(recorder.close_trial, run_id, r, outcome.log_path)
        pruner.observe(spec.flat_params(), size, r.status, run_id or "")
        echo(f"[{trial.index + 1}/{trial.total}] probe    batch={size:<5} {r.status}"
             + (f" | {r.error[:160]}" if r.status not in ("ok", "oom") else ""))  # fmt: skip
        if r.status not in ("ok", "oom"):
            failure = TrialResult(r.status, error=one_line(f"batch.size auto: the probe at batch {size} ended "
                                                           f"{r.status}: {r.error}"))  # fmt: skip
            return search, failure
        search.record(size, r.status == "ok")
    return search, None


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
    if r.status == "ok":
        return (
            f"{head} | {m['images_per_s']:.1f} img/s, step p50 {m['step_s_p50']:.3f}s p90 {m['step_s_p90']:.3f}s,"
            f" {r.bound}, peak {m.get('peak_mem_reserved_gb', 0):.2f} GB, trial {m.get('trial_wall_s', 0):.1f}s"
        )
    return f"{head} | {r.error[:200]}"


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
) -> SweepReport:
    t0 = time.time()
    server = ForkServer() if isolation == "fork" else None
    if server is not None:
        server.start()  # its imports overlap with opening the sweep in MLflow
    options = _Options(force, prune, skip_predicted_oom, shard)
    try:
        return _run_sweep(doc, trials, recorder, workdir, echo, on_spawn, options, server, t0)
    finally:
        if server is not None:
            server.close()


@dataclass(frozen=True)
class _Options:
    force: bool
    prune: bool
    skip_predicted_oom: bool
    shard: str  # "i/N" when this process runs one slice of the sweep


def _annotate(result: TrialResult, spec: TrialSpec, estimates: Estimates, plan: footprint.MemoryPlan | None) -> None:
    """The memory plan next to the measured peaks, and TFLOPs / MFU from the model's FLOPs per image."""
    if plan is not None:
        result.metrics.update(plan.metrics())
        if plan.over:
            result.tags["dinox.predicted_oom"] = plan.over
    cost = estimates.cost(spec)
    if cost is not None and result.status == "ok" and "images_per_s" in result.metrics:
        metrics, tags = footprint.compute_metrics(cost, result.metrics["images_per_s"],
                                                  result.tags.get("dinox.device_name", ""), spec.precision,
                                                  spec.hardware.peak_tflops, spec.hardware.gpus)  # fmt: skip
        result.metrics.update(metrics)
        result.tags.update(tags)


def _probe_spec(spec: TrialSpec, size: int) -> TrialSpec:
    """A probe: the trial at one physical batch, no accumulation, two optimizer steps (the second holds the
    optimizer state and fresh gradients at once: the steady-state peak)."""
    batch = spec.batch.model_copy(update={"size": size, "effective": None, "accumulation": None})
    measure = spec.measure.model_copy(update={"warmup_steps": 1, "bench_steps": 1, "repeats": 1})
    return spec.model_copy(update={"batch": batch, "measure": measure})


def _run_sweep(doc: SpecDocument, trials: list[Trial], recorder: SweepRecorder, workdir: Path,
               echo: Callable[[str], None], on_spawn: Callable[[Trial, int], None] | None, options: _Options,
               server: ForkServer | None, t0: float) -> SweepReport:  # fmt: skip
    force, prune = options.force, options.prune
    name = trials[0].spec.name
    parent = recorder.open_sweep(name, doc.path, len(trials), options.shard)  # a store down at the start: TrackingError
    for note in recorder.notes:
        echo(f"note: {note}")
    recorded = [] if force and not prune else recorder.recorded_trials()
    sweep_dir = workdir / "sweeps" / name / f"{time.strftime('%Y%m%d-%H%M%S')}-{parent[:8]}"
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / "spec.yaml").write_text(doc.text)
    normalized = [
        {"index": t.index, "trial_id": t.trial_id, "sweep_values": t.overrides, "spec": t.spec.model_dump(mode="json")}
        for t in trials
    ]
    (sweep_dir / "spec.normalized.yaml").write_text(yaml.safe_dump(normalized, sort_keys=False))
    journal = Journal(sweep_dir)
    journal.sweep(recorder.uri, recorder.experiment_id, parent, name)
    report = SweepReport(parent, recorder.experiment_id, sweep_dir)
    store = _Store(recorder, journal, echo, report)
    csv_path = sweep_dir / "results.csv"
    plural = "s" if len(trials) != 1 else ""
    echo(
        f"dinox: {len(trials)} trial{plural} of {name!r} -> {recorder.uri} (experiment {recorder.experiment_id}, "
        f"parent run {parent}); local results in {sweep_dir}"
    )

    # Parameters, FLOPs and memory of every model, on the meta device, in a child of its own.
    data, failure = runner.run_estimate(Estimates.request([t.spec for t in trials]), sweep_dir / "estimate", server)
    estimates = Estimates.parse(data, failure)
    if estimates.machine is None:
        echo(f"warning: no memory or FLOPs estimates ({estimates.why_missing(trials[0].spec)}); measuring anyway")

    done = {} if force else {r.tags["dinox.trial_id"]: r for r in recorded if r.status in FINAL}
    pruner = Pruner()
    if prune:
        for r in recorded:
            pruner.observe(r.params, r.batch_size, r.status, r.run_id)

    run_id: str | None = None
    try:
        with _signals_raise():
            for trial in trials:
                if trial.trial_id in done:
                    prior = done[trial.trial_id]
                    report.resumed.append((trial, prior.status))
                    echo(f"[{trial.index + 1}/{trial.total}] recorded {trial.label} | {prior.status} in run "
                         f"{prior.run_id}; --force measures it again")  # fmt: skip
                    continue
                search_failure: TrialResult | None = None
                search: BatchSearch | None = None
                if trial.spec.batch.auto:
                    search, search_failure = _search_batch(trial, sweep_dir, store, recorder, pruner, server, echo)
                    size = search.chosen()
                    if size is not None and search_failure is None:
                        trial = replace(trial, spec=trial.spec.with_batch(size))
                t_trial = time.time()  # after any batch search: its probes are trials' time of their own
                result_id = new_result_id()
                _ok, run_id = store.call(recorder.open_trial, trial, result_id)
                reason = pruner.reason(trial.spec) if prune else None
                plan = None if trial.spec.batch.auto else estimates.memory(trial.spec)
                if reason is None and options.skip_predicted_oom and plan is not None and plan.over:
                    reason = f"predicted out of memory: {plan.over}; run without --skip-predicted-oom to measure it"
                log_path: Path | None = None
                if search is not None and trial.spec.batch.auto:
                    result = search_failure or TrialResult(
                        "oom", error=f"batch.size auto: not even batch.auto_min={search.low} fits "
                                     f"(probes {search.describe()})")  # fmt: skip
                elif reason:
                    result = TrialResult("skipped", error=reason, marks={"result_written": time.time()})
                else:
                    spawn = (lambda pid, t=trial: on_spawn(t, pid)) if on_spawn else None
                    outcome = runner.run_trial(trial, sweep_dir / "trials" / f"{trial.index:03d}-{trial.trial_id}",
                                               spawn, server=server)  # fmt: skip
                    result, log_path = outcome.result, outcome.log_path
                if search is not None:
                    result.tags["dinox.batch_auto_probes"] = search.describe()
                    result.metrics["batch_auto_probes"] = float(len(search.probes))
                    if search.fit is not None:
                        result.metrics["batch_auto_fit"] = float(search.fit)
                _annotate(result, trial.spec, estimates, plan)
                journal.result(result_id, trial, result, run_id, str(log_path or ""))
                report.rows.append(_row(trial, run_id or "", result))
                report.results.append(result)
                write_csv(csv_path, report.rows)
                if run_id is None:
                    _ok, run_id = store.call(recorder.open_trial, trial, result_id)
                if run_id is not None and store.call(recorder.close_trial, run_id, result, log_path)[0]:
                    journal.logged(result_id, run_id)
                if not trial.spec.batch.auto:
                    pruner.observe(trial.spec.flat_params(), trial.spec.size, result.status, run_id or "")
                run_id = None
                if not reason:
                    report.trial_loop_s.append(time.time() - t_trial)
                echo(describe(trial, result))
    except (KeyboardInterrupt, Interrupted) as e:
        # Ignore further signals until the store says KILLED: a second Ctrl-C must not leave runs RUNNING.
        old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            reason = str(e) if isinstance(e, Interrupted) else "interrupted by SIGINT"
            journal.sweep_end("KILLED")
            if run_id:
                store.call(recorder.kill_trial, run_id, reason)
            if store.call(recorder.close_sweep, "KILLED", result_summary(report.results),
                          [csv_path, sweep_dir / "spec.yaml"])[0]:  # fmt: skip
                journal.sweep_closed()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        raise
    journal.sweep_end("FINISHED")
    artifacts = [csv_path, sweep_dir / "spec.yaml", sweep_dir / "spec.normalized.yaml"]
    if store.call(recorder.close_sweep, "FINISHED", result_summary(report.results), artifacts)[0]:
        journal.sweep_closed()
    report.wall_s = time.time() - t0
    return report

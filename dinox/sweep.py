"""Orchestrate one sweep: trials -> child processes -> results -> MLflow, plus a local copy of each result.

This module only sequences the others. Every result is appended to ``results.jsonl`` and ``results.csv``
in the sweep's folder the moment it is known, so a failure later in the sweep never loses it.
"""

from __future__ import annotations

import contextlib
import csv
import json
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dinox import runner
from dinox.grid import Trial
from dinox.result import TrialResult
from dinox.spec import SpecDocument
from dinox.tracking import SweepRecorder, result_summary

CSV_LEAD = [
    "index", "trial_id", "run_id", "label", "status", "bound", "images_per_s", "step_s_p50", "step_s_p90",
    "data_s", "h2d_s", "compute_s", "peak_mem_allocated_gb", "peak_mem_reserved_gb", "device_mem_total_gb",
    "host_peak_rss_gb", "params_m", "error",
]  # fmt: skip


class Interrupted(Exception):
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
    # Parent-side seconds per trial, from opening its run to closing it: the child's life plus recording.
    trial_loop_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    def timeline(self) -> dict[str, float]:
        """Mean seconds per trial by phase; `overhead_s` is what is neither data setup, model build nor steps."""
        n = len(self.results)
        if not n:
            return {}
        mean = {k: sum(r.metrics.get(k, 0.0) for r in self.results) / n
                for k in ("startup_s", "setup_s", "data_setup_s", "build_s", "measure_s", "teardown_s",
                          "trial_wall_s")}  # fmt: skip
        loop = sum(self.trial_loop_s) / n
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


def _row(trial: Trial, run_id: str, r: TrialResult) -> dict[str, object]:
    row: dict[str, object] = {
        "index": trial.index, "trial_id": trial.trial_id, "run_id": run_id, "label": trial.label,
        "status": r.status, "bound": r.bound, "error": r.error,
    }  # fmt: skip
    row.update({k: round(v, 6) for k, v in r.metrics.items()})
    row.update(trial.spec.flat_params())
    return row


def _write_csv(path: Path, rows: list[dict[str, object]]) -> None:
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
) -> SweepReport:
    t0 = time.time()
    name = trials[0].spec.name
    parent = recorder.open_sweep(name, doc.path, len(trials))
    for note in recorder.notes:
        echo(f"note: {note}")
    sweep_dir = workdir / "sweeps" / name / f"{time.strftime('%Y%m%d-%H%M%S')}-{parent[:8]}"
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / "spec.yaml").write_text(doc.text)
    normalized = [
        {"index": t.index, "trial_id": t.trial_id, "sweep_values": t.overrides, "spec": t.spec.model_dump(mode="json")}
        for t in trials
    ]
    (sweep_dir / "spec.normalized.yaml").write_text(yaml.safe_dump(normalized, sort_keys=False))
    report = SweepReport(parent, recorder.experiment_id, sweep_dir)
    csv_path, jsonl_path = sweep_dir / "results.csv", sweep_dir / "results.jsonl"
    plural = "s" if len(trials) != 1 else ""
    echo(
        f"dinox: {len(trials)} trial{plural} of {name!r} -> {recorder.uri} (experiment {recorder.experiment_id}, "
        f"parent run {parent}); local results in {sweep_dir}"
    )

    run_id = ""
    try:
        with _signals_raise():
            for trial in trials:
                t_trial = time.time()
                run_id = recorder.open_trial(trial)
                spawn = (lambda pid, t=trial: on_spawn(t, pid)) if on_spawn else None
                outcome = runner.run_trial(trial, sweep_dir / "trials" / f"{trial.index:03d}-{trial.trial_id}", spawn)
                row = _row(trial, run_id, outcome.result)
                with open(jsonl_path, "a") as f:
                    f.write(json.dumps(row) + "\n")
                report.rows.append(row)
                report.results.append(outcome.result)
                _write_csv(csv_path, report.rows)
                recorder.close_trial(run_id, outcome)
                run_id = ""
                report.trial_loop_s.append(time.time() - t_trial)
                echo(describe(trial, outcome.result))
    except (KeyboardInterrupt, Interrupted) as e:
        # Ignore further signals until the store says KILLED: a second Ctrl-C must not leave runs RUNNING.
        old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            reason = str(e) if isinstance(e, Interrupted) else "interrupted by SIGINT"
            if run_id:
                recorder.kill_trial(run_id, reason)
            recorder.close_sweep("KILLED", result_summary(report.results), [csv_path, sweep_dir / "spec.yaml"])
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        raise
    artifacts = [csv_path, sweep_dir / "spec.yaml", sweep_dir / "spec.normalized.yaml"]
    recorder.close_sweep("FINISHED", result_summary(report.results), artifacts)
    report.wall_s = time.time() - t0
    return report

"""``dinox sync``: log the results a sweep kept locally while the tracking store was unreachable.

Reads a sweep's journal and, for each result not marked logged, finds its run by the ``dinox.result_id``
tag (set when the run was opened) or opens one, then logs the result. A result whose run already carries
its ``dinox.status`` is only marked logged, so running sync twice, or after a sweep that logged half of a
result, never writes a result twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dinox.journal import JOURNAL, Journal
from dinox.tracking import SweepRecorder, result_summary


@dataclass
class SyncReport:
    sweep_dir: Path
    logged: int = 0  # results written now
    already: int = 0  # results the store held already
    closed_sweep: bool = False


def pending_sweeps(workdir: Path) -> list[Path]:
    """Sweep folders under workdir whose journal has results or a sweep end not yet in the store."""
    out = []
    for path in sorted((workdir / "sweeps").glob(f"*/*/{JOURNAL}")):
        state = Journal(path.parent).read()
        if state.pending or (state.end_status and not state.closed):
            out.append(path.parent)
    return out


def sync_sweep(sweep_dir: Path, tracking_uri: str | None = None, echo: Callable[[str], None] = print) -> SyncReport:
    journal = Journal(sweep_dir)
    state = journal.read()
    if not state.sweep:
        raise FileNotFoundError(f"{sweep_dir}: no sweep journal ({JOURNAL}) here")
    recorder = SweepRecorder(tracking_uri or state.sweep["tracking_uri"])
    recorder.attach(state.sweep["experiment_id"], state.sweep["parent_run_id"])
    report = SyncReport(sweep_dir)
    for p in state.pending:
        run = recorder.find_result(p.result_id)
        if run is not None and run.data.tags.get("dinox.status"):
            recorder.ensure_terminated(run)
            journal.logged(p.result_id, run.info.run_id)
            report.already += 1
            continue
        if run is not None:
            run_id = run.info.run_id
        elif p.run_id and recorder.run_exists(p.run_id):
            run_id = p.run_id
        else:
            run_id = recorder.open_trial(p.trial, p.result_id)
        recorder.close_trial(run_id, p.result, p.log_path or None)
        journal.logged(p.result_id, run_id)
        report.logged += 1
    if state.end_status and not state.closed:
        results = [r.result for r in state.results.values()]
        artifacts = [sweep_dir / "results.csv", sweep_dir / "spec.yaml", sweep_dir / "spec.normalized.yaml"]
        recorder.close_sweep(state.end_status, result_summary(results), artifacts)
        journal.sweep_closed()
        report.closed_sweep = True
    echo(f"sync {sweep_dir}: {report.logged} result(s) logged, {report.already} already in the store"
         + (f", sweep closed as {state.end_status}" if report.closed_sweep else ""))  # fmt: skip
    return report

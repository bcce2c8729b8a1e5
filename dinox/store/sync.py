"""``dinox sync``: complete in the tracking store what a sweep kept locally, and close sweeps that died.

Reads a sweep's journal and, for each result not marked logged, finds its one run (by the
``dinox.result_id`` tag set when it was opened, else the run id the journal recorded) or opens one, then
writes the whole result on it: params, metrics, tags, status. A run that already carries its
``dinox.status`` is only checked, so running sync twice, or after a sweep that logged half of a result,
never writes a result twice or opens a second run for it.

A sweep whose process is gone without ending (SIGKILL, the OOM killer, a closed session) is closed here:
its results are logged, its runs still RUNNING are marked KILLED with the reason, and so is its parent.
``dinox run`` of the same experiment does the same for such sweeps before it starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mlflow.exceptions import MlflowException

from dinox import record as rec
from dinox.contract import ProcessRef
from dinox.errors import DinoxError, shell_word
from dinox.store import descriptions
from dinox.store.backend import TrackingError, describe_store_error, shown_uri
from dinox.store.journal import JOURNAL, Journal, JournalState
from dinox.store.recorder import RUN_STATUS, SweepRecorder, result_summary

GONE = (
    "the sweep process ({where}) is gone without closing its runs (SIGKILL, the OOM killer or a closed "
    "session); closed by a later dinox command"
)


class SyncError(DinoxError):
    """A local problem with a sweep's folder (no journal): never the store's fault."""


@dataclass
class SyncReport:
    sweep_dir: Path
    logged: int = 0  # results written now
    already: int = 0  # results the store held already
    drift: int = 0  # drift checks written now (dinox.sweep.drift)
    closed_sweep: str = ""  # the status the parent run was closed with now, or ""
    bad_lines: int = 0


def _gone(state: JournalState) -> ProcessRef | None:
    """The sweep's process, when it is known to be gone while the journal shows no end."""
    if state.end_status is not None:
        return None
    ref = ProcessRef.from_tags(state.sweep.get("process") or {})
    return ref if ref is not None and ref.gone() else None


def pending_sweeps(workdir: Path) -> list[Path]:
    """Sweep folders under workdir with something not yet in the store: results, a sweep end, or a sweep
    whose process died without ending."""
    out = []
    for path in sorted((workdir / "sweeps").glob(f"*/*/{JOURNAL}")):
        state = Journal(path.parent).read()
        unclosed = (state.end_status and not state.closed) or (state.sweep and _gone(state))
        if state.pending or state.pending_drift or unclosed:
            out.append(path.parent)
    return out


def _journal_uri(recorded: str) -> str:
    """The store a journal names. Its password was masked when written: the environment's URI fills it in
    when it names the same store, else the user is asked for it."""
    if shown_uri(recorded) == recorded and "***@" not in recorded:
        return recorded
    env = os.environ.get("MLFLOW_TRACKING_URI", "")
    if env and shown_uri(env) == recorded:
        return env
    raise SyncError(
        f"the sweep's journal names {recorded} without its password (never written to disk): give the store "
        "with --tracking-uri or MLFLOW_TRACKING_URI"
    )


def sync_sweep(
    sweep_dir: Path, tracking_uri: str | None = None, echo: Callable[[str], None] = print, new_sweep: bool = False
) -> SyncReport:
    """Raises SyncError for a local problem (the store is not the one the sweep ran against, without
    `new_sweep`), TrackingError when the store fails."""
    journal = Journal(sweep_dir)
    state = journal.read()
    if not state.sweep:
        why = f"; {len(state.bad_lines)} unreadable line(s)" if state.bad_lines else ""
        raise SyncError(f"{sweep_dir}: no sweep journal ({JOURNAL}) here{why}")
    report = SyncReport(sweep_dir, bad_lines=len(state.bad_lines))
    for bad in state.bad_lines[:5]:
        echo(f"warning: {journal.path}: {bad}; skipped")
    try:
        recorder = SweepRecorder(tracking_uri or _journal_uri(state.sweep["tracking_uri"]))
        recorder.attach(state.sweep["experiment_id"], state.sweep["parent_run_id"])
        if problem := _not_its_sweep(recorder, state.sweep):
            if not new_sweep:
                raise SyncError(
                    f"{sweep_dir}: {problem}: this store is not the one the sweep ran against (a new mlflow.db?), "
                    f"and nothing was written to it; the results stay here. "
                    f"`dinox sync --new-sweep {shell_word(sweep_dir)}` "
                    f"logs them all as a new sweep of {state.sweep['name']!r} there"
                )
            _restart_in(recorder, journal, state)
            echo(f"sync {sweep_dir}: a new sweep run {recorder.parent_run_id} of {state.sweep['name']!r} holds them")
        _log_pending(recorder, journal, state, report)
        _log_drift(recorder, journal, state, report)
        _close_parent(recorder, journal, state, report)
    except MlflowException as e:
        raise TrackingError(describe_store_error(e)) from None
    echo(
        f"sync {sweep_dir}: {report.logged} result(s) logged, {report.already} already in the store"
        + (", the drift check logged" if report.drift else "")
        + (f", sweep closed as {report.closed_sweep}" if report.closed_sweep else "")
    )
    return report


def _not_its_sweep(recorder: SweepRecorder, sweep: dict) -> str:
    """Why the store's run of the journal's parent id is not this sweep's parent ("" when it is): the store
    was made again (mlflow.db deleted) and another sweep may own that experiment id by now."""
    try:
        run = recorder.client.get_run(sweep["parent_run_id"])
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return f"the store has no run {sweep['parent_run_id']} (the sweep's parent)"
    if run.info.experiment_id != sweep["experiment_id"] or run.data.tags.get(rec.ROLE) != "sweep":
        return f"run {sweep['parent_run_id']} of the store is not this sweep's parent"
    return ""


def _restart_in(recorder: SweepRecorder, journal: Journal, state: JournalState) -> None:
    """A new parent run of the sweep's experiment (by name) in this store, written to the journal; every
    result of the sweep pending again (the store that held the logged ones is gone)."""
    recorder.parent_run_id = ""
    recorder.connect(state.sweep["name"])
    total = max((p.trial.total for p in state.results.values()), default=0)
    recorder.open_sweep(state.sweep["name"], "", total)
    journal.sweep(shown_uri(recorder.uri), recorder.experiment_id, recorder.parent_run_id, state.sweep["name"])
    for p in state.results.values():
        p.run_id = None
    state.logged.clear()
    state.drift_logged.clear()
    state.closed = False


def _log_pending(recorder: SweepRecorder, journal: Journal, state: JournalState, report: SyncReport) -> None:
    for p in state.pending:
        run_id = p.run_id = recorder.run_for(p.trial, p.result_id, p.run_id)
        run = recorder.client.get_run(run_id)
        if run.data.tags.get(rec.STATUS):  # written last: the run holds the whole result
            if run.info.status == "RUNNING":
                recorder.client.set_terminated(run_id, RUN_STATUS[p.result.status])
            journal.logged(p.result_id, run_id)
            report.already += 1
            continue
        recorder.close_trial(run_id, p.trial, p.result, p.log_path or None)
        journal.logged(p.result_id, run_id)
        report.logged += 1


def _log_drift(recorder: SweepRecorder, journal: Journal, state: JournalState, report: SyncReport) -> None:
    """Each drift check the store lacks, on its trial's run (every result has one now: _log_pending ran)."""
    for result_id, check in state.pending_drift.items():
        recorder.tag_drift_check(str(state.results[result_id].run_id), check)
        journal.drift_logged(result_id)
        report.drift += 1


def _close_parent(recorder: SweepRecorder, journal: Journal, state: JournalState, report: SyncReport) -> None:
    sweep_dir = journal.path.parent
    results = [r.result for r in state.results.values()]
    if state.end_status and not state.closed:
        names = ("results.csv", "spec.yaml", "spec.normalized.yaml", descriptions.THROUGHPUT_PLOT)
        extra = {"note": state.end_note, "metrics": state.end_metrics}
        summary = result_summary(results)
        recorder.close_sweep(state.end_status, summary, [sweep_dir / n for n in names], state.end_error, extra)
        journal.sweep_closed()
        report.closed_sweep = state.end_status
    elif (ref := _gone(state)) is not None:
        reason = GONE.format(where=f"{ref.host} pid {ref.pid}")
        recorder.kill_sweep(recorder.parent_run_id, reason)
        journal.sweep_end("KILLED", reason)
        journal.sweep_closed()
        report.closed_sweep = "KILLED"


def close_orphans(recorder: SweepRecorder) -> list[str]:
    """Sweeps of the recorder's experiment left RUNNING by a process that is gone: synced from their journal
    when it is on this host, else their RUNNING runs and themselves marked KILLED. One note per sweep."""
    notes = []
    for run_id, ref, sweep_dir in recorder.orphans():
        where = f"{ref.host} pid {ref.pid}"
        try:
            if sweep_dir and (Path(sweep_dir) / JOURNAL).exists():
                report = sync_sweep(Path(sweep_dir), recorder.uri, echo=lambda _line: None)
                notes.append(
                    f"closed sweep run {run_id} as {report.closed_sweep or 'it was'}: its process "
                    f"({where}) is gone; {report.logged} result(s) from its journal logged"
                )
            else:
                n = recorder.kill_sweep(run_id, GONE.format(where=where))
                notes.append(f"closed sweep run {run_id} and {n} of its runs as KILLED: its process ({where}) is gone")
        except (SyncError, TrackingError, MlflowException) as e:  # an old sweep never stops a new one
            notes.append(f"could not close sweep run {run_id} left by {where}: {e}; `dinox sync` may later")
    return notes

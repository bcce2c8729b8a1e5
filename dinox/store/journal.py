"""The sweep's local journal: every result, the moment it is known, whatever the tracking store does.

``results.jsonl`` in the sweep's folder is append-only, one JSON event per line:

- ``sweep``: the sweep's identity (tracking URI, experiment, parent run, name);
- ``opened``: a trial's run exists (its id), before the trial runs;
- ``result``: one trial's result with everything needed to log it later (the trial, the result, the run
  id if one was opened), under a unique ``result_id``;
- ``logged``: that result reached the tracking store (its run carries tag ``dinox.result_id``);
- ``drift_check`` / ``drift_logged``: the sweep's drift check (dinox.sweep.drift), keyed by the result id of the
  trial it measured again / that check reached the store (rec.DRIFT_CHECK on that trial's run);
- ``sweep_end`` / ``sweep_closed``: the sweep ended with a status, and what its parent run is closed with (the
  reason it stopped, its Description and summary metrics) / the parent run was told so.

``dinox sync`` replays what is not marked logged (a drift check once its trial's result is). Because a
result's run is found again by its ``dinox.result_id`` tag, a result is never logged twice, however often
sync runs.
"""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dinox import record as rec
from dinox.contract import DriftCheck, TrialResult
from dinox.errors import WorkdirError
from dinox.plan.grid import Trial
from dinox.spec.sections import TrialSpec

JOURNAL = "results.jsonl"


def new_result_id() -> str:
    return uuid.uuid4().hex


_RESULT_ID = re.compile(r"[0-9a-f]{32}")  # new_result_id's
# MLflow's own rule for a run id (mlflow.utils.validation), whole: its `$` lets a trailing newline through.
_RUN_ID = re.compile(r"[a-zA-Z0-9][\w\-]{0,255}", re.ASCII)


def _id(e: dict, key: str, pattern: re.Pattern[str]) -> str:
    """An id a journal line names: it goes into the store's queries and the terminal, so only the form dinox and
    MLflow write is read (a quote would end the search filter it is put in)."""
    value = e[key]
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(f"{key} {str(value)[:40]!r} is not an id dinox writes")  # repr: escaped, one line
    return value


@dataclass
class PendingResult:
    result_id: str
    trial: Trial
    result: TrialResult
    run_id: str | None
    log_path: str


@dataclass
class JournalState:
    sweep: dict[str, Any] = field(default_factory=dict)
    results: dict[str, PendingResult] = field(default_factory=dict)  # in journal order
    logged: set[str] = field(default_factory=set)
    drift: dict[str, DriftCheck] = field(default_factory=dict)  # result id -> the drift check of that trial
    drift_logged: set[str] = field(default_factory=set)
    end_status: str | None = None
    end_error: str = ""  # why it stopped (a sweep that did not finish)
    end_note: str = ""  # the parent run's Description (dinox.store.descriptions.sweep_note)
    end_metrics: dict[str, float] = field(default_factory=dict)  # the parent run's summary metrics
    closed: bool = False
    bad_lines: list[str] = field(default_factory=list)  # "line N: why", for lines that were skipped

    @property
    def pending(self) -> list[PendingResult]:
        return [r for rid, r in self.results.items() if rid not in self.logged]

    @property
    def pending_drift(self) -> dict[str, DriftCheck]:
        """Drift checks the store does not hold yet, of results the journal has (a check names its trial's)."""
        return {rid: c for rid, c in self.drift.items() if rid not in self.drift_logged and rid in self.results}


class Journal:
    def __init__(self, sweep_dir: Path):
        self.path = Path(sweep_dir) / JOURNAL

    def _append(self, event: dict[str, Any]) -> None:
        # One write per line and an fsync: a crash of the parent right after keeps the result.
        line = json.dumps(event, sort_keys=True) + "\n"
        try:
            with open(self.path, "a") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise WorkdirError(e.errno, f"cannot write {self.path}: {e.strerror or e}") from e

    def sweep(
        self,
        tracking_uri: str,
        experiment_id: str,
        parent_run_id: str,
        name: str,
        process: dict[str, str] | None = None,
    ) -> None:
        self._append(
            {
                "event": "sweep",
                "tracking_uri": tracking_uri,
                "experiment_id": experiment_id,
                "parent_run_id": parent_run_id,
                "name": name,
                "process": process or {},
            }
        )

    def opened(self, result_id: str, run_id: str) -> None:
        """The run that will carry a result exists: sync completes it rather than opening another."""
        self._append({"event": "opened", "result_id": result_id, "run_id": run_id})

    def result(self, result_id: str, trial: Trial, result: TrialResult, run_id: str | None, log_path: str) -> None:
        self._append(
            {
                "event": "result",
                "result_id": result_id,
                "run_id": run_id,
                "log_path": log_path,
                "trial": {
                    "index": trial.index,
                    "total": trial.total,
                    "trial_id": trial.trial_id,
                    "overrides": trial.overrides,
                    "sets": list(trial.sets),
                    "spec": trial.spec.model_dump(mode="json"),
                },
                "result": json.loads(result.to_json()),
            }
        )

    def logged(self, result_id: str, run_id: str) -> None:
        self._append({"event": "logged", "result_id": result_id, "run_id": run_id})

    def drift_check(self, result_id: str, check: DriftCheck) -> None:
        """The drift check, before the store is asked to keep it: a store that fails then loses nothing."""
        self._append({"event": "drift_check", "result_id": result_id, "check": json.loads(check.to_json())})

    def drift_logged(self, result_id: str) -> None:
        self._append({"event": "drift_logged", "result_id": result_id})

    def sweep_end(self, status: str, error: str = "", note: str = "", metrics: dict[str, float] | None = None) -> None:
        """How the sweep ended, with everything its parent run is closed with: a store that fails then loses
        none of it (`dinox sync` closes the parent from here)."""
        self._append({"event": "sweep_end", "status": status, "error": error, "note": note, "metrics": metrics or {}})

    def sweep_closed(self) -> None:
        self._append({"event": "sweep_closed"})

    def read(self) -> JournalState:
        """Every event that can be read. A line that cannot (cut short by a crash, edited, not UTF-8, not an
        event) is skipped and listed in bad_lines: it never hides the lines around it."""
        state = JournalState()
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return state
        opened: dict[str, str] = {}
        for number, data in enumerate(raw.splitlines(), start=1):
            if not data.strip():
                continue
            why = _apply(data, state, opened)
            if why:
                state.bad_lines.append(f"line {number}: {why}")
        for result_id, run_id in opened.items():
            pending = state.results.get(result_id)
            if pending is not None and pending.run_id is None:
                pending.run_id = run_id
        return state


def _apply(data: bytes, state: JournalState, opened: dict[str, str]) -> str:
    """Apply one journal line to the state; why it could not be, or ""."""
    try:
        e = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        return "not UTF-8 text"
    except ValueError:
        return "not JSON (a line cut short by a crash?)"
    if not isinstance(e, dict) or not isinstance(e.get("event"), str):
        return f"not a journal event ({type(e).__name__})"
    try:
        _EVENTS[e["event"]](e, state, opened)
    except KeyError as missing:
        return f"{e['event']} event without {missing}" if e["event"] in _EVENTS else f"unknown event {e['event']!r}"
    except (TypeError, ValueError, AttributeError) as err:
        return f"{e['event']} event that cannot be read ({type(err).__name__}: {str(err).splitlines()[0][:120]})"
    return ""


def _on_sweep(e: dict, state: JournalState, _opened: dict[str, str]) -> None:
    state.sweep = {k: e[k] for k in ("tracking_uri", "experiment_id", "parent_run_id", "name")}
    state.sweep["process"] = e.get("process") or {}


def _on_result(e: dict, state: JournalState, _opened: dict[str, str]) -> None:
    t = e["trial"]
    spec = TrialSpec.model_validate(t["spec"])
    sets = tuple(map(str, t.get("sets") or ()))  # absent from journals written before it was kept
    trial = Trial(t["index"], t["total"], t["overrides"], spec, t["trial_id"], sets=sets)
    result_id = _id(e, "result_id", _RESULT_ID)
    run_id = _id(e, "run_id", _RUN_ID) if e.get("run_id") is not None else None
    result = TrialResult(**e["result"])
    state.results[result_id] = PendingResult(result_id, trial, result, run_id, e.get("log_path", ""))


def _on_opened(e: dict, _state: JournalState, opened: dict[str, str]) -> None:
    opened[_id(e, "result_id", _RESULT_ID)] = _id(e, "run_id", _RUN_ID)


def _on_logged(e: dict, state: JournalState, _opened: dict[str, str]) -> None:
    result_id = _id(e, "result_id", _RESULT_ID)
    run_id = _id(e, "run_id", _RUN_ID)
    state.logged.add(result_id)
    if result_id in state.results:
        state.results[result_id].run_id = run_id


def _on_drift_check(e: dict, state: JournalState, _opened: dict[str, str]) -> None:
    # Read as the store's tag is read: only a check dinox could have written reaches the store.
    check = DriftCheck.parse(json.dumps(e["check"]))
    if check is None:
        raise ValueError(f"check {json.dumps(e['check'])[:60]!r} is not a drift check dinox writes")
    state.drift[_id(e, "result_id", _RESULT_ID)] = check


def _on_drift_logged(e: dict, state: JournalState, _opened: dict[str, str]) -> None:
    state.drift_logged.add(_id(e, "result_id", _RESULT_ID))


_END_STATUS = ("FINISHED", "FAILED", "KILLED")  # what a sweep's parent run is closed as


def _sweep_metric(name: object) -> bool:
    """A summary metric of the parent run, as the record declares it."""
    declared = rec.NAMES.get(name) if isinstance(name, str) else None
    return declared is not None and declared.kind == "metric" and declared.run == "sweep"


def _on_sweep_end(e: dict, state: JournalState, _opened: dict[str, str]) -> None:
    # What reaches the parent run is read as dinox writes it: a status MLflow closes runs with, text, and named
    # finite numbers (journals written before the close was kept carry the status alone).
    status, error, note, metrics = e["status"], e.get("error", ""), e.get("note", ""), e.get("metrics", {})
    if status not in _END_STATUS:
        raise ValueError(f"status {str(status)[:40]!r} is not one a sweep ends with")
    if not isinstance(error, str) or not isinstance(note, str) or not isinstance(metrics, dict):
        raise TypeError("error and note must be text, metrics an object")
    for name, value in metrics.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not _sweep_metric(name) or not number:
            raise ValueError(f"metric {name[:40]!r}: {str(value)[:40]!r} is not a summary metric dinox writes")
    state.end_status, state.end_error, state.end_note = status, error, note
    state.end_metrics = {name: float(value) for name, value in metrics.items()}


def _on_sweep_closed(_e: dict, state: JournalState, _opened: dict[str, str]) -> None:
    state.closed = True


_EVENTS = {
    "sweep": _on_sweep,
    "result": _on_result,
    "opened": _on_opened,
    "logged": _on_logged,
    "drift_check": _on_drift_check,
    "drift_logged": _on_drift_logged,
    "sweep_end": _on_sweep_end,
    "sweep_closed": _on_sweep_closed,
}

"""The sweep's local journal: every result, the moment it is known, whatever the tracking store does.

``results.jsonl`` in the sweep's folder is append-only, one JSON event per line:

- ``sweep``: the sweep's identity (tracking URI, experiment, parent run, name);
- ``result``: one trial's result with everything needed to log it later (the trial, the result, the run
  id if one was opened), under a unique ``result_id``;
- ``logged``: that result reached the tracking store (its run carries tag ``dinox.result_id``);
- ``sweep_end`` / ``sweep_closed``: the sweep ended with a status / the parent run was told so.

``dinox sync`` replays what is not marked logged. Because a result's run is found again by its
``dinox.result_id`` tag, a result is never logged twice, however often sync runs.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dinox.grid import Trial
from dinox.result import TrialResult
from dinox.spec import TrialSpec

JOURNAL = "results.jsonl"


def new_result_id() -> str:
    return uuid.uuid4().hex


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
    end_status: str | None = None
    closed: bool = False

    @property
    def pending(self) -> list[PendingResult]:
        return [r for rid, r in self.results.items() if rid not in self.logged]


class Journal:
    def __init__(self, sweep_dir: Path):
        self.path = Path(sweep_dir) / JOURNAL

    def _append(self, event: dict[str, Any]) -> None:
        # One write per line and an fsync: a crash of the parent right after keeps the result.
        line = json.dumps(event, sort_keys=True) + "\n"
        with open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def sweep(self, tracking_uri: str, experiment_id: str, parent_run_id: str, name: str) -> None:
        self._append({"event": "sweep", "tracking_uri": tracking_uri, "experiment_id": experiment_id,
                      "parent_run_id": parent_run_id, "name": name})  # fmt: skip

    def result(self, result_id: str, trial: Trial, result: TrialResult, run_id: str | None, log_path: str) -> None:
        self._append({
            "event": "result", "result_id": result_id, "run_id": run_id, "log_path": log_path,
            "trial": {"index": trial.index, "total": trial.total, "trial_id": trial.trial_id,
                      "overrides": trial.overrides, "spec": trial.spec.model_dump(mode="json")},
            "result": json.loads(result.to_json()),
        })  # fmt: skip

    def logged(self, result_id: str, run_id: str) -> None:
        self._append({"event": "logged", "result_id": result_id, "run_id": run_id})

    def sweep_end(self, status: str) -> None:
        self._append({"event": "sweep_end", "status": status})

    def sweep_closed(self) -> None:
        self._append({"event": "sweep_closed"})

    def read(self) -> JournalState:
        state = JournalState()
        if not self.path.exists():
            return state
        for line in self.path.read_text().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash mid-write: the events before it stand
            kind = e.get("event")
            if kind == "sweep":
                state.sweep = e
            elif kind == "result":
                t = e["trial"]
                trial = Trial(
                    t["index"], t["total"], t["overrides"], TrialSpec.model_validate(t["spec"]), t["trial_id"]
                )
                state.results[e["result_id"]] = PendingResult(
                    e["result_id"], trial, TrialResult(**e["result"]), e.get("run_id"), e.get("log_path", "")
                )
            elif kind == "logged":
                state.logged.add(e["result_id"])
                if e["result_id"] in state.results:
                    state.results[e["result_id"]].run_id = e["run_id"]
            elif kind == "sweep_end":
                state.end_status = e["status"]
            elif kind == "sweep_closed":
                state.closed = True
        return state

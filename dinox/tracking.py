"""The only module that talks to MLflow: one parent run per sweep, one nested child run per trial.

The record written here is the contract of DESIGN.md: ``decide``, the MLflow UI and users' own queries
rely on its names. The client API with explicit run ids is used instead of the fluent ``mlflow.start_run``
stack, so nothing depends on global "active run" state.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from dinox.grid import Trial
from dinox.records import TrialRecord
from dinox.result import TrialResult, one_line

for _name in ("mlflow", "alembic"):
    # The store's schema migrations log at INFO on first use; a sweep's terminal output is for trials.
    logging.getLogger(_name).setLevel(logging.WARNING)

# MLflow's defaults (7 retries, backoff factor 2, 120 s timeout) stall a sweep for minutes per call when a
# tracking server is down. dinox keeps every result locally and syncs later, so it fails fast instead,
# unless the user set these themselves.
# Against a tracking server MLflow prints a "View run at ..." link at every run end: a sweep prints its own.
_QUIET_AND_QUICK = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
for _var, _value in _QUIET_AND_QUICK.items():
    os.environ.setdefault(_var, _value)

# Final MLflow run status per dinox status: the precise cause always stays in the dinox.status tag.
RUN_STATUS = {
    "ok": "FINISHED",
    "skipped": "FINISHED",
    "oom": "FAILED",
    "error": "FAILED",
    "crashed": "FAILED",
    "timeout": "FAILED",
}
_MAX_PARAMS_PER_CALL = 100  # MLflow's log_batch limit


class TrackingError(Exception):
    """The tracking store cannot be used (unreachable, deleted experiment, ...): one line for the user."""


def resolve_tracking_uri(explicit: str | None = None) -> str:
    """--tracking-uri, else MLFLOW_TRACKING_URI, else the embedded store: mlflow.db in the working dir."""
    if explicit:
        return explicit
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def _now_ms() -> int:
    return int(time.time() * 1000)


class SweepRecorder:
    def __init__(self, tracking_uri: str):
        self.uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.experiment_id = ""
        self.parent_run_id = ""
        self.notes: list[str] = []

    # --- sweep -------------------------------------------------------------------------------------

    def open_sweep(self, name: str, spec_path: str, n_trials: int, shard: str = "") -> str:
        adopt = os.environ.get("MLFLOW_RUN_ID")
        try:
            if adopt:
                # Under `mlflow run`, the run it started is the sweep's parent: one invocation, one top-level
                # run. Children must live in the parent's experiment for the UI to nest them.
                run = self.client.get_run(adopt)
                self.experiment_id = run.info.experiment_id
                self.parent_run_id = adopt
                exp_name = self.client.get_experiment(self.experiment_id).name
                if exp_name != name:
                    self.notes.append(
                        f"mlflow run placed this sweep in experiment {exp_name!r}, not {name!r}; "
                        f"pass --experiment-name {name} to mlflow run to keep sweeps under the spec's name"
                    )
            else:
                self.experiment_id = self._experiment(name)
                suffix = f" shard {shard}" if shard else ""
                run = self.client.create_run(
                    self.experiment_id, run_name=f"{name} sweep{suffix} {time.strftime('%Y-%m-%d %H:%M:%S')}"
                )
                self.parent_run_id = run.info.run_id
            self.client.log_batch(
                self.parent_run_id,
                params=[Param("spec.name", name), Param("sweep.trials", str(n_trials))],
                tags=[
                    RunTag("dinox.role", "sweep"),
                    RunTag("dinox.spec_path", spec_path),
                    RunTag("dinox.spec_name", name),
                    *([RunTag("dinox.shard", shard)] if shard else []),
                ],
            )
        except MlflowException as e:
            raise TrackingError(f"tracking store {self.uri}: {one_line(e.message, 300)}") from None
        return self.parent_run_id

    def _experiment(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                raise TrackingError(
                    f"experiment {name!r} is deleted in {self.uri}; restore it "
                    f"(mlflow experiments restore --experiment-id {exp.experiment_id}) or change the spec's name"
                )
            return exp.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:
            # Another sweep created it between our look-up and our create.
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def close_sweep(self, status: str, summary: dict[str, int], artifacts: list[Path]) -> None:
        tags = [RunTag("dinox.counts", " ".join(f"{k}={v}" for k, v in sorted(summary.items())))]
        self.client.log_batch(self.parent_run_id, tags=tags)
        for path in artifacts:
            if path.exists():
                self.client.log_artifact(self.parent_run_id, str(path))
        self.client.set_terminated(self.parent_run_id, status)

    # --- trials ------------------------------------------------------------------------------------

    def attach(self, experiment_id: str, parent_run_id: str) -> None:
        """Continue a sweep opened earlier (dinox sync)."""
        self.experiment_id, self.parent_run_id = experiment_id, parent_run_id

    def open_trial(self, trial: Trial, result_id: str, role: str = "trial") -> str:
        """A run for a trial (role trial) or for one probe of a batch.size auto search (role probe: kept
        apart from trials by resume and decide, there to show how the batch was found)."""
        prefix = f"probe batch={trial.spec.batch.size} " if role == "probe" else ""
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"{trial.index + 1:03d} {prefix}{trial.label}",
            tags={
                "mlflow.parentRunId": self.parent_run_id,
                "dinox.role": role,
                "dinox.trial_id": trial.trial_id,
                "dinox.trial_index": str(trial.index),
                "dinox.sweep_values": trial.label,
                # Set before the trial runs, so the run can always be found again (dinox sync).
                "dinox.result_id": result_id,
            },
        )
        params = [Param(k, v) for k, v in trial.spec.flat_params().items()]
        for i in range(0, len(params), _MAX_PARAMS_PER_CALL):
            self.client.log_batch(run.info.run_id, params=params[i : i + _MAX_PARAMS_PER_CALL])
        return run.info.run_id

    def close_trial(self, run_id: str, r: TrialResult, log_path: str | Path | None) -> None:
        """Log a result on its run. Safe to repeat: metric timestamps come from the result itself, so a
        second write of the same metrics is a no-op, and dinox.status is written last, so a run without it
        is a run whose result has not fully arrived."""
        ts = int(r.marks.get("result_written", r.marks.get("start", 0.0)) * 1000) or _now_ms()
        tags = dict(r.tags)
        if r.bound:
            tags["dinox.bound"] = r.bound
        if r.error:
            tags["dinox.error"] = r.error
        metrics = [Metric(k, float(v), ts, 0) for k, v in sorted(r.metrics.items())]
        # The step-time history, so the UI can plot each timed step.
        metrics += [Metric("step_s", float(v), ts, i) for i, v in enumerate(r.step_s)]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(run_id, metrics=metrics[i : i + 1000])
        if tags:
            self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in sorted(tags.items())])
        if log_path is not None and Path(log_path).exists() and Path(log_path).stat().st_size:
            self.client.log_artifact(run_id, str(log_path))  # same name again: overwritten, not doubled
        self.client.set_tag(run_id, "dinox.status", r.status)
        self.client.set_terminated(run_id, RUN_STATUS[r.status])

    def find_result(self, result_id: str):
        """The run that carries a result id, or None."""
        runs = self.client.search_runs([self.experiment_id], f"tags.`dinox.result_id` = '{result_id}'")
        return runs[0] if runs else None

    def run_exists(self, run_id: str) -> bool:
        try:
            self.client.get_run(run_id)
        except MlflowException:
            return False
        return True

    def ensure_terminated(self, run) -> None:
        if run.info.status == "RUNNING":
            self.client.set_terminated(run.info.run_id, RUN_STATUS.get(run.data.tags.get("dinox.status", ""), "FAILED"))

    def recorded_trials(self) -> list[TrialRecord]:
        """Every trial run of the experiment that has a final dinox.status (resume and pruning read these)."""
        try:
            runs = _search_all(self.client, [self.experiment_id], "tags.`dinox.role` = 'trial'")
        except MlflowException as e:
            raise TrackingError(f"tracking store {self.uri}: {one_line(e.message, 300)}") from None
        return [_record(run) for run in runs if run.data.tags.get("dinox.status")]

    def kill_trial(self, run_id: str, reason: str) -> None:
        """The trial was interrupted: no measurement, MLflow status KILLED."""
        self.client.log_batch(run_id, tags=[RunTag("dinox.error", one_line(reason))])
        self.client.set_terminated(run_id, "KILLED")


def result_summary(results: list[TrialResult]) -> dict[str, int]:
    return dict(Counter(r.status for r in results))


def _record(run) -> TrialRecord:
    return TrialRecord(run.info.run_id, run.info.experiment_id, run.info.run_name or "", dict(run.data.params),
                       dict(run.data.metrics), dict(run.data.tags))  # fmt: skip


# --- reading back, and the decision run ------------------------------------------------------------


def _search_all(client: MlflowClient, experiment_ids: list[str], filter_string: str = "") -> list:
    runs, token = [], None
    while True:
        page = client.search_runs(experiment_ids, filter_string, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def fetch_trials(
    tracking_uri: str, experiments: list[str], run_ids: list[str]
) -> tuple[list[TrialRecord], list[str], str]:
    """Trial records of the named experiments and/or sweep parent runs, read as one sweep however many
    parents (shards, hosts, resumed runs) they came from: a trial measured more than once (the same
    dinox.trial_id) counts once, by its latest run. Also the sources read and the experiment id a decision
    run should go to. Raises TrackingError for what does not exist."""
    client = MlflowClient(tracking_uri=tracking_uri)
    found: dict[str, tuple[int, TrialRecord]] = {}
    sources: list[str] = []
    home = ""
    try:
        for name in experiments:
            exp = client.get_experiment_by_name(name)
            if exp is None or exp.lifecycle_stage == "deleted":
                raise TrackingError(f"experiment {name!r} not found in {tracking_uri}")
            home = home or exp.experiment_id
            sources.append(f"experiment {name}")
            for run in _search_all(client, [exp.experiment_id]):
                _keep(run, found)
        for run_id in run_ids:
            try:
                parent = client.get_run(run_id)
            except MlflowException:
                raise TrackingError(f"run {run_id!r} not found in {tracking_uri}") from None
            home = home or parent.info.experiment_id
            sources.append(f"sweep run {run_id}")
            children = _search_all(client, [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")
            for run in children:
                _keep(run, found)
    except MlflowException as e:
        raise TrackingError(f"tracking store {tracking_uri}: {one_line(e.message, 300)}") from None
    latest: dict[str, tuple[int, TrialRecord]] = {}
    for start, record in found.values():
        key = record.tags.get("dinox.trial_id") or record.run_id
        if key not in latest or start > latest[key][0]:
            latest[key] = (start, record)
    superseded = len(found) - len(latest)
    if superseded:
        sources.append(f"{superseded} earlier measurement(s) of the same trials superseded by their latest run")
    return [record for _start, record in latest.values()], sources, home


def _keep(run, found: dict[str, tuple[int, TrialRecord]]) -> None:
    tags = run.data.tags
    # The record's own key: a trial is a run with a dinox.status, whoever logged it; sweeps and decisions
    # carry a dinox.role of their own and no status; batch-search probes are two-step runs, not measurements.
    if "dinox.status" not in tags or tags.get("dinox.role") in ("sweep", "decision", "probe"):
        return
    found[run.info.run_id] = (run.info.start_time or 0, _record(run))


def log_decision(
    tracking_uri: str, experiment_id: str, verdict: str, params: dict[str, str], metrics: dict[str, float],
    files: list[Path],
) -> str:  # fmt: skip
    """Record a decision as a run of its own (dinox.role = decision) with the report files as artifacts.
    Under `mlflow run`, the run MLflow started is that run."""
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        run_id = os.environ.get("MLFLOW_RUN_ID")
        if not run_id:
            run_id = client.create_run(
                experiment_id, run_name=f"decision {time.strftime('%Y-%m-%d %H:%M:%S')}"
            ).info.run_id
        ts = _now_ms()
        client.log_batch(
            run_id,
            params=[Param(k, v) for k, v in params.items()],
            metrics=[Metric(k, float(v), ts, 0) for k, v in metrics.items()],
            tags=[RunTag("dinox.role", "decision"), RunTag("dinox.verdict", verdict)],
        )
        for path in files:
            client.log_artifact(run_id, str(path))
        client.set_terminated(run_id, "FINISHED")
    except MlflowException as e:
        raise TrackingError(f"tracking store {tracking_uri}: {one_line(e.message, 300)}") from None
    return run_id

"""Writing a sweep to MLflow: one parent run per sweep, one nested child run per trial.

The record written here is the one docs/record.md describes (names from ``dinox.record``): ``decide``, the MLflow
UI and users' own queries rely on its names. The client API with explicit run ids is used instead of the fluent
``mlflow.start_run`` stack, so nothing depends on global "active run" state. MLflow is imported by this module,
``store`` (reaching and creating the store) and ``readback`` (decide's reads) only; never in a trial's process.
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

from dinox import record as rec
from dinox.contract import DriftCheck, ProcessRef, TrialResult, one_line
from dinox.plan.grid import Trial
from dinox.store.backend import (
    StoreFile,
    TrackingError,
    check_reachable,
    configure_client,
    describe_store_error,
    now_ms,
    prepare_store,
    resolve_tracking_uri,
    search_all,
    shown_uri,
    store_error,
    store_problem,
)
from dinox.store.descriptions import NOTE_TAG
from dinox.store.readback import record_of
from dinox.store.trial_record import TrialRecord

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


# The kind MLflow 3's UI asks about (GenAI or model training): a dinox experiment is the latter, said up front.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


class SweepRecorder:
    def __init__(self, tracking_uri: str):
        configure_client()
        self.uri = tracking_uri
        # Made in connect(), after the store is prepared: MLflow 3's client creates and migrates an embedded
        # store as it is made, which must happen under prepare_store's lock (two first sweeps raced there).
        self.client: MlflowClient = None  # type: ignore[assignment]
        self.experiment_id = ""
        self.parent_run_id = ""
        self.adopted = False  # the parent is the run `mlflow run` started (MLFLOW_RUN_ID): its status is mlflow's
        self.notes: list[str] = []
        self._identity: StoreFile | None = None

    # --- sweep -------------------------------------------------------------------------------------

    def connect(self, name: str) -> None:
        """Open the store (an embedded one is created and migrated here) and find the sweep's experiment. Under
        `mlflow run`, the run it started is the sweep's parent: one invocation, one top-level run; children
        must live in its experiment for the UI to nest them."""
        adopt = os.environ.get("MLFLOW_RUN_ID")
        self._open()
        try:
            self._identity = StoreFile.of(self.uri)
            if adopt:
                run = self.client.get_run(adopt)
                self.experiment_id, self.parent_run_id, self.adopted = run.info.experiment_id, adopt, True
                exp_name = self.client.get_experiment(self.experiment_id).name
                if exp_name != name:
                    self.notes.append(
                        f"mlflow run placed this sweep in experiment {exp_name!r}, not {name!r}; "
                        f"pass --experiment-name {name} to mlflow run to keep sweeps under the spec's name"
                    )
            else:
                self.experiment_id = self._experiment(name)
        except (MlflowException, OSError, ValueError, ImportError) as e:
            raise TrackingError(store_error(self.uri, e)) from None

    def _open(self) -> None:
        """The client, once the store is known to be able to hold a sweep and an embedded one is created and
        migrated under its folder's lock. Raises TrackingError (one line) for any store that cannot."""
        if why := store_problem(self.uri):
            raise TrackingError(f"tracking store {shown_uri(self.uri)}: {why}")
        check_reachable(self.uri)
        try:
            prepare_store(self.uri)
            self.client = MlflowClient(tracking_uri=self.uri)
        except (MlflowException, OSError, ValueError, ImportError) as e:
            raise TrackingError(store_error(self.uri, e)) from None

    def open_sweep(self, name: str, spec_path: str, n_trials: int, shard: str = "", shrunk: bool = False) -> str:
        """The sweep's parent run (the adopted one under `mlflow run`), tagged; after connect()."""
        try:
            if not self.parent_run_id:
                suffix = f" shard {shard}" if shard else ""
                run = self.client.create_run(
                    self.experiment_id, run_name=f"{name} sweep{suffix} {time.strftime('%Y-%m-%d %H:%M:%S')}"
                )
                self.parent_run_id = run.info.run_id
            tags = {
                rec.ROLE: "sweep",
                rec.SPEC_PATH: spec_path,
                rec.SPEC_NAME: name,
                **ProcessRef.me().tags(),
                **({rec.SHARD: shard} if shard else {}),
                **({rec.SHRUNK: "true"} if shrunk else {}),
            }
            self.client.log_batch(
                self.parent_run_id,
                params=[Param(rec.SPEC_NAME_PARAM, name), Param(rec.SWEEP_TRIALS, str(n_trials))],
                tags=[RunTag(k, v) for k, v in tags.items()],
            )
        except (MlflowException, OSError) as e:
            raise TrackingError(store_error(self.uri, e)) from None
        return self.parent_run_id

    def watch(self, run_id: str, gpus: tuple[str, ...] | None = None):
        """System metrics on `run_id` until the returned monitor's finish(); None if they cannot be sampled.
        `gpus`: the UUIDs of the trial's own GPUs (None: all)."""
        from dinox.store.system_metrics import TrialMonitor

        try:
            return TrialMonitor(run_id, self.uri, gpus)
        except Exception:  # noqa: BLE001 - system metrics are an extra: a trial is measured without them
            logging.getLogger(__name__).warning("no system metrics for run %s", run_id, exc_info=True)
            return None

    def tag_sweep_dir(self, sweep_dir: Path) -> None:
        """Where the sweep keeps its journal: a later command that finds the sweep orphaned syncs it from there."""
        self.client.set_tag(self.parent_run_id, rec.SWEEP_DIR, str(sweep_dir.resolve()))

    def tag_drift_check(self, run_id: str, check: DriftCheck) -> None:
        """The sweep's drift check (dinox.sweep.drift), kept on the trial it measured again."""
        self.client.set_tag(run_id, rec.DRIFT_CHECK, check.to_json())

    def _experiment(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                raise TrackingError(
                    f"experiment {name!r} is deleted in {shown_uri(self.uri)}; restore it "
                    f"(mlflow experiments restore --experiment-id {exp.experiment_id}) or change the spec's name"
                )
            if EXPERIMENT_KIND[0] not in exp.tags:
                self.client.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
            return exp.experiment_id
        try:
            return self.client.create_experiment(name, tags=dict([EXPERIMENT_KIND]))
        except MlflowException:
            # Another sweep created it between our look-up and our create.
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def close_sweep(
        self, status: str, summary: dict[str, int], artifacts: list[Path], error: str = "", extra: dict | None = None
    ) -> None:
        """extra: {"note": the run's Markdown description, "metrics": summary metrics}."""
        tags = [RunTag(rec.COUNTS, " ".join(f"{k}={v}" for k, v in sorted(summary.items())))]
        if error:
            tags.append(RunTag(rec.ERROR, one_line(error)))
        extra = extra or {}
        if extra.get("note"):
            tags.append(RunTag(NOTE_TAG, extra["note"]))
        ts = now_ms()
        metrics = [Metric(k, float(v), ts, 0) for k, v in sorted(extra.get("metrics", {}).items())]
        self.client.log_batch(self.parent_run_id, metrics=metrics, tags=tags)
        for path in artifacts:
            if path.exists():
                self.client.log_artifact(self.parent_run_id, str(path))
        self.client.set_terminated(self.parent_run_id, status)
        self._confirm_file()

    def orphans(self) -> list[tuple[str, ProcessRef, str]]:
        """Sweeps of this experiment still marked RUNNING whose process is gone (SIGKILL, the OOM killer, a
        closed session): (parent run id, its process, its sweep folder or "")."""
        found = []
        query = "attributes.status = 'RUNNING' and tags.`dinox.role` = 'sweep'"
        for run in search_all(self.client, [self.experiment_id], query):
            ref = ProcessRef.from_tags(run.data.tags)
            if run.info.run_id != self.parent_run_id and ref is not None and ref.gone():
                found.append((run.info.run_id, ref, run.data.tags.get(rec.SWEEP_DIR, "")))
        return found

    def kill_sweep(self, parent_run_id: str, reason: str) -> int:
        """A sweep that can no longer end itself: its RUNNING runs and itself KILLED, with the reason.
        Returns how many trial (or probe) runs were closed with it."""
        query = f"tags.{rec.PARENT_RUN} = '{parent_run_id}' and attributes.status = 'RUNNING'"
        children = search_all(self.client, [self.experiment_id], query)
        for run in children:
            self.kill_trial(run.info.run_id, reason)
        self.kill_trial(parent_run_id, reason)
        return len(children)

    # --- trials ------------------------------------------------------------------------------------

    def attach(self, experiment_id: str, parent_run_id: str) -> None:
        """Continue a sweep opened earlier (dinox sync)."""
        self._open()
        self.experiment_id, self.parent_run_id = experiment_id, parent_run_id

    def open_trial(self, trial: Trial, result_id: str, role: str = "trial") -> str:
        """A run for a trial (role trial) or for one probe of a batch.size auto search (role probe: kept
        apart from trials by resume and decide, there to show how the batch was found). Only creates it, so
        a store failure after this still leaves the caller its id (log_params and close_trial follow)."""
        probe = f" probe bs={trial.spec.batch.size}" if role == "probe" else ""
        run = self.client.create_run(
            self.experiment_id,
            run_name=trial.run_name + probe,
            tags={
                rec.PARENT_RUN: self.parent_run_id,
                rec.ROLE: role,
                rec.TRIAL_ID: trial.trial_id,
                rec.TRIAL_INDEX: str(trial.index),
                rec.SWEEP_VALUES: trial.label,
                **({rec.SETS: "; ".join(trial.sets)} if trial.sets else {}),
                # Set before the trial runs, so the run can always be found again (dinox sync).
                rec.RESULT_ID: result_id,
                **({rec.SHRUNK: "true"} if trial.spec.shrunk else {}),
            },
        )
        return run.info.run_id

    def log_params(self, run_id: str, trial: Trial) -> None:
        """The trial's params; repeating it is harmless (MLflow accepts a param logged again with its value)."""
        params = [Param(k, v) for k, v in trial.spec.flat_params().items()]
        for i in range(0, len(params), _MAX_PARAMS_PER_CALL):
            self.client.log_batch(run_id, params=params[i : i + _MAX_PARAMS_PER_CALL])

    def close_trial(self, run_id: str, trial: Trial, r: TrialResult, log_path: str | Path | None) -> None:
        """Log a whole result on its run and check that the store holds it. Safe to repeat: params take the
        same values, metric timestamps come from the result itself (a second write is a no-op), and
        dinox.status is written last, so a run without it is a run whose result has not fully arrived."""
        self.log_params(run_id, trial)
        ts = int(r.marks.get("result_written", r.marks.get("start", 0.0)) * 1000) or now_ms()
        tags = dict(r.tags)
        if r.bound:
            tags[rec.BOUND] = r.bound
        if r.error:
            tags[rec.ERROR] = r.error
        metrics = [Metric(k, float(v), ts, 0) for k, v in sorted(r.metrics.items())]
        # The step-time history, so the UI can plot each timed step.
        metrics += [Metric(rec.STEP_S, float(v), ts, i) for i, v in enumerate(r.step_s)]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(run_id, metrics=metrics[i : i + 1000])
        if tags:
            self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in sorted(tags.items())])
        if log_path is not None and Path(log_path).exists() and Path(log_path).stat().st_size:
            self.client.log_artifact(run_id, str(log_path))  # same name again: overwritten, not doubled
        for path in r.artifacts:  # measure.profile's trace; a file gone since (a cleaned workdir) is left out
            if Path(path).is_file():
                self.client.log_artifact(run_id, path, rec.PROFILE_DIR)
        self.client.set_tag(run_id, rec.STATUS, r.status)
        self.client.set_terminated(run_id, RUN_STATUS[r.status])
        self.confirm(run_id, r.status)

    def confirm(self, run_id: str, status: str) -> None:
        """The store holds this result: read back from it (and, for a SQLite store, from the file it was
        opened on). Raises TrackingError otherwise: the result then stays pending in the journal."""
        run = self.client.get_run(run_id)
        if run.data.tags.get(rec.STATUS) != status or run.info.status != RUN_STATUS[status]:
            raise TrackingError(f"run {run_id} does not read back as {status} from {shown_uri(self.uri)}")
        self._confirm_file()

    def explain(self, e: BaseException) -> str:
        """One line for a failed store call: the store file's fate when it was deleted, else the error."""
        return (self._identity.problem() if self._identity is not None else None) or describe_store_error(e)

    def _confirm_file(self) -> None:
        problem = self._identity.problem() if self._identity is not None else None
        if problem:
            raise TrackingError(problem)

    def runs_of_result(self, result_id: str) -> list:
        """The runs that carry a result id (more than one only after a store failure of an older dinox)."""
        query = f"tags.`dinox.result_id` = '{result_id}'"
        return sorted(self.client.search_runs([self.experiment_id], query), key=lambda r: r.info.start_time or 0)

    def run_for(self, trial: Trial, result_id: str, run_id_hint: str | None) -> str:
        """The one run of a result: the run carrying its id (one with a status first), else the run the
        journal names, else a new one. Other runs of the same result are closed as KILLED duplicates."""
        runs = self.runs_of_result(result_id)
        runs.sort(key=lambda r: not r.data.tags.get(rec.STATUS))
        if runs:
            chosen = runs[0].info.run_id
            for dup in runs[1:]:
                if dup.info.status == "RUNNING":
                    self.kill_trial(
                        dup.info.run_id, f"a duplicate run of result {result_id}; the result is in run {chosen}"
                    )
            return chosen
        if run_id_hint and self.run_exists(run_id_hint):
            return run_id_hint
        return self.open_trial(trial, result_id)

    def run_exists(self, run_id: str) -> bool:
        try:
            self.client.get_run(run_id)
        except MlflowException:
            return False
        return True

    def recorded_trials(self) -> list[TrialRecord]:
        """Every trial run of the experiment that has a final dinox.status (resume and pruning read these)."""
        try:
            runs = search_all(self.client, [self.experiment_id], "tags.`dinox.role` = 'trial'")
        except MlflowException as e:
            raise TrackingError(store_error(self.uri, e)) from None
        return [record_of(run) for run in runs if run.data.tags.get(rec.STATUS)]

    def kill_trial(self, run_id: str, reason: str) -> None:
        """The trial was interrupted: no measurement, MLflow status KILLED."""
        self.client.log_batch(run_id, tags=[RunTag(rec.ERROR, one_line(reason))])
        self.client.set_terminated(run_id, "KILLED")


def result_summary(results: list[TrialResult]) -> dict[str, int]:
    return dict(Counter(r.status for r in results))


def note_refusal(message: str) -> None:
    """Under `mlflow run`, dinox refused to start (bad input): the run mlflow run made, which it will mark
    FAILED, says why in its Description and `dinox.error`, so the FAILED run atop the table explains itself.
    Best effort: the message was printed already, and no store trouble may turn into a traceback here."""
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        return
    try:
        client = MlflowClient(resolve_tracking_uri(None))
        note = f"**dinox refused to start: nothing was measured**\n\n```\n{message}\n```"
        tags = [RunTag(NOTE_TAG, note), RunTag(rec.ERROR, one_line(message))]
        client.log_batch(run_id, tags=tags)
    except Exception:  # noqa: BLE001, S110 - the refusal is on the terminal whatever the store does
        pass

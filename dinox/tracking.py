"""The only module that talks to MLflow: one parent run per sweep, one nested child run per trial.

The record written here is the contract of DESIGN.md: ``decide``, the MLflow UI and users' own queries
rely on its names. The client API with explicit run ids is used instead of the fluent ``mlflow.start_run``
stack, so nothing depends on global "active run" state.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import socket
import sqlite3
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from dinox.grid import Trial
from dinox.lifeline import ProcessRef
from dinox.records import TrialRecord
from dinox.result import TrialResult, one_line
from dinox.sweep_summary import NOTE_TAG

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
# The loggers of the store's libraries: schema migrations log at INFO, and a failing store logs whole
# tracebacks (60 KB for a deleted mlflow.db). dinox reports a store failure in one line of its own.
_STORE_LOGGERS = ("mlflow", "alembic", "sqlalchemy", "urllib3")


def configure_client(log_file: Path | None = None) -> None:
    """Fail fast against a dead server, and keep the store libraries' own logging off the terminal: in
    `log_file` when given (the sweep's store.log), else only warnings and worse."""
    for var, value in _QUIET_AND_QUICK.items():
        os.environ.setdefault(var, value)
    for name in _STORE_LOGGERS:
        log = logging.getLogger(name)
        if log_file is None:
            log.setLevel(max(log.level, logging.WARNING))
            continue
        for old in list(log.handlers):  # MLflow's own stderr handler among them
            log.removeHandler(old)
            if isinstance(old, logging.FileHandler):
                old.close()
        handler = logging.FileHandler(log_file, delay=True)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.propagate = False


@contextlib.contextmanager
def _dir_lock(folder: Path) -> Iterator[None]:
    """An exclusive flock on a folder (no lock file left behind), held while the block runs."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def sqlite_path(uri: str) -> Path | None:
    """The database file of a sqlite:/// URI, or None for any other store."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def prepare_store(uri: str) -> None:
    """Create and migrate an embedded (SQLite) store once, under a lock on its folder: two first `dinox run`s
    on a new mlflow.db otherwise race in MLflow's schema migration and can leave it half-migrated. A new one
    starts as a copy of an empty store this MLflow migrated once (kept in the user's cache): MLflow's ~60
    migrations cost seconds on every new file."""
    path = sqlite_path(uri)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with _dir_lock(path.parent):
        seeded = not path.exists() and _copy_empty_store(path)
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)
        if seeded:
            _adopt_default_experiment(client, path)


def _empty_store() -> Path | None:
    """An empty store migrated by this MLflow, made once per MLflow version; None if it cannot be kept."""
    import mlflow

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dinox"
    template = cache / f"mlflow-{mlflow.__version__}-empty.db"
    if template.exists():
        return template
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with _dir_lock(cache):
            if not template.exists():
                tmp = cache / f".mlflow-{os.getpid()}.db"
                try:
                    MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments(max_results=1)
                    os.replace(tmp, template)
                finally:
                    tmp.unlink(missing_ok=True)
    except (OSError, MlflowException):
        return None
    return template


def _copy_empty_store(path: Path) -> bool:
    template = _empty_store()
    if template is None:
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        shutil.copyfile(template, tmp)
        os.replace(tmp, path)
    except OSError:  # a full disk: MLflow's own migration then reports it as it always did
        tmp.unlink(missing_ok=True)
        return False
    return True


def _adopt_default_experiment(client: MlflowClient, path: Path) -> None:
    """The copied store's one experiment, MLflow's Default, takes the location and time MLflow would have
    given it here (its artifact root follows the working directory)."""
    from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    from mlflow.utils.uri import append_to_uri_path, resolve_uri_if_local

    location = append_to_uri_path(resolve_uri_if_local(DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH), "0")
    now = _now_ms()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? "
            "WHERE experiment_id = 0",
            (str(location), now, now),
        )


@dataclass(frozen=True)
class _FileIdentity:
    """Which file an embedded store is: a store deleted or replaced mid-sweep takes writes into a file that
    no longer has a name (an open connection) or into a new empty one. Neither is "logged"."""

    path: Path
    device: int
    inode: int

    @classmethod
    def of(cls, uri: str) -> _FileIdentity | None:
        path = sqlite_path(uri)
        if path is None:
            return None
        st = path.stat()
        return cls(path, st.st_dev, st.st_ino)

    def problem(self) -> str | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return f"the store file {self.path} was deleted during the sweep"
        if (st.st_dev, st.st_ino) != (self.device, self.inode):
            return f"the store file {self.path} was replaced during the sweep"
        return None


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


# The kind MLflow 3's UI asks about (GenAI or model training): a dinox experiment is the latter, said up front.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


def _now_ms() -> int:
    return int(time.time() * 1000)


class SweepRecorder:
    def __init__(self, tracking_uri: str):
        configure_client()
        self.uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.experiment_id = ""
        self.parent_run_id = ""
        self.notes: list[str] = []
        self._identity: _FileIdentity | None = None

    # --- sweep -------------------------------------------------------------------------------------

    def connect(self, name: str) -> None:
        """Open the store (an embedded one is created and migrated here) and find the sweep's experiment. Under
        `mlflow run`, the run it started is the sweep's parent: one invocation, one top-level run; children
        must live in its experiment for the UI to nest them."""
        check_reachable(self.uri)
        adopt = os.environ.get("MLFLOW_RUN_ID")
        try:
            prepare_store(self.uri)
            self._identity = _FileIdentity.of(self.uri)
            if adopt:
                run = self.client.get_run(adopt)
                self.experiment_id, self.parent_run_id = run.info.experiment_id, adopt
                exp_name = self.client.get_experiment(self.experiment_id).name
                if exp_name != name:
                    self.notes.append(
                        f"mlflow run placed this sweep in experiment {exp_name!r}, not {name!r}; "
                        f"pass --experiment-name {name} to mlflow run to keep sweeps under the spec's name"
                    )
            else:
                self.experiment_id = self._experiment(name)
        except (MlflowException, OSError) as e:
            raise TrackingError(store_error(self.uri, e)) from None

    def open_sweep(self, name: str, spec_path: str, n_trials: int, shard: str = "") -> str:
        """The sweep's parent run (the adopted one under `mlflow run`), tagged; after connect()."""
        try:
            if not self.parent_run_id:
                suffix = f" shard {shard}" if shard else ""
                run = self.client.create_run(
                    self.experiment_id, run_name=f"{name} sweep{suffix} {time.strftime('%Y-%m-%d %H:%M:%S')}"
                )
                self.parent_run_id = run.info.run_id
            tags = {
                "dinox.role": "sweep",
                "dinox.spec_path": spec_path,
                "dinox.spec_name": name,
                **ProcessRef.me().tags(),
                **({"dinox.shard": shard} if shard else {}),
            }
            self.client.log_batch(
                self.parent_run_id,
                params=[Param("spec.name", name), Param("sweep.trials", str(n_trials))],
                tags=[RunTag(k, v) for k, v in tags.items()],
            )
        except (MlflowException, OSError) as e:
            raise TrackingError(store_error(self.uri, e)) from None
        return self.parent_run_id

    def watch(self, run_id: str):
        """System metrics on `run_id` until the returned monitor's finish(); None if they cannot be sampled."""
        from dinox.system_metrics import TrialMonitor

        try:
            return TrialMonitor(run_id, self.uri)
        except Exception:  # noqa: BLE001 - system metrics are an extra: a trial is measured without them
            logging.getLogger(__name__).warning("no system metrics for run %s", run_id, exc_info=True)
            return None

    def tag_sweep_dir(self, sweep_dir: Path) -> None:
        """Where the sweep keeps its journal: a later command that finds the sweep orphaned syncs it from there."""
        self.client.set_tag(self.parent_run_id, "dinox.sweep_dir", str(sweep_dir.resolve()))

    def _experiment(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                raise TrackingError(
                    f"experiment {name!r} is deleted in {self.uri}; restore it "
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
        tags = [RunTag("dinox.counts", " ".join(f"{k}={v}" for k, v in sorted(summary.items())))]
        if error:
            tags.append(RunTag("dinox.error", one_line(error)))
        extra = extra or {}
        if extra.get("note"):
            tags.append(RunTag(NOTE_TAG, extra["note"]))
        ts = _now_ms()
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
        for run in _search_all(self.client, [self.experiment_id], query):
            ref = ProcessRef.from_tags(run.data.tags)
            if run.info.run_id != self.parent_run_id and ref is not None and ref.gone():
                found.append((run.info.run_id, ref, run.data.tags.get("dinox.sweep_dir", "")))
        return found

    def kill_sweep(self, parent_run_id: str, reason: str) -> int:
        """A sweep that can no longer end itself: its RUNNING runs and itself KILLED, with the reason.
        Returns how many trial (or probe) runs were closed with it."""
        query = f"tags.mlflow.parentRunId = '{parent_run_id}' and attributes.status = 'RUNNING'"
        children = _search_all(self.client, [self.experiment_id], query)
        for run in children:
            self.kill_trial(run.info.run_id, reason)
        self.kill_trial(parent_run_id, reason)
        return len(children)

    # --- trials ------------------------------------------------------------------------------------

    def attach(self, experiment_id: str, parent_run_id: str) -> None:
        """Continue a sweep opened earlier (dinox sync)."""
        self.experiment_id, self.parent_run_id = experiment_id, parent_run_id

    def open_trial(self, trial: Trial, result_id: str, role: str = "trial") -> str:
        """A run for a trial (role trial) or for one probe of a batch.size auto search (role probe: kept
        apart from trials by resume and decide, there to show how the batch was found). Only creates it, so
        a store failure after this still leaves the caller its id (log_params and close_trial follow)."""
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
        self.confirm(run_id, r.status)

    def confirm(self, run_id: str, status: str) -> None:
        """The store holds this result: read back from it (and, for a SQLite store, from the file it was
        opened on). Raises TrackingError otherwise: the result then stays pending in the journal."""
        run = self.client.get_run(run_id)
        if run.data.tags.get("dinox.status") != status or run.info.status != RUN_STATUS[status]:
            raise TrackingError(f"run {run_id} does not read back as {status} from {self.uri}")
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
        runs.sort(key=lambda r: not r.data.tags.get("dinox.status"))
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
            runs = _search_all(self.client, [self.experiment_id], "tags.`dinox.role` = 'trial'")
        except MlflowException as e:
            raise TrackingError(store_error(self.uri, e)) from None
        return [_record(run) for run in runs if run.data.tags.get("dinox.status")]

    def kill_trial(self, run_id: str, reason: str) -> None:
        """The trial was interrupted: no measurement, MLflow status KILLED."""
        self.client.log_batch(run_id, tags=[RunTag("dinox.error", one_line(reason))])
        self.client.set_terminated(run_id, "KILLED")


def describe_store_error(e: BaseException) -> str:
    """One line for a store failure; for a server that cannot be reached, why, before MLflow's long tail of
    retry details cuts it off."""
    text = getattr(e, "message", None) or str(e) or type(e).__name__
    why = _unreachable(text)
    return f"cannot reach the server ({why})" if why else one_line(text, 300)


def store_error(uri: str, e: BaseException) -> str:
    why = _unreachable(getattr(e, "message", None) or str(e))
    return (
        f"cannot reach the tracking server at {uri} ({why})"
        if why
        else f"tracking store {uri}: " + (describe_store_error(e))
    )


_UNREACHABLE = (
    ("Connection refused", "connection refused"),
    ("Name or service not known", "host name not known"),
    ("Temporary failure in name resolution", "host name not known"),
    ("No route to host", "no route to host"),
    ("timed out", "no answer in time"),
    ("Max retries exceeded", "no connection"),
)


def _unreachable(text: str) -> str:
    return next((why for pattern, why in _UNREACHABLE if pattern in text), "")


def check_reachable(uri: str, timeout: float = 10.0) -> None:
    """One plain request to an HTTP tracking server before MLflow's client, which retries a refused connection
    with backoff for minutes before it says anything. Any HTTP answer will do: something is listening."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout).close()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError | socket.timeout):
            why = f"no answer within {timeout:g} s"
        elif isinstance(reason, ConnectionRefusedError):
            why = "connection refused"
        else:
            # Only what certainly means "nobody there": a TLS setup MLflow is told about (a CA bundle,
            # MLFLOW_TRACKING_INSECURE_TLS) may fail here and work there, so MLflow gets to try.
            why = _unreachable(str(reason)) if isinstance(reason, socket.gaierror | OSError) else ""
        if why:
            raise TrackingError(f"cannot reach the tracking server at {uri} ({why})") from None


def result_summary(results: list[TrialResult]) -> dict[str, int]:
    return dict(Counter(r.status for r in results))


def _record(run) -> TrialRecord:
    return TrialRecord(
        run.info.run_id,
        run.info.experiment_id,
        run.info.run_name or "",
        dict(run.data.params),
        dict(run.data.metrics),
        dict(run.data.tags),
    )


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
    check_reachable(tracking_uri)
    path = sqlite_path(tracking_uri)
    if path is not None and not path.exists():  # reading never creates a store
        raise TrackingError(
            f"no tracking store at {path}: `dinox run SPEC` records the trials there first "
            "(or pass --tracking-uri / set MLFLOW_TRACKING_URI to where they are)"
        )
    client = MlflowClient(tracking_uri=tracking_uri)
    found: dict[str, tuple[int, TrialRecord]] = {}
    sources: list[str] = []
    home = ""
    try:
        for name in experiments:
            exp = client.get_experiment_by_name(name)
            if exp is None or exp.lifecycle_stage == "deleted":
                raise TrackingError(
                    f"experiment {name!r} not found in {tracking_uri}: `dinox run SPEC` records a "
                    "spec's trials in the experiment named by its `name`"
                )
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
        raise TrackingError(store_error(tracking_uri, e)) from None
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
    tracking_uri: str,
    experiment_id: str,
    verdict: str,
    params: dict[str, str],
    metrics: dict[str, float],
    files: list[Path],
    note: str = "",
) -> str:
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
            tags=[RunTag("dinox.role", "decision"), RunTag("dinox.verdict", verdict)]
            + ([RunTag(NOTE_TAG, note)] if note else []),
        )
        for path in files:
            client.log_artifact(run_id, str(path))
        client.set_terminated(run_id, "FINISHED")
    except MlflowException as e:
        raise TrackingError(store_error(tracking_uri, e)) from None
    return run_id

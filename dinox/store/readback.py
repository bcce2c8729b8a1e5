"""What ``dinox decide`` reads from the tracking store (every trial of a sweep, however many runs and hosts it
took) and the decision run it writes back.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from dinox import record as rec
from dinox.plan.shrink import shrunk_name
from dinox.spec import params
from dinox.store.backend import (
    TrackingError,
    check_reachable,
    now_ms,
    search_all,
    shown_uri,
    sqlite_path,
    store_error,
    store_problem,
)
from dinox.store.backend import (
    client as store_client,
)
from dinox.store.descriptions import NOTE_TAG, with_line
from dinox.store.trial_record import TrialRecord, store_text


def record_of(run) -> TrialRecord:
    """A run as a trial record, its text made printable (records.store_text): from here on it is data."""

    def text(mapping: dict[str, str]) -> dict[str, str]:
        return {store_text(k): store_text(str(v)) for k, v in mapping.items()}

    return TrialRecord(
        store_text(run.info.run_id),
        store_text(run.info.experiment_id),
        store_text(run.info.run_name or ""),
        text(run.data.params),
        dict(run.data.metrics),
        text(run.data.tags),
    )


@dataclass(frozen=True)
class Readback:
    """What decide reads: each trial by its latest run (`records`), the runs those superseded (`earlier`,
    oldest first: what the box measured of the same trials before), the sources read, and the experiment a
    decision run goes to."""

    records: list[TrialRecord]
    earlier: list[TrialRecord]
    sources: list[str]
    home: str


def fetch_trials(tracking_uri: str, experiments: list[str], run_ids: list[str]) -> Readback:
    """Trial records of the named experiments and/or sweep parent runs, read as one sweep however many
    parents (shards, hosts, resumed runs) they came from: a trial measured more than once (the same
    dinox.trial_id) counts once, by its latest run. Raises TrackingError for what does not exist."""
    if why := store_problem(tracking_uri):
        raise TrackingError(f"tracking store {shown_uri(tracking_uri)}: {why}")
    check_reachable(tracking_uri)
    path = sqlite_path(tracking_uri)
    if path is not None and not path.exists():  # reading never creates a store
        raise TrackingError(
            f"no tracking store at {path}: `dinox run SPEC` records the trials there first "
            "(or pass --tracking-uri / set MLFLOW_TRACKING_URI to where they are)"
        )
    found: dict[str, tuple[int, TrialRecord]] = {}
    sources: list[str] = []
    home = ""
    try:
        client = store_client(tracking_uri)
        for name in experiments:
            exp = client.get_experiment_by_name(name)
            if exp is None or exp.lifecycle_stage == "deleted":
                small = client.get_experiment_by_name(shrunk_name(name))
                shrunk = f"; {shrunk_name(name)!r} holds its `dinox run --shrink` trials (decide --shrunk)"
                raise TrackingError(
                    f"experiment {name!r} not found in {shown_uri(tracking_uri)}: `dinox run SPEC` records a "
                    f"spec's trials in the experiment named by its `name`{shrunk if small is not None else ''}"
                )
            home = home or exp.experiment_id
            sources.append(f"experiment {name}")
            for run in search_all(client, [exp.experiment_id]):
                _keep(run, found)
        for run_id in run_ids:
            try:
                parent = client.get_run(run_id)
            except MlflowException:
                raise TrackingError(f"run {run_id!r} not found in {shown_uri(tracking_uri)}") from None
            home = home or parent.info.experiment_id
            sources.append(f"sweep run {run_id}")
            children = search_all(client, [parent.info.experiment_id], f"tags.{rec.PARENT_RUN} = '{run_id}'")
            for run in children:
                _keep(run, found)
    except (MlflowException, OSError, ValueError, ImportError) as e:
        raise TrackingError(store_error(tracking_uri, e)) from None
    latest = latest_per_device(list(found.values()))
    kept = {r.run_id for r in latest}
    earlier = [r for _start, r in sorted(found.values(), key=lambda x: x[0]) if r.run_id not in kept]
    if earlier:
        sources.append(f"{len(earlier)} earlier measurement(s) of the same trials superseded by their latest run")
    return Readback(latest, earlier, sources, home)


def latest_per_device(found: list[tuple[int, TrialRecord]]) -> list[TrialRecord]:
    """A trial measured more than once counts once per device it was measured on (dinox.device_name and its
    count, hardware.gpus), by its latest run there: the same spec on an H100 and on an A100 (two experiments,
    a second host's shard) are two trials. A record that never reached a device (skipped, crashed at start)
    is superseded by any later run of its trial."""

    def device(r: TrialRecord) -> tuple[str, str]:
        return r.tags.get(rec.DEVICE_NAME, ""), r.params.get(params.HARDWARE_GPUS, "1")

    latest: dict[tuple[str, tuple[str, str]], tuple[int, TrialRecord]] = {}
    for start, record in found:
        key = (record.tags.get(rec.TRIAL_ID) or record.run_id, device(record))
        if key not in latest or start > latest[key][0]:
            latest[key] = (start, record)
    newest = {}
    for (trial, _device), (start, _record) in latest.items():
        newest[trial] = max(newest.get(trial, start), start)
    return [
        record
        for (trial, dev), (start, record) in latest.items()
        if dev[0] or start >= newest[trial]  # deviceless: kept only as its trial's latest run
    ]


def _keep(run, found: dict[str, tuple[int, TrialRecord]]) -> None:
    tags = run.data.tags
    # The record's own key: a trial is a run with a dinox.status, whoever logged it; sweeps and decisions
    # carry a dinox.role of their own and no status; batch-search probes are two-step runs, not measurements.
    if rec.STATUS not in tags or tags.get(rec.ROLE) in ("sweep", "decision", "probe"):
        return
    found[run.info.run_id] = (run.info.start_time or 0, record_of(run))


def log_decision(
    tracking_uri: str,
    experiment_id: str,
    verdict: str,
    settled: bool,
    params: dict[str, str],
    metrics: dict[str, float],
    files: list[Path],
    note: str = "",
    shrunk: bool = False,
) -> str:
    """Record a decision as a run of its own (dinox.role = decision) with the report files as artifacts.
    Under `mlflow run`, the run MLflow started is that run."""
    client = store_client(tracking_uri)
    try:
        run_id = os.environ.get("MLFLOW_RUN_ID")
        if not run_id:
            run_id = client.create_run(
                experiment_id, run_name=f"decision {time.strftime('%Y-%m-%d %H:%M:%S')}"
            ).info.run_id
        ts = now_ms()
        client.log_batch(
            run_id,
            params=[Param(k, v) for k, v in params.items()],
            metrics=[Metric(k, float(v), ts, 0) for k, v in metrics.items()],
            tags=[
                RunTag(rec.ROLE, "decision"),
                RunTag(rec.VERDICT, verdict),
                RunTag(rec.SETTLED, str(settled).lower()),
            ]
            + ([RunTag(NOTE_TAG, note)] if note else [])
            + ([RunTag(rec.SHRUNK, "true")] if shrunk else []),
        )
        for path in files:
            client.log_artifact(run_id, str(path))
        client.set_terminated(run_id, "FINISHED")
    except MlflowException as e:
        raise TrackingError(store_error(tracking_uri, e)) from None
    return run_id


def read_run(tracking_uri: str, run_id: str) -> TrialRecord:
    """One run as a record (`dinox verify` reads the trial it trains). Raises TrackingError."""
    if why := store_problem(tracking_uri):
        raise TrackingError(f"tracking store {shown_uri(tracking_uri)}: {why}")
    check_reachable(tracking_uri)
    path = sqlite_path(tracking_uri)
    if path is not None and not path.exists():
        raise TrackingError(f"no tracking store at {path}: `dinox run SPEC` records the trials there first")
    try:
        return record_of(store_client(tracking_uri).get_run(run_id))
    except MlflowException:
        raise TrackingError(f"run {run_id!r} not found in {shown_uri(tracking_uri)}") from None
    except (OSError, ValueError, ImportError) as e:
        raise TrackingError(store_error(tracking_uri, e)) from None


def fetch_verifications(tracking_uri: str, experiment_ids: list[str]) -> dict[str, TrialRecord]:
    """The latest `dinox verify` run of each trial run (dinox.verifies) in these experiments. Raises
    TrackingError."""
    latest: dict[str, tuple[int, TrialRecord]] = {}
    for start, record in _runs_of_role(tracking_uri, experiment_ids, "verify"):
        trial = record.tags.get(rec.VERIFIES, "")
        if trial and (trial not in latest or start > latest[trial][0]):
            latest[trial] = (start, record)
    return {trial: record for trial, (_start, record) in latest.items()}


def fetch_head_to_heads(tracking_uri: str, experiment_ids: list[str]) -> list[TrialRecord]:
    """Every `dinox head-to-head` round in these experiments (dinox.decide.head_to_head reads them). Raises
    TrackingError."""
    return [record for _start, record in _runs_of_role(tracking_uri, experiment_ids, "head_to_head")]


def _runs_of_role(tracking_uri: str, experiment_ids: list[str], role: str) -> list[tuple[int, TrialRecord]]:
    try:
        client = store_client(tracking_uri)
        runs = search_all(client, sorted(set(experiment_ids)), f"tags.`{rec.ROLE}` = '{role}'")
        return [(run.info.start_time or 0, record_of(run)) for run in runs]
    except (MlflowException, OSError, ValueError, ImportError) as e:
        raise TrackingError(store_error(tracking_uri, e)) from None


def log_beside(
    tracking_uri: str,
    experiment_id: str,
    role: str,
    run_name: str,
    params: dict[str, str],
    metrics: dict[str, float],
    tags: dict[str, str],
    note: str,
) -> str:
    """Record a run of its own beside the trials it measured again (dinox.role = verify: a `dinox verify`;
    head_to_head: a `dinox head-to-head` round). Raises TrackingError."""
    client = store_client(tracking_uri)
    try:
        run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
        client.log_batch(
            run_id,
            params=[Param(k, v) for k, v in params.items()],
            metrics=[Metric(k, float(v), now_ms(), 0) for k, v in metrics.items()],
            tags=[RunTag(rec.ROLE, role), RunTag(NOTE_TAG, note)] + [RunTag(k, v) for k, v in tags.items()],
        )
        client.set_terminated(run_id, "FINISHED")
    except MlflowException as e:
        raise TrackingError(store_error(tracking_uri, e)) from None
    return run_id


def note_on_parents(tracking_uri: str, parents: list[str], best: float, line: str) -> None:
    """A head-to-head's outcome on the sweeps it settled: best_images_per_s becomes the figure decide now plans
    with (a later step, so the runs table shows it), and the parent's Description gains a line saying why.
    Raises TrackingError."""
    client = store_client(tracking_uri)
    try:
        for run_id in dict.fromkeys(parents):
            run = client.get_run(run_id)
            steps = client.get_metric_history(run_id, rec.BEST_IMAGES_PER_S)
            step = max((m.step for m in steps), default=0) + 1
            client.log_batch(
                run_id,
                metrics=[Metric(rec.BEST_IMAGES_PER_S, float(best), now_ms(), step)],
                tags=[RunTag(NOTE_TAG, with_line(run.data.tags.get(NOTE_TAG, ""), line))],
            )
    except MlflowException as e:
        raise TrackingError(store_error(tracking_uri, e)) from None


def sweep_experiment(tracking_uri: str, name: str | None) -> tuple[str, str] | None:
    """(name, id) of the experiment called `name`, else of the one holding the newest dinox sweep; None where
    there is none. A name the store lacks is a TrackingError naming the experiments it has."""
    try:
        store = store_client(tracking_uri)
        if name is not None:
            found = store.get_experiment_by_name(name)
            if found is None:
                names = ", ".join(sorted(e.name for e in store.search_experiments())) or "none"
                raise TrackingError(f"--experiment {name}: not in {shown_uri(tracking_uri)} (it has: {names})")
            return found.name, found.experiment_id
        ids = [e.experiment_id for e in store.search_experiments()]
        newest = store.search_runs(ids, f"tags.`{rec.ROLE}` = 'sweep'", max_results=1, order_by=["start_time DESC"])
        if not newest:
            return None
        exp = store.get_experiment(newest[0].info.experiment_id)
        return exp.name, exp.experiment_id
    except (MlflowException, OSError, ValueError) as e:
        raise TrackingError(store_error(tracking_uri, e)) from None

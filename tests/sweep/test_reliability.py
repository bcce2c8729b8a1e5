"""Nothing lost: signals mid-trial and resume, pruning on a real OOM, a tracking server that dies mid-sweep
then `dinox sync`, and two sweeps writing to one server at once. Real processes, real signals, real
servers; the store is checked run by run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow import MlflowClient

from dinox.contract import DriftCheck
from tests.conftest import SIDE_BY_SIDE, TINY, MlflowServer, backend_uri, outage_backend, run_dinox, trial_process


def dinox_popen(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, sigint: bool = False
) -> subprocess.Popen:
    """`python -m dinox ARGS` running; `sigint`: with SIGINT's default action, as a terminal starts it (a test
    that sends Ctrl-C; a background child of pytest would ignore it)."""
    full = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    full.pop("MLFLOW_RUN_ID", None)
    return subprocess.Popen(
        [sys.executable, "-m", "dinox", *args],
        cwd=cwd,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if sigint else None,  # noqa: PLW1509
    )


def trial_child(proc: subprocess.Popen, index: int, timeout: float = 120) -> psutil.Process:
    """Wait until trial `index` of a running sweep has its own process, and return it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = trial_process(proc.pid, index)
        if found is not None:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"sweep ended early: {proc.communicate()}")
        time.sleep(0.05)
    raise AssertionError(f"trial {index} never started")


def runs_of(uri: str, experiment: str) -> list:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp else []


# Enough timed steps (about a second) that a signal sent when a trial starts lands inside it.
# 20 timed steps a trial: long enough that a trial is still running when a test acts on it mid-trial.
LONGER = TINY.replace("bench_steps: 3", "bench_steps: 20")
THREE = LONGER.format(name="resume") + "sweep:\n  grid:\n    batch.size: [2, 3, 4]\n"


def test_sigterm_then_sigint_mid_trial_then_resume(tmp_path):
    (tmp_path / "s.yaml").write_text(THREE)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = dinox_popen(["run", "s.yaml"], tmp_path)
    child = trial_child(proc, 1)  # trial 0 is done and logged; trial 1 is in flight
    tree = [child]
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # a second signal during shutdown
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err
    _gone, alive = psutil.wait_procs(tree, timeout=10)
    assert not alive
    runs = runs_of(uri, "resume")
    assert all(r.info.status != "RUNNING" for r in runs)
    states = sorted(
        (
            r.data.tags.get("dinox.role"),
            r.data.params.get("batch.size", ""),
            r.info.status,
            r.data.tags.get("dinox.status", ""),
        )
        for r in runs
    )
    assert states == [("sweep", "", "KILLED", ""), ("trial", "2", "FINISHED", "ok"), ("trial", "3", "KILLED", "")]

    # Resume: the ok trial is not measured again; the killed one and the last one are.
    proc = run_dinox(["run", "s.yaml"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[1/3] recorded size=2 | ok in run" in proc.stdout
    assert "2 ok; 1 already recorded" in proc.stdout
    runs = runs_of(uri, "resume")
    assert all(r.info.status != "RUNNING" for r in runs)
    with_result = [r for r in runs if r.data.tags.get("dinox.status")]
    # Each trial's result exactly once.
    assert sorted(r.data.params["batch.size"] for r in with_result) == ["2", "3", "4"]
    assert len({r.data.tags["dinox.trial_id"] for r in with_result}) == 3
    assert sorted(r.info.status for r in runs if r.data.tags.get("dinox.role") == "sweep") == ["FINISHED", "KILLED"]
    # (--force, which measures everything again, is run in test_pruning_on_a_real_oom_and_from_the_store.)


OOM_GRID = """\
name: prune
model: {name: vit_tiny_patch16_224, img_size: 224, kwargs: {depth: 2}}
objective: {num_classes: 10}
hardware: {memory_limit_gb: 1.5}
measure: {warmup_steps: 1, bench_steps: 1, repeats: 1, timeout_s: 120, ablation: false}
sweep:
  grid:
    batch.size: %s
  cases:
    - {model.kwargs: {depth: 2}}
    - {model.kwargs: {depth: 2, num_heads: 5}}   # 192 is not divisible by 5: an error, never a prune
"""


def test_pruning_on_a_real_oom_and_from_the_store(tmp_path):
    (tmp_path / "s.yaml").write_text(OOM_GRID % "[2, 512, 1024]")
    proc = run_dinox(["run", "s.yaml"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = runs_of(f"sqlite:///{tmp_path / 'mlflow.db'}", "prune")
    by = {
        (
            r.data.params["model.kwargs.num_heads"] if "model.kwargs.num_heads" in r.data.params else "-",
            r.data.params["batch.size"],
        ): r
        for r in runs
        if r.data.tags.get("dinox.role") == "trial"
    }
    assert {k: v.data.tags["dinox.status"] for k, v in by.items()} == {
        ("-", "2"): "ok",
        ("-", "512"): "oom",
        ("-", "1024"): "skipped",
        ("5", "2"): "error",
        ("5", "512"): "error",
        ("5", "1024"): "error",
    }
    skipped = by[("-", "1024")]
    assert skipped.info.status == "FINISHED"
    assert skipped.data.tags["dinox.error"].startswith("pruned: batch.size 1024 > 512, which ran out of memory")
    assert "images_per_s" not in skipped.data.metrics  # nothing was run

    # In a later sweep, the OOM the store holds prunes too: without --no-prune the batch is skipped, with it,
    # it runs (and runs out of memory).
    (tmp_path / "one.yaml").write_text((OOM_GRID % "[1024]").split("  cases:")[0])
    proc = run_dinox(["run", "one.yaml", "--force"], cwd=tmp_path)
    assert "] skipped  size=1024 | pruned: batch.size 1024 > 512" in proc.stdout, proc.stdout
    proc = run_dinox(["run", "one.yaml", "--force", "--no-prune"], cwd=tmp_path)
    assert "] oom      size=1024 |" in proc.stdout, proc.stdout


@pytest.fixture(params=[outage_backend()])
def outage_store(request):
    return backend_uri(request, "outage")


def test_tracking_server_dies_mid_sweep_then_sync(tmp_path, outage_store):
    """The store goes away during trial 1 and stays away through the drift check: sync writes every result and the
    drift check (kept in the journal only) once it is back, each on its trial's run once."""
    server = MlflowServer(tmp_path / "server", outage_store)
    (tmp_path / "server").mkdir()
    server.start()
    try:
        # Two timed windows a trial: the first trial has a range, so the sweep measures it again at its end.
        spec = LONGER.format(name="outage").replace("repeats: 1", "repeats: 2")
        (tmp_path / "s.yaml").write_text(spec + "sweep:\n  grid:\n    batch.size: [2, 3, 4]\n")
        # No HTTP retries: the store's failure is found the same way, only sooner.
        env = {"MLFLOW_TRACKING_URI": server.url, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
        proc = dinox_popen(["run", "s.yaml"], tmp_path, env)
        trial_child(proc, 1)  # trial 0 is logged; trial 1's run is open
        server.stop()  # the store goes away mid-sweep
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, out + err
        assert "warning: tracking store" in out and "dinox sync" in out
        assert sum(1 for ln in out.splitlines() if ln.startswith("[") and ln.split()[1] == "ok") == 3, out
        assert "drift check: 1 bs=2 ran " in out, out
        # While the store is still down, sync says so in one line and keeps everything.
        proc = run_dinox(["sync"], cwd=tmp_path, env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"})
        assert proc.returncode == 2 and "tracking store unreachable or failing" in proc.stderr, proc.stderr
        assert "nothing lost" in proc.stderr and "Traceback" not in proc.stderr
        server.start()
        client = MlflowClient(server.url)
        exp = client.get_experiment_by_name("outage")
        before = client.search_runs([exp.experiment_id], "tags.`dinox.role` = 'trial'")
        assert len([r for r in before if r.data.tags.get("dinox.status")]) == 1
        proc = run_dinox(["sync"], cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        said = "2 result(s) logged, 0 already in the store, the drift check logged, sweep closed as FINISHED"
        assert said in proc.stdout, proc.stdout
        runs = client.search_runs([exp.experiment_id])
        trials = [r for r in runs if r.data.tags.get("dinox.role") == "trial"]
        # Every result exactly once, each complete, nothing left RUNNING.
        assert sorted(r.data.params["batch.size"] for r in trials) == ["2", "3", "4"]
        assert all(r.data.tags["dinox.status"] == "ok" and "images_per_s" in r.data.metrics for r in trials)
        history = [len(client.get_metric_history(r.info.run_id, "step_s")) for r in trials]
        assert history == [2 * 19] * 3, history  # two windows of 20 step ends
        (parent,) = [r for r in runs if r.data.tags.get("dinox.role") == "sweep"]
        assert parent.info.status == "FINISHED" and all(r.info.status != "RUNNING" for r in runs)
        # The parent closed by sync as the sweep would have: its Description (the ranking, the drift check's
        # line), its summary metrics and its plot, all kept in the journal and the sweep's folder meanwhile.
        note = parent.data.tags["mlflow.note.content"]
        assert note.startswith("**outage**: 3 trials measured (3 ok)") and "Best by its forecast: **" in note, note
        assert "Drift check: 1 bs=2 ran " in note, note
        best = max(r.data.metrics["images_per_s"] for r in trials)
        assert parent.data.metrics["trials_ok"] == 3 and parent.data.metrics["best_images_per_s"] == pytest.approx(best)
        assert "throughput_vs_batch.png" in {a.path for a in client.list_artifacts(parent.info.run_id)}
        # The drift check on the first trial's run, as the sweep measured it; sync again writes nothing more.
        checks = {r.data.params["batch.size"]: DriftCheck.parse(r.data.tags.get("dinox.drift_check")) for r in trials}
        assert checks["3"] is None and checks["4"] is None and checks["2"] is not None, checks
        assert f"{checks['2'].slow_ips:.1f}-{checks['2'].fast_ips:.1f} img/s" in out, out
        again = run_dinox(["sync"], cwd=tmp_path)
        assert again.returncode == 0 and "nothing to sync" in again.stdout, again.stdout + again.stderr
    finally:
        server.stop()


def test_two_sweeps_at_once_against_one_server(mlflow_server, tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.yaml").write_text(TINY.format(name="shared") + "sweep:\n  grid:\n    batch.size: [2, 3]\n")
    env = {"MLFLOW_TRACKING_URI": mlflow_server.url, **SIDE_BY_SIDE}
    procs = [dinox_popen(["run", f"{n}.yaml", "--force", "--workdir", f".dinox-{n}"], tmp_path, env) for n in "ab"]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, out + err
        assert "2 ok" in out and "warning" not in out
    client = MlflowClient(mlflow_server.url)
    exp = client.get_experiment_by_name("shared")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("dinox.role") == "sweep"]
    trials = [r for r in runs if r.data.tags.get("dinox.role") == "trial"]
    assert len(parents) == 2 and all(p.info.status == "FINISHED" for p in parents)
    assert len(trials) == 4
    for p in parents:
        mine = [t for t in trials if t.data.tags["mlflow.parentRunId"] == p.info.run_id]
        assert sorted(t.data.params["batch.size"] for t in mine) == ["2", "3"]
        assert all(t.data.tags["dinox.status"] == "ok" and t.info.status == "FINISHED" for t in mine)
        assert {a.path for a in client.list_artifacts(p.info.run_id)} >= {
            "results.csv",
            "spec.yaml",
            "throughput_vs_batch.png",
        }


def test_a_password_in_the_tracking_uri_is_used_and_never_shown(mlflow_server, tmp_path):
    """http://user:password@host, as MLflow takes it (basic auth), is accepted, not refused as an unknown
    host; the password reaches no line, log, file, tag or report (each once printed it)."""
    secret = "s3cret-pw"
    host = mlflow_server.url.split("://", 1)[1]
    uri = f"http://team:{secret}@{host}"
    (tmp_path / "s.yaml").write_text(TINY.format(name="guarded") + "budget: {days: 1, target_images: 100}\n")
    env = {"MLFLOW_TRACKING_URI": uri, **SIDE_BY_SIDE}
    ran = run_dinox(["run", "s.yaml"], tmp_path, env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"-> http://team:***@{host} (experiment" in ran.stdout
    decided = run_dinox(["decide", "--spec", "s.yaml", "--out", "out"], tmp_path, env)
    assert decided.returncode in (0, 1, 3), decided.stdout + decided.stderr
    down = run_dinox(["decide", "--spec", "s.yaml", "--tracking-uri", f"http://team:{secret}@127.0.0.1:9"], tmp_path)
    assert down.returncode == 2 and "http://team:***@127.0.0.1:9" in down.stderr, down.stderr
    (sweep_dir,) = (tmp_path / ".dinox" / "sweeps" / "guarded").iterdir()
    synced = run_dinox(["sync", str(sweep_dir)], tmp_path, env)  # the journal's masked URI, filled from the env
    assert synced.returncode == 0 and "0 result(s) logged" in synced.stdout, synced.stdout + synced.stderr
    unsure = run_dinox(["sync", str(sweep_dir)], tmp_path, {"MLFLOW_TRACKING_URI": mlflow_server.url})
    assert unsure.returncode == 2 and "names http://team:***@" in unsure.stderr, unsure.stdout + unsure.stderr
    assert "without its password (never written to disk)" in unsure.stderr
    for proc in (ran, decided, down, synced, unsure):
        assert secret not in proc.stdout + proc.stderr
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    client = MlflowClient(mlflow_server.url)
    exp = client.get_experiment_by_name("guarded")
    for run in client.search_runs([exp.experiment_id]):
        assert secret not in json.dumps([run.data.tags, run.data.params]), run.info.run_id


def test_sync_never_files_a_sweep_into_another_store_s_sweep(tmp_path):
    """mlflow.db deleted after a sweep whose results were not yet in it: once, sync failed forever, and after
    another sweep made an experiment with the same id, filed the old trials there (its decide counted them).
    Now sync refuses, writing nothing; with --new-sweep it logs them as a new sweep of their own experiment."""
    two_windows = TINY.format(name="first").replace("repeats: 1", "repeats: 2")  # a range: a drift check too
    (tmp_path / "a.yaml").write_text(two_windows + "sweep:\n  grid:\n    batch.size: [2, 3]\n")
    (tmp_path / "b.yaml").write_text(TINY.format(name="second"))
    assert run_dinox(["run", "a.yaml"], tmp_path).returncode == 0
    (sweep_dir,) = (tmp_path / ".dinox" / "sweeps" / "first").iterdir()
    journal = sweep_dir / "results.jsonl"
    kept = [ln for ln in journal.read_text().splitlines() if json.loads(ln)["event"] not in ("logged", "sweep_closed")]
    # As if the store had failed before any result reached it; the drift check stays marked logged (a store that
    # took it, then was deleted): a new sweep writes it again all the same.
    assert sum(json.loads(ln)["event"] == "drift_logged" for ln in kept) == 1, kept
    journal.write_text("\n".join(kept) + "\n")
    (tmp_path / "mlflow.db").unlink()
    assert run_dinox(["run", "b.yaml"], tmp_path).returncode == 0  # experiment 1 again, now 'second'
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    before = len(runs_of(uri, "second"))

    refused = run_dinox(["sync", str(sweep_dir)], tmp_path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "this store is not the one the sweep ran against (a new mlflow.db?), and nothing was written" in (
        refused.stderr
    )
    assert f"`dinox sync --new-sweep {sweep_dir}`" in refused.stderr
    assert len(runs_of(uri, "second")) == before and not runs_of(uri, "first")

    synced = run_dinox(["sync", "--new-sweep", str(sweep_dir)], tmp_path)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert "2 result(s) logged" in synced.stdout and "sweep closed as FINISHED" in synced.stdout
    first = runs_of(uri, "first")
    assert sorted(r.data.tags["dinox.role"] for r in first) == ["sweep", "trial", "trial"]
    assert "the drift check logged" in synced.stdout, synced.stdout
    checked = {r.data.params["batch.size"] for r in first if DriftCheck.parse(r.data.tags.get("dinox.drift_check"))}
    assert checked == {"2"}, checked
    assert all(r.info.status == "FINISHED" for r in first) and len(runs_of(uri, "second")) == before
    assert run_dinox(["sync", str(sweep_dir)], tmp_path).returncode == 0  # its journal names the new parent

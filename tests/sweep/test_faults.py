"""The faults a hostile week brings, each reproduced for real: SIGKILL of the sweep, a full workdir, a full
store, a store file deleted mid-sweep, two first sweeps on a new store, a damaged journal. After each,
nothing is RUNNING, nothing measured is lost, and no result is recorded twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow import MlflowClient

from dinox.store.journal import Journal
from tests.conftest import SIDE_BY_SIDE, TINY, run_dinox
from tests.sweep.test_reliability import LONGER, dinox_popen, runs_of, trial_child

THREE = LONGER.format(name="faults") + "sweep:\n  grid:\n    batch.size: [2, 3, 4]\n"


def _tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root in a machine that allows it)")


def _fill(folder: Path) -> Path:
    """Write zeros into `folder` until its file system refuses: a disk that is full from now on."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                pass
    return filler


def _states(runs) -> list[tuple[str, str, str, str]]:
    return sorted(
        (
            r.data.tags.get("dinox.role", ""),
            r.data.params.get("batch.size", ""),
            r.info.status,
            r.data.tags.get("dinox.status", ""),
        )
        for r in runs
    )


def test_sigkill_takes_every_child_along_and_sync_closes_the_runs(tmp_path):
    """The OOM killer or a closed SSH session SIGKILLs `dinox run`: the fork server, the trial and its loader
    workers must go with it (a hung trial once computed forever), and `dinox sync` closes what it left
    RUNNING, saying why."""
    spec = (
        TINY.format(name="sigkill")
        .replace("bench_steps: 3", "bench_steps: 1000000")
        .replace("timeout_s: 120", "timeout_s: 3600")
        + "loader: {num_workers: 1}\nsweep:\n  grid:\n    batch.size: [2, 3]\n"
    )
    (tmp_path / "s.yaml").write_text(spec)
    proc = dinox_popen(["run", "s.yaml"], tmp_path)
    child = trial_child(proc, 0)
    deadline = time.time() + 120
    while not child.children() and time.time() < deadline:
        time.sleep(0.05)  # until the trial's loader worker exists
    tree = psutil.Process(proc.pid).children(recursive=True)
    assert len(tree) >= 3, tree  # fork server, trial, loader worker
    proc.kill()
    proc.communicate()
    _gone, alive = psutil.wait_procs(tree, timeout=20)
    assert not alive, [(p.pid, p.cmdline()) for p in alive]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert {r.info.status for r in runs_of(uri, "sigkill")} == {"RUNNING"}  # what SIGKILL leaves behind

    out = run_dinox(["sync"], cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 result(s) logged, 0 already in the store, sweep closed as KILLED" in out.stdout
    runs = runs_of(uri, "sigkill")
    assert _states(runs) == [("sweep", "", "KILLED", ""), ("trial", "2", "KILLED", "")]
    assert all("is gone without closing its runs" in r.data.tags["dinox.error"] for r in runs)
    again = run_dinox(["sync"], cwd=tmp_path)
    assert again.returncode == 0 and "nothing to sync" in again.stdout


def test_a_later_sweep_closes_an_orphan_of_its_experiment(tmp_path):
    """`dinox run` closes what a dead sweep of its experiment left RUNNING before it starts: here an orphan
    without a journal on this host, so its runs are marked KILLED directly."""
    from dinox.contract import ProcessRef
    from dinox.store.recorder import SweepRecorder
    from dinox.store.sync import close_orphans

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(dead.pid).create_time()
    dead.wait()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("orphans")
    ref = ProcessRef(ProcessRef.me().host, dead.pid, started)
    parent = client.create_run(exp, tags={"dinox.role": "sweep", **ref.tags()}).info.run_id
    child = client.create_run(exp, tags={"dinox.role": "trial", "mlflow.parentRunId": parent}).info.run_id
    alive = client.create_run(exp, tags={"dinox.role": "sweep", **ProcessRef.me().tags()}).info.run_id

    recorder = SweepRecorder(uri)
    recorder.connect("orphans")
    recorder.open_sweep("orphans", "s.yaml", 1)
    notes = close_orphans(recorder)
    assert notes == [
        f"closed sweep run {parent} and 1 of its runs as KILLED: its process ({ref.host} pid {dead.pid}) is gone"
    ]
    assert client.get_run(parent).info.status == "KILLED" and client.get_run(child).info.status == "KILLED"
    assert client.get_run(alive).info.status == "RUNNING"  # a sweep whose process lives is left alone


def test_a_full_workdir_stops_the_sweep_in_one_line_keeping_what_was_measured(tmp_path):
    work = tmp_path / "work"
    _tmpfs(work, "4m")
    try:
        (tmp_path / "s.yaml").write_text(THREE)
        proc = dinox_popen(["run", "s.yaml", "--workdir", str(work)], tmp_path)
        trial_child(proc, 1)
        _fill(work)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, out + err
        assert "No space left on device" in err and err.count("\n") == 1 and "Traceback" not in err, err
        runs = runs_of(f"sqlite:///{tmp_path / 'mlflow.db'}", "faults")
        assert _states(runs) == [
            ("sweep", "", "FAILED", ""),
            ("trial", "2", "FINISHED", "ok"),
            ("trial", "3", "KILLED", ""),
        ]
        killed = next(r for r in runs if r.info.status == "KILLED")
        assert "No space left on device" in killed.data.tags["dinox.error"]
    finally:
        subprocess.run(["umount", "-l", str(work)], check=False)  # lazy: this process may hold the store open


def test_a_full_store_loses_nothing_and_sync_completes_each_run_once(tmp_path):
    """The SQLite store fills its disk mid-sweep: the sweep goes on, and after `dinox sync` every result is
    in the store exactly once, complete, on the run opened for it."""
    store = tmp_path / "store"
    _tmpfs(store, "4m")
    try:
        (tmp_path / "s.yaml").write_text(THREE)
        uri = f"sqlite:///{store / 'mlflow.db'}"
        proc = dinox_popen(["run", "s.yaml", "--tracking-uri", uri], tmp_path)
        trial_child(proc, 1)
        filler = _fill(store)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, out + err
        assert "warning: tracking store" in out and "dinox sync" in out and "Traceback" not in out + err
        assert len(out + err) < 5000  # no MLflow tracebacks on the terminal
        filler.unlink()
        proc = run_dinox(["sync"], cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs = runs_of(uri, "faults")
        trials = [r for r in runs if r.data.tags.get("dinox.role") == "trial"]
        assert sorted(r.data.params["batch.size"] for r in trials) == ["2", "3", "4"]
        assert len({r.data.tags["dinox.result_id"] for r in trials}) == 3
        assert all(r.info.status == "FINISHED" and r.data.tags["dinox.status"] == "ok" for r in trials)
        assert all("images_per_s" in r.data.metrics and "model.name" in r.data.params for r in trials)
        assert [r.info.status for r in runs if r.data.tags.get("dinox.role") == "sweep"] == ["FINISHED"]
    finally:
        subprocess.run(["umount", "-l", str(store)], check=False)  # lazy: this process may hold the store open


def test_a_store_file_deleted_mid_sweep_is_never_called_logged(tmp_path):
    (tmp_path / "s.yaml").write_text(THREE)
    proc = dinox_popen(["run", "s.yaml"], tmp_path)
    trial_child(proc, 1)
    (tmp_path / "mlflow.db").unlink()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    assert "was deleted during the sweep" in out and "Traceback" not in out + err
    assert len(out + err) < 5000, out + err  # MLflow's own tracebacks go to the sweep's store.log
    journal = next((tmp_path / ".dinox" / "sweeps" / "faults").glob("*/results.jsonl"))
    state = Journal(journal.parent).read()
    assert len(state.results) == 3 and len(state.logged) == 1  # only the result logged before the deletion


def test_two_first_dinox_runs_on_a_new_store_at_the_same_instant_do_not_race(tmp_path):
    """Two `dinox run`s started together on a new mlflow.db, two rounds: MLflow 3's client creates and
    migrates the store as it is made, so it must be made under the lock prepare_store takes (the race came
    back, 4 of 4 rounds, when the CLI built its client first: "duplicate column name: step", a traceback)."""
    # A batch the plan knows cannot fit, skipped unmeasured: each run opens the store, records its trial and
    # closes the sweep, and no seconds go to measuring what the race is not about.
    spec = TINY.format(name="race").replace("batch: {size: 4}", "batch: {size: 100000}")
    for round_ in range(2):
        work = tmp_path / f"r{round_}"
        work.mkdir()
        (work / "s.yaml").write_text(spec)
        env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow.db'}", **SIDE_BY_SIDE)
        env.pop("MLFLOW_RUN_ID", None)
        command = [sys.executable, "-m", "dinox", "run", "s.yaml", "--no-system-metrics", "--skip-predicted-oom"]
        procs = [
            subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        for p in procs:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, f"round {round_}: {out[-1500:]}{err[-1500:]}"
            assert "Traceback" not in err
        runs = MlflowClient(f"sqlite:///{work / 'mlflow.db'}").search_runs(["1"], "tags.`dinox.role` = 'trial'")
        assert len(runs) >= 1 and {r.data.tags["dinox.status"] for r in runs} == {"skipped"}


def test_bad_journal_lines_are_skipped_and_reported_and_the_rest_syncs(tmp_path):
    """A line `[1, 2]`, `null`, `{"event": "result"}` or non-UTF-8 bytes once made sync blame the store and
    stop; a folder without a journal stopped a bare `dinox sync` from syncing the others."""
    (tmp_path / "s.yaml").write_text(TINY.format(name="journal") + "sweep:\n  grid:\n    batch.size: [2, 3]\n")
    proc = run_dinox(["run", "s.yaml"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sweep_dir = next((tmp_path / ".dinox" / "sweeps" / "journal").glob("*"))
    lines = (sweep_dir / "results.jsonl").read_bytes().splitlines()
    # Forget the second result's "logged", as if the store had failed then, and damage the journal.
    second = [json.loads(ln)["result_id"] for ln in lines if json.loads(ln)["event"] == "result"][1]
    kept = [ln for ln in lines if not (json.loads(ln)["event"] == "logged" and json.loads(ln)["result_id"] == second)]
    bad = [b"[1, 2]", b"null", b'{"event": "result"}', b"\xff\xfe not utf-8", b'{"event": "resu']
    (sweep_dir / "results.jsonl").write_bytes(b"\n".join([kept[0], *bad, *kept[1:]]) + b"\n")
    state = Journal(sweep_dir).read()
    assert state.bad_lines == [
        "line 2: not a journal event (list)",
        "line 3: not a journal event (NoneType)",
        "line 4: result event without 'trial'",
        "line 5: not UTF-8 text",
        "line 6: not JSON (a line cut short by a crash?)",
    ]
    assert [p.result_id for p in state.pending] == [second]
    # A second sweep folder with nothing readable in it: reported, and the good one still syncs.
    broken = sweep_dir.parent / "broken"
    broken.mkdir()
    (broken / "results.jsonl").write_bytes(b"null\n")
    out = run_dinox(["sync", str(broken), str(sweep_dir)], cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no sweep journal (results.jsonl) here; 1 unreadable line(s)" in out.stderr
    assert "tracking store" not in out.stderr and "Traceback" not in out.stderr
    assert "line 2: not a journal event (list); skipped" in out.stdout
    assert "0 result(s) logged, 1 already in the store" in out.stdout  # the store had it: never written twice
    runs = runs_of(f"sqlite:///{tmp_path / 'mlflow.db'}", "journal")
    assert len([r for r in runs if r.data.tags.get("dinox.role") == "trial"]) == 2


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("sqlite:////dev/null", "tracking store sqlite:////dev/null: /dev/null is not a regular file"),
        ("sqlite:///:memory:", "an in-memory SQLite store keeps nothing once dinox exits"),
        ("sqlite://", "an in-memory SQLite store keeps nothing once dinox exits"),
        ("sqlite:////proc/dinox-x.db", "cannot create the store /proc/dinox-x.db"),
        ("http://[::1", "tracking store http://[::1: not a URL (Invalid IPv6 URL)"),
        ("postgresql+pg8000://u@localhost/db", "its database driver is not installed: pip install pg8000"),
        ("file:///tmp/dinox-file-store", "tracking store file:///tmp/dinox-file-store: "),
    ],
)
def test_a_store_that_cannot_hold_a_sweep_is_refused_in_one_line_before_a_trial_runs(
    tmp_path, monkeypatch, uri, expected
):
    """Each of these gave a traceback and exit 1 (decide's NO-GO code), hung in MLflow's retries (/proc), or
    reported "sweep done" and kept nothing (in-memory)."""
    from click.testing import CliRunner

    from dinox.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(TINY.format(name="nostore"))
    result = CliRunner().invoke(main, ["run", "s.yaml", "--tracking-uri", uri])
    assert result.exit_code == 2, result.output
    assert expected in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.output and not (tmp_path / ".dinox" / "sweeps").exists()


@pytest.mark.parametrize("after_s", [0.0, 0.3])
def test_a_ctrl_c_as_the_sweep_closes_leaves_its_runs_finished_and_says_what_was_recorded(tmp_path, after_s):
    """Ctrl-C the moment the last trial's line is out (the parent's plot, its close, the fork server's end, the
    summary): every run ends FINISHED, and dinox never says that nothing was recorded (it once did, exit 130,
    the parent left RUNNING)."""
    import signal

    (tmp_path / "s.yaml").write_text(TINY.format(name="closing") + "sweep:\n  grid:\n    batch.size: [2, 4]\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = dinox_popen(["run", "s.yaml", "--tracking-uri", uri, "--no-system-metrics"], tmp_path, sigint=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("[2/2]"):
            time.sleep(after_s)
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, 130), err
    assert "nothing was recorded" not in err and "Traceback" not in err, err
    if proc.returncode == 130:
        assert err.startswith(
            "dinox: interrupted by SIGINT while the sweep was closing: every trial is recorded, its run closed FINISHED"
        ) or err.startswith("dinox: interrupted by SIGINT after the sweep was recorded and closed"), err
    runs = runs_of(uri, "closing")
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 3, [(r.info.run_name, r.info.status) for r in runs]


def test_a_ctrl_c_between_the_last_trial_and_the_close_is_honoured_by_the_close(tmp_path, monkeypatch):
    """The instant between the trials' block handing its signal handler back and the close taking over: a SIGINT
    there once escaped as KeyboardInterrupt, and `dinox run` said nothing was recorded though every trial was
    (CI, 2026-11-29, a Ctrl-C the moment the last trial's line was out). Sent at that instant (as the close is
    called, in `dinox run` itself), it is noted and the close honours it: exit 130, every run FINISHED."""
    import signal

    from click.testing import CliRunner

    from dinox.cli.main import main
    from dinox.sweep import end

    real = end.finish

    def finish(sweep, stopped="", noted=None):  # noqa: ANN001, ANN202 - the close, a signal landing as it is called
        os.kill(os.getpid(), signal.SIGINT)
        return real(sweep, stopped, noted)

    monkeypatch.setattr(end, "finish", finish)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(TINY.format(name="gap"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = CliRunner().invoke(main, ["run", "s.yaml", "--tracking-uri", uri, "--no-system-metrics"])
    assert result.exit_code == 130, result.output
    assert result.stderr.startswith("dinox: interrupted by SIGINT while the sweep was closing: every trial is recorded")
    assert "nothing was recorded" not in result.stderr, result.stderr
    runs = runs_of(uri, "gap")
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 2, [(r.info.run_name, r.info.status) for r in runs]


def test_a_matplotlib_that_cannot_be_imported_costs_the_sweep_its_plot_never_a_trial(tmp_path):
    """The parent imports matplotlib early, while its fork server imports torch: a broken one (here a package
    that raises on import, first on the path) must cost only the throughput plot, said in a warning."""
    broken = tmp_path / "broken" / "matplotlib"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('matplotlib is broken on this box')\n")
    (tmp_path / "spec.yaml").write_text(TINY.format(name="noplot") + "sweep:\n  grid:\n    batch.size: [2, 4]\n")
    proc = run_dinox(
        ["run", "spec.yaml", "--no-system-metrics"], cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "broken")}
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 ok" in proc.stdout and "Traceback" not in proc.stderr
    assert "warning: no throughput plot for the parent run (matplotlib is broken on this box)" in proc.stdout
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (parent,) = client.search_runs(["1"], "tags.`dinox.role` = 'sweep'")
    assert parent.info.status == "FINISHED"
    assert len(client.search_runs(["1"], "tags.`dinox.role` = 'trial' and tags.`dinox.status` = 'ok'")) == 2

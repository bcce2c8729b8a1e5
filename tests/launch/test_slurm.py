"""`dinox submit` on a real one-node Slurm, recording into an `mlflow server` on PostgreSQL: a sweep as an array
of two tasks, one task cancelled mid-trial and submitted again alone, `dinox decide` over both shards, and the
shipped sbatch template run on the same sweep. Skipped (with the reason) where Slurm or PostgreSQL is missing."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from dinox.plan import grid
from dinox.spec import file as spec_file
from tests.conftest import ROOT, SIDE_BY_SIDE, TINY, run_dinox

# Four trials, two a task; a sample takes 30 ms, so a trial lasts long enough to be caught mid-way.
SWEEP = (
    TINY.format(name="slurmed").replace("repeats: 1", "repeats: 2")
    + "data: {source: synthetic, sample_delay_ms: 30}\nsweep:\n  grid:\n    batch.size: [2, 3, 4, 5]\n"
)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    from tests.services import Slurm

    cluster = Slurm(tmp_path_factory.mktemp("slurm"))
    if why := cluster.missing():
        pytest.skip(why)
    cluster.start()
    yield cluster
    cluster.stop()


def _until(check, timeout: float, what: str):
    deadline = time.time() + timeout
    while not (found := check()):
        if time.time() > deadline:
            pytest.fail(f"no {what} after {timeout:.0f} s")
        time.sleep(0.2)
    return found


def _mid_trial(workdir: Path) -> Path | None:
    """A trial of task 2 that has started and not ended: its child.log without a result beside it."""
    for log in workdir.glob("slurm/*/task-2/sweeps/*/*/trials/*/child.log"):
        if not (log.parent / "result.json").exists():
            return log
    return None


def test_a_sweep_submitted_as_a_slurm_array_records_each_trial_once_through_a_cancelled_task(
    tmp_path, slurm, pg_mlflow_server
):
    mlflow_server = pg_mlflow_server
    (tmp_path / "s.yaml").write_text(SWEEP)
    env = {**slurm.env, "MLFLOW_TRACKING_URI": mlflow_server.url, **SIDE_BY_SIDE}  # two tasks on two cores
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # the template calls `dinox`

    first = run_dinox(["submit", "s.yaml", "--tasks", "2", "--cpus-per-task", "1"], cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    job = first.stdout.split("submitted as Slurm job ")[1].split(":")[0]
    assert f"tasks 1-2 of 2 slices, recording into {mlflow_server.url}" in first.stdout
    _until(lambda: _mid_trial(tmp_path / ".dinox"), 120, "trial of task 2 under way")
    assert slurm.run("scancel", f"{job}_2").returncode == 0

    again = run_dinox(["submit", "s.yaml", "--tasks", "2", "--array", "2", "--wait"], cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    lines = again.stdout.splitlines()
    assert lines[-1] == "dinox: all 1 tasks completed; decide: dinox decide --spec s.yaml"
    assert any(line.endswith("(1 completed); trials recorded 4/4") for line in lines), again.stdout
    _until(lambda: not slurm.run("squeue", "-h", "-j", job).stdout.strip(), 120, "end of the first job")
    states = slurm.run("scontrol", "-o", "show", "job", job).stdout
    assert "ArrayTaskId=1 " in states and "ArrayTaskId=2 " in states and "JobState=CANCELLED" in states

    client = MlflowClient(mlflow_server.url)
    exp = client.get_experiment_by_name("slurmed")
    runs = client.search_runs([exp.experiment_id])
    trials = [r for r in runs if r.data.tags.get("dinox.role") == "trial"]
    ok = sorted(r.data.tags["dinox.trial_id"] for r in trials if r.data.tags.get("dinox.status") == "ok")
    expected = sorted(t.trial_id for t in grid.expand(spec_file.load(str(tmp_path / "s.yaml"))))
    assert ok == expected  # every trial ok exactly once
    killed = [r for r in trials if "dinox.status" not in r.data.tags]
    assert [r.info.status for r in killed] == ["KILLED"]  # the one cancelled mid-trial, closed as such
    assert all(r.info.status != "RUNNING" for r in runs)
    shards = sorted(r.data.tags.get("dinox.shard") for r in runs if r.data.tags.get("dinox.role") == "sweep")
    assert shards == ["1/2", "2/2", "2/2"]  # the cancelled task's parent and the one submitted again

    decided = run_dinox(["decide", "--spec", "s.yaml", "--days", "1", "--target-images", "100"], tmp_path, env)
    # Two windows a trial (the spec's repeats): too few for a GO, said as exit 3; the records are what is tested.
    assert decided.returncode == 3 and "too few timed windows" in decided.stdout, decided.stdout + decided.stderr
    (row,) = [ln for ln in decided.stdout.splitlines() if ln.startswith("vit_tiny")]
    assert "ok=4" in row, decided.stdout  # the model's row: four ok trials, no more
    report = (tmp_path / "decision" / "report.md").read_text()
    assert "4 trials (4 ok)" in report, report

    # The shipped template, on the same sweep: each task finds its slice recorded and measures nothing.
    # The node has no GPU and 2 cores: the template's --gres, --cpus-per-task and --mem are overridden.
    small = ["--cpus-per-task=1", "--gres=none", "--mem=1G", f"--output={tmp_path}/template-%a.out"]
    script = str(ROOT / "scripts" / "slurm_sweep.sbatch")
    args = ["sbatch", "--parsable", "--array=1-2", "--export=ALL,SPEC=s.yaml,SHARDS=2", *small, script]
    template = slurm.run(*args, cwd=tmp_path, env=env, timeout=60)
    assert template.returncode == 0, template.stdout + template.stderr
    # (Not sbatch --wait: it polls Slurm every few seconds, and would add them to the suite.)
    job = template.stdout.strip()
    _until(lambda: not slurm.run("squeue", "-h", "-j", job).stdout.strip(), 120, "end of the template's job")
    assert slurm.run("scontrol", "-o", "show", "job", job).stdout.count("JobState=COMPLETED") == 2
    for task in (1, 2):
        out = (tmp_path / f"template-{task}.out").read_text()
        assert f"dinox: shard {task}/2" not in out  # an explicit slice: nothing read from the scheduler
        assert "nothing left to measure: all 2 trials of 'slurmed' are recorded" in out, out


def test_submit_refuses_a_local_store_and_tasks_or_ids_the_sweep_does_not_have(tmp_path):
    (tmp_path / "s.yaml").write_text(SWEEP)
    refusals = {
        ("--tasks", "2"): f"error: tracking store sqlite:///{tmp_path / 'mlflow.db'} is a local file: every array task",
        ("--tasks", "5"): "error: --tasks 5: the sweep has 4 trials; give at most 4",
        ("--tasks", "2", "--array", "3"): "error: --array 3: task ids run from 1 to --tasks 2",
    }
    for args, message in refusals.items():
        proc = run_dinox(["submit", "s.yaml", *args], cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.startswith(message), (args, proc.stderr)
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / ".dinox").exists()


def test_submit_refuses_what_would_not_stay_a_value_in_the_job_script(tmp_path):
    """A newline in an option or the workdir once became a command line of job.sbatch (run on the node), a
    space made sbatch refuse the script, a % sent every task's log to a path that does not exist, and
    --array 1-999999999 was expanded before it was bounded. Each is refused naming the option, exit 2, before
    the store is asked and before anything is written."""
    (tmp_path / "s.yaml").write_text(SWEEP)
    bad = tmp_path / "bad"
    control = "holds the control character '\\n'"  # every command's rule (tests/cli/test_hostile.py)
    hostile = {
        ("--mem", "64G\necho pwned >/tmp/pwned"): ("Invalid value for '--mem'", control),
        ("--partition", "gpu\n#SBATCH --uid=0"): ("Invalid value for '--partition'", control),
        ("--sbatch-option", "--qos=high\ntouch x"): ("Invalid value for '--sbatch-option'", control),
        ("--workdir", f"{bad}\nid"): ("Invalid value for '--workdir'", control),
        ("--mem", "64 G"): ("error: --mem '64 G': not a value sbatch takes for --mem",),
        ("--time", "6h; rm -rf ~"): ("error: --time '6h; rm -rf ~': not a value sbatch takes for --time",),
        ("--sbatch-option", "qos=high"): ("error: --sbatch-option 'qos=high': an sbatch option starts with -",),
        ("--workdir", f"{bad} space"): ("error: --workdir: the job's folder", "holds ' '"),
        ("--workdir", f"{bad}%A"): ("error: --workdir: the job's folder", "holds '%'"),
        ("--array", "1-999999999"): ("error: --array 1-999999999: task ids run from 1 to --tasks 2",),
    }
    for (option, value), expected in hostile.items():
        args = ["submit", "s.yaml", "--tasks", "2", option, value, "--tracking-uri", "http://127.0.0.1:9"]
        proc = run_dinox(args, cwd=tmp_path)
        assert proc.returncode == 2 and all(e in proc.stderr for e in expected), (option, value, proc.stderr)
        assert "Traceback" not in proc.stderr and "\nid" not in proc.stderr and "pwned\n" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]  # nothing written, no store made


def test_submit_into_a_workdir_it_cannot_write_leaves_nothing_behind(tmp_path, slurm, pg_mlflow_server):
    """Once a traceback and a 0-byte job.sbatch: now one line, exit 2, no job folder, nothing submitted. A
    file where the workdir should be fails for root as for anyone (a read-only folder does not stop root)."""
    (tmp_path / "s.yaml").write_text(SWEEP)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "slurm").write_text("a file, not a folder\n")
    env = {**slurm.env, "MLFLOW_TRACKING_URI": pg_mlflow_server.url}
    proc = run_dinox(["submit", "s.yaml", "--tasks", "2", "--workdir", "taken"], cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    folder = tmp_path / "taken" / "slurm"
    assert proc.stderr.startswith(f"error: --workdir: cannot write the job script in '{folder}/"), proc.stderr
    assert "Not a directory" in proc.stderr and "Traceback" not in proc.stderr
    assert (tmp_path / "taken" / "slurm").read_text() == "a file, not a folder\n"
    assert not slurm.run("squeue", "-h").stdout.strip()  # nothing submitted


def test_ctrl_c_during_wait_says_the_job_runs_on_and_it_does(tmp_path, slurm, pg_mlflow_server):
    """Ctrl-C during --wait once said "nothing was recorded" while the job ran on and recorded. It stops
    the following only, and says so with how to follow or cancel the job."""
    import signal
    import subprocess

    # A sweep of its own: the module's server already holds 'slurmed' (its tasks would find nothing to do).
    (tmp_path / "s.yaml").write_text(SWEEP.replace("name: slurmed", "name: waited"))
    env = {**os.environ, **slurm.env, "MLFLOW_TRACKING_URI": pg_mlflow_server.url, **SIDE_BY_SIDE}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dinox", "submit", "s.yaml", "--tasks", "2", "--wait", "--workdir", "w"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = proc.stdout.readline()
    job = first.split("submitted as Slurm job ")[1].split(":")[0]
    try:
        while not (line := proc.stdout.readline()).startswith(f"slurm job {job}:"):
            assert line, proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, out + err
        assert (
            f"dinox: stopped following; job {job} runs on and records into the store. Follow it: scontrol show "
            f"job {job}; cancel it: scancel {job}"
        ) in err
        assert "nothing was recorded" not in err
        assert slurm.run("squeue", "-h", "-j", job).stdout.strip()  # the job is still Slurm's
    finally:
        slurm.run("scancel", job)

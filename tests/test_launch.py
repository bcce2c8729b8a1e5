"""dinox/launch: the sbatch script, Slurm's array notation and the wait, on fake Slurm answers (the real Slurm
runs in tests/test_slurm.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dinox.launch.slurm import GONE, Job, Resources, TaskState, Wait, compress, expand, parse_scontrol, render


def test_array_ids_round_trip_through_sbatch_notation():
    assert expand("1-3,5%2") == [1, 2, 3, 5] and expand("1-7:3") == [1, 4, 7] and expand("4") == [4]
    assert compress((5, 1, 2, 3)) == "1-3,5" and compress((2,)) == "2" and compress((1, 3)) == "1,3"


def test_the_script_runs_its_slice_by_task_id_with_every_resource_and_quotes_what_it_passes(tmp_path):
    job = Job("s w", 4, (2,), tmp_path / "job dir")
    resources = Resources("gpu", 1, 16, "64G", "06:00:00", 2, ("--qos=high",))
    text = render(
        job, resources, ["/venv/bin/python", "-m", "dinox", "run", "/a b/s.yaml", "--set", "x=1 2"], tmp_path, tmp_path
    )
    assert "#SBATCH --array=2%2\n" in text
    for line in (
        "--partition=gpu",
        "--gpus-per-task=1",
        "--cpus-per-task=16",
        "--mem=64G",
        "--time=06:00:00",
        "--qos=high",
    ):
        assert f"#SBATCH {line}\n" in text
    exec_line = text.splitlines()[-1]
    assert exec_line.startswith("exec /venv/bin/python -m dinox run '/a b/s.yaml' --set 'x=1 2' --shard")
    assert '--shard "${SLURM_ARRAY_TASK_ID}/4"' in exec_line
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    # Without the server to record into, a task submitted by hand stops at once, saying what to export.
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode != 0 and "export MLFLOW_TRACKING_URI" in proc.stderr


def test_scontrol_lines_become_task_states_a_pending_range_included():
    text = (
        "JobId=12 ArrayJobId=12 ArrayTaskId=3-4%2 JobName=s JobState=PENDING Reason=JobArrayTaskLimit ExitCode=0:0\n"
        "JobId=13 ArrayJobId=12 ArrayTaskId=1 JobName=dinox-s JobState=COMPLETED Reason=None ExitCode=0:0\n"
        "JobId=14 ArrayJobId=12 ArrayTaskId=2 JobName=dinox-s JobState=CANCELLED Reason=None ExitCode=0:15\n"
    )
    states = parse_scontrol(text)
    assert states[1] == TaskState("COMPLETED", "0:0", "None") and states[2].state == "CANCELLED"
    assert states[3] == states[4] == TaskState("PENDING", "0:0", "JobArrayTaskLimit") and not states[3].ended


def test_the_wait_prints_each_change_once_and_ends_with_every_task_ended_or_gone():
    answers = [
        {1: TaskState("PENDING"), 2: TaskState("PENDING")},
        {1: TaskState("RUNNING"), 2: TaskState("RUNNING")},
        {1: TaskState("RUNNING"), 2: TaskState("RUNNING")},
        {2: TaskState("FAILED", "1:0")},  # task 1 forgotten by Slurm before a poll saw it end
    ]
    recorded = iter([0, 0, 1, 3])
    lines: list[str] = []
    seen = Wait("12", (1, 2), lambda: answers.pop(0), lambda: next(recorded), 4, lines.append, lambda _s: None).run()
    assert lines == [
        "slurm job 12: 2 tasks (2 pending); trials recorded 0/4",
        "slurm job 12: 2 tasks (2 running); trials recorded 0/4",
        "slurm job 12: 2 tasks (2 running); trials recorded 1/4",
        "slurm job 12: 2 tasks (1 failed, 1 gone); trials recorded 3/4",
    ]
    assert seen[1].state == GONE and seen[2] == TaskState("FAILED", "1:0")


def test_a_job_slurm_never_knew_is_an_error_not_a_wait_forever():
    from dinox.launch.slurm import SlurmError

    wait = Wait("99", (1,), dict, lambda: 0, 1, print, lambda _s: None)
    with pytest.raises(SlurmError, match="Slurm does not know job 99"):
        wait.run()


def test_job_paths_are_beside_each_other():
    job = Job("s", 2, (1, 2), Path("/w/slurm/x"))
    assert job.script == Path("/w/slurm/x/job.sbatch") and job.log(2, "12") == Path("/w/slurm/x/task-2-12.out")

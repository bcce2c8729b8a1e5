"""dinox/launch: the sbatch script, Slurm's array notation and the wait, on fake Slurm answers (the real Slurm
runs in tests/launch/test_slurm.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dinox.launch.slurm import (
    GONE,
    Job,
    Resources,
    ScriptValueError,
    TaskState,
    Wait,
    compress,
    expand,
    parse_scontrol,
    render,
)


def test_array_ids_round_trip_through_sbatch_notation():
    assert expand("1-3,5%2") == [1, 2, 3, 5] and expand("1-7:3") == [1, 4, 7] and expand("4") == [4]
    assert compress((5, 1, 2, 3)) == "1-3,5" and compress((2,)) == "2" and compress((1, 3)) == "1,3"


def test_the_script_runs_its_slice_by_task_id_with_every_resource_and_quotes_what_it_passes(tmp_path):
    # A job folder or name with whitespace is refused (an #SBATCH line has no quoting); the command is quoted.
    for bad in (Job("s w", 4, (2,), tmp_path / "job_dir"), Job("s", 4, (2,), tmp_path / "job dir")):
        with pytest.raises(ScriptValueError):
            render(bad, Resources(), ["dinox"], tmp_path, tmp_path)
    job = Job("s_w", 4, (2,), tmp_path / "job_dir")
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


def test_a_controller_that_does_not_answer_is_waited_for_not_read_as_tasks_gone():
    """A few seconds of slurmctld downtime once printed "task 1 GONE ... submit it again" while the task ran
    on: a resubmission would have measured its slice twice. Now the wait keeps what it saw and asks again."""
    from dinox.launch.slurm import ControllerDown, SlurmError

    def down():
        raise ControllerDown("Unable to contact slurm controller (connect failure)")

    answers = [lambda: {1: TaskState("RUNNING")}, down, down, lambda: {1: TaskState("COMPLETED", "0:0")}]
    lines: list[str] = []
    wait = Wait("7", (1,), lambda: answers.pop(0)(), lambda: 2, 2, lines.append, lambda _s: None)
    assert wait.run()[1].state == "COMPLETED"
    assert lines == [
        "slurm job 7: 1 tasks (1 running); trials recorded 2/2",
        "slurm controller not answering (Unable to contact slurm controller (connect failure)); still following job 7",
        "slurm controller answers again",
        "slurm job 7: 1 tasks (1 completed); trials recorded 2/2",
    ]
    # Down for longer than its patience: an error that says the job may still run, and how to follow it.
    ticks = iter(range(0, 10_000, 400))
    stuck = Wait("8", (1,), down, lambda: 0, 1, lines.append, lambda _s: None, clock=lambda: next(ticks))
    with pytest.raises(SlurmError, match="may still run and record: follow it with scontrol show job 8"):
        stuck.run()


def test_an_array_range_is_bounded_before_it_is_expanded():
    with pytest.raises(ValueError, match="task id 999999999 above 4"):
        expand("1-999999999", limit=4)
    assert expand("1-3,4", limit=4) == [1, 2, 3, 4]


def test_a_job_slurm_never_knew_is_an_error_not_a_wait_forever():
    from dinox.launch.slurm import SlurmError

    wait = Wait("99", (1,), dict, lambda: 0, 1, print, lambda _s: None)
    with pytest.raises(SlurmError, match="Slurm does not know job 99"):
        wait.run()


def test_job_paths_are_beside_each_other():
    job = Job("s", 2, (1, 2), Path("/w/slurm/x"))
    assert job.script == Path("/w/slurm/x/job.sbatch") and job.log(2, "12") == Path("/w/slurm/x/task-2-12.out")

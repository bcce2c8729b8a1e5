"""`dinox submit`: a sweep as a Slurm job array, one array task per slice of the grid, each task a `dinox run
--shard I/N` recording into one tracking server; and the wait that follows the array to its end.

The job is a plain sbatch script written beside its logs, not a pickled function (submitit's way): a user
reads it, and submits one task of it again alone (`sbatch --array=2 job.sbatch`). For that the slice is the
array task id itself (`--shard ${SLURM_ARRAY_TASK_ID}/N`, ids 1..N), never derived from the array's size,
which a lone resubmission changes. The wait reads Slurm with `scontrol` (no accounting database needed, which
`sacct` and so submitit's own job states are) and the store for the trials recorded.

Slurm is reached through its commands (sbatch, scontrol, scancel) on PATH, under SLURM_CONF if set.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dinox.launch.launcher import (
    GONE,
    TERMINAL,
    Job,
    LaunchError,
    SchedulerDown,
    ScriptValueError,
    TaskState,
    Wait,
    compress,
    expand,
)

# Slurm's names for the launcher's errors: its tests and its users' scripts know these.
SlurmError = LaunchError
ControllerDown = SchedulerDown


# A control character (a newline above all) ends an #SBATCH or comment line, and what follows it is a command
# of the job script, run on the node.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# An #SBATCH line has no quoting: whitespace ends its value, and in --output's path % starts one of Slurm's
# filename patterns (%a, %A, %j): a log path with either is wrong before the task runs.
_NOT_IN_A_DIRECTIVE_PATH = re.compile(r"[\s%\"'\\]")
# sbatch's own forms: --mem 64G, 16000M, 500; --time 30, 06:00:00, 2-00:00:00, 2-12; a partition's name.
_FORMS = {
    "--mem": re.compile(r"\d+[KMGT]?"),
    "--time": re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE"),
    "--partition": re.compile(r"[\w.+-]+(,[\w.+-]+)*"),
}


def check_script_values(resources: Resources, job_dir: Path) -> None:
    """Refuse, in one line naming the option, every value that would not stay what it is in the job script:
    a line of its own, a shell command, a Slurm pattern. The rest of the script is shell-quoted."""
    values = [("--partition", resources.partition), ("--mem", resources.mem), ("--time", resources.time)]
    values += [("--sbatch-option", e) for e in resources.extra]
    for option, value in values:
        if value is None:
            continue
        if _CONTROL.search(value):
            raise ScriptValueError(
                f"{option} {value!r}: a control character (a newline) would end the #SBATCH line and make the "
                "rest a command of the job script"
            )
        if option in _FORMS and not _FORMS[option].fullmatch(value):
            raise ScriptValueError(f"{option} {value!r}: not a value sbatch takes for {option}")
        if option == "--sbatch-option" and not value.startswith("-"):
            raise ScriptValueError(f"{option} {value!r}: an sbatch option starts with - (--qos=high)")
    if bad := _CONTROL.search(str(job_dir)) or _NOT_IN_A_DIRECTIVE_PATH.search(str(job_dir)):
        raise ScriptValueError(
            f"--workdir: the job's folder {str(job_dir)!r} holds {bad.group()!r}: Slurm reads the tasks' log path "
            "from an #SBATCH line, where whitespace ends it, % starts a pattern and a newline starts a command; "
            "give a --workdir (by default .dinox in the current folder) without whitespace, %, quotes or backslashes"
        )


@dataclass(frozen=True)
class Resources:
    """What each array task asks Slurm for; None: the cluster's default."""

    partition: str | None = None
    gpus_per_task: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None  # sbatch's --mem: 64G, 16000M
    time: str | None = None  # sbatch's --time: 06:00:00, 2-00:00:00
    parallel: int | None = None  # at most this many tasks at once (--array=1-N%K)
    extra: tuple[str, ...] = ()  # more sbatch options, as written (`--qos=high`, `--constraint=h100`)

    def directives(self) -> list[str]:
        pairs = [
            ("--partition", self.partition),
            ("--gpus-per-task", self.gpus_per_task),
            ("--cpus-per-task", self.cpus_per_task),
            ("--mem", self.mem),
            ("--time", self.time),
        ]
        return [f"#SBATCH {k}={v}" for k, v in pairs if v is not None] + [f"#SBATCH {e}" for e in self.extra]


def render(job: Job, resources: Resources, run_args: list[str], workdir: Path, cwd: Path) -> str:
    """The sbatch script: directives, then `dinox run ... --shard ${SLURM_ARRAY_TASK_ID}/N` in `cwd`, each task
    journaling into a workdir of its own (tasks on one shared file system must not share one). Values in its
    directives and comments are checked (check_script_values); those in its commands are shell-quoted."""
    check_script_values(resources, job.job_dir)
    if _CONTROL.search(job.name) or _NOT_IN_A_DIRECTIVE_PATH.search(job.name):  # the spec's name allows none
        raise ScriptValueError(f"name {job.name!r}: not a job name an #SBATCH line keeps whole")
    run = " ".join(shlex.quote(a) for a in run_args)
    task_dir = shlex.quote(str(workdir / "task-")) + "${SLURM_ARRAY_TASK_ID}"
    return "\n".join(
        [
            "#!/bin/bash",
            f"# dinox submit: {job.name}, {job.tasks} slices of the sweep, one per array task (ids 1-{job.tasks}).",
            f"# One task again alone (a failed or preempted one): sbatch --array=2 {job.script}",
            "# resume then measures only what that task's slice is missing.",
            f"#SBATCH --job-name=dinox-{job.name}",
            f"#SBATCH --array={job.array_text(resources.parallel)}",
            f"#SBATCH --output={job.job_dir}/task-%a-%A.out",
            *resources.directives(),
            "set -euo pipefail",
            ': "${MLFLOW_TRACKING_URI:?export MLFLOW_TRACKING_URI, the tracking server every task records into}"',
            f"cd {shlex.quote(str(cwd))}",
            f'exec {run} --shard "${{SLURM_ARRAY_TASK_ID}}/{job.tasks}" --workdir {task_dir}',
            "",
        ]
    )


def sbatch(script: Path, env: dict[str, str], array: str | None = None) -> str:
    """Submit; the job id. `array` overrides the script's own --array (a task submitted again)."""
    args = ["sbatch", "--parsable", *([f"--array={array}"] if array else []), str(script)]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
    except FileNotFoundError:
        raise SlurmError("sbatch is not on PATH: run dinox submit where Slurm's commands are") from None
    except subprocess.TimeoutExpired:
        raise SlurmError("sbatch did not answer in 60 s: is slurmctld up (scontrol ping)?") from None
    if proc.returncode != 0:
        raise SlurmError(f"sbatch refused the job: {' '.join(proc.stderr.split())[:400]}")
    return proc.stdout.strip().split(";")[0]  # "123" or "123;cluster"


_FIELD = re.compile(r"(\w+)=(\S*)")


def parse_scontrol(text: str) -> dict[int, TaskState]:
    """`scontrol -o show job ARRAY_JOB_ID`: one line per task (a pending range on one line), to states."""
    out: dict[int, TaskState] = {}
    for line in text.splitlines():
        f = dict(_FIELD.findall(line))
        if "ArrayTaskId" not in f or "JobState" not in f:
            continue
        state = TaskState(f["JobState"], f.get("ExitCode", ""), f.get("Reason", ""))
        for task in expand(f["ArrayTaskId"]):
            out[task] = state
    return out


def query(job_id: str, env: dict[str, str]) -> dict[int, TaskState]:
    """The array's tasks Slurm still knows ({} once it has forgotten the job). Raises ControllerDown when the
    controller does not answer (a restart, a failover): that says nothing about the tasks."""
    try:
        proc = subprocess.run(
            ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, env=env, timeout=60
        )
    except subprocess.TimeoutExpired:
        raise ControllerDown("scontrol did not answer in 60 s") from None
    if proc.returncode == 0:
        return parse_scontrol(proc.stdout)
    if "Invalid job id" in proc.stderr:  # Slurm has forgotten the job (MinJobAge)
        return {}
    raise ControllerDown(" ".join(proc.stderr.split())[:200] or f"scontrol exited {proc.returncode}")


@dataclass(frozen=True)
class Slurm:
    """The Launcher for Slurm: a job array's sbatch script, submitted with sbatch, read back with scontrol."""

    resources: Resources = Resources()
    name: str = "slurm"

    def render(self, job: Job, spec: Path, sets: tuple[str, ...], cwd: Path) -> dict[Path, str]:
        run_args = [
            sys.executable,
            "-m",
            "dinox",
            "run",
            str(spec.absolute()),
            *(a for s in sets for a in ("--set", s)),
        ]
        return {job.script: render(job, self.resources, run_args, job.job_dir, cwd)}

    def submit(self, job: Job, files: dict[Path, str], env: dict[str, str]) -> str:
        return sbatch(job.script, env)

    def poll(self, job: Job, job_id: str, env: dict[str, str]) -> dict[int, TaskState]:
        return query(job_id, env)

    def log(self, job: Job, task: int, job_id: str) -> str:
        return f"log {job.log(task, job_id)}"

    def again(self, job: Job, task: int) -> str:
        return f"sbatch --array={task} {job.script}"

    def follow(self, job_id: str) -> tuple[str, str]:
        return f"scontrol show job {job_id}", f"scancel {job_id}"


__all__ = [
    "GONE", "TERMINAL", "ControllerDown", "Job", "Resources", "ScriptValueError", "Slurm", "SlurmError",
    "TaskState", "Wait", "check_script_values", "compress", "expand", "parse_scontrol", "query", "render", "sbatch",
]  # fmt: skip

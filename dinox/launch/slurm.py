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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dinox.errors import DinoxError

# Where a task ends. PENDING, RUNNING, REQUEUED, SUSPENDED, ... are on their way.
TERMINAL = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)
GONE = "GONE"  # left Slurm's memory (MinJobAge) before the wait saw it end: its log says how


class SlurmError(DinoxError):
    """sbatch refused the job, or Slurm's commands are not here."""


class ScriptValueError(DinoxError):
    """A value that cannot enter the job script safely (exit 2): refused before anything is written."""


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


@dataclass(frozen=True)
class Job:
    """One submission: its script (beside the logs) and what it runs."""

    name: str
    tasks: int  # the slices: the sweep's --shard I/N, N
    array: tuple[int, ...]  # the task ids submitted (all of 1..tasks, or the ones submitted again)
    job_dir: Path

    @property
    def script(self) -> Path:
        return self.job_dir / "job.sbatch"

    def log(self, task: int, job_id: str) -> Path:
        return self.job_dir / f"task-{task}-{job_id}.out"

    def array_text(self, parallel: int | None = None) -> str:
        text = compress(self.array)
        return f"{text}%{parallel}" if parallel else text


def compress(ids: tuple[int, ...]) -> str:
    """(1, 2, 3, 5) -> '1-3,5': sbatch's --array."""
    spans: list[list[int]] = []
    for i in sorted(set(ids)):
        if spans and spans[-1][1] == i - 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def expand(text: str, limit: int | None = None) -> list[int]:
    """sbatch's --array (or scontrol's ArrayTaskId) to ids: '1-3,5%2' -> [1, 2, 3, 5]; '1-7:3' -> [1, 4, 7].
    With `limit`, an id above it is refused before any list is made ('1-999999999' would fill the memory)."""
    ids: list[int] = []
    for part in text.split("%")[0].split(","):
        span, _, step = part.partition(":")
        low, _, high = span.partition("-")
        top = int(high or low)
        if limit is not None and top > limit:
            raise ValueError(f"task id {top} above {limit}")
        ids += list(range(int(low), top + 1, int(step or 1)))
    return ids


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


@dataclass(frozen=True)
class TaskState:
    state: str
    exit_code: str = ""  # Slurm's "exit:signal"
    reason: str = ""

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL or self.state == GONE


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


class ControllerDown(SlurmError):
    """slurmctld did not answer a query: the job's state is unknown, not ended."""


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


@dataclass
class Wait:
    """Follows one submission to its end: a line whenever the tasks' states or the trials recorded change."""

    job_id: str
    tasks: tuple[int, ...]
    poll: Callable[[], dict[int, TaskState]]
    recorded: Callable[[], int]  # trials of the sweep recorded in the store (final statuses)
    total: int  # trials in the sweep
    echo: Callable[[str], None]
    sleep: Callable[[float], None] = time.sleep
    interval: float = 2.0
    patience: float = 600.0  # seconds without an answer from the controller before the wait gives up
    clock: Callable[[], float] = time.monotonic
    seen: dict[int, TaskState] = field(default_factory=dict)

    def run(self) -> dict[int, TaskState]:
        last, down_since = "", None
        while True:
            try:
                now = self.poll()
            except ControllerDown as e:
                # The controller restarting is not the tasks ending: keep what was seen, ask again.
                if down_since is None:
                    down_since = self.clock()
                    self.echo(f"slurm controller not answering ({e}); still following job {self.job_id}")
                elif self.clock() - down_since > self.patience:
                    raise SlurmError(
                        f"the Slurm controller has not answered for {self.patience:.0f} s ({e}); job {self.job_id} "
                        f"may still run and record: follow it with scontrol show job {self.job_id}, cancel it with "
                        f"scancel {self.job_id}"
                    ) from None
                self.sleep(self.interval)
                continue
            if down_since is not None:
                self.echo("slurm controller answers again")
                down_since = None
            for task in self.tasks:
                if task in now:
                    self.seen[task] = now[task]
                elif task in self.seen and not self.seen[task].ended:
                    self.seen[task] = TaskState(GONE)  # ran, then forgotten before a poll saw its end
            done = all(self.seen.get(t, TaskState("PENDING")).ended for t in self.tasks)
            line = self.line(self.recorded())
            if line != last:
                self.echo(line)
                last = line
            if done:
                return self.seen
            if not now and not self.seen:
                raise SlurmError(f"Slurm does not know job {self.job_id} (scontrol show job): was it cancelled?")
            self.sleep(self.interval)

    def line(self, recorded: int) -> str:
        counts: dict[str, int] = {}
        for task in self.tasks:
            state = self.seen.get(task, TaskState("PENDING")).state
            counts[state] = counts.get(state, 0) + 1
        states = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
        return f"slurm job {self.job_id}: {len(self.tasks)} tasks ({states}); trials recorded {recorded}/{self.total}"

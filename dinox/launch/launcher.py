"""What every launcher shares: the protocol a scheduler is reached through (render, submit, poll, one task
again), a submission's tasks and their states, the wait that follows them to the end, the store every task
must reach, and the count of the sweep's trials recorded there.

A submission is N tasks, task I (1..N) running `dinox run SPEC --shard I/N`: the sweep stays `dinox run`, and
a task submitted again alone measures only what its slice is missing (resume). A launcher turns that into
its scheduler's objects (Slurm: a job array's sbatch script; Kubernetes: an Indexed Job) and reads back each
task's state in the states below.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from dinox import record as rec
from dinox.contract import FINAL
from dinox.errors import DinoxError
from dinox.store.backend import TrackingError, check_reachable, resolve_tracking_uri, shown_uri, store_problem

# Where a task ends (Slurm's words, which every launcher's states are read into). PENDING, RUNNING,
# REQUEUED, SUSPENDED, ... are on their way.
TERMINAL = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)
GONE = "GONE"  # left the scheduler's memory before the wait saw it end: its log says how

# Stores a task on another host cannot share: each would write (or fail to find) its own.
_LOCAL_SCHEMES = ("sqlite", "file", "")


class LaunchError(DinoxError):
    """The scheduler refused the job, or its commands are not here."""


class ScriptValueError(DinoxError):
    """A value that cannot enter the job's script or manifest safely (exit 2): refused before anything is
    written."""


class SchedulerDown(LaunchError):
    """The scheduler did not answer a query: the job's state is unknown, not ended."""


@dataclass(frozen=True)
class Job:
    """One submission: where its files go (beside the tasks' logs) and what it runs."""

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


@dataclass(frozen=True)
class TaskState:
    state: str
    exit_code: str = ""  # the scheduler's exit code ("exit:signal" on Slurm)
    reason: str = ""

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL or self.state == GONE


class Launcher(Protocol):
    """A scheduler as `dinox submit` reaches it. `render` writes nothing; `submit` returns the job's id."""

    name: str  # "slurm", "kubernetes": the word in the wait's lines

    def render(self, job: Job, spec: Path, sets: tuple[str, ...], cwd: Path) -> dict[Path, str]:
        """The files the submission is made of (script, manifest), by path, every value checked or quoted: each
        task runs `dinox run SPEC --set ... --shard I/N`."""
        ...

    def submit(self, job: Job, files: dict[Path, str], env: dict[str, str]) -> str: ...

    def poll(self, job: Job, job_id: str, env: dict[str, str]) -> dict[int, TaskState]:
        """Each task the scheduler still knows ({} once it has forgotten the job); SchedulerDown when it does
        not answer."""
        ...

    def log(self, job: Job, task: int, job_id: str) -> str:
        """Where task's output is, in words a user can follow."""
        ...

    def again(self, job: Job, task: int) -> str:
        """The command that submits one task again alone."""
        ...

    def follow(self, job_id: str) -> tuple[str, str]:
        """The commands that follow the job outside dinox, and that cancel it."""
        ...


def compress(ids: tuple[int, ...]) -> str:
    """(1, 2, 3, 5) -> '1-3,5': sbatch's --array, and dinox submit's."""
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
    patience: float = 600.0  # seconds without an answer from the scheduler before the wait gives up
    clock: Callable[[], float] = time.monotonic
    seen: dict[int, TaskState] = field(default_factory=dict)
    scheduler: str = "slurm"  # its name, in the lines
    controller: str = "slurm controller"  # what stops answering
    follow: tuple[str, str] | None = None  # the commands that follow and cancel it (default: Slurm's)

    def run(self) -> dict[int, TaskState]:
        last, down_since = "", None
        while True:
            try:
                now = self.poll()
            except SchedulerDown as e:
                # The scheduler restarting is not the tasks ending: keep what was seen, ask again.
                if down_since is None:
                    down_since = self.clock()
                    self.echo(f"{self.controller} not answering ({e}); still following job {self.job_id}")
                elif self.clock() - down_since > self.patience:
                    follow = (
                        self.follow
                        or f"follow it with scontrol show job {self.job_id}, cancel it with scancel {self.job_id}"
                    )
                    raise LaunchError(
                        f"the {self.controller} has not answered for {self.patience:.0f} s ({e}); job {self.job_id} "
                        f"may still run and record: {follow}"
                    ) from None
                self.sleep(self.interval)
                continue
            if down_since is not None:
                self.echo(f"{self.controller} answers again")
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
                raise LaunchError(
                    f"{self.scheduler.capitalize()} does not know job {self.job_id}"
                    f"{' (scontrol show job)' if self.scheduler == 'slurm' else ''}: was it cancelled?"
                )
            self.sleep(self.interval)

    def line(self, recorded: int) -> str:
        counts: dict[str, int] = {}
        for task in self.tasks:
            state = self.seen.get(task, TaskState("PENDING")).state
            counts[state] = counts.get(state, 0) + 1
        states = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
        return (
            f"{self.scheduler} job {self.job_id}: {len(self.tasks)} tasks ({states}); "
            f"trials recorded {recorded}/{self.total}"
        )


def shared_store(tracking_uri: str | None) -> str:
    """The store every task can reach, or a one-line refusal (ScriptValueError, exit 2) with the fix."""
    uri = resolve_tracking_uri(tracking_uri)
    scheme = urllib.parse.urlsplit(uri).scheme.lower()
    if scheme in _LOCAL_SCHEMES or len(scheme) == 1:  # a Windows drive letter is a path too
        raise ScriptValueError(
            f"tracking store {shown_uri(uri)} is a local file: every array task would write its own on its own "
            "host; start one `mlflow server` the nodes reach and give its URL (--tracking-uri http://HOST:5000, or "
            "export MLFLOW_TRACKING_URI)"
        )
    if problem := store_problem(uri):
        raise ScriptValueError(f"tracking store {shown_uri(uri)}: {problem}")
    try:
        check_reachable(uri)
    except TrackingError as e:
        raise ScriptValueError(f"{e}: start it before submitting") from None
    return uri


def recorded_counter(uri: str, name: str, trial_ids: set[str]) -> Callable[[], int]:
    """How many of the sweep's trials the store holds for good (what resume would not measure again); the last
    count while the server is away for a moment (the tasks journal and sync)."""
    from dinox.store.recorder import SweepRecorder

    recorder: SweepRecorder | None = None
    last = 0

    def count() -> int:
        nonlocal recorder, last
        try:
            if recorder is None:
                recorder = SweepRecorder(uri)
                recorder.connect(name)
            records = recorder.recorded_trials()
        except DinoxError:
            return last
        last = len({r.tags.get(rec.TRIAL_ID) for r in records if r.status in FINAL} & trial_ids)
        return last

    return count

"""`dinox submit`: the sweep as a Slurm job array, read top to bottom: options, the spec and its trials, the
store every task records into, the script, the submission, and the wait."""

from __future__ import annotations

import os
import shutil
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import click

from dinox import record as rec
from dinox.cli.common import SET, TRACKING_URI, BadInput, load_trials
from dinox.errors import DinoxError
from dinox.launch import slurm
from dinox.store.backend import shown_uri
from dinox.writes import write_whole

# Stores a task on another host cannot share: each would write (or fail to find) its own.
_LOCAL_SCHEMES = ("sqlite", "file", "")


@click.command()
@click.argument("spec_file", metavar="SPEC")
@TRACKING_URI
@click.option("--tasks", type=click.IntRange(1), required=True, help="Array tasks: the sweep's slices, one each.")
@click.option(
    "--array",
    default=None,
    metavar="IDS",
    help="Submit only these task ids (2, or 1,3): a failed or preempted task again, its slice its own.",
)
@click.option("--partition", default=None, help="Slurm partition of every task.")
@click.option("--gpus-per-task", type=click.IntRange(0), default=None)
@click.option("--cpus-per-task", type=click.IntRange(1), default=None)
@click.option("--mem", default=None, metavar="SIZE", help="Memory per task, as sbatch writes it (64G).")
@click.option("--time", "time_limit", default=None, metavar="LIMIT", help="Time limit per task (06:00:00).")
@click.option("--parallel", type=click.IntRange(1), default=None, help="At most this many tasks at once.")
@click.option(
    "--sbatch-option",
    "extra",
    multiple=True,
    metavar="OPTION",
    help="Another sbatch option for every task, as written (--sbatch-option=--qos=high); repeatable.",
)
@click.option(
    "--workdir",
    default=".dinox",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the job's script, its tasks' logs and their journals go (a file system the nodes share).",
)
@click.option("--wait", is_flag=True, help="Follow the array to its end; exit 1 if a task did not complete.")
@SET
def submit(
    spec_file: str,
    tracking_uri: str | None,
    tasks: int,
    array: str | None,
    partition: str | None,
    gpus_per_task: int | None,
    cpus_per_task: int | None,
    mem: str | None,
    time_limit: str | None,
    parallel: int | None,
    extra: tuple[str, ...],
    workdir: str,
    wait: bool,
    sets: tuple[str, ...],
) -> None:
    """Submit SPEC's sweep to Slurm as a job array: task I runs `dinox run SPEC --shard I/TASKS`, every task
    recording into one tracking server (an embedded SQLite store is refused: each host would write its own).

    \b
    The script is kept with the tasks' logs; a task that failed or was preempted is submitted again alone with
    --array I (or `sbatch --array=I` on the script): resume measures only what its slice is missing. With
    --wait, a line whenever the tasks' states or the trials recorded change, and at the end each task that
    did not complete with its log. Exit code 0, 1 when a task did not complete (--wait), 2 for bad input.
    """
    _doc, trials = load_trials(spec_file, preflight=True, sets=sets)
    if tasks > len(trials):
        raise BadInput(f"--tasks {tasks}: the sweep has {len(trials)} trials; give at most {len(trials)}")
    ids = _array(array, tasks)
    name = trials[0].spec.name
    resources = slurm.Resources(partition, gpus_per_task, cpus_per_task, mem, time_limit, parallel, extra)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    job = slurm.Job(name, tasks, ids, Path(workdir).absolute() / "slurm" / f"{stamp}-{name}")
    slurm.check_script_values(resources, job.job_dir)  # before the store is asked anything
    uri = _shared_store(tracking_uri)
    run_args = [sys.executable, "-m", "dinox", "run", str(Path(spec_file).absolute())]
    run_args += [arg for s in sets for arg in ("--set", s)]
    _write_script(job, slurm.render(job, resources, run_args, job.job_dir, Path.cwd()))
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri)  # sbatch passes its environment on (--export=ALL)
    try:
        job_id = slurm.sbatch(job.script, env)
    except slurm.SlurmError:
        shutil.rmtree(job.job_dir, ignore_errors=True)  # nothing submitted: no script left to mistake for a job
        raise
    click.echo(
        f"dinox: {name!r} ({len(trials)} trials) submitted as Slurm job {job_id}: tasks "
        f"{slurm.compress(ids)} of {tasks} slices, recording into {shown_uri(uri)}"
    )
    click.echo(f"       script and logs: {job.job_dir}; one task again: dinox submit ... --array ID")
    if wait:
        _wait_for(job, job_id, uri, trials, env)
        click.echo(f"dinox: all {len(ids)} tasks completed; decide: dinox decide --spec {spec_file}")


def _wait_for(job: slurm.Job, job_id: str, uri: str, trials: list, env: dict[str, str]) -> None:
    """--wait: follow the array to its end; a signal stops only the following (exit 130)."""
    ids, name = job.array, trials[0].spec.name
    recorded = _recorded(uri, name, trials)
    from dinox.sweep.interrupts import Interrupted, signals_raise

    try:
        # Ctrl-C and SIGTERM stop the following, even where the shell started dinox with SIGINT ignored.
        with signals_raise():
            wait = slurm.Wait(job_id, ids, lambda: slurm.query(job_id, env), recorded, len(trials), click.echo)
            _follow(wait, job)
    except (KeyboardInterrupt, Interrupted):
        # Only the following stops: the job is Slurm's, and its tasks go on recording.
        click.echo(
            f"dinox: stopped following; job {job_id} runs on and records into the store. Follow it: "
            f"scontrol show job {job_id}; cancel it: scancel {job_id}",
            err=True,
        )
        sys.exit(130)


def _write_script(job: slurm.Job, text: str) -> None:
    """The script whole or not at all: written beside itself and renamed, so a full or unwritable workdir
    leaves no empty job.sbatch to be mistaken for a job, and no folder of the job's."""
    made = not job.job_dir.exists()
    try:
        job.job_dir.mkdir(parents=True, exist_ok=True)
        write_whole(job.script, text)
    except OSError as e:
        if made:
            shutil.rmtree(job.job_dir, ignore_errors=True)
        raise BadInput(f"--workdir: cannot write the job script in {str(job.job_dir)!r} ({e.strerror})") from None


def _follow(wait: slurm.Wait, job: slurm.Job) -> None:
    """The array to its end; each task that did not complete with its log and how to submit it again (exit 1)."""
    ended = wait.run()
    failed = [t for t in job.array if ended[t].state != "COMPLETED"]
    for t in failed:
        s = ended[t]
        click.echo(
            f"task {t} {s.state}{f' (exit {s.exit_code})' if s.exit_code else ''}: log {job.log(t, wait.job_id)}; "
            f"again: sbatch --array={t} {job.script}"
        )
    if failed:
        sys.exit(1)


def _array(text: str | None, tasks: int) -> tuple[int, ...]:
    if text is None:
        return tuple(range(1, tasks + 1))
    try:
        ids = tuple(sorted(set(slurm.expand(text, limit=tasks))))
    except ValueError as e:
        if "above" in str(e):
            raise BadInput(f"--array {text}: task ids run from 1 to --tasks {tasks}") from None
        raise BadInput(f"--array {text}: not a list of task ids (2, 1,3 or 1-3)") from None
    if not ids or ids[0] < 1 or ids[-1] > tasks:
        raise BadInput(f"--array {text}: task ids run from 1 to --tasks {tasks}")
    return ids


def _shared_store(tracking_uri: str | None) -> str:
    """The store every task can reach, or a one-line refusal with the fix."""
    from dinox.store.backend import TrackingError, check_reachable, resolve_tracking_uri, store_problem

    uri = resolve_tracking_uri(tracking_uri)
    scheme = urllib.parse.urlsplit(uri).scheme.lower()
    if scheme in _LOCAL_SCHEMES or len(scheme) == 1:  # a Windows drive letter is a path too
        raise BadInput(
            f"tracking store {shown_uri(uri)} is a local file: every array task would write its own on its own "
            "host; start "
            "one `mlflow server` the nodes reach and give its URL (--tracking-uri http://HOST:5000, or export "
            "MLFLOW_TRACKING_URI)"
        )
    if problem := store_problem(uri):
        raise BadInput(f"tracking store {shown_uri(uri)}: {problem}")
    try:
        check_reachable(uri)
    except TrackingError as e:
        raise BadInput(f"{e}: start it before submitting") from None
    return uri


def _recorded(uri: str, name: str, trials: list):
    """How many of the sweep's trials the store holds for good (what resume would not measure again)."""
    from dinox.store.recorder import SweepRecorder
    from dinox.sweep.outputs import FINAL

    wanted = {t.trial_id for t in trials}
    recorder: SweepRecorder | None = None

    last = 0

    def count() -> int:
        nonlocal recorder, last
        try:
            if recorder is None:
                recorder = SweepRecorder(uri)
                recorder.connect(name)
            records = recorder.recorded_trials()
        except DinoxError:  # the server away for a moment: the tasks journal and sync; the count waits
            return last
        last = len({r.tags.get(rec.TRIAL_ID) for r in records if r.status in FINAL} & wanted)
        return last

    return count

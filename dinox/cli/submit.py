"""`dinox submit`: the sweep handed to a cluster's scheduler (Slurm's job array, or a Kubernetes Indexed Job),
read top to bottom: options, the spec and its trials, the launcher, the store every task records into, the
files, the submission, and the wait."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from pathlib import Path

import click

from dinox.cli.common import SET, TRACKING_URI, BadInput, load_trials
from dinox.launch import launcher as launch
from dinox.launch import slurm
from dinox.store.backend import shown_uri
from dinox.writes import write_whole

# Options one launcher takes and the other has no use for: refused, never ignored.
_SLURM_ONLY = ("--partition", "--time", "--sbatch-option")
_KUBERNETES_ONLY = ("--image", "--namespace", "--volume")
_SHOWN = {"slurm": "Slurm", "kubernetes": "Kubernetes"}


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
@click.option("--wait", is_flag=True, help="Follow the tasks to their end; exit 1 if a task did not complete.")
@click.option(
    "--launcher",
    type=click.Choice(["slurm", "kubernetes"]),
    default="slurm",
    show_default=True,
    help="The scheduler: a Slurm job array (sbatch), or a Kubernetes Indexed Job (kubectl).",
)
@click.option("--image", default=None, help="Kubernetes: the container image (dinox and its torch stack in it).")
@click.option("--namespace", default=None, help="Kubernetes: the namespace (default: kubectl's context's).")
@click.option(
    "--volume",
    "volumes",
    multiple=True,
    metavar="CLAIM:PATH",
    help="Kubernetes: a PersistentVolumeClaim mounted at PATH in every pod (the data; the first one also keeps "
    "the tasks' journals); repeatable.",
)
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
    launcher: str,
    image: str | None,
    namespace: str | None,
    volumes: tuple[str, ...],
    sets: tuple[str, ...],
) -> None:
    """Submit SPEC's sweep to a scheduler: task I runs `dinox run SPEC --shard I/TASKS`, every task recording
    into one tracking server (an embedded SQLite store is refused: each host would write its own).

    \b
    Slurm (the default): a job array; its script is kept with the tasks' logs. Kubernetes (--launcher
    kubernetes --image IMAGE): an Indexed Job, the spec in a ConfigMap, the store's URI in a Secret; the
    manifest is kept in the workdir. A task that failed or was preempted is submitted again alone with
    --array I (Slurm: or `sbatch --array=I` on the script): resume measures only what its slice is missing.
    With --wait, a line whenever the tasks' states or the trials recorded change, and at the end each task
    that did not complete with its log. Exit code 0, 1 when a task did not complete (--wait), 2 for bad input.
    """
    _one_launchers_options(launcher, {"--partition": partition, "--time": time_limit, "--sbatch-option": extra,
                                      "--image": image, "--namespace": namespace, "--volume": volumes})  # fmt: skip
    doc, trials = load_trials(spec_file, preflight=True, sets=sets)
    if tasks > len(trials):
        raise BadInput(f"--tasks {tasks}: the sweep has {len(trials)} trials; give at most {len(trials)}")
    ids = _array(array, tasks)
    name = trials[0].spec.name
    stamp = time.strftime("%Y%m%d-%H%M%S")
    job = launch.Job(name, tasks, ids, Path(workdir).absolute() / launcher / f"{stamp}-{name}")
    if launcher == "slurm":
        resources = slurm.Resources(partition, gpus_per_task, cpus_per_task, mem, time_limit, parallel, extra)
        slurm.check_script_values(resources, job.job_dir)  # before the store is asked anything
        uri, chosen = launch.shared_store(tracking_uri), slurm.Slurm(resources)
    else:
        kube = _kubernetes(doc.path, image, namespace, volumes, gpus_per_task, cpus_per_task, mem, parallel)
        uri = launch.shared_store(tracking_uri)
        chosen = dataclasses.replace(kube, tracking_uri=uri)
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri)  # sbatch passes its environment on (--export=ALL)
    job_id = _render_and_submit(chosen, job, Path(spec_file), sets, env)
    click.echo(
        f"dinox: {name!r} ({len(trials)} trials) submitted as {_SHOWN[launcher]} job {job_id}: tasks "
        f"{launch.compress(ids)} of {tasks} slices, recording into {shown_uri(uri)}\n"
        f"       files and logs: {job.job_dir}; one task again: dinox submit ... --array ID"
    )
    for line in _entry_lines(trials, launcher):
        click.echo(line)
    if wait:
        _wait_for(chosen, job, job_id, uri, trials, env)
        click.echo(f"dinox: all {len(ids)} tasks completed; decide: dinox decide --spec {spec_file}")


def _entry_lines(trials: list, launcher: str) -> list[str]:
    """Where the tasks import a `kind: python` step from: it was imported and built here (preflight); a task
    finds it again only where the same folder is there."""
    from dinox.spec.objectives import PythonObjective

    entries = {(o.entry, o.path) for t in trials if isinstance(o := t.spec.objective, PythonObjective)}
    where = (
        f"each task starts in {Path.cwd()} (sbatch's script cds there): the folder must be on a file system the "
        "nodes share"
        if launcher == "slurm"
        else "the pods import it from the same folder in --image: the image must hold it there"
    )
    return [f"       objective.entry {e}: imported and built here from {p}; {where}" for e, p in sorted(entries)]


def _render_and_submit(
    chosen: launch.Launcher, job: launch.Job, spec: Path, sets: tuple[str, ...], env: dict[str, str]
) -> str:
    """The job's files written whole, then submitted; the job's id. Nothing submitted: no files left."""
    files = chosen.render(job, spec, sets, Path.cwd())
    _write_files(job, files)
    try:
        return chosen.submit(job, files, env)
    except launch.LaunchError:
        shutil.rmtree(job.job_dir, ignore_errors=True)  # no files left to mistake for a job
        raise


def _one_launchers_options(launcher: str, given: dict) -> None:
    """An option the chosen launcher has no use for is refused, naming it, never silently dropped."""
    other = _KUBERNETES_ONLY if launcher == "slurm" else _SLURM_ONLY
    wrong = [o for o in other if given[o]]
    if wrong:
        raise BadInput(f"{', '.join(wrong)}: not an option of --launcher {launcher}")
    if launcher == "kubernetes" and not given["--image"]:
        raise BadInput("--launcher kubernetes needs --image: the container image every task runs (dinox in it)")


def _kubernetes(spec_path, image, namespace, volumes, gpus, cpus, mem, parallel):  # noqa: ANN001, ANN202
    """The Kubernetes launcher, its values checked before the store is asked anything."""
    from dinox.launch import kubernetes

    try:
        spec_text = Path(spec_path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"{spec_path}: cannot read it for the ConfigMap ({e})") from None
    mounted = tuple(kubernetes.Volume.parse(v) for v in volumes)
    chosen = kubernetes.Kubernetes(image, spec_text, "", namespace, mounted, gpus, cpus, mem, parallel)
    chosen.check()
    return chosen


def _wait_for(
    chosen: launch.Launcher, job: launch.Job, job_id: str, uri: str, trials: list, env: dict[str, str]
) -> None:
    """--wait: follow the tasks to their end; a signal stops only the following (exit 130)."""
    recorded = launch.recorded_counter(uri, trials[0].spec.name, {t.trial_id for t in trials})
    from dinox.sweep.interrupts import Interrupted, signals_raise

    controller = "slurm controller" if chosen.name == "slurm" else "kubernetes API server"
    try:
        # Ctrl-C and SIGTERM stop the following, even where the shell started dinox with SIGINT ignored.
        with signals_raise():
            poll = lambda: chosen.poll(job, job_id, env)  # noqa: E731
            wait = launch.Wait(job_id, job.array, poll, recorded, len(trials), click.echo,
                               scheduler=chosen.name, controller=controller, follow=chosen.follow(job_id))  # fmt: skip
            _follow(wait, job, chosen)
    except (KeyboardInterrupt, Interrupted):
        # Only the following stops: the job is the scheduler's, and its tasks go on recording.
        look, cancel = chosen.follow(job_id)
        click.echo(
            f"dinox: stopped following; job {job_id} runs on and records into the store. Follow it: {look}; "
            f"cancel it: {cancel}",
            err=True,
        )
        sys.exit(130)


def _write_files(job: launch.Job, files: dict[Path, str]) -> None:
    """The script (or manifest) whole or not at all: written beside itself and renamed, so a full or unwritable
    workdir leaves no empty job.sbatch to be mistaken for a job, and no folder of the job's."""
    made = not job.job_dir.exists()
    try:
        job.job_dir.mkdir(parents=True, exist_ok=True)
        for path, text in files.items():
            write_whole(path, text)
    except OSError as e:
        if made:
            shutil.rmtree(job.job_dir, ignore_errors=True)
        raise BadInput(f"--workdir: cannot write the job script in {str(job.job_dir)!r} ({e.strerror})") from None


def _follow(wait: launch.Wait, job: launch.Job, chosen: launch.Launcher) -> None:
    """The tasks to their end; each that did not complete with its log and how to submit it again (exit 1)."""
    ended = wait.run()
    failed = [t for t in job.array if ended[t].state != "COMPLETED"]
    for t in failed:
        s = ended[t]
        click.echo(
            f"task {t} {s.state}{f' (exit {s.exit_code})' if s.exit_code else ''}: {chosen.log(job, t, wait.job_id)}; "
            f"again: {chosen.again(job, t)}"
        )
    if failed:
        sys.exit(1)


def _array(text: str | None, tasks: int) -> tuple[int, ...]:
    if text is None:
        return tuple(range(1, tasks + 1))
    try:
        ids = tuple(sorted(set(launch.expand(text, limit=tasks))))
    except ValueError as e:
        if "above" in str(e):
            raise BadInput(f"--array {text}: task ids run from 1 to --tasks {tasks}") from None
        raise BadInput(f"--array {text}: not a list of task ids (2, 1,3 or 1-3)") from None
    if not ids or ids[0] < 1 or ids[-1] > tasks:
        raise BadInput(f"--array {text}: task ids run from 1 to --tasks {tasks}")
    return ids

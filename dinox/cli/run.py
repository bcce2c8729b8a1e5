"""`dinox run`: a spec's trials measured, each in a child process of its own, and recorded in MLflow (the sweep:
dinox.sweep.run), with the fork server started first so its imports overlap with opening the store."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import click

from dinox.cli.common import (
    MAX_TRIALS,
    SET,
    SHRINK,
    SHRINK_IF,
    TRACKING_URI,
    BadInput,
    load_trials,
    machine_problems,
)

if TYPE_CHECKING:  # the command imports these when it runs: `dinox --help` stays quick
    from dinox.isolate.forkserver import ForkServer
    from dinox.isolate.slots import Request as DevicesRequest
    from dinox.plan.grid import Trial
    from dinox.spec.file import SpecDocument
    from dinox.sweep.run import SweepOptions


@click.command()
@click.argument("spec_file", metavar="SPEC")
@TRACKING_URI
@click.option(
    "--workdir",
    default=".dinox",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where each sweep keeps its local results, trial specs and child logs.",
)
@click.option("--force", is_flag=True, help="Measure every trial, also those the experiment already holds.")
@click.option(
    "--remeasure-unsettled",
    is_flag=True,
    help="Measure again the trials the experiment holds as ok but unsettled (timed windows that disagreed).",
)
@click.option("--no-prune", is_flag=True, help="Run larger batches even after a smaller one ran out of memory.")
@MAX_TRIALS
@click.option(
    "--isolation",
    type=click.Choice(["fork", "spawn"]),
    default="fork" if sys.platform == "linux" else "spawn",
    show_default=True,
    help="fork: each trial is forked from a process with torch and timm imported "
    "(cheap); spawn: each trial is a fresh interpreter (python -m dinox.measure.trial). Both: one process a trial.",
)
@click.option(
    "--shard",
    default=None,
    metavar="I/N|auto[/N]",
    help="Run only the I-th of N disjoint slices of the sweep (1/N ... N/N), e.g. one per host against "
    "one tracking server; resume makes a re-run of a shard measure only what is missing. auto: the slice "
    "of this Slurm array task (SLURM_ARRAY_TASK_ID) or Kubernetes indexed pod (JOB_COMPLETION_INDEX; "
    "the count from auto/N or DINOX_SHARD_COUNT).",
)
@click.option(
    "--devices",
    default=None,
    metavar="all|0,1,..|cpu:N",
    help="Run trials side by side, each on its own device (CUDA_VISIBLE_DEVICES) and its own equal share "
    "of the cores (its GPU's NUMA node where known); a hardware.gpus: N trial takes N devices. all: every "
    "CUDA device; cpu:N: N trials at once on disjoint cores. Default: one trial at a time on the whole machine.",
)
@click.option(
    "--skip-predicted-oom",
    is_flag=True,
    help="Record trials that `dinox plan` predicts to run out of memory as skipped, unmeasured.",
)
@click.option(
    "--no-system-metrics",
    is_flag=True,
    help="Do not sample CPU, memory and GPU utilisation into each trial run's system/ metrics.",
)
@click.option(
    "--profile",
    "profiles",
    multiple=True,
    metavar="TRIAL|all",
    help="Trace these trials' steps (measure.profile): a trial's number as its run's name starts, or its trial id; "
    "repeatable. They are measured again even where the experiment holds them.",
)
@SET
@SHRINK
@SHRINK_IF
def run(
    spec_file: str,
    tracking_uri: str | None,
    workdir: str,
    force: bool,
    remeasure_unsettled: bool,
    no_prune: bool,
    max_trials: int,
    isolation: Literal["fork", "spawn"],
    shard: str | None,
    devices: str | None,
    skip_predicted_oom: bool,
    no_system_metrics: bool,
    profiles: tuple[str, ...],
    sets: tuple[str, ...],
    shrink: bool,
    shrink_if: bool,
) -> None:
    """Measure every trial of SPEC, each in its own child process, and record it in MLflow.

    \b
    Each trial becomes a nested MLflow run (params: the trial; metrics: images_per_s, step_s_p50/p90,
    data_s, h2d_s, compute_s, peak memory, ...; tag dinox.status: ok | oom | error | crashed | timeout |
    skipped). A trial that fails never stops the sweep. Running the same spec again skips the trials the
    experiment already holds as ok / oom / skipped (--force measures them again, --remeasure-unsettled the ok
    ones whose timed windows disagreed); after an OOM, larger batches of the same configuration are recorded
    as skipped (--no-prune runs them). Every result is also kept in the sweep's results.jsonl; if the
    tracking store fails mid-sweep, `dinox sync` logs the rest.
    Exit code 0 when the sweep ran to the end (whatever the trials' statuses), 2 for bad input or an
    unusable tracking store, 130 when interrupted.
    """
    request = _devices(devices)
    doc, trials = load_trials(spec_file, max_trials, preflight=True, sets=sets, shrink=shrink or shrink_if)
    trials, again = _profiled(trials, profiles)
    trials, shard = _of_shard(trials, shard)
    if not trials:
        click.echo(f"dinox: shard {shard} of {spec_file} holds no trial; nothing to do")
        return
    if problems := machine_problems(doc, trials, sets):  # refused before torch is even imported
        from dinox.spec.file import SpecError

        raise SpecError(doc.path, problems)
    server = _started_server(isolation)
    from dinox.sweep.run import SweepOptions

    options = SweepOptions(
        force=force,
        prune=not no_prune,
        skip_predicted_oom=skip_predicted_oom,
        shard=shard or "",
        isolation=isolation,
        system_metrics=not no_system_metrics,
        live=sys.stdout.isatty(),
        devices=request,
        remeasure_unsettled=remeasure_unsettled,
        again=again,
    )
    _sweep(doc, trials, options, tracking_uri, Path(workdir), server)


def _started_server(isolation: str) -> ForkServer | None:
    """`--isolation fork`'s zygote, started now: it imports torch and timm (seconds) while this process imports
    MLflow and opens the store."""
    if isolation != "fork":
        return None
    from dinox.isolate.forkserver import ForkServer

    server = ForkServer()
    server.start()
    return server


def _devices(text: str | None) -> DevicesRequest | None:
    from dinox.isolate.slots import DevicesError, parse

    try:
        return parse(text) if text is not None else None
    except DevicesError as e:
        raise BadInput(f"--devices {e}") from None


def _sweep(
    doc: SpecDocument,
    trials: list[Trial],
    options: SweepOptions,
    tracking_uri: str | None,
    workdir: Path,
    server: ForkServer | None,
) -> None:
    from dinox.errors import WorkdirError
    from dinox.store.backend import resolve_tracking_uri
    from dinox.store.recorder import SweepRecorder
    from dinox.sweep.interrupts import Interrupted, SweepStopped
    from dinox.sweep.run import run_sweep

    uri = resolve_tracking_uri(tracking_uri)
    try:
        report = run_sweep(doc, trials, SweepRecorder(uri), workdir, options, click.echo, server)
    except WorkdirError as e:
        killed = getattr(e, "killed", 0)
        in_flight = f"the {killed} trials in flight are" if killed > 1 else "the trial in flight is" if killed else ""
        raise BadInput(
            f"{e.strerror}; the sweep stopped{f', {in_flight} marked KILLED' if in_flight else ''}; free space in "
            f"--workdir {workdir} and run it again (what was measured is kept; a resumed sweep measures the rest)"
        ) from None
    except SweepStopped as e:
        click.echo(f"dinox: {e}", err=True)
        sys.exit(130)
    except (KeyboardInterrupt, Interrupted) as e:
        why = str(e) if isinstance(e, Interrupted) else "interrupted by SIGINT"
        click.echo(f"dinox: {why} before the sweep opened; nothing was recorded", err=True)
        sys.exit(130)
    if report.parent_run_id:  # else nothing was left to measure, and the sweep said so
        try:
            for line, to_stderr in report.summary(uri):
                click.echo(line, err=to_stderr)
        except KeyboardInterrupt:  # the sweep is recorded and closed: only its summary is cut short
            click.echo("dinox: interrupted by SIGINT after the sweep was recorded and closed", err=True)
            sys.exit(130)


def _profiled(trials: list[Trial], names: tuple[str, ...]) -> tuple[list[Trial], frozenset[str]]:
    """--profile: the named trials with measure.profile on (not part of a trial's id), and their ids, which the
    sweep measures again even where recorded."""
    if not names:
        return trials, frozenset()
    by_name = {str(t.index + 1): t.trial_id for t in trials} | {t.trial_id: t.trial_id for t in trials}
    unknown = [n for n in names if n != "all" and n not in by_name]
    if unknown:
        raise BadInput(
            f"--profile {unknown[0]}: no such trial; give its number (1-{len(trials)}, as its run's name starts), "
            "its trial id, or all"
        )
    ids = {t.trial_id for t in trials} if "all" in names else {by_name[n] for n in names}

    def traced(t: Trial) -> Trial:
        measure = t.spec.measure.model_copy(update={"profile": True})
        return dataclasses.replace(t, spec=t.spec.model_copy(update={"measure": measure}))

    return [traced(t) if t.trial_id in ids else t for t in trials], frozenset(ids)


def _of_shard(trials: list[Trial], shard: str | None) -> tuple[list[Trial], str | None]:
    """The trials of this process's slice, and the slice as I/N (`auto` read from the scheduler's variables)."""
    if shard is None:
        return trials, None
    from dinox.plan.grid import shard as shard_of
    from dinox.sweep import shards as shard_env

    try:
        picked = shard_env.resolve(shard, os.environ)
    except shard_env.ShardEnvError as e:
        raise BadInput(f"--shard {e}") from None
    if picked is not None:
        click.echo(f"dinox: shard {picked.spec} ({picked.source})")
        shard = picked.spec
    try:
        return shard_of(trials, shard), shard
    except ValueError as e:
        raise BadInput(f"--shard {e}") from None

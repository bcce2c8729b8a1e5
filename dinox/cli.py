"""The dinox command line: a thin click group. Heavy modules are imported inside command bodies."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click

EXIT_BAD_INPUT = 2


class BadInput(click.ClickException):
    """Bad input or an unusable store: exit 2 and one line (or one per problem), never a traceback. click's
    own errors print "Error: ..." and exit 1; dinox keeps exit code 1 for a NO-GO."""

    exit_code = EXIT_BAD_INPUT

    def show(self, file=None) -> None:  # noqa: ANN001 - click's signature
        message = self.format_message()
        click.echo(message if "\n" in message else f"error: {message}", err=True)


def _load(path: str, max_trials: int | None = 1000, preflight: bool = False, sets: tuple[str, ...] = ()):
    """The spec (with any --set overrides) and its trials, or exit 2 with one line per problem. With preflight,
    also the model names and data files (this imports timm, so it is kept to the commands that need it)."""
    from dinox import grid, overrides, spec_file

    items = overrides.parse(sets)
    try:
        doc = overrides.apply(spec_file.load(path), items)
        trials = grid.expand(doc, max_trials)
        if preflight:
            from dinox.preflight import check

            problems = check(doc, trials)
            if problems:
                raise spec_file.SpecError(doc.path, problems)
        return doc, trials
    except spec_file.SpecError as e:
        e.problems = [_named_override(p, items) for p in e.problems]
        raise BadInput(e.render()) from None


def _named_override(problem, items: list[tuple[str, str | None]]):
    """A problem in a value set on the command line says so."""
    import dataclasses

    key, raw = next(((k, v) for k, v in items if problem.path == k or problem.path.startswith(k + ".")), ("", None))
    if not key or "--set" in problem.message:
        return problem
    return dataclasses.replace(problem, message=f"{problem.message} (from --set {key}={raw})")


TRACKING_URI = click.option(
    "--tracking-uri",
    default=None,
    metavar="URI",
    help="MLflow store; default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in this directory.",
)
SET = click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a fixed field of the spec (dotted path as in sweep, value read as YAML); repeatable, or "
    "several separated by ';'. Example: --set batch.size=32 --set data.index_csv=/data/idx.csv",
)
MAX_TRIALS = click.option(
    "--max-trials",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Refuse sweeps that expand to more trials than this.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dinox")
def main() -> None:
    """dinox measures real training steps over a grid of configurations, records each as an MLflow run,
    and tells whether a training schedule fits a compute budget.

    \b
    Typical flow:
      dinox validate specs/quickstart.yaml   # is the spec right?
      dinox plan specs/quickstart.yaml       # which trials will run?
      dinox run specs/quickstart.yaml        # measure them, record in MLflow
    """


@main.command()
@click.argument("spec_files", metavar="SPEC...", nargs=-1, required=True)
@MAX_TRIALS
@SET
def validate(spec_files: tuple[str, ...], max_trials: int, sets: tuple[str, ...]) -> None:
    """Check each SPEC and every trial its sweep expands to, without running anything: fields,
    contradictions, timm model names, data files.

    Prints a one-line OK per spec, or one line per problem (file:line: field.path: message) and exits 2.
    """
    failed = False
    for spec_file in spec_files:
        try:
            _doc, trials = _load(spec_file, max_trials, preflight=True, sets=sets)
        except BadInput as e:
            e.show()
            failed = True  # check the other specs too
            continue
        click.echo(
            f"OK {spec_file}: {len(trials)} trial{'s' if len(trials) != 1 else ''}, experiment {trials[0].spec.name!r}"
        )
    if failed:
        sys.exit(EXIT_BAD_INPUT)


@main.command()
def schema() -> None:
    """Print the spec file's JSON Schema (for editor completion: see specs/dinox.schema.json)."""
    from dinox.schema import render

    click.echo(render(), nl=False)


@main.command()
@click.argument("spec_file", metavar="SPEC")
@MAX_TRIALS
@click.option("--no-estimate", is_flag=True, help="Only the table of trials: no memory or FLOPs estimate.")
@SET
def plan(spec_file: str, max_trials: int, no_estimate: bool, sets: tuple[str, ...]) -> None:
    """Show the trials SPEC expands to, in the order `run` measures them, with what each will cost.

    \b
    Nothing is measured. Unless --no-estimate, a child process runs one training step of each model on
    torch's meta device (no memory, no compute) and the table gains: training GFLOPs per image (forward +
    backward, no recomputation); predicted device memory (weights, gradients, optimizer state, the tensors
    saved for backward at the trial's batch, checkpointing and precision; on the CPU also the process
    itself); the loader's host RAM (workers x prefetch x batch bytes, plus a pinned copy); and OOM? for
    trials predicted to exceed 95% of the device (or hardware.memory_limit_gb) or of host memory. `dinox run
    --skip-predicted-oom` skips those.
    """
    _doc, trials = _load(spec_file, max_trials, sets=sets)
    estimates = None
    if not no_estimate:
        import tempfile

        from dinox import runner
        from dinox.footprint import Estimates

        with tempfile.TemporaryDirectory(prefix="dinox-plan-") as tmp:
            data, failure = runner.run_estimate(Estimates.request([t.spec for t in trials]), Path(tmp))
        estimates = Estimates.parse(data, failure)
    from dinox.plan_table import render

    for line in render(trials, estimates):
        click.echo(line)


@main.command()
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
@click.option("--no-prune", is_flag=True, help="Run larger batches even after a smaller one ran out of memory.")
@MAX_TRIALS
@click.option(
    "--isolation",
    type=click.Choice(["fork", "spawn"]),
    default="fork" if sys.platform == "linux" else "spawn",
    show_default=True,
    help="fork: each trial is forked from a process with torch and timm imported "
    "(cheap); spawn: each trial is a fresh interpreter (python -m dinox.trial). Both: one process a trial.",
)
@click.option(
    "--shard",
    default=None,
    metavar="I/N",
    help="Run only the I-th of N disjoint slices of the sweep (1/N ... N/N), e.g. one per host against "
    "one tracking server; resume makes a re-run of a shard measure only what is missing.",
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
@SET
def run(
    spec_file: str,
    tracking_uri: str | None,
    workdir: str,
    force: bool,
    no_prune: bool,
    max_trials: int,
    isolation: str,
    shard: str | None,
    skip_predicted_oom: bool,
    no_system_metrics: bool,
    sets: tuple[str, ...],
) -> None:
    """Measure every trial of SPEC, each in its own child process, and record it in MLflow.

    \b
    Each trial becomes a nested MLflow run (params: the trial; metrics: images_per_s, step_s_p50/p90,
    data_s, h2d_s, compute_s, peak memory, ...; tag dinox.status: ok | oom | error | crashed | timeout |
    skipped). A trial that fails never stops the sweep. Running the same spec again skips the trials the
    experiment already holds as ok / oom / skipped (--force measures them again); after an OOM, larger
    batches of the same configuration are recorded as skipped (--no-prune runs them). Every result is also
    kept in the sweep's results.jsonl; if the tracking store fails mid-sweep, `dinox sync` logs the rest.
    Exit code 0 when the sweep ran to the end (whatever the trials' statuses), 2 for bad input or an
    unusable tracking store, 130 when interrupted.
    """
    doc, trials = _load(spec_file, max_trials, preflight=True, sets=sets)
    trials = _of_shard(trials, shard)
    if not trials:
        click.echo(f"dinox: shard {shard} of {spec_file} holds no trial; nothing to do")
        return
    from dinox.device_check import missing_message, without_torch

    for kind in sorted({t.spec.hardware.device for t in trials}):
        if has := without_torch(kind):
            raise BadInput(missing_message(spec_file, kind, has))
    from dinox.forkserver import ForkServer

    # The fork server imports torch and timm (seconds) while this process imports MLflow and opens the store.
    server = ForkServer() if isolation == "fork" else None
    if server is not None:
        server.start()
    from dinox.interrupts import Interrupted
    from dinox.journal import WorkdirError
    from dinox.store import TrackingError, resolve_tracking_uri
    from dinox.sweep import DeviceMissing, SweepOptions, run_sweep
    from dinox.tracking import SweepRecorder

    uri = resolve_tracking_uri(tracking_uri)
    live = sys.stdout.isatty()
    options = SweepOptions(force, not no_prune, skip_predicted_oom, shard or "", isolation, not no_system_metrics, live)
    try:
        report = run_sweep(doc, trials, SweepRecorder(uri), Path(workdir), options, click.echo, server)
    except (TrackingError, DeviceMissing) as e:
        raise BadInput(str(e)) from None
    except WorkdirError as e:
        raise BadInput(
            f"{e.strerror}; the sweep stopped, the trial in flight is marked KILLED; free space in --workdir "
            f"{workdir} and run it again (what was measured is kept; a resumed sweep measures the rest)"
        ) from None
    except (KeyboardInterrupt, Interrupted) as e:
        click.echo(f"dinox: {e or 'interrupted'}; the trial in flight and the sweep are marked KILLED", err=True)
        sys.exit(130)
    if report.parent_run_id:  # else nothing was left to measure, and the sweep said so
        for line, to_stderr in report.summary(uri):
            click.echo(line, err=to_stderr)


def _of_shard(trials: list, shard: str | None) -> list:
    if shard is None:
        return trials
    from dinox.grid import shard as shard_of

    try:
        return shard_of(trials, shard)
    except ValueError as e:
        raise BadInput(f"--shard {e}") from None


@main.command()
@click.option(
    "--experiment",
    "experiments",
    multiple=True,
    metavar="NAME",
    help="Experiment whose trial runs to read (repeatable). Default: the --spec's name.",
)
@click.option(
    "--run-id", "run_ids", multiple=True, metavar="ID", help="A sweep's parent run: read its trial runs (repeatable)."
)
@TRACKING_URI
@click.option(
    "--out",
    "out_dir",
    default="decision",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where report.md, decision.json and the plots go.",
)
@click.option("--spec", "spec_file", default=None, metavar="SPEC", help="Take the budget (and experiment) from SPEC.")
@click.option("--days", type=float, default=None, help="Compute budget in days.")
@click.option("--dataset-size", type=int, default=None, help="Images per epoch (with --epochs).")
@click.option("--epochs", type=float, default=None, help="Epochs of the schedule (with --dataset-size).")
@click.option("--target-images", type=int, default=None, help="The schedule as a number of images.")
@click.option(
    "--utilization",
    type=float,
    default=1.0,
    show_default=True,
    help="Share of wall time a real run spends in training steps (evaluation, checkpoints, restarts).",
)
@click.option(
    "--effective-batch",
    type=int,
    default=None,
    help="Only trials with this effective batch count (the recipe needs it).",
)
@click.option(
    "--max-memory-share",
    type=float,
    default=0.90,
    show_default=True,
    help="Trials whose peak reserved memory is above this share of the device are not recommended.",
)
@click.option(
    "--knee-tolerance",
    type=float,
    default=0.05,
    show_default=True,
    help="The worker knee: fewest workers within this share of the best throughput.",
)
@click.option(
    "--exclude-unstable",
    is_flag=True,
    help="Do not recommend trials tagged unstable (timed windows that disagree); by default they are only flagged.",
)
@click.option("--no-log", is_flag=True, help="Do not record the decision as an MLflow run.")
def decide(
    experiments: tuple[str, ...],
    run_ids: tuple[str, ...],
    tracking_uri: str | None,
    out_dir: str,
    spec_file: str | None,
    days: float | None,
    dataset_size: int | None,
    epochs: float | None,
    target_images: int | None,
    utilization: float,
    effective_batch: int | None,
    max_memory_share: float,
    knee_tolerance: float,
    exclude_unstable: bool,
    no_log: bool,
) -> None:
    """GO / NO-GO: can the schedule finish inside the budget, on the trials recorded in MLflow?

    \b
    Reads trial runs (tag dinox.status) of --experiment NAME(s) or of sweep --run-id(s), takes the budget
    from --spec and/or --days with --dataset-size and --epochs (or --target-images), and writes report.md,
    decision.json and PNG plots to --out, also logged as artifacts of a dinox.role=decision run.
    Exit code: 0 GO, 1 NO-GO, 2 error.
    """
    from dinox.budget import DecisionError, merge_budget
    from dinox.decide import Policy
    from dinox.deciding import DecideRequest
    from dinox.deciding import run as run_decision
    from dinox.store import TrackingError, resolve_tracking_uri

    base: dict = {}
    names = list(experiments)
    if spec_file:
        _doc, trials = _load(spec_file, None)
        base = trials[0].spec.budget.model_dump() if trials[0].spec.budget is not None else {}
        names = names or ([] if run_ids else [trials[0].spec.name])
    if not names and not run_ids:
        raise BadInput("give --experiment NAME, --run-id ID or --spec SPEC to say which trials to decide on")
    try:
        budget = merge_budget(base, days, dataset_size, epochs, target_images, utilization)
        policy = Policy(max_memory_share, effective_batch, knee_tolerance, exclude_unstable)
        uri = resolve_tracking_uri(tracking_uri)
        request = DecideRequest(uri, names, list(run_ids), budget, policy, Path(out_dir), log=not no_log)
        decision = run_decision(request, click.echo)
    except (DecisionError, TrackingError) as e:
        raise BadInput(str(e)) from None
    sys.exit(0 if decision.verdict == "GO" else 1)


@main.command()
@click.option("--dicom-root", required=True, type=click.Path(file_okay=False), help="Tree of DICOM series.")
@click.option(
    "--out-root", required=True, type=click.Path(file_okay=False), help="Where the PNG series and _index/index.csv go."
)
@click.option("--force", is_flag=True, help="Convert every series again, even those already done.")
@click.option(
    "--min-slices",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Skip series with fewer readable slices (scouts, localizers).",
)
def preprocess(dicom_root: str, out_root: str, force: bool, min_slices: int) -> None:
    """Convert DICOM CT series to lossless 16-bit PNG slices (HU + 32768) and one index.csv.

    \b
    Slices are converted to Hounsfield units (RescaleSlope / RescaleIntercept) and ordered by position.
    Incremental: a series already converted is re-indexed, not converted again (--force rebuilds).
    Unreadable, non-DICOM, non-CT, truncated or compressed-without-decoder input is skipped and reported.
    """
    from dinox.data.dicom_preprocess import PreprocessError, render_summary
    from dinox.data.dicom_preprocess import preprocess as run_preprocess

    if not Path(dicom_root).is_dir():
        raise BadInput(f"--dicom-root {dicom_root}: no such directory")
    try:
        summary = run_preprocess(dicom_root, out_root, force=force, min_slices=min_slices)
    except PreprocessError as e:
        raise BadInput(str(e)) from None
    click.echo(render_summary(summary))
    if not summary.slices_indexed:
        raise BadInput(f"no CT series with at least {min_slices} readable slices under {dicom_root}")


@main.command()
@click.option("--index-csv", required=True, type=click.Path(dir_okay=False), help="index.csv from dinox preprocess.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder for the .tar shards.")
@click.option(
    "--root",
    default=None,
    type=click.Path(file_okay=False),
    help="Folder png_path is relative to; default: the folder above _index/.",
)
@click.option("--shard-size", type=click.IntRange(min=1), default=1000, show_default=True, help="Samples per shard.")
def shards(index_csv: str, out_dir: str, root: str | None, shard_size: int) -> None:
    """Write webdataset tar shards from an index: each sample keeps its three slices (z-1, z, z+1) as the
    lossless 16-bit PNGs, for `data: {source: webdataset, shards: DIR}`."""
    from dinox.data.ct_png import DataError
    from dinox.data.webdataset_source import write_shards

    try:
        paths = write_shards(index_csv, out_dir, root=root, shard_size=shard_size)
    except (DataError, OSError) as e:
        raise BadInput(str(e)) from None
    click.echo(f"wrote {len(paths)} shard{'s' if len(paths) != 1 else ''} to {out_dir}")


@main.command()
@click.argument("sweep_dirs", nargs=-1, type=click.Path(file_okay=False), metavar="[SWEEP_DIR]...")
@click.option(
    "--workdir",
    default=".dinox",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Without SWEEP_DIRs: every sweep under here with results not yet in the store.",
)
@click.option("--tracking-uri", default=None, metavar="URI", help="Override the store the sweep was run against.")
def sync(sweep_dirs: tuple[str, ...], workdir: str, tracking_uri: str | None) -> None:
    """Log the results a sweep kept locally while the tracking store was unreachable.

    Each result is logged once: one already in the store (found by its dinox.result_id tag) is not
    written again. Exit code 0 when everything is in the store, 2 when the store is still unreachable.
    """
    from dinox.store import TrackingError
    from dinox.sync import SyncError, pending_sweeps, sync_sweep

    dirs = [Path(d) for d in sweep_dirs] or pending_sweeps(Path(workdir))
    if not dirs:
        click.echo(f"nothing to sync under {workdir}")
        return
    failed = 0
    for d in dirs:  # one sweep's problem never keeps the others from syncing
        try:
            sync_sweep(d, tracking_uri, click.echo)
        except SyncError as e:
            failed += 1
            click.echo(f"error: sync {e}", err=True)
        except TrackingError as e:
            failed += 1
            click.echo(
                f"error: sync {d}: tracking store unreachable or failing ({e}); nothing lost, try again later", err=True
            )
    if failed:
        sys.exit(EXIT_BAD_INPUT)


@main.command()
@TRACKING_URI
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. The default keeps the UI on this machine; 0.0.0.0 exposes it to "
    "every network the machine is on, without authentication.",
)
@click.option("--port", type=click.IntRange(1, 65535), default=5000, show_default=True)
def ui(tracking_uri: str | None, host: str, port: int) -> None:
    """Open the MLflow UI on the sweeps' store (`mlflow ui`), listening on 127.0.0.1 unless told otherwise."""
    from dinox.store import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    if uri.startswith(("http://", "https://")):
        raise BadInput(f"{uri} is a tracking server: open it in a browser, it serves its own UI")
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: the UI listens on {host}, reachable by others, with no authentication", err=True)
    click.echo(f"MLflow UI on http://{host}:{port} for {uri} (Ctrl-C to stop)")
    # One user's UI: one worker starts in a fraction of the time of MLflow's default four, and the job
    # runner MLflow 3 starts beside it (for its GenAI features) has nothing to do for dinox's runs.
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        uri,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    os.execv(sys.executable, command)


def entry() -> None:
    """The `dinox` command: the click group, then a quick exit. Once a command has returned, everything it
    wrote is flushed and closed; interpreter teardown would only unload torch and MLflow (about 2.5 s here)."""
    try:
        main(prog_name="dinox")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if isinstance(e.code, str):
            click.echo(e.code, err=True)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()

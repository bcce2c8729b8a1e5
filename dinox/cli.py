"""The dinox command line: a thin click group. Heavy modules are imported inside command bodies."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import click

EXIT_BAD_INPUT = 2


def _fail(message: str) -> None:
    click.echo(f"error: {message}" if "\n" not in message else message, err=True)
    sys.exit(EXIT_BAD_INPUT)


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
        _fail(e.render())


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
        except SystemExit:
            failed = True  # its problems are printed; check the other specs too
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
    swept = list(dict.fromkeys(k for t in trials for k in t.overrides))
    header = ["#", "trial_id", *swept, "model", "img", "batch", "accum", "effective", "precision", "workers"]
    if estimates is not None:
        header += ["GFLOP/img", "device GB", "loader GB", "OOM?"]
    rows = []
    for t in trials:
        s = t.spec
        if s.batch.auto:  # what the batch search leaves open
            accum, effective = str(s.batch.accumulation or "auto"), str(s.batch.effective or "auto")
        else:
            accum, effective = str(s.accumulation), str(s.effective_batch)
        row = [
            str(t.index + 1),
            t.trial_id[:8],
            *(str(t.overrides.get(k, "")) for k in swept),
            s.model.name,
            str(s.model.img_size),
            str(s.batch.size),
            accum,
            effective,
            s.precision,
            str(s.loader.num_workers),
        ]
        if estimates is not None:
            cost = estimates.cost(s)
            mem = None if s.batch.auto else estimates.memory(s)
            row += [
                f"{cost.flops_per_image / 1e9:.1f}" if cost else "-",
                f"{mem.device_gb:.2f}" if mem else "-",
                f"{mem.loader_host_gb:.2f}" if mem else "-",
                "OOM" if mem and mem.over else "",
            ]
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    budget = trials[0].spec.measure
    click.echo(
        f"{len(trials)} trials; each: {budget.warmup_steps} warm-up + {budget.repeats} x "
        f"{budget.bench_steps} timed optimizer steps, timeout {budget.timeout_s:g}s"
    )
    if estimates is None:
        return
    m = estimates.machine
    if m is None:
        click.echo(f"no memory plan: {estimates.why_missing(trials[0].spec) or 'no estimate'}")
    else:
        limit = f"{m.device_total_gb:.1f} GB" if m.device_total_gb is not None else "unknown memory"
        click.echo(f"estimated for {m.device} ({m.device_name}, {limit}; host {m.host_total_gb:.1f} GB)")
    for t in trials:
        mem = None if t.spec.batch.auto else estimates.memory(t.spec)
        if mem is not None and mem.over:
            click.echo(f"  #{t.index + 1} predicted OOM: {mem.over}")
        elif estimates.cost(t.spec) is None:
            click.echo(f"  #{t.index + 1} no estimate: {estimates.why_missing(t.spec) or 'unknown'}")


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
    if shard is not None:
        from dinox.grid import shard as shard_of

        try:
            trials = shard_of(trials, shard)
        except ValueError as e:
            _fail(f"--shard {e}")
        if not trials:
            click.echo(f"dinox: shard {shard} of {spec_file} holds no trial; nothing to do")
            return
    from dinox.device_check import missing_message, without_torch

    for kind in sorted({t.spec.hardware.device for t in trials}):
        if has := without_torch(kind):
            _fail(missing_message(spec_file, kind, has))
    from dinox.forkserver import ForkServer

    # The fork server imports torch and timm (seconds) while this process imports MLflow and opens the store.
    server = ForkServer() if isolation == "fork" else None
    if server is not None:
        server.start()
    from dinox.interrupts import Interrupted
    from dinox.journal import WorkdirError
    from dinox.store import TrackingError, resolve_tracking_uri
    from dinox.sweep import DeviceMissing, run_sweep
    from dinox.tracking import SweepRecorder, result_summary

    uri = resolve_tracking_uri(tracking_uri)
    try:
        recorder = SweepRecorder(uri)
        report = run_sweep(
            doc,
            trials,
            recorder=recorder,
            workdir=Path(workdir),
            echo=click.echo,
            force=force,
            prune=not no_prune,
            isolation=isolation,
            skip_predicted_oom=skip_predicted_oom,
            shard=shard or "",
            server=server,
            system_metrics=not no_system_metrics,
            live=sys.stdout.isatty(),
        )
    except (TrackingError, DeviceMissing) as e:
        _fail(str(e))
    except WorkdirError as e:
        _fail(
            f"{e.strerror}; the sweep stopped, the trial in flight is marked KILLED; free space in --workdir "
            f"{workdir} and run it again (what was measured is kept; a resumed sweep measures the rest)"
        )
    except (KeyboardInterrupt, Interrupted) as e:
        click.echo(f"dinox: {e or 'interrupted'}; the trial in flight and the sweep are marked KILLED", err=True)
        sys.exit(130)
    if not report.parent_run_id:
        return  # nothing was left to measure: the sweep said so
    counts = ", ".join(f"{n} {s}" for s, n in sorted(result_summary(report.results).items())) or "nothing run"
    resumed = f"; {len(report.resumed)} already recorded" if report.resumed else ""
    click.echo(
        f"dinox: sweep done in {report.wall_s:.1f}s: {counts}{resumed}. Results: {report.sweep_dir / 'results.csv'}"
    )
    t = report.timeline()
    if t:
        click.echo(
            f"       per trial (mean): start-up {t['startup_s']:.1f}s, setup {t['setup_s']:.1f}s, "
            f"measurement {t['measure_s']:.1f}s, teardown {t['teardown_s']:.1f}s, "
            f"recording {t['recording_s']:.1f}s"
        )
    if report.store_failures:
        click.echo(
            f"warning: {report.store_failures} tracking store call(s) failed; run `dinox sync "
            f"{report.sweep_dir}` once the store is back",
            err=True,
        )
    if uri.startswith("sqlite:///"):
        click.echo(f"       browse: mlflow ui --backend-store-uri {uri}  (then open http://127.0.0.1:5000)")


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
    from dinox import decide as decide_mod
    from dinox import report as report_mod
    from dinox.readback import fetch_trials, log_decision
    from dinox.store import TrackingError, resolve_tracking_uri

    base: dict = {}
    names = list(experiments)
    if spec_file:
        _doc, trials = _load(spec_file, None)
        budget_spec = trials[0].spec.budget
        if budget_spec is not None:
            base = budget_spec.model_dump()
        if not names and not run_ids:
            names = [trials[0].spec.name]
    if not names and not run_ids:
        _fail("give --experiment NAME, --run-id ID or --spec SPEC to say which trials to decide on")
    try:
        budget = decide_mod.merge_budget(base, days, dataset_size, epochs, target_images, utilization)
        policy = decide_mod.Policy(max_memory_share, effective_batch, knee_tolerance, exclude_unstable)
        uri = resolve_tracking_uri(tracking_uri)
        records, sources, home = fetch_trials(uri, names, list(run_ids))
        if not records:
            _fail(f"no dinox trial runs (tag dinox.status) in {', '.join(sources)} at {uri}")
        decision = decide_mod.decide(records, budget, policy)
    except (decide_mod.DecisionError, TrackingError) as e:
        _fail(str(e))
    decision.sources = sources
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from dinox.plots import write_plots

    plots = write_plots(decision, records, out)
    report = out / "report.md"
    text = report_mod.render_markdown(decision, [p.name for p in plots])
    report.write_text(text)
    from dinox.report_html import render_html

    page = out / "report.html"
    page.write_text(render_html(text, decision.verdict, out))
    payload = report_mod.to_json(decision)
    (out / "decision.json").write_text(json.dumps(payload, indent=2) + "\n")
    click.echo(report_mod.render_terminal(decision))
    click.echo(f"report: {report} ({page.name} beside it)  decision: {out / 'decision.json'}")
    if not no_log:
        try:
            files = [report, page, out / "decision.json", *plots]
            params, metrics = report_mod.log_params(decision), report_mod.log_metrics(decision)
            note = f"**{decision.verdict}**\n\n```\n{report_mod.render_terminal(decision)}\n```"
            run_id = log_decision(uri, home, decision.verdict, params, metrics, files, note)
        except TrackingError as e:
            _fail(str(e))
        click.echo(f"logged as decision run {run_id}")
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
        _fail(f"--dicom-root {dicom_root}: no such directory")
    try:
        summary = run_preprocess(dicom_root, out_root, force=force, min_slices=min_slices)
    except PreprocessError as e:
        _fail(str(e))
    click.echo(render_summary(summary))
    if not summary.slices_indexed:
        _fail(f"no CT series with at least {min_slices} readable slices under {dicom_root}")


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
        _fail(str(e))
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
        _fail(f"{uri} is a tracking server: open it in a browser, it serves its own UI")
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

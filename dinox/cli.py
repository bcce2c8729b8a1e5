"""The dinox command line: a thin click group. Heavy modules are imported inside command bodies."""

from __future__ import annotations

import sys
from pathlib import Path

import click

EXIT_BAD_INPUT = 2


def _fail(message: str) -> None:
    click.echo(f"error: {message}" if "\n" not in message else message, err=True)
    sys.exit(EXIT_BAD_INPUT)


def _load(path: str):
    from dinox import grid, spec

    try:
        doc = spec.load(path)
        return doc, grid.expand(doc)
    except spec.SpecError as e:
        _fail(e.render())


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
@click.argument("spec_file", metavar="SPEC")
def validate(spec_file: str) -> None:
    """Check SPEC and every trial its sweep expands to, without running anything.

    Prints a one-line OK, or one line per problem (file:line: field.path: message) and exits 2.
    """
    _doc, trials = _load(spec_file)
    click.echo(f"OK {spec_file}: {len(trials)} trial{'s' if len(trials) != 1 else ''}, "
               f"experiment {trials[0].spec.name!r}")  # fmt: skip


@main.command()
@click.argument("spec_file", metavar="SPEC")
def plan(spec_file: str) -> None:
    """Show the trials SPEC expands to, in the order `run` measures them (nothing is measured)."""
    _doc, trials = _load(spec_file)
    swept = list(dict.fromkeys(k for t in trials for k in t.overrides))
    header = ["#", "trial_id", *swept, "model", "img", "batch", "accum", "effective", "precision", "workers"]
    rows = []
    for t in trials:
        s = t.spec
        rows.append([
            str(t.index + 1), t.trial_id[:8], *(str(t.overrides.get(k, "")) for k in swept), s.model.name,
            str(s.model.img_size), str(s.batch.size), str(s.accumulation), str(s.effective_batch), s.precision,
            str(s.loader.num_workers),
        ])  # fmt: skip
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    budget = trials[0].spec.measure
    click.echo(f"{len(trials)} trials; each: {budget.warmup_steps} warm-up + {budget.bench_steps} timed "
               f"optimizer steps, timeout {budget.timeout_s:g}s")  # fmt: skip


@main.command()
@click.argument("spec_file", metavar="SPEC")
@click.option(
    "--tracking-uri",
    default=None,
    metavar="URI",
    help="MLflow store; default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in this directory.",
)
@click.option("--workdir", default=".dinox", show_default=True, type=click.Path(file_okay=False),
              help="Where each sweep keeps its local results, trial specs and child logs.")  # fmt: skip
def run(spec_file: str, tracking_uri: str | None, workdir: str) -> None:
    """Measure every trial of SPEC, each in its own child process, and record it in MLflow.

    \b
    Each trial becomes a nested MLflow run (params: the trial; metrics: images_per_s, step_s_p50/p90,
    data_s, h2d_s, compute_s, peak memory, ...; tag dinox.status: ok | oom | error | crashed | timeout).
    A trial that fails never stops the sweep. Exit code 0 when the sweep ran to the end (whatever the
    trials' statuses), 2 for bad input or an unusable tracking store, 130 when interrupted.
    """
    doc, trials = _load(spec_file)
    from dinox.sweep import Interrupted, run_sweep
    from dinox.tracking import SweepRecorder, TrackingError, resolve_tracking_uri, result_summary

    uri = resolve_tracking_uri(tracking_uri)
    try:
        recorder = SweepRecorder(uri)
        report = run_sweep(doc, trials, recorder=recorder, workdir=Path(workdir), echo=click.echo)
    except TrackingError as e:
        _fail(str(e))
    except (KeyboardInterrupt, Interrupted) as e:
        click.echo(f"dinox: {e or 'interrupted'}; the trial in flight and the sweep are marked KILLED", err=True)
        sys.exit(130)
    counts = ", ".join(f"{n} {s}" for s, n in sorted(result_summary(report.results).items()))
    click.echo(f"dinox: sweep done in {report.wall_s:.1f}s: {counts}. Results: {report.sweep_dir / 'results.csv'}")
    t = report.timeline()
    click.echo(f"       per trial (mean): start-up {t['startup_s']:.1f}s, setup {t['setup_s']:.1f}s, "
               f"measurement {t['measure_s']:.1f}s, teardown {t['teardown_s']:.1f}s, "
               f"recording {t['recording_s']:.1f}s")  # fmt: skip
    if uri.startswith("sqlite:///"):
        click.echo(f"       browse: mlflow ui --backend-store-uri {uri}  (then open http://127.0.0.1:5000)")


if __name__ == "__main__":
    main()

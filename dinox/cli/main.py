"""The dinox command line: a thin click group. Heavy modules are imported inside command bodies."""

from __future__ import annotations

import logging
import os
import sys
import typing
from pathlib import Path

import click

from dinox.cli import decide, head_to_head, run, submit, tools, verify
from dinox.cli.common import (
    MAX_TRIALS,
    SET,
    SHRINK,
    Inert,
    ReaderGone,
    entry_problems,
    load_trials,
    machine_problems,
    refuse_control_characters,
    show_error,
    spec_problems,
)
from dinox.errors import DEPENDENCIES, EXIT_BAD_INPUT, DinoxError, MissingDependency, interrupted

if typing.TYPE_CHECKING:  # imported when a command runs: `dinox --help` stays quick
    from dinox.plan.grid import Trial
    from dinox.spec.file import SpecDocument


class _Commands(click.Group):
    """The group catches dinox's errors once, for every command: the message, the error's exit code."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            try:
                return super().invoke(ctx)
            except ModuleNotFoundError as e:
                if (e.name or "").split(".")[0] not in DEPENDENCIES:
                    raise  # dinox's own code: a bug, and its traceback is what finds it
                raise MissingDependency(e.name or "?", sys.executable) from None
        except DinoxError as e:
            show_error(e)
            if os.environ.get("MLFLOW_RUN_ID") and not e.store_unusable:
                try:
                    from dinox.store.recorder import note_refusal
                except ModuleNotFoundError:  # this Python has no MLflow: the line above is all there is to say
                    ctx.exit(e.exit_code)
                note_refusal(str(e))  # the FAILED run `mlflow run` made says why (a store in trouble: not tried)
            ctx.exit(e.exit_code)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
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
@SHRINK
def validate(spec_files: tuple[str, ...], max_trials: int, sets: tuple[str, ...], shrink: bool) -> None:
    """Check each SPEC and every trial its sweep expands to, without running anything: fields,
    contradictions, timm model names, data files.

    Prints a one-line OK per spec, or one line per problem (file:line: field.path: message) and exits 2.
    """
    # Every spec read first, then the team's entries of all of them checked at once (one child, not one a
    # spec), then each spec's answer in the order given.
    read: list[tuple[str, list[str], tuple[SpecDocument, list[Trial]] | DinoxError]] = []
    for spec_file in spec_files:
        said: list[str] = []
        try:
            loaded = load_trials(
                spec_file, max_trials, preflight=True, sets=sets, shrink=shrink, entries=False, say=said.append
            )
        except DinoxError as e:
            loaded = e  # check the other specs too
        read.append((spec_file, said, loaded))
    groups = [loaded[1] if isinstance(loaded, tuple) else [] for _, _, loaded in read]
    failed = False
    for (spec_file, said, loaded), found in zip(read, entry_problems(groups), strict=True):
        for line in said:
            click.echo(line)
        if isinstance(loaded, tuple):
            try:
                spec_problems(loaded[0], found, sets)
            except DinoxError as e:
                loaded = e
        if isinstance(loaded, DinoxError):
            show_error(loaded)
            failed = True
            continue
        doc, trials = loaded
        click.echo(
            f"OK {spec_file}: {len(trials)} trial{'s' if len(trials) != 1 else ''}, experiment {trials[0].spec.name!r}"
        )
        for problem in machine_problems(doc, trials, sets):  # valid, and yet `run` would refuse it here
            click.echo(f"  but not on this machine: {problem.render(doc.path)}")
    if failed:
        sys.exit(EXIT_BAD_INPUT)


@main.command()
def schema() -> None:
    """Print the spec file's JSON Schema (for editor completion: see specs/dinox.schema.json)."""
    from dinox.spec.schema import render

    click.echo(render(), nl=False)


@main.command()
@click.argument("spec_file", metavar="SPEC")
@MAX_TRIALS
@click.option("--no-estimate", is_flag=True, help="Only the table of trials: no memory or FLOPs estimate.")
@SET
@SHRINK
def plan(spec_file: str, max_trials: int, no_estimate: bool, sets: tuple[str, ...], shrink: bool) -> None:
    """Show the trials SPEC expands to, in the order `run` measures them, with what each will cost.

    \b
    Nothing is measured. Unless --no-estimate, a child process runs one training step of each model on
    torch's meta device (no memory, no compute) and the table gains: training GFLOPs per image (forward +
    backward, no recomputation); predicted device memory in GiB (weights, gradients, optimizer state, the tensors
    saved for backward at the trial's batch, checkpointing and precision; on the CPU also the process
    itself); the loader's host RAM in GiB (workers x prefetch x batch bytes, plus a pinned copy); and OOM? for
    trials predicted to exceed 95% of the device (or hardware.memory_limit_gb) or of host memory. `dinox run
    --skip-predicted-oom` skips those.
    """
    _doc, trials = load_trials(spec_file, max_trials, sets=sets, shrink=shrink)
    estimates = None
    if not no_estimate:
        import tempfile

        from dinox.isolate import runner
        from dinox.plan.footprint import Estimates

        with tempfile.TemporaryDirectory(prefix="dinox-plan-") as tmp:
            data, failure = runner.run_estimate(Estimates.request([t.spec for t in trials]), Path(tmp))
        estimates = Estimates.parse(data, failure)
    from dinox.plan.table import render

    for line in render(trials, estimates):
        click.echo(line)


for command in (
    run.run,
    decide.decide,
    verify.verify,
    head_to_head.head_to_head,
    submit.submit,
    tools.preprocess,
    tools.shards,
    tools.sync,
    tools.ui,
):
    main.add_command(command)
refuse_control_characters(main)


def entry() -> None:
    """The `dinox` command: the click group, then a quick exit. Once a command has returned, everything it
    wrote is flushed and closed; interpreter teardown would only unload torch and MLflow (about 2.5 s here)."""
    sys.stdout = ReaderGone(Inert(sys.stdout))  # type: ignore[assignment]  # a closed pipe ends the view, not the work
    # No raw escape sequence from a value reaches a terminal; a closed stderr ends its view too, silently.
    sys.stderr = ReaderGone(Inert(sys.stderr), notice=False)  # type: ignore[assignment]
    try:
        # Not click's standalone mode: it turns a Ctrl-C into "Aborted!" and exit 1, where dinox says 130.
        result = main.main(prog_name="dinox", standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except click.exceptions.Exit as e:
        code = e.exit_code
    except click.ClickException as e:  # click's own (a usage error)
        e.show()
        code = e.exit_code
    except (KeyboardInterrupt, click.exceptions.Abort):
        click.echo("dinox: interrupted by SIGINT; nothing was recorded", err=True)
        code = 130
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if isinstance(e.code, str):
            click.echo(e.code, err=True)
    except Exception as e:
        if not interrupted(e):  # a library's error made of a Ctrl-C is the Ctrl-C; anything else is a bug
            raise
        click.echo("dinox: interrupted by SIGINT; nothing was recorded", err=True)
        code = 130
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()

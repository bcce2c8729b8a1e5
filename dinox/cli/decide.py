"""`dinox decide` end to end, top to bottom: options into a Budget and a Policy (each problem named by its
option), the trials from the store, the decision, the report files, the verdict said, the decision run logged."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import sys
import threading
import traceback
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from dinox.cli.common import TRACKING_URI, BadInput, load_trials
from dinox.errors import DinoxError, interrupted
from dinox.plan.shrink import shrunk_name
from dinox.store.backend import shown_uri
from dinox.writes import write_whole

if typing.TYPE_CHECKING:  # imported when the command runs: `dinox --help` stays quick
    from dinox.decide.budget import Budget
    from dinox.decide.types import Policy
    from dinox.decide.verdict import Decision
    from dinox.store.trial_record import TrialRecord


@click.command()
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
    "--price",
    "prices",
    multiple=True,
    metavar='"NAME=PRICE"|PRICE',
    help="Price of one device for one hour, by device name (as the trials' dinox.device_name tag), or a bare "
    "number for every device; repeatable. The report then gives each configuration's cost.",
)
@click.option("--max-cost", type=float, default=None, help="GO also needs the whole schedule to cost at most this.")
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
@click.option(
    "--shrunk",
    is_flag=True,
    help="Plan from trials `dinox run --shrink` measured (with --spec: its NAME_shrunk experiment). Such a "
    "decision tries the pipeline, not the study: it is marked shrunk and exits 3 whatever its verdict.",
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
    prices: tuple[str, ...],
    max_cost: float | None,
    effective_batch: int | None,
    max_memory_share: float,
    knee_tolerance: float,
    exclude_unstable: bool,
    shrunk: bool,
    no_log: bool,
) -> None:
    """GO / NO-GO: can the schedule finish inside the budget, on the trials recorded in MLflow?

    \b
    Reads trial runs (tag dinox.status) of --experiment NAME(s) or of sweep --run-id(s), takes the budget
    from --spec and/or --days with --dataset-size and --epochs (or --target-images), and writes report.md,
    decision.json and PNG plots to --out, also logged as artifacts of a dinox.role=decision run.
    Exit code: 0 GO, 1 NO-GO, 2 error, 3 UNSETTLED (the measured range straddles the budget, or too few
    timed windows ran to have one: the report says which trials to measure again, and how).
    """
    from dinox.decide.budget import DecisionError
    from dinox.decide.types import Policy
    from dinox.store.backend import resolve_tracking_uri

    base, names = _from_spec(spec_file, shrunk, list(experiments), run_ids)
    if not names and not run_ids:
        raise BadInput("give --experiment NAME, --run-id ID or --spec SPEC to say which trials to decide on")
    try:
        budget = budget_of(base, days, dataset_size, epochs, target_images, utilization, prices, max_cost)
        policy = Policy(max_memory_share, effective_batch, knee_tolerance, exclude_unstable)
    except DecisionError as e:
        raise BadInput(e.named(OPTIONS)) from None
    uri = resolve_tracking_uri(tracking_uri)
    try:
        decision = run_decision(
            uri, names, list(run_ids), budget, policy, Path(out_dir), not no_log, spec_file or "", shrunk
        )
    except DinoxError:
        raise
    except Exception as e:  # noqa: BLE001 - exit 1 is NO-GO, which a crash must never read as
        if interrupted(e):
            raise KeyboardInterrupt from None
        traceback.print_exc()
        raise BadInput("dinox decide failed (the traceback above): no decision was made") from None
    from dinox.report.decision_json import exit_code

    sys.exit(exit_code(decision))


def _from_spec(spec_file: str | None, shrunk: bool, names: list[str], run_ids: tuple[str, ...]) -> tuple[dict, list]:
    """The spec's budget (what the options then override) and, where neither --experiment nor --run-id named
    the trials, its experiment (NAME_shrunk with --shrunk)."""
    if not spec_file:
        return {}, names
    _doc, trials = load_trials(spec_file, None)
    spec = trials[0].spec
    name = shrunk_name(spec.name) if shrunk else spec.name
    return (spec.budget.model_dump() if spec.budget is not None else {}), names or ([] if run_ids else [name])


# The budget's and the policy's fields as `dinox decide` takes them.
OPTIONS = {
    "days": "--days",
    "dataset_size": "--dataset-size",
    "epochs": "--epochs",
    "target_images": "--target-images",
    "utilization": "--utilization",
    "price_per_device_hour": "--price",
    "prices": "--price",
    "max_cost": "--max-cost",
    "max_memory_share": "--max-memory-share",
    "knee_tolerance": "--knee-tolerance",
    "effective_batch": "--effective-batch",
}


def budget_of(
    base: dict[str, Any],
    days: float | None,
    dataset_size: int | None,
    epochs: float | None,
    target_images: int | None,
    utilization: float,
    prices: tuple[str, ...] = (),
    max_cost: float | None = None,
) -> Budget:
    """The spec's budget (`base`, possibly empty) overridden field by field by the options given; a schedule
    given as images replaces one given as epochs, and the other way round. `prices` as --price takes them:
    "NAME=PRICE" for one device name, a bare number for every device. Raises DecisionError."""
    from dinox.decide.budget import Budget, DecisionError
    from dinox.spec.sections import BudgetSpec

    merged = dict(base)
    merged["prices"] = dict(merged.get("prices") or {})
    for item in prices:
        name, _, value = item.rpartition("=")
        try:
            price = float(value)
        except ValueError:
            raise DecisionError(
                f'--price {item!r}: expected NAME=PRICE or a number, e.g. "NVIDIA H100 80GB HBM3=2.5"'
            ) from None
        if name:
            merged["prices"][name.strip()] = price
        else:
            merged["price_per_device_hour"] = price
    if max_cost is not None:
        merged["max_cost"] = max_cost
    if days is not None:
        merged["days"] = days
    if target_images is not None:
        merged.update(target_images=target_images, dataset_size=None, epochs=None)
    if dataset_size is not None or epochs is not None:
        merged["target_images"] = None
        merged.update({k: v for k, v in (("dataset_size", dataset_size), ("epochs", epochs)) if v is not None})
    if merged.get("days") is None:
        raise DecisionError(
            "no budget: give --days with --dataset-size and --epochs (or --target-images), or a --spec with one"
        )
    schedule = BudgetSpec.model_construct(**{k: merged.get(k) for k in ("target_images", "dataset_size", "epochs")})
    if problem := schedule.schedule_problem(OPTIONS):
        raise DecisionError(f"budget {problem}")
    return Budget(**{k: v for k, v in merged.items() if v is not None}, utilization=utilization)


def run_decision(
    uri: str,
    experiments: list[str],
    run_ids: list[str],
    budget: Budget,
    policy: Policy,
    out: Path,
    log: bool,
    spec_file: str = "",
    shrunk: bool = False,
) -> Decision:
    """Decide on the trials in the store, write the report files, say the verdict, log the decision run.
    Raises DecisionError and TrackingError, both one line for the user."""
    from dinox.decide import head_to_head
    from dinox.decide.budget import DecisionError
    from dinox.decide.verdict import decide
    from dinox.report import decision_json
    from dinox.report import text as report
    from dinox.spec.params import SHRUNK
    from dinox.store.readback import fetch_head_to_heads, fetch_trials, fetch_verifications, log_decision

    found = fetch_trials(uri, experiments, run_ids)
    records, sources, home = found.records, found.sources, found.home
    if not records:
        raise DecisionError(f"no dinox trial runs (tag dinox.status) in {', '.join(sources)} at {shown_uri(uri)}")
    small = [r for r in records if r.param_bool(SHRUNK)]
    if small and not shrunk:
        raise DecisionError(
            f"{len(small)} of the {len(records)} trials in {', '.join(sources)} were measured with `dinox run "
            "--shrink` (a small model, images, batches and steps standing in for the spec's): their figures say "
            "nothing of the study's days; measure it without --shrink, or give --shrunk to try decide on them"
        )
    experiment_ids = sorted({r.experiment_id for r in records})
    verified = fetch_verifications(uri, experiment_ids)
    rematches = head_to_head.read(fetch_head_to_heads(uri, experiment_ids))
    decision = decide(records, budget, policy, verified, rematches, found.earlier)
    decision.sources = sources
    decision.spec_file = spec_file
    decision.sets = recorded_sets(records)
    decision.shrunk = bool(small)
    files = write_reports(decision, records, out)
    click.echo(report.render_terminal(decision))
    click.echo(f"report: {files[0]} ({files[1].name} beside it)  decision: {files[2]}")
    if log:
        note = report.render_note(decision)
        params, metrics = decision_json.log_params(decision), decision_json.log_metrics(decision)
        run_id = log_decision(
            uri, home, decision.verdict, decision.settled, params, metrics, files, note, shrunk=decision.shrunk
        )
        click.echo(f"logged as decision run {run_id}")
    return decision


def recorded_sets(records: list[TrialRecord]) -> tuple[str, ...]:
    """The `--set`s the trials were measured with, where they share them (one sweep's): the commands decide
    prints carry them, or they would name other trials. None where the trials differ in them."""
    from dinox import record as rec

    given = {r.tags.get(rec.SETS, "") for r in records}
    return tuple(s.strip() for s in given.pop().split(";") if s.strip()) if len(given) == 1 else ()


def write_reports(decision: Decision, records: list[TrialRecord], out: Path) -> list[Path]:
    """report.md, report.html, decision.json and the plots, in that order, written to `out` as one set: made
    in a folder of their own inside it, then renamed into place, so a Ctrl-C or a failure while they are made
    (seconds of plotting) leaves the previous decision's files as they were, never this one's plots beside
    that one's decision.json (and no new `out` at all). Raises BadInput naming --out when it cannot be
    written (/dev/null, /proc, a read-only mount, a full disk)."""
    from dinox.report import decision_json
    from dinox.report import text as report
    from dinox.report.html import render_html
    from dinox.report.plots import write_plots

    made = not out.exists()
    staging = None
    with _sigint_noted() as noted:
        try:
            out.mkdir(parents=True, exist_ok=True)
            # Named before it is made (mkdtemp's name comes back after the folder exists: a Ctrl-C in between
            # left it behind), and made by mkdir, which fails on anything at that name, a planted link included.
            staging = out / f".decide-{os.getpid()}-{secrets.token_hex(6)}"
            try:
                staging.mkdir()
            except FileExistsError:
                staging = None  # not this process's to remove
                raise
            plots = write_plots(decision, records, staging)
            markdown = report.render_markdown(decision, [p.name for p in plots])
            names = ["report.md", "report.html", "decision.json"]
            texts = [markdown, render_html(markdown, decision.verdict, staging), decision_json.dumps(decision)]
            for name, text in zip(names, texts, strict=True):
                write_whole(staging / name, text)
            files = [*names, *(p.name for p in plots)]
            if noted:  # a C library met the Ctrl-C, cleared it and went on: it was still the user's
                raise KeyboardInterrupt
            _renamed_whole([(staging / name, out / name) for name in files], noted)
            if noted:  # it came while the set was renamed into place: honoured once the set is whole
                raise KeyboardInterrupt
        except OSError as e:
            raise BadInput(f"--out {out}: cannot write the report there ({e.strerror or e})") from None
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            if made:
                with contextlib.suppress(OSError):  # left only where nothing reached it
                    out.rmdir()
    return [out / name for name in files]


def _renamed_whole(moves: list[tuple[Path, Path]], noted: list[int]) -> None:
    """Each file renamed into place, as one set: a Ctrl-C meanwhile is only noted (the caller honours it once
    they all are), never one decision's files beside the last one's."""
    main = threading.current_thread() is threading.main_thread()
    handler = signal.signal(signal.SIGINT, lambda signum, _frame: noted.append(signum)) if main else None
    try:
        for source, target in moves:
            os.replace(source, target)
    finally:
        if main:
            signal.signal(signal.SIGINT, handler)


@contextlib.contextmanager
def _sigint_noted() -> Iterator[list[int]]:
    """Ctrl-C raises KeyboardInterrupt as usual and is also noted in the list yielded: a C library that calls
    back into Python (matplotlib's, while decide plots) can clear the exception and go on, and the note
    outlives that. Only in the main thread, where Python runs signal handlers."""
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return

    def handler(signum: int, _frame: object) -> None:
        noted.append(signum)
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, old)

"""`dinox decide`: options into a Budget and a Policy; ``deciding`` does the rest."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import click

from dinox.cli.common import TRACKING_URI, BadInput, load_trials


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
    no_log: bool,
) -> None:
    """GO / NO-GO: can the schedule finish inside the budget, on the trials recorded in MLflow?

    \b
    Reads trial runs (tag dinox.status) of --experiment NAME(s) or of sweep --run-id(s), takes the budget
    from --spec and/or --days with --dataset-size and --epochs (or --target-images), and writes report.md,
    decision.json and PNG plots to --out, also logged as artifacts of a dinox.role=decision run.
    Exit code: 0 GO, 1 NO-GO, 2 error.
    """
    from dinox.decide.budget import DecisionError, merge_budget
    from dinox.decide.end_to_end import DecideRequest
    from dinox.decide.end_to_end import run as run_decision
    from dinox.decide.verdict import Policy
    from dinox.store.backend import TrackingError, resolve_tracking_uri

    base: dict = {}
    names = list(experiments)
    if spec_file:
        _doc, trials = load_trials(spec_file, None)
        base = trials[0].spec.budget.model_dump() if trials[0].spec.budget is not None else {}
        names = names or ([] if run_ids else [trials[0].spec.name])
    if not names and not run_ids:
        raise BadInput("give --experiment NAME, --run-id ID or --spec SPEC to say which trials to decide on")
    try:
        budget = merge_budget(base, days, dataset_size, epochs, target_images, utilization, prices, max_cost)
        policy = Policy(max_memory_share, effective_batch, knee_tolerance, exclude_unstable)
        uri = resolve_tracking_uri(tracking_uri)
        request = DecideRequest(uri, names, list(run_ids), budget, policy, Path(out_dir), log=not no_log)
        decision = run_decision(request, click.echo)
    except (DecisionError, TrackingError) as e:
        raise BadInput(str(e)) from None
    except Exception:  # noqa: BLE001 - exit 1 is NO-GO, which a crash must never read as
        traceback.print_exc()
        raise BadInput("dinox decide failed (the traceback above): no decision was made") from None
    sys.exit(0 if decision.verdict == "GO" else 1)

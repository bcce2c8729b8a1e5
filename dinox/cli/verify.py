"""`dinox verify`: the forecast held against real training, top to bottom: which trial (the decision's
recommendation, or --run-id), its spec, the slice, the training, the verdict said and recorded."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from dinox.cli.common import SET, TRACKING_URI, BadInput, decision_option, load_trials, read_decision
from dinox.errors import shell_word

if TYPE_CHECKING:
    from dinox.store.trial_record import TrialRecord


@click.command()
@click.argument("spec_file", metavar="SPEC")
@decision_option("train its recommended configuration")
@click.option(
    "--run-id",
    "run_id",
    default=None,
    metavar="ID",
    help="Train this trial run instead, held against what decide plans it at: its windows, or where `dinox "
    "head-to-head` measured it again, its rounds' pooled figure.",
)
@TRACKING_URI
@click.option(
    "--minutes", type=float, default=None, help="Train this long after warm-up (default 3, with no --epochs)."
)
@click.option("--epochs", type=float, default=None, help="Train this many epochs of the spec's data.")
@click.option(
    "--epoch-images",
    type=int,
    default=None,
    help="Synthetic data without data.num_samples: the images in one epoch (default: the budget's dataset_size "
    "where the slice crosses it, else about a third of the slice's images).",
)
@click.option("--workdir", default=".dinox", show_default=True, help="Where the training child's files go.")
@SET
@click.option(
    "--shrink",
    is_flag=True,
    help="Train a trial `dinox run --shrink` measured: SPEC shrunk as that run shrank it. The stand-in's forecast "
    "held against its own training tries the verify step here; it says nothing of the study: exit 3.",
)
def verify(
    spec_file: str,
    decision_dir: str,
    run_id: str | None,
    tracking_uri: str | None,
    minutes: float | None,
    epochs: float | None,
    epoch_images: int | None,
    workdir: str,
    sets: tuple[str, ...],
    shrink: bool,
) -> None:
    """Train a measured configuration for real and hold decide's forecast against it.

    \b
    Trains the trial `dinox decide` recommended (or --run-id) through the same loader, data, epoch boundaries
    and step as the trial (its OpenMP threads waiting as they did where the forecast was measured: the trial, or
    the head-to-head rounds decide plans it with; on as many cores where `dinox run --devices` held it to a
    share), for --minutes (default 3) or --epochs, then compares the slice's wall time with the forecast for
    the same images (decide's figure: images over the timed windows, or the trial's head-to-head rounds, plus
    each epoch boundary, checkpoint and evaluation pass: the spec's routine, run at its cadence). Records a
    run (dinox.role = verify) beside the trial; `dinox decide` then shows it.
    Before and after the slice, windows are timed as the trial timed its: where those after run outside the
    trial's windows (the head-to-head rounds' where the forecast pools them) by more than 5 %, or the forecast
    at their rate and the trial's fall on either side of 5 %, the box (or the process) is not as the trial found
    it, and a miss cannot say whether the forecast or the box is wrong; so too where the forecast at the pace of
    the slice's slowest quarter and of its fastest falls on either side of 5 % (the box changed speed inside it).
    Exit code: 0 the forecast held within 5 %, 1 it was off by more, 2 error, 3 undecided: the box moved by the
    check windows or the slice's quarters, so a match is as open as a miss (measure again, then verify), or a
    --shrink stand-in was trained.
    """
    from dinox.store.backend import resolve_tracking_uri
    from dinox.verify import verify as run_verify
    from dinox.verify.run import epoch_images_for, find_trial

    seconds = _slice_seconds(minutes, epochs, epoch_images)
    uri = resolve_tracking_uri(tracking_uri)
    forecast = None
    if run_id is None:
        run_id, forecast = _recommended(decision_dir)
    _doc, trials = load_trials(spec_file, None, sets=sets, shrink=shrink)
    record = _ok_trial(uri, run_id)
    forecast = forecast or _planned(uri, record)
    trial = find_trial(record, trials, spec_file, shrink)
    epoch, why = epoch_images_for(trial, epoch_images, seconds if math.isfinite(seconds) else 0.0, forecast)
    click.echo(
        f"dinox: verifying {record.run_name or run_id} for {_slice(minutes, epochs)} (forecast: {forecast.source})"
    )
    if why:
        click.echo(f"       {why}")
    for line in _step_lines(record, forecast):
        click.echo(f"       {line}")
    done = run_verify(uri, record, trial, forecast, seconds, epochs, epoch, Path(workdir))
    _say(done, done.trial_windows.ips, shrink)
    undecided = done.word == "UNDECIDED"
    if undecided and not shrink:
        again = _measure_again(spec_file, sets)
        click.echo(f"       undecided: `{again}` measures the sweep again on the box as it is; verify again then")
    sys.exit(3 if shrink or undecided else 0 if done.word == "HELD" else 1)


def _step_lines(record: TrialRecord, forecast) -> list[str]:  # noqa: ANN001 - a dinox.verify.Forecast (lazily)
    """What the terminal says of the step the slice trains where it is not plainly the trial's: the cores a
    trial side by side was held to, the OpenMP policy (the forecast's where it differs from the trial's sweep),
    and that its threads sleep where dinox made them. Numbers and words of a closed set (contention.POLICIES),
    never the store's text."""
    from dinox import record as rec
    from dinox.isolate import contention
    from dinox.isolate.slots import affinity
    from dinox.verify.step import held_cores, held_policy, held_threads

    policy, forecasts = held_policy(record, forecast)
    said = (held_cores(record, forecast, affinity())[1], held_threads(record, forecast, os.environ)[1])
    lines = [line for line in said if line]
    if forecasts:
        sweep = contention.policy_of(record.tags.get(rec.OMP_WAIT_POLICY, "")) or "none recorded"
        lines.append(
            f"its forecast was measured with OMP_WAIT_POLICY={contention.policy_of(policy)} (the head-to-head "
            "rounds decide plans it with, or the verification a decision planned with), the trial's own windows "
            f"with {sweep}: the slice trains the forecast's step, and its check windows are held against the "
            "forecast's range"
        )
    whose = "the forecast's measurement" if forecasts else "the trial's"
    if line := contention.held_notice(policy, os.environ, whose):
        lines.append(line)
    return lines


def _ok_trial(uri: str, run_id: str) -> TrialRecord:
    """The trial run `run_id` from the store; BadInput where it is not an ok trial."""
    from dinox.store.readback import read_run

    record = read_run(uri, run_id)
    if record.status != "ok":
        raise BadInput(
            f"run {run_id} is not an ok trial (dinox.status {record.status or 'missing'!r}): nothing to verify"
        )
    return record


def _planned(uri: str, record: TrialRecord):  # noqa: ANN202 - a dinox.verify.Forecast (lazily)
    """--run-id's forecast: what decide plans the trial at, its head-to-head's rounds where one measured it again
    (its sweep's windows are then not the figure any decision holds, nor the step the rounds timed)."""
    from dinox.decide import head_to_head
    from dinox.store.readback import fetch_head_to_heads
    from dinox.verify import Forecast

    rounds = head_to_head.read(fetch_head_to_heads(uri, [record.experiment_id])).get(record.run_id)
    return Forecast.of_trial(record, rounds)


def _slice_seconds(minutes: float | None, epochs: float | None, epoch_images: int | None) -> float:
    """The slice's seconds (infinite where --epochs alone ends it; 3 minutes by default), each option checked."""
    for name, value in (("--minutes", minutes), ("--epochs", epochs), ("--epoch-images", epoch_images)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise BadInput(f"{name} {value}: must be a positive number")
    return minutes * 60.0 if minutes is not None else (math.inf if epochs is not None else 180.0)


def _measure_again(spec_file: str, sets: tuple[str, ...]) -> str:
    """The sweep measured again, as its trials were (their --sets), every word quoted for pasting."""
    return f"dinox run {shell_word(spec_file)}{''.join(f' --set {shell_word(s)}' for s in sets)} --force"


def _say(done, own_ips: float, shrunk: bool) -> None:  # noqa: ANN001 - a dinox.verify.VerifyOutcome (lazily)
    """The verdict, the rates it rests on, and where the plan was a tied trial's, this trial's own windows."""
    forecast = done.forecast
    stand_in = " on a SHRUNK stand-in (it tries the verify step, not the study's forecast)" if shrunk else ""
    click.echo(f"{done.word}{stand_in}: {done.verdict()}")
    slow, fast = done.quarters
    quarters = f" ({slow:.1f}-{fast:.1f} over its quarters)" if slow and fast else ""
    click.echo(
        f"       {done.images_per_s:.1f} img/s over the slice{quarters} against a forecast of {forecast.ips:.1f} "
        f"(measured range {forecast.slow_ips:.1f}-{forecast.fast_ips:.1f}); recorded as verify run {done.run_id}"
    )
    # A decision's plan may be a head-to-head's pooled figure (or, before ties recommended their slowest, a tied
    # trial's): this trial's own windows too, where they differ from it.
    if forecast.source.startswith("decision") and not math.isclose(own_ips, forecast.ips, rel_tol=1e-6):
        click.echo(f"       against this trial's own windows ({own_ips:.1f} img/s): {done.own_error:+.1%}")
    if done.moved and done.check_error is not None:  # the box's move set aside: what the method alone missed by
        click.echo(
            f"       against the check windows ({done.check_rate:.1f} img/s, timed in this process around the "
            f"slice): {done.check_error:+.1%}"
        )


def _slice(minutes: float | None, epochs: float | None) -> str:
    if minutes is not None:
        return f"{minutes:g} minute{'' if minutes == 1 else 's'}"
    return f"{epochs:g} epochs" if epochs else "3 minutes"


def _recommended(folder: str):  # noqa: ANN202 - (run id, Forecast)
    """The decision's recommended trial and the forecast decide planned it with, from decision.json."""
    from dinox.store.trial_record import store_text
    from dinox.verify import Forecast

    payload, shown = read_decision(folder, "name a trial with --run-id")
    best = payload.get("recommended")
    if best is None:
        raise BadInput(
            f"{shown}: the decision recommends nothing (verdict {store_text(str(payload.get('verdict')))}): name a "
            "trial with --run-id"
        )
    try:
        span, routine = best["span"], best.get("routine") or {}
        forecast = Forecast(
            float(span["forecast_ips"]),
            float(span["slow_ips"]),
            float(span["fast_ips"]),
            # A decision.json from before epoch_boundary_s charged the restart's whole first batch.
            float(best.get("epoch_boundary_s", best.get("epoch_start_s")) or 0.0),
            f"decision {shown}",
            float(routine.get("checkpoint_s") or 0.0),
            float(routine.get("eval_s") or 0.0),
            _policy_text(best.get("omp_wait_policy")),
            _pooled_rounds(best.get("head_to_head")),
        )
        run_id = str(best["run_id"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise BadInput(f"{shown}: not a dinox decision ({type(e).__name__}: {e})") from None
    rates, costs = (forecast.ips, forecast.slow_ips, forecast.fast_ips), (forecast.epoch_boundary_s, forecast.eval_s)
    if not all(math.isfinite(x) and x > 0 for x in rates) or not all(
        math.isfinite(x) and x >= 0 for x in (*costs, forecast.checkpoint_s)
    ):  # a forecast no decide writes: NaN or a negative rate would pass as a figure
        raise BadInput(f"{shown}: not a dinox decision (its forecast holds a rate or cost that is not a finite figure)")
    return run_id, forecast


def _policy_text(value: object) -> str:
    """decision.json's omp_wait_policy: text, or "" where the decision (an older one) names none."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"omp_wait_policy is {type(value).__name__}, not text")
    return value


def _pooled_rounds(block: object) -> int:
    """decision.json's recommended.head_to_head: the rounds the forecast pools (0 where no head-to-head ran)."""
    if block is None:
        return 0
    count = block["pooled_rounds"] if "pooled_rounds" in block else block["rounds"]  # type: ignore[index, operator]
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise TypeError(f"head_to_head's rounds is {count!r}, not a count")
    return count

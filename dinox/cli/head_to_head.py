"""`dinox head-to-head`: tied leaders measured again, interleaved, until their order settles; top to bottom: which
trials (the decision's tied leaders, or --run-id), their trials in the spec, the rounds, what they settled."""

from __future__ import annotations

from pathlib import Path

import click

from dinox.cli.common import SET, TRACKING_URI, BadInput, decision_option, load_trials, read_decision


@click.command("head-to-head")
@click.argument("spec_file", metavar="SPEC")
@decision_option("measure the leaders it found tied")
@click.option("--run-id", "run_ids", multiple=True, metavar="ID", help="Measure these trial runs instead (2 or more).")
@TRACKING_URI
@click.option(
    "--rounds",
    "max_rounds",
    type=click.IntRange(5, 9),
    default=9,
    show_default=True,
    help="Rounds at most (5-9; the order is looked at after rounds 5, 7, 9 and the last).",
)
@click.option("--workdir", default=".dinox", show_default=True, help="Where the rounds' child files go.")
@SET
def head_to_head(
    spec_file: str,
    decision_dir: str,
    run_ids: tuple[str, ...],
    tracking_uri: str | None,
    max_rounds: int,
    workdir: str,
    sets: tuple[str, ...],
) -> None:
    """Measure tied leaders again, head to head, until their order is settled.

    \b
    Where `dinox decide` found the leading trials' measured ranges overlapping (tied: it plans at the slowest of
    them), this measures them again in rounds: each trial once a round, back to back, in an order that reverses
    every round, until a sign test over the paired rounds settles which is faster (5 of 5 rounds, 7 of 7, 8 of
    9) or --rounds have run. Each measurement is recorded as a run (dinox.role = head_to_head) the moment it
    ends; `dinox decide` then plans with the rounds' figures and says what they settled.
    Exit code: 0 measured (settled or tied: decide says which), 2 error, 130 interrupted.
    """
    from dinox import record as rec
    from dinox.decide.head_to_head import HeadToHead
    from dinox.store.backend import resolve_tracking_uri
    from dinox.store.descriptions import head_to_head_line
    from dinox.store.readback import note_on_parents, read_run
    from dinox.verify.head_to_head import Leader
    from dinox.verify.head_to_head import head_to_head as measure
    from dinox.verify.run import find_trial

    ids = list(dict.fromkeys(run_ids)) or _tied_leaders(decision_dir)
    if len(ids) < 2:
        raise BadInput(f"--run-id: a head-to-head needs two trial runs or more, got {len(ids)}")
    uri = resolve_tracking_uri(tracking_uri)
    _doc, trials = load_trials(spec_file, None, sets=sets)
    leaders = []
    for run_id in ids:
        record = read_run(uri, run_id)
        if record.status != "ok":
            raise BadInput(f"run {run_id} is not an ok trial (dinox.status {record.status or 'missing'!r})")
        leaders.append(Leader(record, find_trial(record, trials, spec_file)))
    names = ", ".join(x.name for x in leaders)
    click.echo(f"dinox: head to head: {names}; at most {max_rounds} rounds, order reversed every round")
    h: HeadToHead = measure(uri, leaders, Path(workdir), max_rounds, say=lambda s: click.echo(f"       {s}"))
    for bout in h.outcome(h.leader()):
        click.echo(f"{'SETTLED' if bout.order else 'TIED'}: {bout.describe()}")
    pooled = ", ".join(f"{h.names[r]} {h.pooled(r):.1f}" for r in h.runs)
    click.echo(f"       pooled over the rounds, img/s: {pooled}; `dinox decide` plans with these now")
    if mixed := h.mixed():  # words of a closed set (contention.POLICIES)
        click.echo(
            f"       the box crossed dinox's busy line between rounds (OMP_WAIT_POLICY {mixed}): each round still "
            "orders its pair, but each figure pools only the rounds under its latest round's policy, one step"
        )
    # The sweep's parent shows the figure decide now plans with, and says where it came from.
    parents = [p for x in leaders if (p := x.record.tags.get(rec.PARENT_RUN))]
    rounds = len(h.rounds) // max(len(h.runs), 1)
    line = head_to_head_line(h.group, rounds, names, h.settled(), h.planned())
    note_on_parents(uri, parents, h.planned(), line)


def _tied_leaders(folder: str) -> list[str]:
    """The trial runs decision.json names as tied leaders (its head_to_head.runs)."""
    from dinox.store.trial_record import store_text

    payload, shown = read_decision(folder, "name trials with --run-id")
    block = payload.get("head_to_head")
    if block is None:
        raise BadInput(
            f"{shown}: nothing is tied in this decision (verdict {store_text(str(payload.get('verdict')))}): "
            "its leader stands on its own; name trials with --run-id to compare others"
        )
    try:
        return [str(r) for r in block["runs"]]
    except (KeyError, TypeError) as e:
        raise BadInput(f"{shown}: not a dinox decision ({type(e).__name__}: {e})") from None

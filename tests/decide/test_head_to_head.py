"""Tied leaders measured again head to head: the sign test's rule, decide planning with the rounds, and
`dinox head-to-head` through the command a user types."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import signal
import subprocess
import sys
import time

import pytest
from mlflow import MlflowClient

from dinox.decide import budget
from dinox.decide import head_to_head as h2h
from dinox.decide import verdict as decide
from dinox.isolate import contention
from dinox.report import decision_json as report_json
from dinox.report import text as report
from dinox.store.trial_record import TrialRecord
from tests import study
from tests.conftest import ROOT, TINY, run_dinox

BUDGET = budget.Budget(days=15, dataset_size=study.DATASET, epochs=study.EPOCHS)
ROWS = study.study()
FIRST, SECOND = ROWS[0]["run_id"], ROWS[1]["run_id"]  # ViT-L 48x4 (23.54 img/s) and 64x4 (23.51): tied


@pytest.mark.parametrize(
    ("won", "lost", "order"),
    [(5, 0, 1), (0, 5, -1), (4, 0, 0), (4, 1, 0), (6, 0, 1), (5, 1, 0), (7, 0, 1), (6, 1, 0), (8, 1, 1), (7, 2, 0)],
)
def test_the_order_needs_a_sign_test_at_one_in_sixteen_over_five_rounds_or_more(won, lost, order):
    assert h2h.order_of(won, lost) == order
    assert h2h.sign_test(5, 0) == pytest.approx(1 / 16) and h2h.sign_test(8, 1) == pytest.approx(20 / 512)


def _round(
    trial: str, number: int, ips: float, group: str = "20261126T150000-box-1", policy: str = "", **extra
) -> TrialRecord:
    metrics = {"images_per_s": ips, "images_per_s_min": ips * 0.997, "images_per_s_max": ips * 1.003, "windows": 3.0}
    metrics |= {"round": float(number), **extra}
    tags = {"dinox.role": "head_to_head", "dinox.remeasures": trial, "dinox.head_to_head": group}
    if policy:
        tags["dinox.omp_wait_policy"] = policy
    return TrialRecord(f"{trial}-{group}-{number}", "0", f"round {number}", {}, metrics, tags)


def _rounds(first: list[float], second: list[float], group: str = "20261126T150000-box-1") -> list[TrialRecord]:
    return [_round(FIRST, i + 1, a, group) for i, a in enumerate(first)] + [
        _round(SECOND, i + 1, b, group) for i, b in enumerate(second)
    ]


def test_rounds_are_read_per_trial_by_its_latest_head_to_head_and_damaged_ones_are_not_rounds():
    older = _rounds([30.0] * 5, [20.0] * 5, group="20261126T140000-box-1")
    newer = _rounds([23.6] * 5, [23.7] * 5)
    damaged = [
        _round(FIRST, 6, math.nan),
        _round(FIRST, 7, 1e12),
        _round(FIRST, 0, 23.0),
        _round(FIRST, 2.5, 23.0),
        _round(SECOND, 8, 23.0, group=""),
    ]
    read = h2h.read(older + newer + damaged)
    h = read[FIRST]
    assert h is read[SECOND] and h.group == "20261126T150000-box-1"
    assert len(h.of(FIRST)) == 5 and h.pooled(FIRST) == pytest.approx(23.6)
    assert h.paired(SECOND, FIRST) == (5, 0) and h.bout(SECOND, FIRST).order == 1
    assert h.leader() == SECOND and h.settled() and h.unbeaten() == [SECOND]
    assert h.span(FIRST) == pytest.approx((23.6 * 0.997, 23.6 * 1.003, 15))


def test_a_settled_head_to_head_orders_the_tie_and_the_plan_takes_the_rounds_figure():
    """Without rounds, 48x4 and 64x4 are tied and decide offers the head-to-head; with five rounds that all
    put 64x4 ahead, 64x4 leads alone and the plan is its pooled figure from the rounds, not the sweep's."""
    before = decide.decide(study.records(ROWS), BUDGET)
    large = next(m for m in before.models if m.name.startswith("vit_large"))
    assert [c.run_id for c in before.contested] == [FIRST, SECOND] and large.tied
    payload = report_json.to_json(before)
    assert payload["head_to_head"] == {"runs": [FIRST, SECOND], "command": "dinox head-to-head SPEC"}
    (tie,) = payload["recommended"]["ties"]  # why, in the file: their sweep ranges overlap
    assert tie["run_id"] in {FIRST, SECOND} and tie["why"] == "overlap" and "share a rate" in tie["detail"]
    assert "`dinox head-to-head SPEC` measures the tied trials again, interleaved" in report.render_terminal(before)

    rounds = h2h.read(_rounds([23.30, 23.41, 23.38, 23.35, 23.44], [23.62, 23.70, 23.66, 23.58, 23.69]))
    after = decide.decide(study.records(ROWS), BUDGET, rematches=rounds)
    large = next(m for m in after.models if m.name.startswith("vit_large"))
    assert large.best.run_id == SECOND and large.tied == [] and after.contested == []
    pooled = 5 / sum(1 / x for x in [23.62, 23.70, 23.66, 23.58, 23.69])
    assert large.span.forecast_ips == pytest.approx(pooled)
    assert large.best.rematch.sweep_ips == pytest.approx(23.51) and large.best.windows == 15
    assert large.span.slow_ips == pytest.approx(23.58 * 0.997)
    (bout,) = large.bouts
    assert (bout.first, bout.other, bout.won, bout.lost, bout.order) == (SECOND, FIRST, 5, 0, 1)
    terminal = report.render_terminal(after)
    line = next(ln for ln in terminal.splitlines() if ln.startswith("leaders: "))
    assert "in 5 of 5 rounds" in line and f"{pooled:.1f} img/s pooled, where the sweep had measured 23.5" in line
    payload = report_json.to_json(after)
    assert payload["head_to_head"] is None and payload["recommended"]["head_to_head"]["bouts"][0]["won"] == 5
    import jsonschema

    schema = json.loads((ROOT / "docs" / "decision.schema.json").read_text())
    for decision in (before, after):
        jsonschema.validate(report_json.to_json(decision), schema)


def test_the_plan_pools_the_rounds_of_one_step_and_verify_trains_that_step(tmp_path):
    """A neighbour arrived mid head-to-head: rounds 1-3 ran with torch's own policy (spinning threads, as the
    sweep's trials did), rounds 4-7 with OMP_WAIT_POLICY=PASSIVE, slower. Each round orders its pair
    (one policy for both), so 64x4 is faster in 7 of 7; the plan pools only the rounds of the latest step, and
    decision.json names that step, which `dinox verify` then trains (its check windows held against the rounds'
    range, not the sweep's windows of the other step)."""
    from dinox.cli.verify import _recommended
    from dinox.verify import Forecast
    from dinox.verify.run import reference
    from dinox.verify.step import held_policy

    quiet, busy = (
        "unset (the box was quiet: 0.1 cores busy when read)",
        "PASSIVE (set by dinox: 1.3 cores busy when read)",
    )
    first, second = [24.90, 25.01, 24.98, 23.40, 23.42, 23.39, 23.41], [25.22, 25.30, 25.26, 23.60, 23.63, 23.59, 23.61]
    records = [
        _round(trial, i + 1, x, policy=quiet if i < 3 else busy)
        for trial, rates in ((FIRST, first), (SECOND, second))
        for i, x in enumerate(rates)
    ]
    rounds = h2h.read(records)
    rows = study.study()
    for row in rows:
        row["tags"]["dinox.omp_wait_policy"] = quiet  # the sweep: a quiet box
    d = decide.decide(study.records(rows), BUDGET, rematches=rounds)
    large = next(m for m in d.models if m.name.startswith("vit_large"))
    assert large.best.run_id == SECOND and large.tied == [] and large.bouts[0].won == 7
    assert large.span.forecast_ips == pytest.approx(4 / sum(1 / x for x in second[3:]))  # the busy rounds' step only
    assert large.span.slow_ips == pytest.approx(23.59 * 0.997)
    assert (large.best.rematch.rounds, large.best.rematch.pooled_rounds, large.best.rematch.policy) == (7, 4, "PASSIVE")
    assert large.best.omp_wait_policy == busy
    line = next(ln for ln in report.render_terminal(d).splitlines() if ln.startswith("leaders: "))
    assert "7 interleaved rounds: " in line and "in 7 of 7 rounds" in line, line  # the order: every round
    assert "pooled over the 4 with OMP_WAIT_POLICY=PASSIVE, its latest round's, where the sweep" in line, line
    assert rounds[FIRST].mixed() == "unset, PASSIVE" and h2h.read(records[:3] + records[7:10])[FIRST].mixed() == ""
    small = next(m for m in d.models if m is not large and m.best is not None)
    assert small.best.omp_wait_policy == quiet  # no rounds: its sweep's own step
    payload = report_json.to_json(d)
    assert payload["recommended"]["omp_wait_policy"] == busy
    assert (
        payload["recommended"]["head_to_head"]["rounds"] == 7
        and payload["recommended"]["head_to_head"]["pooled_rounds"] == 4
    )
    import jsonschema

    jsonschema.validate(payload, json.loads((ROOT / "docs" / "decision.schema.json").read_text()))
    (tmp_path / "decision.json").write_text(report_json.dumps(d))
    run_id, forecast = _recommended(str(tmp_path))
    record = next(r for r in study.records(rows) if r.run_id == run_id)
    assert held_policy(record, forecast) == (busy, True)
    assert forecast.rounds == 4 and reference(record, forecast) == (forecast, "rounds")  # checked against the rounds
    # `dinox verify --run-id` (no recommendation to read, e.g. an UNSETTLED decision): the same forecast of the
    # same step, from the store's rounds, for either trial of them; a trial never measured again keeps its windows.
    by_id = {r.run_id: r for r in study.records(rows)}
    named = Forecast.of_trial(record, rounds[SECOND])
    fields = ("ips", "slow_ips", "fast_ips", "omp_policy", "rounds")
    assert [getattr(named, f) for f in fields] == [pytest.approx(getattr(forecast, f)) for f in fields]
    other = Forecast.of_trial(by_id[FIRST], rounds[FIRST])
    assert other.ips == pytest.approx(4 / sum(1 / x for x in first[3:]))
    assert (other.omp_policy, other.rounds) == (busy, 4)
    assert reference(by_id[FIRST], other) == (other, "rounds") and held_policy(by_id[FIRST], other) == (busy, True)
    alone = by_id[small.best.run_id]
    assert Forecast.of_trial(alone, rounds.get(alone.run_id)) == Forecast.of_record(alone)
    unpooled = dataclasses.replace(forecast, rounds=0)
    assert reference(record, unpooled) == (unpooled, "forecast")  # another step than the sweep's windows timed
    same = type(forecast)(forecast.ips, forecast.slow_ips, forecast.fast_ips, omp_policy="unset (the user's)")
    assert held_policy(record, same) == (quiet, False) and reference(record, same)[0].ips == 23.51
    for forged, said in (
        ({"omp_wait_policy": 7}, "omp_wait_policy is int, not text"),
        ({"omp_wait_policy": ["PASSIVE"]}, "omp_wait_policy is list, not text"),
        ({"head_to_head": {"rounds": "7"}}, "head_to_head's rounds is '7', not a count"),
        ({"head_to_head": {"pooled_rounds": True}}, "head_to_head's rounds is True, not a count"),
        ({"head_to_head": []}, "list indices"),
    ):
        (tmp_path / "decision.json").write_text(json.dumps({"recommended": payload["recommended"] | forged}))
        with pytest.raises(Exception, match=f"not a dinox decision .TypeError: {re.escape(said)}"):
            _recommended(str(tmp_path))


def test_a_trial_settled_slower_than_a_tied_one_is_out_of_the_plan():
    """Three leaders: 64x4 and 48x4 tied, 96x2 slower than 64x4 in 5 of 5 (but not settled against 48x4): 96x2
    can no longer be the fastest, so the plan rests on the two unbeaten ones, and says why 96x2 is out."""
    third = ROWS[2]["run_id"]  # 96x2
    rounds = _rounds([23.5, 23.7, 23.4, 23.6, 23.5], [23.6, 23.5, 23.5, 23.5, 23.6])
    rounds += [_round(third, i + 1, x) for i, x in enumerate([23.45, 23.45, 23.45, 23.45, 23.45])]
    read = h2h.read(rounds)
    assert sorted(read[FIRST].unbeaten()) == sorted([FIRST, SECOND]) and not read[FIRST].settled()
    d = decide.decide(study.records(ROWS), BUDGET, rematches=read)
    large = next(m for m in d.models if m.name.startswith("vit_large"))
    assert {large.best.run_id, *(c.run_id for c in large.tied)} == {FIRST, SECOND}
    said = {b.other: b.describe() for b in large.bouts}
    assert said[third] == f"`{SECOND}` faster than `{third}` in 5 of 5 rounds"


def test_an_order_a_head_to_head_settled_holds_after_the_leader_meets_others_in_a_later_one():
    """64x4 settled faster than 48x4 in a first head-to-head, then faster than 96x2 in a second that 48x4 was
    not in. The second is 64x4's latest, but it never measured 48x4 again: the first one's order still holds
    (before, decide tied 48x4 with the leader again by their sweep ranges and asked for the head-to-head that
    had already settled them; bench_verify's round of 19:33 on 2026-11-30 then planned at 48x4's figure)."""
    third = ROWS[2]["run_id"]  # 96x2
    first = _rounds([23.30, 23.41, 23.38, 23.35, 23.44], [23.62, 23.70, 23.66, 23.58, 23.69], "20261126T140000-box-1")
    second = [_round(SECOND, i + 1, x) for i, x in enumerate([23.61, 23.66, 23.64, 23.60, 23.67])]
    second += [_round(third, i + 1, x) for i, x in enumerate([23.40, 23.45, 23.42, 23.41, 23.43])]
    read = h2h.read(first + second)
    assert read[SECOND] is read[third] and read[FIRST] is not read[SECOND]  # each trial's latest
    assert read[SECOND].last_met(SECOND, FIRST) is read[FIRST]
    d = decide.decide(study.records(ROWS), BUDGET, rematches=read)
    large = next(m for m in d.models if m.name.startswith("vit_large"))
    assert large.best.run_id == SECOND and large.tied == [] and d.contested == []
    said = {b.other: b.describe() for b in large.bouts}
    assert {b.other: b.head_to_head for b in large.bouts} == {third: read[SECOND].group, FIRST: read[FIRST].group}
    assert said == {
        third: f"`{SECOND}` faster than `{third}` in 5 of 5 rounds",
        FIRST: f"`{SECOND}` faster than `{FIRST}` in 5 of 5 rounds",
    }
    assert large.span.forecast_ips == pytest.approx(5 / sum(1 / x for x in [23.61, 23.66, 23.64, 23.60, 23.67]))
    import jsonschema

    payload = report_json.to_json(d)
    jsonschema.validate(payload, json.loads((ROOT / "docs" / "decision.schema.json").read_text()))
    bouts = payload["recommended"]["head_to_head"]["bouts"]
    assert {b["other"]: b["head_to_head"] for b in bouts} == {third: read[SECOND].group, FIRST: read[FIRST].group}


def test_a_trial_outside_the_head_to_head_is_held_against_the_leaders_sweep_range_not_its_rounds():
    """Rounds spread over minutes hold the box's drift (here 22.0-25.0 img/s); 96x2 (23.10-23.34 in the
    sweep), never tied with the leaders in the sweep, must not become tied through that spread."""
    rounds = h2h.read(_rounds([21.9, 22.9, 23.9, 24.4, 24.8], [22.0, 23.0, 24.0, 24.5, 25.0]))
    d = decide.decide(study.records(ROWS), BUDGET, rematches=rounds)
    large = next(m for m in d.models if m.name.startswith("vit_large"))
    assert large.best.run_id == SECOND and large.tied == [] and d.contested == []
    assert large.best.occasion_range == pytest.approx((23.39245, 23.62755))


def test_an_unsettled_head_to_head_stays_tied_at_the_slower_pooled_figure_and_is_not_offered_again():
    rounds = h2h.read(_rounds([23.5, 23.7, 23.4, 23.6, 23.5], [23.6, 23.5, 23.5, 23.5, 23.6]))
    d = decide.decide(study.records(ROWS), BUDGET, rematches=rounds)
    large = next(m for m in d.models if m.name.startswith("vit_large"))
    assert {large.best.run_id, *(c.run_id for c in large.tied)} == {FIRST, SECOND}
    slower = min(rounds[FIRST].pooled(FIRST), rounds[SECOND].pooled(SECOND))
    assert large.span.forecast_ips == pytest.approx(slower)
    assert d.contested == []  # already measured head to head: tied, said so, not offered again
    assert "tied (" in next(ln for ln in report.render_terminal(d).splitlines() if ln.startswith("leaders: "))
    (tie,) = report_json.to_json(d)["recommended"]["ties"]  # the rounds, not the sweep's ranges, tie them
    (bout,) = large.bouts
    assert tie["why"] == "head_to_head", tie
    assert tie["detail"] == f"measured again head to head: {bout.won} rounds to {bout.lost}, not settled"
    md = report.render_markdown(d, [])
    # The tied trial here is the leader, with this one (the recommended, the slower pooled)
    assert f"Tied with `{tie['run_name']}`: measured again head to head with this one, and the rounds did not" in md
    assert "their measured ranges overlap" not in md


SPEC = TINY.format(name="h2h").replace("batch: {size: 4}", "batch: {size: 4}\nsweep: {grid: {batch.size: [2, 4]}}")


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """Two tiny trials measured for real, as `dinox run` records them: (work, client, their run ids)."""
    work = tmp_path_factory.mktemp("h2h")
    (work / "spec.yaml").write_text(SPEC)
    proc = run_dinox(["run", "spec.yaml", "--no-system-metrics"], cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    trials = client.search_runs(["1"], "tags.`dinox.role` = 'trial'", order_by=["attributes.run_name"])
    return work, client, [t.info.run_id for t in trials]


def test_the_parent_s_best_figure_is_the_one_decide_plans_with(measured, tmp_path):
    """Issue 37's "one figure, one value", before any head-to-head: the sweep's parent shows as best the
    trial decide recommends, at the figure decide plans with; where decide calls the leaders tied, it plans at
    the slower of them, names the parent's best among them, and the parent's figure is the faster end."""
    work, client, runs = measured
    (parent,) = client.search_runs(["1"], "tags.`dinox.role` = 'sweep'")
    trials = {r: client.get_run(r).data.metrics["images_per_s"] for r in runs}
    best = max(trials, key=trials.__getitem__)
    assert parent.data.metrics["best_images_per_s"] == pytest.approx(trials[best])
    assert f"{trials[best]:.1f} img/s (windows)" in parent.data.tags["mlflow.note.content"]
    out = tmp_path / "d"
    gate = run_dinox(
        ["decide", "--spec", "spec.yaml", "--days", "1", "--target-images", "100", "--no-log", "--out", str(out)],
        cwd=work,
    )
    assert gate.returncode in (0, 3), gate.stdout + gate.stderr
    # The model's entry (its verdict may be GO or UNSETTLED: these windows are one each): its best, its plan.
    (model,) = json.loads((out / "decision.json").read_text())["models"]
    planned, tied = model["span"]["forecast_ips"], model["tied"]
    if not tied:
        assert model["best"]["run_id"] == best and planned == pytest.approx(trials[best])
    else:
        assert best in {model["best"]["run_id"], *tied}
        assert planned == pytest.approx(min(trials.values())) and planned <= trials[best]


def _rounds_recorded(client) -> list:
    return client.search_runs(["1"], "tags.`dinox.role` = 'head_to_head'")


def test_head_to_head_measures_interleaved_rounds_that_decide_then_plans_with(measured):
    tmp_path, client, (a, b) = measured
    before = len(_rounds_recorded(client))
    proc = run_dinox(["head-to-head", "spec.yaml", "--run-id", a, "--run-id", b, "--rounds", "5"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("dinox: head to head: 1 bs=2, 2 bs=4; at most 5 rounds"), proc.stdout
    said = [ln.split(":")[1].strip() for ln in lines if ln.strip().startswith("round ")]
    assert said == ["1 bs=2", "2 bs=4", "2 bs=4", "1 bs=2"] * 2 + ["1 bs=2", "2 bs=4"]  # A B, B A, ...
    assert sum(ln.startswith(("SETTLED: ", "TIED: ")) for ln in lines) == 1, proc.stdout
    runs = _rounds_recorded(client)[: len(_rounds_recorded(client)) - before]  # newest first
    assert len(runs) == 10 and {r.data.tags["dinox.remeasures"] for r in runs} == {a, b}
    assert sorted(int(r.data.metrics["round"]) for r in runs) == sorted(list(range(1, 6)) * 2)
    assert len({r.data.tags["dinox.head_to_head"] for r in runs}) == 1
    assert all("dinox.status" not in r.data.tags for r in runs)  # not trials: the sweep's records stay as they are
    # Each round says what OpenMP's waiting threads did in it (the box is read again before each round).
    assert all(r.data.tags["dinox.omp_wait_policy"].startswith(("PASSIVE (", "unset (", "ACTIVE (")) for r in runs)
    out = tmp_path / "after"
    gate = run_dinox(
        ["decide", "--spec", "spec.yaml", "--days", "1", "--target-images", "100", "--no-log", "--out", str(out)],
        cwd=tmp_path,
    )
    assert gate.returncode in (0, 3), gate.stdout + gate.stderr
    # One figure, one value after the rounds too: the parent shows what decide now plans with, and says why.
    (parent,) = client.search_runs(["1"], "tags.`dinox.role` = 'sweep'")
    (model,) = json.loads((out / "decision.json").read_text())["models"]
    assert parent.data.metrics["best_images_per_s"] == pytest.approx(model["span"]["forecast_ips"], rel=1e-6)
    assert "Head-to-head " in parent.data.tags["mlflow.note.content"] and "pooled over the rounds" in proc.stdout
    line = next(ln for ln in gate.stdout.splitlines() if ln.startswith("leaders: "))
    assert "head to head, 5 interleaved rounds:" in line, gate.stdout
    # Pooled over all five, or (a neighbour came or went between rounds: this suite's other worker) over those
    # of the latest round's OpenMP policy, saying so.
    mixed = re.search(r"pooled over the [1-4] with OMP_WAIT_POLICY=\w+, its latest round's, where the sweep", line)
    assert "pooled, where the sweep had measured" in line or mixed, gate.stdout
    # The step the plan's figure is of, for `dinox verify` to train: the best trial's latest round's (GO or not).
    best, recommended = model["best"], json.loads((out / "decision.json").read_text())["recommended"]
    latest = max((r for r in runs if r.data.tags["dinox.remeasures"] == best["run_id"]), key=_round_number)
    assert best["omp_wait_policy"] == latest.data.tags["dinox.omp_wait_policy"], best
    assert recommended is None or recommended["omp_wait_policy"] == best["omp_wait_policy"], recommended
    # And trains it: `dinox verify` of the leader by its run id (these one-window trials may leave the decision
    # UNSETTLED, recommending nothing) holds the rounds' pooled figure decide plans it at, with their policy,
    # and its check windows against the rounds' windows, not the sweep's.
    slice_ = ["--minutes", "0.05", "--epoch-images", "16"]
    trained = run_dinox(["verify", "spec.yaml", "--run-id", best["run_id"], *slice_], cwd=tmp_path)
    assert trained.returncode in (0, 1, 3), trained.stdout + trained.stderr  # held, off, undecided: each an answer
    first = trained.stdout.splitlines()[0]
    assert f"(forecast: trial run {best['run_id']}'s head-to-head, " in first and " pooled)" in first, first
    assert f"against a forecast of {best['measured_ips']:.1f} (measured range " in trained.stdout, trained.stdout
    (run,) = client.search_runs(["1"], "tags.`dinox.role` = 'verify'")
    planned = float(run.data.params["verify.forecast_images_per_s"])
    sweep = best["rematch"]["sweep_ips"]
    assert planned == pytest.approx(best["measured_ips"], rel=1e-5) and planned != pytest.approx(sweep)
    assert run.data.tags["dinox.omp_wait_policy"].startswith(contention.policy_of(best["omp_wait_policy"]))
    note = run.data.tags["mlflow.note.content"]
    if "windows timed as the trial timed its ran" in note:  # where the check windows say anything, whose they are
        assert "the head-to-head rounds' windows" in note, note


def _round_number(run) -> float:  # noqa: ANN001 - an MLflow Run
    return run.data.metrics["round"]


def test_a_reader_that_leaves_does_not_stop_the_rounds(measured):
    from tests.cli.test_closed_stdout import GONE, closed_stdout

    work, client, (a, b) = measured
    before = len(_rounds_recorded(client))
    code, err = closed_stdout(["head-to-head", "spec.yaml", "--run-id", a, "--run-id", b, "--rounds", "5"], work)
    assert code == 0 and err.strip().splitlines() == [GONE], err
    assert len(_rounds_recorded(client)) - before == 10  # --rounds 5: five rounds of two, each recorded


def test_rounds_are_measured_only_on_the_leaders_device(measured):
    """Rounds replace the leaders' figures in decide's plan: on a machine whose device is not theirs, the first
    measurement stops the head-to-head before anything is recorded; leaders of two devices (two hosts' shards)
    are refused before anything runs. Exit 2, one printable line, the store's names inert."""
    work, client, (a, b) = measured
    own = client.get_run(a).data.tags["dinox.device_name"]
    before = len(_rounds_recorded(client))
    args = ["head-to-head", "spec.yaml", "--run-id", a, "--run-id", b, "--rounds", "5"]
    try:
        for run in (a, b):
            client.set_tag(run, "dinox.device_name", "NVIDIA H100 80GB HBM3\x1b[2J")
        elsewhere = run_dinox(args, cwd=work)
        client.set_tag(b, "dinox.device_name", own)
        two = run_dinox(args, cwd=work)
    finally:
        client.set_tag(a, "dinox.device_name", own)
    assert elsewhere.returncode == 2 and "Traceback" not in elsewhere.stderr, elsewhere.stderr
    said = elsewhere.stderr
    assert said.startswith(f"error: this machine measures on {own}, 1 bs=2 was measured on NVIDIA H100 80GB HBM3 [2J")
    assert "(this measurement was not recorded)" in said and said.count("\n") == 1 and "\x1b" not in said, said
    assert two.returncode == 2 and two.stderr.startswith(
        f"error: the leaders were measured on different devices (1 bs=2 on NVIDIA H100 80GB HBM3 [2J; 2 bs=4 on {own})"
    ), two.stderr
    assert "round 1" not in two.stdout, two.stdout  # refused before any round
    assert len(_rounds_recorded(client)) == before


def test_ctrl_c_mid_round_keeps_the_rounds_done_and_leaves_no_child(measured):
    """A Ctrl-C at the terminal between rounds: exit 130, the measuring child gone, every round measured before
    it recorded whole (decide reads them), nothing half-written."""
    import psutil

    tmp_path, client, (a, b) = measured
    before = len(_rounds_recorded(client))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dinox", "head-to-head", "spec.yaml", "--run-id", a, "--run-id", b],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal
    )
    deadline = time.time() + 180
    while time.time() < deadline and len(_rounds_recorded(client)) - before < 3:
        time.sleep(0.2)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, out + err
    time.sleep(1)
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)
    runs = _rounds_recorded(client)
    assert len(runs) - before >= 3 and all(
        r.info.status == "FINISHED" and "images_per_s" in r.data.metrics for r in runs
    )
    gate = run_dinox(
        ["decide", "--spec", "spec.yaml", "--days", "1", "--target-images", "100", "--no-log"], cwd=tmp_path
    )
    assert gate.returncode in (0, 3) and "interleaved rounds:" in gate.stdout, gate.stdout + gate.stderr


def test_head_to_head_needs_two_trials_a_decision_that_names_them_and_a_store(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    one = run_dinox(["head-to-head", "spec.yaml", "--run-id", "abc"], cwd=tmp_path)
    assert one.returncode == 2 and one.stderr.startswith("error: --run-id: a head-to-head needs two trial runs"), one
    missing = run_dinox(["head-to-head", "spec.yaml", "--decision", "nowhere"], cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.startswith("error: nowhere/decision.json: No such file"), missing
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "decision.json").write_text(json.dumps({"verdict": "GO", "head_to_head": None}))
    alone = run_dinox(["head-to-head", "spec.yaml", "--decision", "d"], cwd=tmp_path)
    assert alone.returncode == 2 and "nothing is tied in this decision (verdict GO)" in alone.stderr, alone.stderr
    (tmp_path / "d" / "decision.json").write_text("[1, 2]")
    bad = run_dinox(["head-to-head", "spec.yaml", "--decision", "d"], cwd=tmp_path)
    assert bad.returncode == 2 and "not a dinox decision" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    rounds = run_dinox(["head-to-head", "spec.yaml", "--rounds", "4", "--run-id", "a", "--run-id", "b"], cwd=tmp_path)
    assert rounds.returncode == 2 and "--rounds" in rounds.stderr and "4 is not in the range 5<=x<=9" in rounds.stderr
    down = ["--tracking-uri", "http://127.0.0.1:9", "--run-id", "a", "--run-id", "b"]
    gone = run_dinox(["head-to-head", "spec.yaml", *down], cwd=tmp_path)
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1 and "127.0.0.1:9" in gone.stderr, gone.stderr

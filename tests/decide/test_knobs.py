"""What each knob bought: the pairs equal but for one param, their ratio, range, memory and status changes."""

from __future__ import annotations

import itertools
import json

import pytest
from mlflow import MlflowClient

from dinox import record as rec
from dinox.decide import budget, knobs
from dinox.decide import verdict as decide
from dinox.decide.occasions import Move
from dinox.report import decision_json
from dinox.report import text as report
from tests import study

M = {"model.name": "resnet50"}
BUDGET = budget.Budget(days=15, dataset_size=study.DATASET, epochs=study.EPOCHS)
# Per (compile, channels_last, precision): throughput (the p90 figure) at batch 64, or None for an OOM. compile
# buys 1.20x, channels_last 1.10x, bf16 2.0x, each alone; bf16 at batch 128 without compile runs out of memory.
IPS = {
    (c, cl, p): 100.0 * (1.2 if c else 1.0) * (1.1 if cl else 1.0) * (2.0 if p == "bf16-mixed" else 1.0)
    for c, cl, p in itertools.product((False, True), (False, True), ("32", "bf16-mixed"))
}


def _row(c: bool, cl: bool, p: str, size: int = 64, status: str = "ok", spread: float = 0.01) -> dict:
    r = study.trial(M, size, 1, IPS[(c, cl, p)] if status == "ok" else None, status, run_id=f"{c}-{cl}-{p}-{size}")
    r["params"].update({"model.compile": str(c), "model.channels_last": str(cl), "precision": p})
    r["metrics"]["peak_mem_reserved_gb"] = 4.0 + (1.0 if c else 0.0) - (1.5 if p == "bf16-mixed" else 0.0)
    r["metrics"]["window_spread"] = spread
    return r


def rows() -> list[dict]:
    grid = [_row(c, cl, p) for c, cl, p in itertools.product((False, True), (False, True), ("32", "bf16-mixed"))]
    # batch 128: compile off fits at fp32, runs out of memory at bf16 (a knob that makes a batch OOM)
    return grid + [_row(False, False, "32", 128), _row(False, False, "bf16-mixed", 128, status="oom")]


def test_each_knob_its_ratio_pairs_range_memory_and_the_oom_it_causes(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    study.log(MlflowClient(uri), "knobs", rows())  # through MLflow, as decide reads any store
    from dinox.store.readback import fetch_trials

    records = fetch_trials(uri, ["knobs"], []).records
    effects = {(k.field, k.before, k.after): k for k in knobs.knob_effects(records)}
    compile_ = effects[("model.compile", "False", "True")]
    assert compile_.pairs == 4 and compile_.ratio == pytest.approx(1.2) and not compile_.within_noise
    assert compile_.memory == pytest.approx(1.0)
    cl = effects[("model.channels_last", "False", "True")]
    assert cl.ratio == pytest.approx(1.1) and cl.pairs == 4
    bf16 = effects[("precision", "32", "bf16-mixed")]
    assert bf16.ratio == pytest.approx(2.0) and bf16.memory == pytest.approx(-1.5)
    assert bf16.pairs == 5 and bf16.statuses == {"ok -> oom": 1}  # the 128 pair: fp32 fit, bf16 did not
    size = effects[("batch.size", "64", "128")]  # fp32: the same figure; bf16: out of memory at 128
    assert size.statuses == {"ok -> oom": 1} and size.pairs == 2 and size.ratio == pytest.approx(1.0)
    assert size.within_noise  # its throughput change is inside the trials' own 1% spread; its OOM is not noise
    # Status changes first, then by the size of the effect.
    assert list(effects) == [
        ("precision", "32", "bf16-mixed"),
        ("batch.size", "64", "128"),
        ("model.compile", "False", "True"),
        ("model.channels_last", "False", "True"),
    ]

    d = decide.decide(records, budget.Budget(days=15, target_images=10**8))
    md = report.render_markdown(d, [])
    assert "## What each knob bought, measured" in md
    assert "| `model.compile` False -> True | 1.20x | 1.20-1.20x | 4 | +1.00 GiB | - |" in md
    assert "| `precision` 32 -> bf16-mixed | 2.00x | 2.00-2.00x | 5 | -1.50 GiB | 1 ok -> oom |" in md
    assert "| `batch.size` 64 -> 128 | within noise | 1.00-1.00x | 2 | +0.00 GiB | 1 ok -> oom |" in md
    line = next(ln for ln in report.render_terminal(d).splitlines() if ln.startswith("knobs: "))
    assert line.startswith("knobs: precision 32 -> bf16-mixed: 2.00x (4 pairs), memory -1.50 GiB, 1 pair ok -> oom; ")
    # compile, channels_last and bf16 together measured against the product of each alone (1.2 x 1.1 x 2.0)
    assert (
        "| model.channels_last False -> True; model.compile False -> True; precision 32 -> bf16-mixed | 2.64x | 2.64x "
        "| within noise |" in md
    )
    payload = decision_json.to_json(d)
    (three,) = [c for c in payload["combined"] if len(c["changes"]) == 3]
    assert three["measured"] == pytest.approx(2.64) and three["product"] == pytest.approx(2.64)
    assert three["multiplies"] is True and three["noise"] == pytest.approx([0.01]) and three["pairs"] == 1
    (c,) = [k for k in payload["knobs"] if k["field"] == "model.compile"]
    assert c == {
        "field": "model.compile",
        "from": "False",
        "to": "True",
        "pairs": 4,
        "ratio": pytest.approx(1.2),
        "no_effect": None,
        "ratio_min": pytest.approx(1.2),
        "ratio_max": pytest.approx(1.2),
        "within_noise": False,
        "memory_gb": pytest.approx(1.0),
        "status_changes": {},
    }


def test_a_change_inside_the_trials_own_noise_is_said_to_be_noise():
    base = _row(False, False, "32", spread=0.10)
    other = _row(True, False, "32", spread=0.10)
    other["metrics"]["images_per_s"] = base["metrics"]["images_per_s"] * 1.05  # 5% faster, windows 10% apart
    (k,) = knobs.knob_effects(study.records([base, other]))
    assert (
        k.within_noise and k.describe() == "model.compile False -> True: within noise (1.05x, 1 pair), memory +1.00 GiB"
    )


def test_a_combination_apart_from_the_product_is_said_so_unless_the_box_moved_between_its_trials():
    """compile and channels_last together: 1.32x at bf16, as each alone (1.2x, 1.1x) would make it, but 1.6x at
    fp32 (windows 1 % apart): over both pairs the speedups do not multiply, and the row shows both pairs, not
    whichever was found first. With the fp32 trial measured in a later sweep the box moved 33 % between, its
    pair says nothing either way: within the move, as a single knob's pair would be."""
    grid = rows()
    both = next(r for r in grid if r["run_id"] == "True-True-32-64")
    both["metrics"]["images_per_s"] = 160.0
    records = study.records(grid)
    key = ("model.channels_last False -> True", "model.compile False -> True")
    c = {c.changes: c for c in knobs.combinations(records, knobs.knob_effects(records))}[key]
    assert sorted(c.ratios) == pytest.approx([1.32, 1.6]) and c.product == pytest.approx(1.32)
    assert c.measured == pytest.approx(1.46) and not c.multiplies
    d = decide.decide(records, budget.Budget(days=15, target_images=10**8))
    md = report.render_markdown(d, [])
    assert "| 1.46x (1.32-1.60x, 2 pairs) | 1.32x | no: 1.11x the product |" in md
    (row,) = [r for r in decision_json.to_json(d)["combined"] if tuple(r["changes"]) == key]
    assert (row["pairs"], row["multiplies"], row["measured"]) == (2, False, pytest.approx(1.46))
    for r in records:
        r.tags[rec.PARENT_RUN] = "s2" if r.run_id == "True-True-32-64" else "s1"
    sweeps = frozenset(("s1", "s2"))
    moved = {sweeps: Move("3 bs=64", sweeps, (190.0, 210.0), (140.0, 160.0))}
    c = {c.changes: c for c in knobs.combinations(records, knobs.knob_effects(records, moved), moved)}[key]
    assert sorted(c.noise) == pytest.approx([0.01, moved[sweeps].size]) and c.multiplies


def test_the_knobs_plot_is_written(tmp_path):
    from PIL import Image

    from dinox.report.plots import write_plots

    records = study.records(rows())
    d = decide.decide(records, budget.Budget(days=15, target_images=10**8))
    (path,) = [p for p in write_plots(d, records, tmp_path) if p.name == "knobs.png"]
    with Image.open(path) as im:
        assert im.size[0] > 600 and im.size[1] > 200


def test_named_values_pair_in_the_order_the_sweep_ran_them():
    """A ladder's fp32 rung before its bf16-mixed rung reads `fp32 -> bf16-mixed` (alphabetical order read it
    backwards, `bf16-mixed -> fp32: 0.67x`)."""
    fp32, bf16 = _row(False, False, "32"), _row(False, False, "bf16-mixed")
    fp32["params"]["precision"] = "fp32"
    for i, r in enumerate((fp32, bf16)):
        r["tags"]["dinox.trial_index"] = str(i)
    (k,) = knobs.knob_effects(study.records([bf16, fp32]))
    assert (k.before, k.after) == ("fp32", "bf16-mixed") and k.ratio == pytest.approx(2.0)


def test_a_param_swept_over_many_values_gives_a_row_per_step_not_per_pair():
    """5,000 records over 2,500 image sizes gave 3.1 million rows in 54 s (every pair of values); neighbours
    only: one row per step between sizes, plus compile's."""
    rows = []
    for i in range(1000):
        for c in (False, True):
            r = _row(c, False, "32")
            r["params"]["model.img_size"], r["run_id"] = str(32 + i), f"{i}-{c}"
            rows.append(r)
    effects = knobs.knob_effects(study.records(rows))
    sizes = [k for k in effects if k.field == "model.img_size"]
    assert len(sizes) == 999 and {(k.before, k.after) for k in sizes[:1]} <= {
        (str(32 + i), str(33 + i)) for i in range(999)
    }
    (compile_,) = [k for k in effects if k.field == "model.compile"]
    assert compile_.pairs == 1000


def _ladder_rows() -> list[dict]:
    """A ladder on a CPU: base fp32, then tf32 (which the CPU does not apply: dinox.note), then channels_last
    inside the windows' own noise, then bf16 at twice the rate."""
    spec = [("fp32", False, 100.0, ""), ("tf32", False, 101.0, "tf32 has no effect on cpu; measured as fp32")]
    spec += [("tf32", True, 102.0, ""), ("bf16-mixed", True, 204.0, "")]
    out = []
    for i, (p, cl, ips, note) in enumerate(spec):
        r = study.trial(M, 64, 1, ips, run_id=f"rung{i}")
        r["params"].update({"precision": p, "model.channels_last": str(cl)})
        r["metrics"]["window_spread"] = 0.04
        r["tags"]["dinox.trial_index"] = str(i)
        if note:
            r["tags"]["dinox.note"] = note
        out.append(r)
    return out


def test_a_ladder_reads_the_same_in_the_sweep_s_table_and_in_decide():
    """The sweep's ladder table and decide's knob table say the same of each rung: no effect on this device,
    within noise, or a speedup that is the printed figures' own ratio; no "combined" row that is equal to the
    product of its parts by construction."""
    from dinox.sweep.outputs import ladder_lines

    rows = _ladder_rows()
    table_rows = [
        {"index": i, "status": "ok", "note": r["tags"].get("dinox.note", ""), **r["metrics"]}
        for i, r in enumerate(rows)
    ]
    ladder = [{"precision": "tf32"}, {"model.channels_last": True}, {"precision": "bf16-mixed"}]
    lines = ladder_lines(ladder, table_rows)
    assert "no effect on cpu" in lines[3] and "within noise" in lines[4] and "2.00x" in lines[5], lines
    assert "2.04x" in lines[5]  # cumulative: 204.0 / 100.0, as printed
    # A slow base: its printed figure is rounded, and the speedups are that figure's ratio (CI, a busy box:
    # 6.35 and 23.5 img/s printed "6.3" (or 6.4) and "23.5" beside 3.68x, which no reader's division gives).
    slow = [dict(row, images_per_s=ips) for row, ips in zip(table_rows, (6.354, 6.354, 6.354, 23.5), strict=True)]
    slow_lines = ladder_lines(ladder, slow)
    base_shown, top_shown = (float(ln.split()[-4]) for ln in (slow_lines[2], slow_lines[5]))
    assert (base_shown, top_shown) == (6.35, 23.5), slow_lines  # three figures at least below 10 img/s
    assert slow_lines[5].split()[-2] == f"{top_shown / base_shown:.2f}x", slow_lines
    d = decide.decide(study.records(rows), BUDGET)
    said = {(k.field, k.after): k.describe() for k in d.knobs}
    assert "no effect on cpu" in said[("precision", "tf32")]
    assert "within noise" in said[("model.channels_last", "True")]
    assert said[("precision", "bf16-mixed")].startswith("precision tf32 -> bf16-mixed: 2.00x")
    assert d.combined == []  # each product of a ladder's rungs is its measurement by construction


@pytest.mark.parametrize(
    "tag, before, after",
    [
        ("dinox.torch_threads", "1", "2"),
        ("dinox.device_name", "NVIDIA H100 80GB HBM3", "NVIDIA H200"),
        ("dinox.omp_wait_policy", "", "PASSIVE"),
        ("dinox.torch_version", "2.11.0+cu130", "2.14.1+cu130"),
        ("dinox.dinox_version", "0.1.0", "0.2.0"),
    ],
)
def test_trials_measured_in_another_context_never_pair(tag, before, after):
    """decide's knob table paired a 2-thread trial with a 1-thread one and read `runtime.gc enabled ->
    frozen: 10.61x`. What changes a trial's speed besides its params keeps pairs apart; a pair in one
    context still pairs."""
    slow, fast = _row(False, False, "32"), _row(True, False, "32")
    slow["tags"][tag], fast["tags"][tag] = before, after
    assert knobs.knob_effects(study.records([slow, fast])) == []
    fast["tags"][tag] = before
    (k,) = knobs.knob_effects(study.records([slow, fast]))
    assert (k.field, k.ratio) == ("model.compile", pytest.approx(1.2))


def test_a_rung_inside_the_sweep_s_move_is_within_noise_in_the_ladder_and_in_decide_as_the_verdict_ties_it():
    """`dinox run specs/resnet50_ladder.yaml --shrink` on this box (2026-12-01): the sweep moved 12.9 % while it
    ran (its drift check), decide tied the compile rung with the one before by their ranges (81.3-91.6 and
    99.7-106.9 img/s, each fast end raised by that move), yet its knob line and the sweep's ladder table both
    printed compile 1.20x, the ladder's without the move in its noise at all. One rule now: a pair whose ranges
    share a rate as decide's ties read them is within noise, wherever the pair is shown."""
    from dinox.store.trial_record import TrialRecord
    from dinox.sweep.outputs import ladder_lines

    def rung(i: int, compile_: bool, ips: float, lo: float, hi: float, spread: float) -> TrialRecord:
        params = {"model.name": "resnet50", "model.compile": str(compile_), "batch.size": "8"}
        metrics = {"images_per_s": ips, "images_per_s_min": lo, "images_per_s_max": hi, "windows": 2.0}
        metrics["window_spread"] = spread
        tags = {"dinox.status": "ok", "dinox.trial_id": f"t{i}", "mlflow.parentRunId": "s", "dinox.trial_index": str(i)}
        return TrialRecord(str(i), "1", f"{i} compile={compile_}", params, metrics, tags)

    before, after = rung(0, False, 86.16, 81.33, 91.59, 0.1186), rung(1, True, 103.19, 99.75, 106.87, 0.0689)
    days = budget.Budget(days=1, target_images=100 * 86400)
    held = decide.decide([before, after], days)
    assert held.knobs[0].describe().startswith("model.compile False -> True: 1.20x") and held.models[0].tied == []
    check = {"images_per_s": 103.8, "slow_ips": 103.5, "fast_ips": 104.0, "windows": 2, "seconds_after": 43.0}
    before.tags["dinox.drift_check"] = json.dumps(check)  # measured again at the end, 13.0 % over its range
    moved = decide.decide([before, after], days)
    assert [c.run_id for c in moved.models[0].tied] and moved.knobs[0].within_noise
    assert moved.knobs[0].describe().startswith("model.compile False -> True: within noise (1.20x, 1 pair)")
    rows = [{"index": i, "status": "ok", "note": "", **r.metrics} for i, r in enumerate((before, after))]
    gap = 103.5 / 91.59 - 1
    assert "1.20x" in ladder_lines([{"model.compile": True}], rows)[3]  # the box held: the ranges order the two
    step = ladder_lines([{"model.compile": True}], rows, moved=gap)[3].split("  ")
    assert "within noise" in step, step

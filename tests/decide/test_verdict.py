"""The decision policy on known figures: the motivating study's ViT-L / ViT-G numbers and its loader sweep."""

from __future__ import annotations

import json

import pytest

from dinox.decide import budget
from dinox.decide import verdict as decide
from dinox.report import decision_json as report_json
from dinox.report import text as report
from dinox.store.trial_record import TrialRecord
from tests import study

BUDGET = budget.Budget(days=15, dataset_size=study.DATASET, epochs=study.EPOCHS)
IMAGES = study.DATASET * study.EPOCHS  # 24,452,700


def by_name(d: decide.Decision, name: str) -> decide.ModelVerdict:
    (mv,) = [m for m in d.models if m.name == name]
    return mv


def test_study_vit_large_go_vit_giant_no_go():
    d = decide.decide(study.records(study.study()), BUDGET)
    assert d.verdict == "GO"
    large, giant = by_name(d, "vit_large_patch14_dinov2"), by_name(d, "vit_giant_patch14_dinov2")
    # ViT-L at 48x4 leads, the fastest by p90: 24,452,700 / (23.54 x 86400) = 12.02 days.
    assert large.lead.configuration["batch.size"] == "48"
    assert large.lead.conservative_ips == pytest.approx(23.54)
    assert large.lead.days == pytest.approx(IMAGES / (23.54 * 86400))
    assert large.lead.days == pytest.approx(12.02, abs=0.01)
    # 64x4 (23.51, windows 23.39-23.63) overlaps 48x4's range (23.42-23.66): the measurement cannot order the
    # two, so the plan is the slower one's forecast, and the margin the slowest window of either; the slower
    # one is recommended, so the forecast is its own.
    assert large.best.configuration["batch.size"] == "64" and large.tied == [large.lead]
    assert large.days == large.best.days == pytest.approx(IMAGES / (23.51 * 86400))
    assert large.go and large.margin_days == pytest.approx(15 - IMAGES / (23.51 * 0.995 * 86400))
    assert large.span.fast_ips == pytest.approx(23.54 * 1.005)
    # ViT-G at 32x8 with checkpointing: 52.4 days, and the budget buys 28.6 of the 100 epochs.
    assert giant.best.configuration["batch.size"] == "32"
    assert giant.best.days == pytest.approx(IMAGES / (5.40 * 86400))
    assert giant.best.days == pytest.approx(52.41, abs=0.01)
    assert not giant.go
    assert giant.epochs_in_budget == pytest.approx(5.40 * 86400 * 15 / study.DATASET)
    assert giant.epochs_in_budget == pytest.approx(28.62, abs=0.01)
    # The recommendation is the largest GO model, with its configuration and run.
    assert d.recommended is large
    assert "vit_large_patch14_dinov2" in d.reason and "12.0 days" in d.reason
    # Models listed largest first; the median is shown beside the conservative figure.
    assert [m.name for m in d.models] == ["vit_giant_patch14_dinov2", "vit_large_patch14_dinov2"]
    assert large.lead.median_ips == pytest.approx(23.54 / 0.97)


def test_oom_boundary_is_per_memory_configuration():
    d = decide.decide(study.records(study.study()), BUDGET)
    giant = by_name(d, "vit_giant_patch14_dinov2")
    # Without checkpointing 4 fit and 8 did not; with it, nothing OOMed, so there is no boundary to report.
    (boundary,) = giant.oom
    assert boundary.settings["model.grad_checkpointing"] == "False"
    assert (boundary.largest_ok, boundary.smallest_oom) == (4, 8)
    assert by_name(d, "vit_large_patch14_dinov2").oom == []


def test_required_effective_batch_filters_the_recipe():
    d = decide.decide(study.records(study.study()), BUDGET, decide.Policy(effective_batch=256))
    large = by_name(d, "vit_large_patch14_dinov2")
    assert large.best.configuration["batch.size"] == "64"  # 64x4 = 256, the study's choice
    assert {c.configuration["batch.size"] for c in large.candidates if not c.excluded} == {"64", "128"}
    assert all("effective batch" in c.excluded for c in large.candidates if c.configuration["batch.size"] == "48")
    assert by_name(d, "vit_giant_patch14_dinov2").best.configuration["batch.size"] == "32"  # 32x8 = 256


def test_memory_headroom_excludes_a_faster_trial_near_the_edge():
    rows = study.study() + [study.trial(study.VIT_L, 192, 2, 30.0, reserved_gb=90.0, run_id="edge")]
    d = decide.decide(study.records(rows), BUDGET)
    large = by_name(d, "vit_large_patch14_dinov2")
    (edge,) = [c for c in large.candidates if c.run_id == "edge"]
    assert edge.excluded.startswith("peak reserved memory 94% of the device > 90%")
    assert large.best.run_id != "edge"
    relaxed = decide.decide(study.records(rows), BUDGET, decide.Policy(max_memory_share=0.95))
    assert by_name(relaxed, "vit_large_patch14_dinov2").best.run_id == "edge"


def test_no_go_says_what_would_be_needed():
    tight = budget.Budget(days=10, dataset_size=study.DATASET, epochs=study.EPOCHS)
    d = decide.decide(study.records(study.study()), tight)
    assert d.verdict == "NO-GO" and d.recommended is None
    assert d.needed_ips == pytest.approx(IMAGES / (10 * 86400))  # 28.3 img/s
    assert "needs 28.3 img/s" in d.reason and "12.0 days" in d.reason
    text = report.render_markdown(d, [])
    assert "reach 28.3 img/s (windows)" in text and "grant 12.0 days" in text
    assert "the 83.1 epochs the budget buys it" in text  # 23.51 (tied with 23.54: the slower) x 86400 x 10 / 244,527


def test_utilization_stretches_the_days():
    b = budget.Budget(days=15, dataset_size=study.DATASET, epochs=study.EPOCHS, utilization=0.8)
    d = decide.decide(study.records(study.study()), b)
    large = by_name(d, "vit_large_patch14_dinov2")
    assert large.days == pytest.approx(12.04 / 0.8, abs=0.01)  # 15.05 days at the forecast: no longer fits ...
    assert large.span.days_fast == pytest.approx(12.02 / 1.005 / 0.8, abs=0.01)  # ... but 14.95 at its fastest
    assert d.verdict == "UNSETTLED" and not d.settled and d.recommended is None
    assert "the budget lies inside the measured range" in d.reason


def test_each_epoch_of_the_schedule_pays_the_loader_s_epoch_boundary():
    """What a boundary adds (epoch_boundary_s, measured apart from the timed windows): 100 epochs x 3 s on top of
    the steps' days; a schedule given in images has no epochs to charge. A record from before epoch_boundary_s
    is charged its epoch_start_s whole."""
    by_epochs = budget.Budget(days=15, dataset_size=study.DATASET, epochs=study.EPOCHS)
    steps_only = by_epochs.days_for(23.5)
    assert by_epochs.days_for(23.5, epoch_boundary_s=3.0) == pytest.approx(steps_only + study.EPOCHS * 3.0 / 86400)
    assert budget.Budget(days=15, target_images=10**6).days_for(23.5, 3.0) == pytest.approx(10**6 / 23.5 / 86400)
    rows = study.study()
    for row in rows:
        row["metrics"]["epoch_start_s"] = 600.0  # a 10-minute boundary: 100 epochs add 0.69 days
    large = by_name(decide.decide(study.records(rows), by_epochs), "vit_large_patch14_dinov2")
    assert large.lead.days == pytest.approx(12.02 + 100 * 600 / 86400, abs=0.01)
    assert large.days == large.best.days == pytest.approx(IMAGES / (23.51 * 86400) + 100 * 600 / 86400)
    said = "- Epoch boundaries, in the days: 100 x 600 s (the restarted loader's first batch)\n"
    assert said in report.render_markdown(decide.decide(study.records(rows), by_epochs), [])
    for row in rows:  # of the 10-minute restart, the run pays 4: the rest was each steady fetch's own wait
        row["metrics"]["epoch_boundary_s"] = 240.0
    d = decide.decide(study.records(rows), by_epochs)
    large = by_name(d, "vit_large_patch14_dinov2")
    assert large.days == large.best.days == pytest.approx(IMAGES / (23.51 * 86400) + 100 * 240 / 86400)
    assert large.best.epoch_start_s == 600.0 and large.best.epoch_boundary_s == 240.0
    said = "- Epoch boundaries, in the days: 100 x 240 s (the restarted loader's first batch, 600 s, less the wait a"
    assert said in report.render_markdown(d, [])
    for row in rows:  # with workers: the restart's first batch and the step on it (the fork's cost), less a step
        row["metrics"] |= {"epoch_start_s": 0.05, "epoch_restart_step_s": 0.9, "epoch_boundary_s": 0.6}
    d = decide.decide(study.records(rows), by_epochs)
    said = (
        "- Epoch boundaries, in the days: 100 x 0.6 s (the restarted loader's first batch, 0.05 s, and the step that"
        " trains on it, 0.9 s, less a typical step)\n"
    )
    assert said in report.render_markdown(d, [])
    by_images = decide.decide(study.records(rows), budget.Budget(days=15, target_images=10**7))  # no epochs
    assert by_images.recommended is not None and "Epoch boundaries" not in report.render_markdown(by_images, [])


def test_target_images_budget():
    b = budget.Budget(days=15, target_images=10_000_000)
    d = decide.decide(study.records(study.study()), b)
    giant = by_name(d, "vit_giant_patch14_dinov2")
    assert giant.best.days == pytest.approx(10_000_000 / (5.40 * 86400))  # 21.4: still NO-GO
    assert giant.epochs_in_budget is None and giant.images_in_budget == pytest.approx(5.40 * 86400 * 15)


def test_worker_knee_and_pinned_memory():
    d = decide.decide(study.records(study.loader_study()), BUDGET)
    knees = {tuple(sorted(k.settings.items())): k for k in d.loader.knees}
    pinned = knees[(("loader.pin_memory", "True"),)]
    # Best 503 img/s at 24 workers; 8 workers give 495 >= 0.95 x 503: the knee is 8.
    assert pinned.points == [
        (0, pytest.approx(78)),
        (4, pytest.approx(337)),
        (8, pytest.approx(495)),
        (16, pytest.approx(482)),
        (24, pytest.approx(503)),
        (32, pytest.approx(485)),
    ]
    assert (pinned.knee_workers, pinned.best_workers) == (8, 24)
    assert len(d.loader.pin) == 5 and all(p.ratio == pytest.approx(1 / 0.94) for p in d.loader.pin)
    assert d.loader.pin_summary.startswith("pinned memory helps: faster in 5 of 5")
    assert [name for name, _m, _ips, _cost in d.loader.io_bound] == ["resnet18-32x1-w0-True-ok"]


def test_the_loader_ceiling_and_costs_reach_the_findings_and_the_report():
    rows = study.loader_study()
    for row in rows:  # the loader alone: about 110 images/s per worker, 0 workers: the main process, 80
        w = int(row["params"]["loader.num_workers"])
        row["metrics"]["loader_images_per_s"] = 80.0 if w == 0 else 110.0 * w
        row["metrics"]["loader_cost"] = 0.85 if w == 0 else 0.02
        if w == 0:  # the costs the bound was read from; the others are records from before that tag
            row["tags"]["dinox.bound_evidence"] = "loader 84-86%, copies ~0%"
    hosted = study.trial({"model.name": "vit_tiny"}, 8, 1, 900.0, params_m=5.7, bound="host_bound", run_id="tiny")
    d = decide.decide(study.records([*rows, hosted]), BUDGET)
    pinned = next(k for k in d.loader.knees if k.settings == {"loader.pin_memory": "True"})
    assert pinned.loader_points[:3] == [(0, 80.0), (4, 440.0), (8, 880.0)]
    io_bound = [("resnet18-32x1-w0-True-ok", "resnet18", pytest.approx(78), "loader 84-86%, copies ~0%")]
    assert d.loader.io_bound == io_bound
    assert [n for n, _m, _ips in d.loader.host_bound] == ["tiny"]
    text = report.render_markdown(d, [])
    assert "| loader alone by workers |" in text and "0: 80, 4: 440, 8: 880" in text
    assert "(78 img/s, loader 84-86%, copies ~0%)" in text and "host_bound trials (1): tiny (900 img/s)" in text
    assert "| bound |" in text and "| compute_bound (loader 2% (windows)) |" in text


def test_an_io_bound_trial_measured_beside_others_is_flagged_not_one_measured_alone():
    rows = study.loader_study()
    beside = next(r for r in rows if r["tags"].get("dinox.bound") == "io_bound")
    beside["tags"]["dinox.concurrent_trials"] = "2"  # `dinox run --devices` ran it with another trial
    alone = {**beside, "tags": {**beside["tags"], "dinox.concurrent_trials": "1"}, "run_id": "alone"}
    d = decide.decide(study.records([*rows, alone]), BUDGET)
    assert len(d.loader.io_bound) == 2 and d.loader.io_bound_beside == ["resnet18-32x1-w0-True-ok"]
    assert "1 io_bound trial(s) were measured beside other trials" in report.render_markdown(d, [])
    assert "WARNING: io_bound trial(s) measured beside others" in report.render_terminal(d)
    assert report_json.to_json(d)["loader"]["io_bound_beside_others"] == ["resnet18-32x1-w0-True-ok"]


def test_a_trial_that_never_reached_a_device_counts_with_the_device_of_the_others():
    rows = study.study()
    for row in rows:
        row["tags"]["dinox.device_name"] = study.APU
    skipped = study.trial(study.VIT_G, 48, 8, None, "skipped", params_m=1100.0)  # pruned: never ran, no device
    d = decide.decide(study.records([*rows, skipped]), BUDGET)
    assert not d.per_device and d.device_names == [study.APU]
    giant = next(mv for mv in d.models if mv.name.startswith("vit_giant"))
    assert giant.statuses == {"ok": 3, "oom": 1, "skipped": 1}
    # Trials from two machines are decided apart, each model once per device.
    h100 = [{**r, "tags": {**r["tags"], "dinox.device_name": study.H100}, "run_id": r["run_id"] + "-h"} for r in rows]
    d = decide.decide(study.records([*rows, *h100]), BUDGET)
    assert d.per_device and [mv.device for mv in d.models].count(study.H100) == 2


def test_records_from_another_tool_without_optional_fields():
    # Only the names of the record: no batch.effective, no step-time quantiles.
    r = TrialRecord(
        "x",
        "0",
        "other",
        {"model.name": "m", "batch.size": "16", "batch.accumulation": "2"},
        {"images_per_s": 50.0},
        {"dinox.status": "ok"},
    )
    d = decide.decide([r], budget.Budget(days=1, target_images=50 * 86400))
    (mv,) = d.models
    assert mv.best.effective_batch == 32 and mv.best.conservative_ips == 50.0
    # Its forecast fits, but one figure has no measured spread: never a settled GO.
    assert mv.best.days == pytest.approx(1.0) and d.verdict == "UNSETTLED" and "too few timed windows" in d.reason
    assert d.needs == []  # fast enough at its forecast: it needs evidence, not speed


def test_nothing_measured_is_an_error_naming_the_statuses_and_the_commonest_error():
    rows = [study.trial(study.VIT_G, 8, 1, None, "oom"), study.trial(study.VIT_G, 4, 1, None, "crashed")]
    rows += [study.trial(study.VIT_L, b, 1, None, "error") for b in (8, 16, 32)]
    for i, row in enumerate(rows[2:]):
        row["tags"]["dinox.error"] = "hardware.device: cuda was asked for" if i else "another"
    with pytest.raises(budget.DecisionError) as e:
        decide.decide(study.records(rows), BUDGET)
    assert str(e.value) == (
        "nothing was measured (5 trials: error 3, oom 1, crashed 1); the commonest error (2x): "
        "hardware.device: cuda was asked for"
    )


def test_every_configuration_out_of_memory_is_no_go_nothing_fits():
    rows = [study.trial(study.VIT_G, 8, 1, None, "oom"), study.trial(study.VIT_G, 16, 1, None, "skipped")]
    d = decide.decide(study.records(rows), BUDGET)
    assert d.verdict == "NO-GO" and d.reason.startswith("nothing fits: every configuration ran out of memory")
    assert "smallest batch tried was 8" in d.reason and d.models[0].statuses == {"oom": 1, "skipped": 1}
    assert "nothing fits" in report.render_terminal(d) and "nothing fits" in report.render_markdown(d, [])


def test_an_unstable_recommendation_is_called_out_in_the_verdict_line_and_the_report():
    rows = study.study()
    (planned,) = [r for r in rows if r["run_id"] == "vit_large-64x4-w4-True-ok"]  # tied, the plan's: recommended
    planned["tags"]["dinox.unstable"] = "true"
    planned["metrics"]["window_spread"] = 0.18
    d = decide.decide(study.records(rows), BUDGET)
    # The GO holds at the slowest window, so it stands; the forecast's doubt is said beside it.
    assert d.verdict == "GO" and d.settled and "differ by 18%" in d.unstable
    lines = report.render_terminal(d).splitlines()
    assert lines[0].startswith("GO: ") and lines[1].startswith("WARNING: the recommended trial's timed windows")
    assert "--remeasure-unsettled" in report.render_markdown(d, []) and report_json.to_json(d)["unstable"] == d.unstable


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"days": 15, "dataset_size": 10}, "dataset_size together with epochs"),
        ({"days": 15, "target_images": 5, "epochs": 3}, "not both"),
        ({"days": 0, "target_images": 5}, "budget.days: Input should be greater than 0"),
        (
            {"days": 1, "target_images": 5, "utilization": 1.5},
            "budget.utilization: Input should be less than or equal to 1",
        ),
    ],
)
def test_budget_errors(kwargs, message):
    with pytest.raises(budget.DecisionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        budget.Budget(**kwargs)


def test_json_has_the_contract_keys():
    d = decide.decide(study.records(study.study()), BUDGET)
    payload = report_json.to_json(d)
    assert {"verdict", "recommended", "models", "budget", "policy"} <= set(payload)
    assert payload["verdict"] == "GO"
    rec = payload["recommended"]
    # 48x4 and 64x4 tied: the plan takes the slower, 64x4, and recommends it
    assert rec["model"] == "vit_large_patch14_dinov2" and rec["run_id"] == "vit_large-64x4-w4-True-ok"
    assert rec["configuration"]["batch.size"] == "64" and rec["tied_with"] == ["vit_large-48x4-w4-True-ok"]
    assert rec["lead"] == "vit_large-48x4-w4-True-ok"  # the tie's fastest-measured, named beside it
    # The forecast `dinox verify` holds against the recommended trial's training is that trial's own figure.
    (own,) = [r["metrics"]["images_per_s"] for r in study.study() if r["run_id"] == rec["run_id"]]
    assert rec["forecast_images_per_s"] == pytest.approx(own) == rec["span"]["forecast_ips"]
    giant = next(m for m in payload["models"] if m["model"] == "vit_giant_patch14_dinov2")
    assert giant["tied"] == [] and giant["lead"] is None
    assert payload["budget"]["images_needed"] == IMAGES
    assert {m["model"]: m["verdict"] for m in payload["models"]} == {
        "vit_giant_patch14_dinov2": "NO-GO",
        "vit_large_patch14_dinov2": "GO",
    }


def test_options_override_the_spec_budget_field_by_field():
    spec = {"days": 15.0, "dataset_size": 244527, "epochs": 100.0, "target_images": None}
    from dinox.cli.decide import budget_of

    assert budget_of(spec, None, None, None, None, 1.0) == budget.Budget(days=15, dataset_size=244527, epochs=100)
    twelve = budget.Budget(days=12, dataset_size=244527, epochs=100, utilization=0.9)
    assert budget_of(spec, 12, None, None, None, 0.9) == twelve
    assert budget_of(spec, None, None, 50, None, 1.0).epochs == 50
    images = budget_of(spec, None, None, None, 10**6, 1.0)
    assert (images.target_images, images.dataset_size, images.epochs) == (10**6, None, None)
    with pytest.raises(budget.DecisionError, match="no budget"):
        budget_of({}, None, 1000, 10, None, 1.0)


def test_unstable_trials_are_flagged_and_excluded_on_request():
    rows = study.study()
    large = [r for r in rows if r["params"]["model.name"] == "vit_large_patch14_dinov2"]
    best = max((r for r in large if r["tags"]["dinox.status"] == "ok"), key=lambda r: r["metrics"]["images_per_s"])
    best["tags"]["dinox.unstable"] = "true"
    best["metrics"]["window_spread"] = 0.23
    flagged = decide.decide(study.records(rows), BUDGET)
    assert by_name(flagged, "vit_large_patch14_dinov2").lead.run_id == best["run_id"]  # flagged, still counted
    assert "unstable (windows differ by 23%)" in report.render_markdown(flagged, [])
    strict = decide.decide(study.records(rows), BUDGET, decide.Policy(exclude_unstable=True))
    large_mv = by_name(strict, "vit_large_patch14_dinov2")
    assert large_mv.best is not None and large_mv.best.run_id != best["run_id"]
    (excluded,) = [c for c in large_mv.candidates if c.run_id == best["run_id"]]
    assert excluded.excluded == "unstable: its timed windows differ by 23%"
    # How many it left out and why, in the terminal and the report, beside tables that mark the same trial.
    said = "--exclude-unstable: 1 trial left out because their timed windows disagreed"
    assert said in report.render_terminal(strict)
    text = report.render_markdown(strict, [])
    assert f"`{said.split(':')[0]}`:{said.split(':', 1)[1]}" in text
    assert text.count("unstable: its timed windows differ by 23%") == 1


def test_mfu_and_memory_predictions_reach_the_report():
    rows = study.study()
    ok = [r for r in rows if r["tags"]["dinox.status"] == "ok"]
    for r in ok:
        r["metrics"].update(mfu=0.41, tflops=405.0, predicted_device_mem_gb=60.0)
    oom = next(r for r in rows if r["tags"]["dinox.status"] == "oom")
    oom["metrics"]["predicted_device_mem_gb"] = 95.0
    oom["tags"]["dinox.predicted_oom"] = "device 95.0 GB > 95% of device memory (79.1 GB)"
    d = decide.decide(study.records(rows), BUDGET)
    assert d.recommended is not None and d.recommended.best.mfu == 0.41
    assert "MFU 41.0%" in report.render_markdown(d, []) and " 41.0% " in report.render_terminal(d)
    assert len(d.memory) == len(ok) + sum(r["tags"]["dinox.status"] == "oom" for r in rows)
    measured = next(c for c in d.memory if c.status == "ok")
    assert measured.ratio == pytest.approx(measured.measured_gb / 60.0)
    text = report.render_markdown(d, [])
    assert "## Memory: predicted before the sweep, measured in it" in text
    assert report_json.to_json(d)["memory_predictions"][0]["predicted_gb"] in (60.0, 95.0)


# --- records from other tools are never trusted blindly ----------------------------------------------------


def _hostile(run_id: str, params: dict | None = None, metrics: dict | None = None) -> dict:
    row = study.trial(study.VIT_G, 32, 8, 30.0, params_m=1100.0, run_id=run_id)  # fast enough to be GO if trusted
    row["params"].update(params or {})
    row["metrics"].update(metrics or {})
    return row


HOSTILE = [
    (_hostile("nan-ips", metrics={"images_per_s": float("nan")}), "images_per_s nan is not a finite positive"),
    (_hostile("inf-p90", metrics={"step_s_p90": float("inf")}), "step_s_p90 inf is not a finite positive"),
    (_hostile("neg-p90", metrics={"step_s_p90": -16.0}), "step_s_p90 -16.0 is not a finite positive"),
    (_hostile("tiny-step", metrics={"step_s_p90": 1e-9}), "step_s_p90 1e-09 s is shorter than a microsecond"),
    (_hostile("huge-ips", metrics={"images_per_s": 1e308}), "images_per_s 1e+308 is more than 10^7 per device"),
    (_hostile("neg-mem", metrics={"device_mem_total_gb": -96.0}), "device_mem_total_gb -96.0 is not a finite"),
    (_hostile("batch-inf", {"batch.size": "inf"}), "batch.size 'inf' is not a positive integer"),
    (_hostile("batch-1e400", {"batch.size": "1e400"}), "batch.size '1e400' is not a positive integer"),
    (_hostile("batch-0", {"batch.size": "0"}), "batch.size '0' is not a positive integer"),
    (_hostile("batch-neg", {"batch.size": "-32", "batch.effective": "-256"}), "batch.size '-32' is not a positive"),
    (_hostile("gpus-inf", {"hardware.gpus": "inf"}), "hardware.gpus 'inf' is not a positive integer"),
    (_hostile("neg-boundary", metrics={"epoch_boundary_s": -5.0}), "epoch_boundary_s -5.0 is not a finite number"),
    (_hostile("huge-boundary", metrics={"epoch_boundary_s": 1e12}), "epoch_boundary_s 1e+12 is longer than any"),
    (_hostile("tiny-window", metrics={"images_per_s_min": 1e-300}), "images_per_s_min 1e-300 is no timed window"),
    (_hostile("inf-window", metrics={"images_per_s_max": float("inf")}), "images_per_s_max inf is no timed window"),
]


def test_records_that_cannot_be_true_are_left_out_with_the_reason():
    """Before: NaN throughput gave a matplotlib traceback, batch.size inf an OverflowError, batch 0 a
    ZeroDivisionError, a negative p90 GO at -16 img/s and -0.72 days, 1e308 img/s GO."""
    rows = study.study() + [row for row, _why in HOSTILE]
    d = decide.decide(study.records(rows), BUDGET)
    for (run, got), (row, why) in zip(d.left_out, HOSTILE, strict=True):
        assert run == row["run_id"] and got.startswith(why), (run, got)
    # The verdict is the study's: ViT-L GO at 12.0 days; ViT-G, whose hostile records were all "faster", NO-GO.
    assert d.verdict == "GO" and d.recommended.name == "vit_large_patch14_dinov2"
    assert not by_name(d, "vit_giant_patch14_dinov2").go
    assert all(c.conservative_ips > 0 and c.days > 0 for mv in d.models for c in mv.candidates)
    assert "left out 15 record(s) that cannot be trusted: nan-ips: images_per_s nan" in report.render_terminal(d)
    assert "## Records left out" in report.render_markdown(d, [])


def test_only_untrustworthy_records_is_an_error_not_a_verdict():
    with pytest.raises(budget.DecisionError, match="none of the 2 trial records can be used: nan-ips"):
        decide.decide(study.records([HOSTILE[0][0], HOSTILE[7][0]]), BUDGET)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target_images": -5}, "--target-images: Input should be greater than 0"),
        ({"dataset_size": -1000, "epochs": 1.0}, "--dataset-size: Input should be greater than 0"),
        ({"dataset_size": 1000, "epochs": float("nan")}, "--epochs: Input should be a finite number"),
        ({"days": float("inf"), "target_images": 5}, "--days: Input should be a finite number"),
        ({"days": 1e9, "target_images": 5}, "--days: Input should be less than or equal to 3650"),
        ({"target_images": 5, "utilization": float("nan")}, "--utilization: Input should be a finite number"),
    ],
)
def test_budget_options_are_validated_like_spec_fields(kwargs, message):
    """The budget's own errors name its fields; `dinox decide` names the option that set each."""
    from dinox.cli.decide import OPTIONS, budget_of

    args = {"days": 15.0, "dataset_size": None, "epochs": None, "target_images": None, "utilization": 1.0, **kwargs}
    with pytest.raises(budget.DecisionError) as e:
        budget_of({}, **args)
    assert message in e.value.named(OPTIONS)
    assert "--" not in str(e.value)


def test_policy_options_are_validated():
    from dinox.cli.decide import OPTIONS

    cases = [
        ({"max_memory_share": float("nan")}, "--max-memory-share"),
        ({"knee_tolerance": 2.0}, "--knee-tolerance"),
        ({"effective_batch": -4}, "--effective-batch"),
    ]
    for kwargs, message in cases:
        with pytest.raises(budget.DecisionError) as e:
            decide.Policy(**kwargs)
        assert e.value.named(OPTIONS).startswith(message) and "--" not in str(e.value)


def test_png_and_raw16_shards_are_compared_when_both_were_swept():
    base = {"model.name": "m", "batch.size": "8", "data.source": "webdataset", "loader.num_workers": "2"}

    def rec(i: int, shards: str, layout: str, ips: float, alone: float) -> TrialRecord:
        tags = {"dinox.status": "ok", "dinox.shard_layout": layout}
        params = {**base, "data.shards": shards}
        return TrialRecord(f"r{i}", "0", f"t{i}", params, {"images_per_s": ips, "loader_images_per_s": alone}, tags)

    d = decide.decide([rec(0, "/s/png", "png16", 40.0, 50.0), rec(1, "/s/raw", "raw16", 60.0, 140.0)], BUDGET)
    (row,) = d.loader.encodings
    assert row.images_per_s == {"png16": 40.0, "raw16": 60.0} and row.loader_images_per_s["raw16"] == 140.0
    text = report.render_markdown(d, [])
    assert "Shard encodings (data.shards=/s/png" not in text  # the shards are the compared thing, not a setting
    assert "png16 40.0 img/s (loader alone 50), raw16 60.0 img/s (loader alone 140)" in text
    assert report_json.to_json(d)["loader"]["encodings"][0]["images_per_s"]["raw16"] == 60.0


def test_a_loader_alone_window_the_trial_outran_is_no_ceiling_in_the_findings():
    """Beside two busy processes a loader-alone window read 61 img/s where the timed windows ran 173: the trial's
    record says that window was slowed (dinox.bound_note), and the findings leave it out rather than print a
    ceiling below the rate beside it."""
    base = {"model.name": "m", "batch.size": "8"}
    slowed = {"dinox.bound_note": "the trial ran faster (173.2 img/s) than its loader alone (60.5 img/s): ..."}

    def rec(i: int, workers: int, ips: float, alone: float, tags: dict) -> TrialRecord:
        params = {**base, "loader.num_workers": str(workers)}
        metrics = {"images_per_s": ips, "loader_images_per_s": alone}
        return TrialRecord(f"r{i}", "0", f"t{i}", params, metrics, {"dinox.status": "ok", **tags})

    d = decide.decide([rec(0, 0, 90.0, 95.0, {}), rec(1, 2, 173.2, 60.5, slowed)], BUDGET)
    (knee,) = d.loader.knees
    assert knee.points == [(0, 90.0), (2, 173.2)] and knee.loader_points == [(0, 95.0)]
    text = report.render_markdown(d, [])
    assert "| 0: 90, 2: 173 | 0: 95 |" in text, text


def test_the_command_decide_prints_quotes_the_spec_it_was_given():
    """The spec's path reaches the terminal, report.md and decision.json inside a command a user pastes: a
    space, a `;` or a newline in it stays one inert shell word."""
    rows = study.study()
    rows[0]["tags"]["dinox.unstable"] = "true"
    rows[0]["metrics"]["windows"] = 5
    tight = budget.Budget(days=12.02, dataset_size=study.DATASET, epochs=study.EPOCHS)
    d = decide.decide(study.records(rows), tight)
    assert d.verdict == "UNSETTLED" and d.remeasure == [rows[0]["run_id"]]
    d.spec_file = "my specs/a;rm -rf ~\nb.yaml"
    from dinox.report.settling import remeasure_command

    command = remeasure_command(d)
    assert command == "dinox run 'my specs/a;rm -rf ~ b.yaml' --remeasure-unsettled"
    assert command in report.render_terminal(d) and report_json.to_json(d)["remeasure"]["command"] == command


def test_a_capped_trial_s_advice_leaves_out_the_set_that_capped_it():
    """Measured with `--set measure.repeats=1`, the advice to raise it must not hand that --set back: the
    command it prints measures with the spec's own count, the sweep's other --sets kept."""
    from dinox.report.settling import unsettled_lines

    rows = study.study()
    for row in rows:
        row["params"]["measure.repeats"] = "1"
        row["metrics"]["windows"] = 1.0
    d = decide.decide(study.records(rows), BUDGET)
    d.spec_file, d.sets = "s.yaml", ("measure.repeats=1", "data.index_csv=/d/i.csv")
    (line,) = [ln for ln in unsettled_lines(d) if "never settles a GO" in ln]
    assert line.endswith(
        "raise it (measured with `--set measure.repeats=1`: leave it out), then "
        "`dinox run s.yaml --set data.index_csv=/d/i.csv`"
    ), line
    assert d.spec_arg == "s.yaml --set measure.repeats=1 --set data.index_csv=/d/i.csv"  # elsewhere: all of them


@pytest.mark.parametrize(
    ("run_name", "word"),
    [("3 size=64 num_workers=4", "--profile 3"), ("$(touch PWNED);x 2", "--profile N"), ("`id` 1", "--profile N")],
)
def test_the_profile_command_in_the_report_takes_only_the_trial_s_number_from_the_store(run_name, word):
    """report.md suggests `dinox run SPEC --profile N` for an unprofiled recommendation; the run's name is the
    store's, which any tool writes: a name that does not start with dinox's trial number never reaches the
    command a user pastes, and the spec is the one decide was given, quoted."""
    rows = study.study()
    d = decide.decide(study.records(rows), BUDGET)
    d.spec_file = "my specs/s.yaml"
    d.recommended.best.run_name = run_name
    text = report.render_markdown(d, [])
    (line,) = [ln for ln in text.splitlines() if ln.startswith("Not profiled")]
    assert f"`dinox run 'my specs/s.yaml' {word}` traces this trial" in line, line
    assert "PWNED" not in line and "id" not in line.split("--profile")[1], line


def _measured(run_id: str, trial: str, sweep: str, workers: int, lo: float, hi: float) -> TrialRecord:
    """A quickstart trial at batch 32 x 2 as a sweep records it: its windows' range and their rate between."""
    params = {"model.name": "vit_tiny_patch16_224", "batch.size": "32", "batch.accumulation": "2"}
    params["loader.num_workers"] = str(workers)
    metrics = {"images_per_s": (lo + hi) / 2, "images_per_s_min": lo, "images_per_s_max": hi, "windows": 5.0}
    tags = {"dinox.status": "ok", "dinox.trial_id": trial, "mlflow.parentRunId": sweep}
    return TrialRecord(run_id, "1", f"{run_id} bs=32 w={workers}", params, metrics, tags)


def test_leaders_from_two_sweeps_the_box_moved_between_are_tied_not_ordered_by_their_ranges():
    """Issue 33, item 2, as a user met it: after `--remeasure-unsettled`, trial 5 (measured again four minutes
    later) ran 145.7-189.4 img/s where the first sweep had it at 194.7-225.5, and decide ranked the first
    sweep's trial 6 (193.3-212.0) above it by their disjoint ranges: a winner chosen by the box's move."""
    first_5 = _measured("5a", "t5", "sweep-1", 0, 194.7, 225.5)
    six = _measured("6", "t6", "sweep-1", 2, 193.3, 212.0)
    again_5 = _measured("5b", "t5", "sweep-2", 0, 145.7, 189.4)
    days = budget.Budget(days=1, target_images=100 * 86400)
    moved = decide.decide([six, again_5], days, earlier=[first_5])
    (mv,) = moved.models
    assert mv.lead.run_id == "6" and mv.best.run_id == "5b" and [c.run_id for c in mv.tied] == ["6"]
    # planned at the slower of the two, and that one recommended
    assert mv.span.forecast_ips == mv.best.measured_ips == pytest.approx((145.7 + 189.4) / 2)
    assert [c.run_id for c in moved.contested] == ["6", "5b"]  # the head-to-head that would order them
    said = report.render_markdown(moved, [])
    assert "Tied with `6 bs=32 w=2`: measured in another sweep than this one, and the box moved between" in said
    assert "`5b bs=32 w=0` ran 194.7-225.5 img/s in the earlier sweep and 145.7-189.4 in the later" in said
    # The workers' knob is read from that same pair: 1.21x, inside the box's 25 % move, is noise.
    (knob,) = moved.knobs
    assert knob.ratio == pytest.approx(202.65 / 167.55) and knob.within_noise
    # Without the earlier run the store shows no move: the ranges order the two, as before.
    alone = decide.decide([six, again_5], days)
    assert alone.models[0].best.run_id == "6" and alone.models[0].tied == []
    assert not alone.knobs[0].within_noise
    # Trial 5's two runs overlapping: the box held still between the sweeps, and the ranges order them.
    steady = decide.decide([six, again_5], days, earlier=[_measured("5a", "t5", "sweep-1", 0, 170.0, 190.0)])
    assert steady.models[0].tied == [] and steady.models[0].moved == {}
    # An earlier record no sweep could have written (an infinite fastest window) shows nothing.
    broken = _measured("5a", "t5", "sweep-1", 0, 194.7, float("inf"))
    assert decide.decide([six, again_5], days, earlier=[broken]).models[0].tied == []
    # One sweep, whatever else moved: ranges measured together are compared as they are.
    same = decide.decide([six, _measured("5b", "t5", "sweep-1", 0, 145.7, 189.4)], days, earlier=[first_5])
    assert same.models[0].tied == []


def test_a_small_move_between_sweeps_ties_only_the_pairs_closer_than_it():
    """Between two sweeps as within one: a move the store shows ties a pair of trials only where their ranges lie
    closer than the box moved. A 5.7 % move between sweeps (trial 5: 200-210 img/s, then 190-198) says nothing
    about a trial measured 30 % faster than the other sweep's best, yet decide tied the two (any move tied every
    pair across its sweeps) and planned the slower."""
    first_5 = _measured("5a", "t5", "sweep-1", 0, 200.0, 210.0)
    again_5 = _measured("5b", "t5", "sweep-2", 0, 190.0, 198.0)
    days = budget.Budget(days=1, target_images=100 * 86400)
    far = _measured("6", "t6", "sweep-1", 2, 255.0, 262.0)  # 30 % above 5b's range
    d = decide.decide([far, again_5], days, earlier=[first_5])
    (mv,) = d.models
    assert mv.best.run_id == "6" and mv.tied == [] and d.contested == []
    assert mv.span.forecast_ips == pytest.approx((255.0 + 262.0) / 2)
    assert not d.knobs[0].within_noise  # the workers' 1.33x stands out of the 5.7 % move
    # 202.0-206.0 lies 2.0 % above 5b's fastest window, inside the move (mid-ranges 205 / 194, 5.7 %): tied.
    near = _measured("6", "t6", "sweep-1", 2, 202.0, 206.0)
    close = decide.decide([near, again_5], days, earlier=[first_5])
    (mv,) = close.models
    assert mv.lead.run_id == "6" and mv.best.run_id == "5b" and [t.why for t in mv.ties()] == ["moved"]
    assert "in the earlier sweep and 190.0-198.0 in the later, 5.7% apart by their mid-ranges" in mv.ties()[0].detail
    assert close.knobs[0].within_noise


def _drift(r: TrialRecord, lo: float, hi: float) -> TrialRecord:
    """`r` with its sweep's drift check: measured again at the sweep's end at lo-hi img/s."""
    check = {"images_per_s": (lo + hi) / 2, "slow_ips": lo, "fast_ips": hi, "windows": 5, "seconds_after": 60.0}
    r.tags["dinox.drift_check"] = json.dumps(check)
    return r


def test_trials_of_one_sweep_closer_than_its_drift_check_moved_are_tied_not_ordered_by_their_ranges():
    """Issue 33, 2026-11-29 round 2: the sweep put 2 workers above 0 by ranges that did not overlap, where two
    head-to-heads had put 0 workers ahead 5 of 5: the ranges ordered the box's drift. A sweep's first trial,
    measured again at its end (dinox.sweep.drift) outside its own range, shows the move; trials closer than it
    are tied (and planned at the slower), trials further apart are still ordered."""
    days = budget.Budget(days=1, target_images=100 * 86400)
    first = _measured("1", "t1", "s", 0, 221.0, 228.0)  # 0 workers, first in the sweep
    later = _measured("2", "t2", "s", 2, 231.0, 236.0)  # 2 workers, 4.0 % faster at mid-range, ranges apart
    assert decide.decide([first, later], days).models[0].tied == []  # no drift check: ordered, as before
    # Measured again at the end 4.4 % above its own fastest window (238-245 against 221-228): the two lie closer.
    moved = decide.decide([_drift(first, 238.0, 245.0), later], days)
    (mv,) = moved.models
    assert mv.lead.run_id == "2" and mv.best.run_id == "1" and [c.run_id for c in mv.tied] == ["2"]
    assert mv.moved["1"].within and mv.moved["1"].gap == pytest.approx(238 / 228 - 1)  # 4.4 %, over its own range
    assert [c.run_id for c in moved.contested] == ["2", "1"]  # the head-to-head that would order them
    (tie,) = mv.ties()
    assert tie.why == "moved"
    assert tie.detail.startswith("1 bs=32 w=0 ran 221.0-228.0 img/s at the sweep's start and 238.0-245.0 when")
    said = report.render_markdown(moved, [])
    assert "Tied with `2 bs=32 w=2`: measured in the same sweep as this one, which moved while it ran (" in said
    assert "`1 bs=32 w=0` ran 221.0-228.0 img/s at the sweep's start and 238.0-245.0 when measured again" in said
    # The forecast is the box of those minutes: a note says so, in the terminal, report.md and decision.json.
    (note,) = [n for n in moved.notes if "moved while it ran" in n]
    assert note.startswith("the sweep that measured ") and note.endswith(
        "(`dinox verify` holds the forecast against real training)"
    )
    assert "1 bs=32 w=0 ran 221.0-228.0 img/s at the sweep's start and 238.0-245.0 when measured again" in note
    assert f"note: {note}" in report.render_terminal(moved)
    assert f"- {note.split(' (`')[0]}" in said  # report.md: its backticks escaped, as every note's
    assert note in report_json.to_json(moved)["notes"]
    # Verified, the plan's trial has real training's word: no note.
    check = TrialRecord("v1", "0", "verify", {}, {"verify_images_per_s": 225.0, "forecast_error": 0.0}, {})
    verified = decide.decide([_drift(first, 238.0, 245.0), later], days, verified={"1": check})
    assert verified.models[0].best.verified is not None
    assert not [n for n in verified.notes if "moved while it ran" in n]
    # The workers' knob, read from the same pair: 1.04x is inside the sweep's 4.4 % move, so noise.
    assert moved.knobs[0].within_noise
    # A change of 6.2 % is out of the move's 4.4 % gap by the mid-ranges, but the two ranges, each fast end
    # raised by that gap, share a rate (228 x 1.044 = 238.0 above 236): the verdict ties the two, and the knob
    # table says the same of them, never a 1.06x beside that tie (dinox.store.trial_record.within_noise).
    closer = decide.decide([_drift(first, 238.0, 245.0), _measured("2", "t2", "s", 2, 236.0, 241.0)], days)
    (knob,) = closer.knobs
    assert knob.ratio == pytest.approx(238.5 / 224.5) and knob.within_noise
    assert [c.run_id for c in closer.models[0].tied] == ["2"]
    # A trial 20 % faster stands out of a 4.4 % move: still ordered, not tied, and a knob's speedup.
    far = _measured("3", "t3", "s", 4, 268.0, 275.0)
    apart = decide.decide([_drift(first, 238.0, 245.0), far], days)
    assert apart.models[0].tied == [] and not apart.knobs[0].within_noise
    # The check inside the trial's own range: the box held, the ranges order the two.
    held = decide.decide([_drift(first, 222.0, 229.0), later], days)
    assert held.models[0].tied == [] and held.models[0].moved == {}
    assert not [n for n in held.notes if "moved while it ran" in n]
    # A check no sweep could have written (a bool, a NaN, a string, too few windows, a fast end under the rate)
    # shows nothing.
    for bad in ('{"images_per_s": true}', "NaN", '"fast"', "[1, 2]", "{", ""):
        first.tags["dinox.drift_check"] = bad
        assert decide.decide([first, later], days).models[0].tied == [], bad
    # ... nor one whose rates no window ran at (a check of 10^-300 img/s would widen every end 10^302-fold).
    odd = (("slow_ips", 1e-300), ("fast_ips", 1e300))
    for field, value in (("windows", 1), ("windows", True), ("fast_ips", 200.0), ("slow_ips", float("nan")), *odd):
        _drift(first, 238.0, 245.0)
        check = json.loads(first.tags["dinox.drift_check"])
        first.tags["dinox.drift_check"] = json.dumps({**check, field: value})
        assert decide.decide([first, later], days).models[0].tied == [], (field, value)
    # A move in another sweep says nothing of this one.
    other = _measured("9", "t9", "elsewhere", 0, 100.0, 101.0)
    moved_elsewhere = decide.decide([_measured("1", "t1", "s", 0, 221.0, 228.0), later, _drift(other, 150, 151)], days)
    assert moved_elsewhere.models[0].tied == []


def test_a_sweep_that_moved_while_it_ran_widens_each_end_of_its_trials_by_that_move():
    """A GO is read at the slow end of what was measured, and a sweep whose drift check moved measured each trial
    at the pace of its own minutes: real training may meet the box at either end's. Each end is widened by the
    move beyond the windows' spreads (Move.gap); the forecast stays the windows' rate."""
    tight = budget.Budget(days=1, target_images=215 * 86400)  # needs 215 img/s
    still = decide.decide([_measured("1", "t1", "s", 0, 221.0, 228.0)], tight)
    assert still.verdict == "GO" and still.models[0].span.slow_ips == 221.0 and still.models[0].span.drift == 0
    moved = decide.decide([_drift(_measured("1", "t1", "s", 0, 221.0, 228.0), 238.0, 245.0)], tight)
    (mv,) = moved.models
    gap = 238.0 / 228.0 - 1  # 4.4 %: the check's slowest window over the trial's fastest
    assert mv.span.drift == pytest.approx(gap) and mv.span.forecast_ips == pytest.approx(224.5)
    # Each end widened by the move; the trial measured again also covers its check's windows (245.0: its own).
    assert (mv.span.slow_ips, mv.span.fast_ips) == (pytest.approx(221.0 / (1 + gap)), 245.0)
    # Another trial of that sweep: its own windows, each end widened by the move.
    other = decide.decide(
        [_drift(_measured("1", "t1", "s", 0, 221.0, 228.0), 238.0, 245.0), _measured("2", "t2", "s", 2, 231.0, 236.0)],
        tight,
    )
    (two,) = [c for c in other.models[0].candidates if c.run_id == "2"]
    assert (two.slow_ips, two.fast_ips) == (pytest.approx(231.0 / (1 + gap)), pytest.approx(236.0 * (1 + gap)))
    assert moved.verdict == "UNSETTLED" and report_json.exit_code(moved) == 3  # 211.7 img/s < 215 < 245.0
    assert mv.unsettled_why.endswith("each widened by the 4.4% its sweep moved while it ran)")
    said = report.render_terminal(moved)
    assert "(slowest and fastest: window measured, widened by the 4.4% its sweep moved while it ran)" in said
    assert "the sweep moved 4.4% while it ran (its drift check)" in said and "dinox verify SPEC --run-id 1" in said
    assert "`dinox run SPEC --force` on a box that holds still measures every trial again" in said
    md = report.render_markdown(moved, [])
    # The table shows the windows as measured, and the ends the verdict read beside them.
    assert "| 224.50 | 5: 221.00-228.00 |" in md
    assert "ends read 211.71-245.00: window measured, widened by the 4.4% its sweep moved while it ran" in md
    assert "(widened by the sweep's 4.4% move)" in report.render_note(moved)
    data = report_json.to_json(moved)
    assert data["verdict"] == "UNSETTLED" and data["settled"] is False
    assert data["models"][0]["span"]["drift"] == pytest.approx(gap) and data["models"][0]["best"][
        "drift"
    ] == pytest.approx(gap)
    # A budget the widened slow end still holds: GO, and the margin says what its slow end is.
    loose = decide.decide(
        [_drift(_measured("1", "t1", "s", 0, 221.0, 228.0), 238.0, 245.0)],
        tight.model_copy(update={"target_images": 200 * 86400}),
    )
    assert loose.verdict == "GO" and report_json.exit_code(loose) == 0
    assert (
        "even at the slowest window measured, widened by the 4.4% its sweep moved while it ran (211.7 img/s"
        in loose.reason
    )
    # Real training of the trial speaks for itself: verified inside its windows, the ends are the windows'.
    check = TrialRecord("v1", "0", "verify", {}, {"verify_images_per_s": 225.0, "forecast_error": 0.0}, {})
    verified = decide.decide(
        [_drift(_measured("1", "t1", "s", 0, 221.0, 228.0), 238.0, 245.0)], tight, verified={"1": check}
    )
    assert verified.verdict == "GO" and verified.models[0].span.drift == 0 and verified.models[0].span.slow_ips == 221.0
    # ... but not a verification the box moved under (UNDECIDED): it does not speak for real training.
    check.tags["dinox.verify_moved"] = "true"
    undecided = decide.decide(
        [_drift(_measured("1", "t1", "s", 0, 221.0, 228.0), 238.0, 245.0)], tight, verified={"1": check}
    )
    assert undecided.models[0].best.verified.moved and undecided.models[0].span.drift == pytest.approx(gap)
    assert undecided.verdict == "UNSETTLED" and [n for n in undecided.notes if "moved while it ran" in n]


def test_a_three_way_tie_recommends_its_slowest_and_says_what_each_tie_rests_on():
    """Ties are judged against the leader (the fastest forecast); the plan and the recommendation are the tie's
    slowest. A trial tied with the leader need not overlap the slowest: each tie names the pair it rests on."""
    lead = _measured("a", "ta", "s", 0, 190.0, 210.0)  # forecast 200, the leader
    middle = _measured("c", "tc", "s", 2, 195.0, 215.0)  # forecast 205 ...
    middle.metrics["images_per_s"] = 195.0  # ... made 195: overlaps the leader's range, not the slowest's
    slow = _measured("b", "tb", "s", 4, 170.0, 192.0)  # forecast 181: overlaps the leader's range only
    d = decide.decide([lead, middle, slow], budget.Budget(days=1, target_images=100 * 86400))
    (mv,) = d.models
    assert (mv.lead.run_id, mv.best.run_id) == ("a", "b") and {c.run_id for c in mv.tied} == {"a", "c"}
    assert mv.span.forecast_ips == mv.best.measured_ips == pytest.approx(181.0)
    ties = {t.run_id: t for t in mv.ties()}
    assert ties["a"].detail == "measured ranges 170.0-192.0 and 190.0-210.0 img/s share a rate"  # the lead's: with b
    assert ties["c"].detail.endswith("share a rate (with the leader, a bs=32 w=0)")  # c's: with the leader
    said = report.render_markdown(d, [])
    assert "their measured ranges overlap the leader's, whose own overlaps this one's" in said
    assert [c.run_id for c in d.contested] == ["a", "b", "c"]  # the head-to-head: the leader first


def test_a_tie_of_equal_figures_recommends_the_leader_and_says_none_measured_faster():
    """Two trials at the very same forecast: the slowest of the tie is the leader itself, and the report does not
    call either faster."""
    a, b = _measured("a", "ta", "s", 0, 190.0, 210.0), _measured("b", "tb", "s", 2, 190.0, 210.0)
    d = decide.decide([a, b], budget.Budget(days=1, target_images=100 * 86400))
    (mv,) = d.models
    assert mv.lead is mv.best and [c.run_id for c in mv.tied] == ["b"]
    said = report.render_markdown(d, [])
    assert "Tied with `b bs=32 w=2`: their measured ranges overlap this one's" in said
    assert "the slowest of the tied trials; none measured faster (any of them will do)" in said


def test_days_are_printed_to_a_precision_that_means_something_and_never_as_a_bare_1():
    assert [budget.fmt_days(x) for x in (12.02, 0.54, 0.0532, 0.9975, 0.994, 1.0, 123456.0, 2.15e302)] == [
        "12.0", "0.54", "0.053", "1.0", "0.99", "1.0", "1.23e+05", "2.15e+302",
    ]  # fmt: skip


def _on_a_gpu(rows: list[dict], window_s: float, bench_steps: str = "20") -> list[dict]:
    for row in rows:
        row["tags"]["dinox.device"] = "cuda:0"
        row["params"]["measure.bench_steps"] = bench_steps
        if "windows" in row["metrics"]:
            row["metrics"]["window_s"] = window_s * row["metrics"]["windows"]
    return rows


def test_short_windows_on_an_accelerator_are_a_note_with_the_steps_that_make_a_second():
    """Windows of 0.16 s on a GPU (the quickstart's on an H200, 13.6 % off): a note in every output naming the
    measure.bench_steps that makes a window last a second; none from half a second (0.5-0.6 s windows held within
    5 % there), nor on a CPU."""
    d = decide.decide(study.records(_on_a_gpu(study.study(), 0.16)), BUDGET)
    (note,) = [n for n in d.notes if "timed windows lasted" in n]
    assert note.startswith("the recommended trial's timed windows lasted 0.16 s each on cuda:0")
    assert note.endswith("measure.bench_steps: 125 makes them a second")  # 20 steps x 1 s / 0.16 s
    assert f"note: {note}" in report.render_terminal(d) and note in report_json.to_json(d)["notes"]
    assert f"- {note}" in report.render_markdown(d, [])
    long = decide.decide(study.records(_on_a_gpu(study.study(), 0.5)), BUDGET)  # half a second: held on an H200
    on_cpu = study.study()
    for row in on_cpu:
        row["params"]["measure.bench_steps"] = "20"
        row["metrics"]["window_s"] = 0.16 * row["metrics"].get("windows", 3)
    for quiet in (long, decide.decide(study.records(on_cpu), BUDGET)):
        assert not any("timed windows lasted" in n for n in quiet.notes)


def test_the_terminal_s_days_column_is_the_figure_its_range_and_the_report_show():
    """A schedule of hours: the days column once read `0.0` beside a range of `0.043-0.045`."""
    from dinox.decide.budget import fmt_days
    from dinox.report.settling import days_range

    short = budget.Budget(days=1, target_images=study.DATASET // 50)
    d = decide.decide(study.records(study.study()), short)
    terminal, note = report.render_terminal(d), report.render_note(d)
    shown = [mv for mv in d.models if mv.span is not None]
    assert shown and all(mv.span.days < 0.1 for mv in shown), [mv.span.days for mv in shown]
    for mv in shown:
        days = fmt_days(mv.span.days)
        low, high = (float(x) for x in days_range(mv).split("-"))
        assert float(days) > 0 and low <= float(days) <= high, (days, days_range(mv))
        assert f" {days:>7} {days_range(mv):>12}  " in terminal, terminal
        assert f" | {days} | {days_range(mv)} | " in note, note

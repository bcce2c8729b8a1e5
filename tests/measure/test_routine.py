"""The run's routine (checkpoints, evaluation passes): measured by the trial, charged by decide over the
schedule, run at its cadence by `dinox verify` and held in its forecast; each through the command a user types."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from dinox import record as rec
from dinox.decide.budget import Budget, DecisionError
from dinox.decide.routine import RoutineCost, routine_cost
from tests.conftest import TINY, measure_one, run_dinox

ROUTINE = "routine: {checkpoint_every_steps: 3, checkpoint_dir: ckpt, eval_every_epochs: 1, eval_images: 12}\n"
SPEC = TINY.format(name="routine").replace("repeats: 1", "repeats: 3") + ROUTINE


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    work = tmp_path_factory.mktemp("routine")
    (work / "ckpt").mkdir()
    return measure_one(work, SPEC)


def test_the_trial_measures_one_save_and_one_evaluation_window(measured):
    work, trial = measured
    m = trial.data.metrics
    assert m["checkpoint_s"] > 0 and m["eval_images_per_s"] > 0 and m["eval_start_s"] >= 0
    # Model and AdamW's two moments, float32: at least three copies of the weights.
    params = m["trainable_params_m"] * 1e6
    assert m["checkpoint_gb"] * 2**30 >= 3 * 4 * params
    assert list((work / "ckpt").iterdir()) == []  # the save is measured, then removed
    assert trial.data.params["routine.checkpoint_every_steps"] == "3"


def test_decide_charges_the_routine_over_the_schedule(measured):
    work, trial = measured
    proc = run_dinox(
        ["decide", "--spec", "spec.yaml", "--days", "1", "--dataset-size", "120", "--epochs", "2", "--no-log"], cwd=work
    )
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr  # three windows: settled or not, a verdict
    best = json.loads((work / "decision" / "decision.json").read_text())["recommended"]
    m = trial.data.metrics
    routine = best["routine"]
    # 240 images in steps of 4: 60 steps, a checkpoint every 3; an evaluation pass at each of the 2 epochs.
    assert (routine["checkpoints"], routine["evals"]) == (20, 2)
    assert routine["checkpoint_s"] == pytest.approx(m["checkpoint_s"])
    assert routine["eval_s"] == pytest.approx(m["eval_start_s"] + 12 / m["eval_images_per_s"])
    seconds = 240 / best["forecast_images_per_s"] + 2 * m["epoch_boundary_s"] + routine["seconds"]
    assert best["days"] == pytest.approx(seconds / 86400)
    report = (work / "decision" / "report.md").read_text()
    assert "- Routine, in the days: 20 checkpoints x " in report and "+ 2 evaluation passes x " in report


def test_verify_runs_the_routine_at_its_cadence_and_forecasts_it(measured):
    work, trial = measured
    args = ["verify", "spec.yaml", "--run-id", trial.info.run_id, "--minutes", "0.1", "--epoch-images", "12"]
    proc = run_dinox(args, cwd=work)
    # Held, off, or (where the box moved since the trial: its check windows said so) undecided: a verdict.
    assert proc.returncode in (0, 1, 3), proc.stdout + proc.stderr
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    (run,) = client.search_runs(["1"], "tags.`dinox.role` = 'verify'")
    moved = run.data.tags.get(rec.VERIFY_MOVED) == "true"
    assert (proc.returncode == 3) == (moved and "UNDECIDED: " in proc.stdout), proc.stdout
    m, t = run.data.metrics, trial.data.metrics
    assert m["verify_checkpoints"] == m["verify_steps"] // 3 and m["verify_checkpoint_s"] > 0
    assert m["verify_evals"] == m["verify_epochs_ended"] >= 1 and m["verify_eval_s"] > 0
    eval_s = t["eval_start_s"] + 12 / t["eval_images_per_s"]
    forecast = (
        m["verify_images"] / t["images_per_s"]
        + m["verify_epochs_ended"] * t["epoch_boundary_s"]
        + m["verify_checkpoints"] * t["checkpoint_s"]
        + m["verify_evals"] * eval_s
    )
    assert m["forecast_s"] == pytest.approx(forecast)
    # The slice's rate is its steps' own: the routine's time is in the wall, not in the rate.
    steps_s = m["verify_wall_s"] - m["verify_checkpoint_s"] - m["verify_eval_s"]
    assert m["verify_images_per_s"] == pytest.approx(m["verify_images"] / steps_s)
    assert list((work / "ckpt").iterdir()) == []


def test_a_checkpoint_dir_that_cannot_be_written_fails_the_trial_by_name(tmp_path):
    (tmp_path / "ckpt").write_text("a file, not a folder")
    (tmp_path / "spec.yaml").write_text(SPEC)
    proc = run_dinox(["run", "spec.yaml", "--no-system-metrics"], cwd=tmp_path)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("[1/1] "))
    assert " error " in line and "routine.checkpoint_dir: cannot write a checkpoint in ckpt" in line, line
    assert "Traceback" not in proc.stdout.splitlines()[-1]


def test_the_routine_over_a_schedule():
    b = Budget(days=1, dataset_size=1000, epochs=10)
    params = {"routine.checkpoint_every_steps": "100", "routine.eval_every_epochs": "3", "routine.eval_images": "500"}
    metrics = {"checkpoint_s": 2.0, "eval_images_per_s": 250.0, "eval_start_s": 1.0}
    cost = routine_cost(params, metrics, b, effective_batch=10)  # 1,000 steps; epochs 3, 6 and 9
    assert cost == RoutineCost(10, 2.0, 3, 3.0) and cost.seconds == 29.0
    assert cost.describe() == "10 checkpoints x 2 s + 3 evaluation passes x 3 s = 0.00806 h"
    assert routine_cost({}, metrics, b, 10).seconds == 0.0  # a trial measured without a routine
    assert b.days_for(100.0, 0.0, cost.seconds) == pytest.approx((10_000 / 100 + 29) / 86400)
    with pytest.raises(DecisionError, match="routine.eval_every_epochs: the schedule has no epochs"):
        routine_cost(params, metrics, Budget(days=1, target_images=10_000), 10)


def test_an_evaluation_pass_never_resets_a_persistent_training_iterator():
    """A new iterator of a DataLoader whose workers persist is its one iterator reset: the evaluation pass
    reads through a loader of its own, so the training epoch goes on where it was."""
    import torch
    from torch.utils.data import DataLoader

    from dinox.measure.routine import eval_loader

    data = torch.arange(40.0).view(20, 2)
    train = DataLoader(data, batch_size=2, num_workers=1, persistent_workers=True, drop_last=True)
    it = iter(train)
    assert next(it)[0, 0] == 0 and next(it)[0, 0] == 4
    val = eval_loader(train)
    assert val is not train and val.batch_size == 2 and val.drop_last and not val.persistent_workers
    assert [b[0, 0].item() for b in val][:2] == [0.0, 4.0]
    assert next(it)[0, 0] == 8  # the training iterator went on

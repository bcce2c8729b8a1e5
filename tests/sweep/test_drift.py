"""The sweep's drift check (dinox.sweep.drift): its first ok trial measured again after its last, through the
`dinox run` a user types; what the line says; a Ctrl-C during it; and the switch that turns it off."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dinox.contract import DriftCheck, TrialResult
from dinox.plan.grid import Trial
from dinox.spec.sections import TrialSpec
from dinox.sweep import drift
from tests.conftest import TINY
from tests.sweep.test_reliability import dinox_popen, runs_of

# Two windows a trial (a range to check against), the rest the suite's tiny trial.
SPEC = TINY.replace("bench_steps: 3, repeats: 1", "bench_steps: 2, repeats: 2") + (
    "sweep:\n  drift_check: {check}\n  grid:\n    batch.size: [2, 4]\n"
)


def _sweep(tmp_path: Path, name: str, check: str = "true") -> subprocess.Popen:
    (tmp_path / f"{name}.yaml").write_text(SPEC.format(name=name, check=check))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return dinox_popen(["run", f"{name}.yaml", "--tracking-uri", uri, "--no-system-metrics"], tmp_path, sigint=True)


def _trials(tmp_path: Path, name: str) -> dict[str, dict[str, str]]:
    """Each trial run's tags by its run name."""
    runs = runs_of(f"sqlite:///{tmp_path / 'mlflow.db'}", name)
    return {r.info.run_name: r.data.tags for r in runs if r.data.tags.get("dinox.role") == "trial"}


def test_a_sweep_measures_its_first_trial_again_at_its_end_and_keeps_the_figure_on_that_trial(tmp_path):
    """Two trials measured ok: the first is measured again (its windows only) after the second, the line says
    what it ran beside its own range (and so does the parent run's Description), and the figure is on trial 1's
    run (none on trial 2's)."""
    proc = _sweep(tmp_path, "drifting")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    (line,) = [ln for ln in out.splitlines() if ln.startswith("drift check:")]
    assert line.startswith("drift check: 1 bs=2 ran "), line
    assert line.endswith("the box held while the sweep ran") or "the box moved" in line, line
    trials = _trials(tmp_path, "drifting")
    check = DriftCheck.parse(trials["1 bs=2"].get("dinox.drift_check"))
    assert check is not None and check.windows == 2 and check.seconds_after > 0, trials["1 bs=2"]
    assert "dinox.drift_check" not in trials["2 bs=4"]
    runs = runs_of(f"sqlite:///{tmp_path / 'mlflow.db'}", "drifting")
    (parent,) = [r for r in runs if r.data.tags.get("dinox.role") == "sweep"]
    assert "\n\nDrift check: 1 bs=2 ran " in parent.data.tags["mlflow.note.content"]  # its Description says it too
    (folder,) = (tmp_path / ".dinox" / "sweeps" / "drifting").glob("*/trials/000-*-drift")
    assert json.loads((folder / "trial.json").read_text())["measure"]["ablation"] is False
    # Off in the spec: no check, no line, no tag.
    proc = _sweep(tmp_path, "steady", "false")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "drift check" not in out, out + err
    assert all("dinox.drift_check" not in tags for tags in _trials(tmp_path, "steady").values())


def test_a_ctrl_c_during_the_drift_check_keeps_every_trial_recorded_and_the_runs_finished(tmp_path):
    """SIGINT once the check's child is running: exit 130, both trials recorded and FINISHED with the parent, the
    check's child gone, no figure kept from a check that did not end."""
    proc = _sweep(tmp_path, "stopped")
    deadline = time.time() + 240
    found: list[Path] = []
    while not found and time.time() < deadline and proc.poll() is None:
        found = list((tmp_path / ".dinox" / "sweeps").glob("stopped/*/trials/000-*-drift/trial.json"))
        time.sleep(0.02)
    assert found, "the drift check never started"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err and "every trial is recorded" in err, err
    runs = runs_of(f"sqlite:///{tmp_path / 'mlflow.db'}", "stopped")
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 3, [(r.info.run_name, r.info.status) for r in runs]
    assert all("dinox.drift_check" not in tags for tags in _trials(tmp_path, "stopped").values())
    assert "drift check:" not in out


@pytest.mark.parametrize(
    ("again", "said"),
    [
        ((200.0, 208.0), "within its own 198.0-206.0: the box held while the sweep ran"),
        ((215.0, 225.0), "4.4% outside its own 198.0-206.0: the box moved while the sweep ran, and `dinox decide`"),
    ],
)
def test_the_line_says_whether_the_box_held_by_the_rule_decide_reads(again, said):
    spec = TrialSpec.model_validate(
        {"name": "x", "model": {"name": "vit_tiny_patch16_224"}, "objective": {"num_classes": 10}}
    )
    trial = Trial(0, 2, {"batch.size": 2}, spec, "t")
    metrics = {"images_per_s": 202.0, "images_per_s_min": 198.0, "images_per_s_max": 206.0, "windows": 3.0}
    first = drift.First.of(trial, "rid", "run", TrialResult("ok", metrics=metrics))
    assert first is not None
    line = drift.describe(first, DriftCheck(sum(again) / 2, *again, 3, 61.0))
    assert line.startswith("drift check: 1 bs=2 ran ") and " 61 s later, " in line and said in line, line
    # No range to check against: one window, or not ok.
    assert drift.First.of(trial, "rid", "run", TrialResult("ok", metrics={**metrics, "windows": 1.0})) is None
    assert drift.First.of(trial, "rid", "run", TrialResult("oom", metrics=metrics)) is None
    # A trial whose run the store never took is checked all the same: the journal keeps the check for sync.
    unrun = drift.First.of(trial, "rid", None, TrialResult("ok", metrics=metrics))
    assert unrun is not None and unrun.run_id is None and unrun.result_id == "rid"


def test_a_check_whose_child_ends_other_than_ok_keeps_nothing_and_says_why(tmp_path):
    """The check's child timed out (its trial's own measure.timeout_s, here shorter than a fresh interpreter's
    imports): no figure, and the line's reason names the status and the child's log."""
    from dinox.sweep.lanes import Lane

    spec = TrialSpec.model_validate(
        {
            "name": "x",
            "model": {"name": "vit_tiny_patch16_224", "img_size": 32, "kwargs": {"patch_size": 8}},
            "objective": {"num_classes": 10},
            "measure": {"timeout_s": 0.5},
        }
    )
    metrics = {"images_per_s": 202.0, "images_per_s_min": 198.0, "images_per_s_max": 206.0, "windows": 3.0}
    first = drift.First.of(Trial(0, 2, {}, spec, "t"), "rid", "run", TrialResult("ok", metrics=metrics))
    assert first is not None
    check, why = drift.measure_again(first, tmp_path / "000-t-drift", Lane())
    assert check is None and why.startswith("it ended timeout: ") and str(tmp_path / "000-t-drift") in why, why

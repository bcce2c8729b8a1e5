"""`dinox run --shrink` then `dinox decide`, as a user types them: the stand-in is recorded as shrunk
everywhere, decide refuses it by default with one line, and plans from it only when told, exit 3."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from tests.conftest import TINY, run_dinox

pytestmark = pytest.mark.slow

SPEC = (
    TINY.format(name="tryme")
    + "budget: {days: 1, dataset_size: 1000, epochs: 1}\nsweep: {grid: {batch.size: [16, 32]}}\n"
)


def test_a_shrunk_sweep_is_marked_and_decide_plans_from_it_only_when_told(tmp_path):
    (tmp_path / "s.yaml").write_text(SPEC.replace("batch: {size: 4}", "batch: {size: 16}"))
    run = run_dinox(["run", "s.yaml", "--shrink", "--no-system-metrics"], cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("shrunk (--shrink): vit_tiny_patch16_224 at patch_size 8, depth 2")
    assert "batches 16->4, 32->8" in run.stdout and "'tryme_shrunk'" in run.stdout

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tryme_shrunk")
    assert exp is not None and client.get_experiment_by_name("tryme") is None
    runs = client.search_runs([exp.experiment_id])
    trials = [r for r in runs if r.data.tags["dinox.role"] == "trial"]
    (sweep,) = [r for r in runs if r.data.tags["dinox.role"] == "sweep"]
    assert sweep.data.tags["dinox.shrunk"] == "true"
    assert sorted(r.info.run_name for r in trials) == ["1 bs=4 shrunk", "2 bs=8 shrunk"]
    assert all(r.data.tags["dinox.shrunk"] == "true" and r.data.params["shrunk"] == "True" for r in trials)

    plain = run_dinox(["decide", "--spec", "s.yaml", "--no-log"], cwd=tmp_path)
    assert plain.returncode == 2 and "'tryme_shrunk' holds its `dinox run --shrink` trials" in plain.stderr
    refused = run_dinox(["decide", "--experiment", "tryme_shrunk", "--days", "1", "--target-images", "9"], cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "2 of the 2 trials in experiment tryme_shrunk were measured with `dinox run --shrink`" in refused.stderr
    assert not (tmp_path / "decision").exists()  # nothing half-written

    told = run_dinox(["decide", "--spec", "s.yaml", "--shrunk"], cwd=tmp_path)
    assert told.returncode == 3, told.stdout + told.stderr
    verdict = told.stdout.split(" on SHRUNK trials ")[0]
    assert verdict in ("GO", "NO-GO", "UNSETTLED"), told.stdout
    assert "measured shrunk: this decision tries the pipeline" in told.stdout
    decision = json.loads((tmp_path / "decision" / "decision.json").read_text())
    assert (decision["verdict"], decision["shrunk"], decision["settled"], decision["exit_code"]) == (
        verdict,
        True,
        False,
        3,
    )
    assert "on SHRUNK trials" in (tmp_path / "decision" / "report.md").read_text().splitlines()[0]
    (logged,) = client.search_runs([exp.experiment_id], "tags.`dinox.role` = 'decision'")
    assert (logged.data.tags["dinox.shrunk"], logged.data.tags["dinox.settled"]) == ("true", "false")
    # Training the shrunk stand-in for real says nothing of the study: verify names why it refuses it.
    verify = run_dinox(["verify", "s.yaml", "--run-id", trials[0].info.run_id, "--minutes", "0.01"], cwd=tmp_path)
    assert verify.returncode == 2 and "Traceback" not in verify.stderr, verify.stdout + verify.stderr
    assert "it was measured with `dinox run --shrink`, a small stand-in: take a trial" in verify.stderr, verify.stderr
    assert "or give --shrink to train the stand-in" in verify.stderr
    # ... and with --shrink it trains the stand-in, says so, records it as shrunk and exits 3, held or not.
    args = ["verify", "s.yaml", "--shrink", "--run-id", trials[0].info.run_id, "--minutes", "0.02"]
    small = run_dinox(args, cwd=tmp_path)
    assert small.returncode == 3, small.stdout + small.stderr
    assert small.stdout.startswith("shrunk (--shrink): vit_tiny_patch16_224"), small.stdout
    (said,) = [ln for ln in small.stdout.splitlines() if ln.startswith(("HELD", "OFF", "UNDECIDED"))]
    assert said.split(":")[0] in (
        f"{word} on a SHRUNK stand-in (it tries the verify step, not the study's forecast)"
        for word in ("HELD", "OFF", "UNDECIDED")
    )
    (checked,) = client.search_runs([exp.experiment_id], "tags.`dinox.role` = 'verify'")
    assert checked.data.tags["dinox.shrunk"] == "true" and checked.data.tags["dinox.verifies"] == trials[0].info.run_id
    word = said.split(" ")[0]
    assert checked.data.tags["mlflow.note.content"].startswith(f"**SHRUNK stand-in: {word}: forecast ")

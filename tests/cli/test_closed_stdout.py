"""A reader that leaves (`dinox decide | head -1`, a CI log that closes): the command goes on to its end, records
what it records, exits with its own code, and says on stderr in one line that stdout was closed. Through the
commands a user types, with the pipe's read end closed before the first line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mlflow import MlflowClient

from tests.conftest import TINY

GONE = "dinox: standard output was closed; going on (the results are recorded as usual)"


def closed_stdout(args: list[str], cwd, both: bool = False) -> tuple[int, str]:
    """`both`: stderr is the same pipe (`2>&1 | head -1`), closed as well; then the returned text is empty."""
    env = dict(os.environ)
    env.pop("MLFLOW_RUN_ID", None)
    stderr = subprocess.STDOUT if both else subprocess.PIPE
    proc = subprocess.Popen(
        [sys.executable, "-m", "dinox", *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=stderr
    )
    proc.stdout.close()  # the reader is gone before the command writes anything
    err = "" if both else proc.stderr.read().decode()
    return proc.wait(timeout=300), err


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    work = tmp_path_factory.mktemp("closed")
    (work / "spec.yaml").write_text(TINY.format(name="closed").replace("repeats: 1", "repeats: 3"))
    return work, MlflowClient(f"sqlite:///{work / 'mlflow.db'}")


def test_run_decide_and_verify_go_on_when_their_reader_leaves(store):
    work, client = store
    code, err = closed_stdout(["run", "spec.yaml", "--no-system-metrics"], work)
    assert code == 0 and err.strip().splitlines() == [GONE], err
    (sweep,) = client.search_runs(["1"], "tags.`dinox.role` = 'sweep'")
    assert sweep.info.status == "FINISHED" and len(client.search_runs(["1"], "tags.`dinox.role` = 'trial'")) == 1

    code, err = closed_stdout(["decide", "--spec", "spec.yaml", "--days", "1", "--target-images", "1000"], work)
    assert code in (0, 3) and err.strip().splitlines() == [GONE], err  # GO, or unsettled: a verdict either way
    assert len(client.search_runs(["1"], "tags.`dinox.role` = 'decision'")) == 1
    assert (work / "decision" / "decision.json").is_file()

    (trial,) = client.search_runs(["1"], "tags.`dinox.role` = 'trial'")
    args = ["verify", "spec.yaml", "--run-id", trial.info.run_id, "--minutes", "0.05", "--epoch-images", "16"]
    code, err = closed_stdout(args, work)
    assert code in (0, 1, 3) and err.strip().splitlines() == [GONE], err  # held, off, undecided: its own code
    assert len(client.search_runs(["1"], "tags.`dinox.role` = 'verify'")) == 1


def test_shrink_and_shrunk_go_on_when_their_reader_leaves(store):
    """--shrink's first line (what it made of the spec) and --shrunk's decision meet a closed pipe too."""
    work, client = store
    code, err = closed_stdout(["run", "spec.yaml", "--shrink", "--no-system-metrics"], work)
    assert code == 0 and err.strip().splitlines() == [GONE], err
    (small,) = [e for e in client.search_experiments() if e.name == "closed_shrunk"]
    assert len(client.search_runs([small.experiment_id], "tags.`dinox.shrunk` = 'true'")) == 2  # sweep, trial
    args = ["decide", "--spec", "spec.yaml", "--shrunk", "--days", "1", "--target-images", "1000", "--no-log"]
    code, err = closed_stdout([*args, "--out", "shrunk_decision"], work)
    assert code == 3 and err.strip().splitlines() == [GONE], err  # a shrunk decision is never settled
    assert (work / "shrunk_decision" / "decision.json").is_file()


def test_a_reader_that_leaves_both_streams_never_changes_the_exit_code(store):
    """`dinox decide 2>&1 | head -1`: stdout and stderr are one closed pipe. Nothing can be said, and the
    exit code a gate reads is still the command's own: before, the notice's write to the closed stderr raised,
    and a GO came out as exit 1 (NO-GO)."""
    work, client = store
    code, err = closed_stdout(["run", "spec.yaml", "--no-system-metrics"], work, both=True)
    assert code == 0 and err == "", err  # measured here, or resumed after the test above: nothing to do
    args = ["decide", "--spec", "spec.yaml", "--days", "1", "--target-images", "1000", "--out", "both_closed"]
    code, err = closed_stdout(args, work, both=True)
    assert code in (0, 3) and err == "", err
    verdict = json.loads((work / "both_closed" / "decision.json").read_text())
    assert code == {"GO": 0, "UNSETTLED": 3}[verdict["verdict"]], verdict["verdict"]
    code, err = closed_stdout(["validate", "missing.yaml"], work, both=True)  # an error's line meets it too
    assert code == 2 and err == ""

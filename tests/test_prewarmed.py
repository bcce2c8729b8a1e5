"""The suite's prewarmed `dinox` (tests/prewarmed.py) against a fresh `python -m dinox`: the same exit code and the
same bytes on stdout and stderr for each kind of answer a test reads (help, a refused spec, a refused store, a
command's success), and an environment that changes Python's start-up sent to a fresh interpreter."""

from __future__ import annotations

import os

import pytest

from tests.conftest import PREWARMED, TINY, run_dinox

BAD_SPEC = "name: x\nmodel: {name: vit_tiny_patch16_224}\nbatch: {size: -4}\n"


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--help"],
        ["validate", "bad.yaml"],
        ["validate", "ok.yaml"],
        ["plan", "ok.yaml", "--no-estimate"],
        [
            "decide",
            "--spec",
            "ok.yaml",
            "--days",
            "1",
            "--target-images",
            "9",
            "--tracking-uri",
            "sqlite:///nowhere/m.db",
        ],
        ["run", "ok.yaml", "--set", "batch.size=0"],
        ["validate", "cr\r.yaml"],
    ],
    ids=["help", "bad-spec", "validate", "plan", "no-store", "bad-set", "carriage-return"],
)
def test_a_forked_command_answers_as_a_fresh_one(tmp_path, args):
    (tmp_path / "bad.yaml").write_text(BAD_SPEC)
    (tmp_path / "ok.yaml").write_text(TINY.format(name="prewarmed"))
    fresh = run_dinox(args, tmp_path, fresh=True)
    forked = run_dinox(args, tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert fresh.returncode in (0, 2) and "Traceback" not in fresh.stderr, fresh.stderr


def test_an_environment_that_changes_python_s_start_up_runs_fresh():
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_RUN_ID"}
    assert PREWARMED.fits(env)
    assert PREWARMED.fits({**env, "MLFLOW_TRACKING_URI": "sqlite:///m.db", "OMP_NUM_THREADS": "1"})
    for key, value in (("PYTHONIOENCODING", "latin-1"), ("LC_ALL", "C"), ("MPLCONFIGDIR", "/tmp/x")):
        assert not PREWARMED.fits({**env, key: value}), key


def test_a_forked_command_is_a_process_of_its_own_with_the_environment_it_was_given(tmp_path):
    (tmp_path / "ok.yaml").write_text(TINY.format(name="prewarmed"))
    uri = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    proc = run_dinox(
        ["decide", "--spec", "ok.yaml", "--days", "1", "--target-images", "9"], tmp_path, {"MLFLOW_TRACKING_URI": uri}
    )
    assert proc.returncode == 2 and "elsewhere.db" in proc.stderr, proc.stderr  # the env reached the command
    assert not (tmp_path / "elsewhere.db").exists()  # decide never creates a store

"""--shard auto against the variables Slurm job arrays and Kubernetes Indexed Jobs set."""

from __future__ import annotations

import pytest

from dinox.sweep.shards import ShardEnvError, resolve


def slurm(task: int, low: int, high: int, **more: str) -> dict[str, str]:
    return {
        "SLURM_ARRAY_TASK_ID": str(task),
        "SLURM_ARRAY_TASK_MIN": str(low),
        "SLURM_ARRAY_TASK_MAX": str(high),
        **more,
    }


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (slurm(0, 0, 3), "1/4"),  # --array=0-3
        (slurm(3, 0, 3), "4/4"),
        (slurm(1, 1, 4), "1/4"),  # --array=1-4: the index less the minimum
        (slurm(4, 1, 4), "4/4"),
        (slurm(9, 1, 16, SLURM_ARRAY_TASK_STEP="4"), "3/4"),  # --array=1-16:4 -> tasks 1, 5, 9, 13
        ({"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "5", "SLURM_ARRAY_TASK_COUNT": "2"}, "1/2"),
        ({"JOB_COMPLETION_INDEX": "0", "DINOX_SHARD_COUNT": "3"}, "1/3"),
        ({"JOB_COMPLETION_INDEX": "2", "DINOX_SHARD_COUNT": "3"}, "3/3"),
    ],
)
def test_auto_takes_the_slice_the_scheduler_names(env, expected):
    assert resolve("auto", env).spec == expected


def test_auto_n_gives_the_count_a_kubernetes_job_does_not_say():
    picked = resolve("auto/4", {"JOB_COMPLETION_INDEX": "3"})
    assert (picked.index, picked.count, picked.source) == (4, 4, "JOB_COMPLETION_INDEX=3")
    assert resolve("auto/8", slurm(2, 1, 4)).spec == "2/8"  # N given: it wins over the array's size


def test_an_explicit_slice_is_left_to_the_grid():
    assert resolve("2/4", slurm(0, 0, 3)) is None


@pytest.mark.parametrize(
    ("shard", "env", "message"),
    [
        ("auto", {}, "neither SLURM_ARRAY_TASK_ID (a Slurm job array, sbatch --array) nor JOB_COMPLETION_INDEX"),
        ("auto", {"JOB_COMPLETION_INDEX": "1"}, "give --shard auto/N (N = spec.completions) or set DINOX_SHARD_COUNT"),
        ("auto/2", {"JOB_COMPLETION_INDEX": "2"}, "JOB_COMPLETION_INDEX=2: not below the 2 slices"),
        ("auto", {"SLURM_ARRAY_TASK_ID": "3"}, "neither SLURM_ARRAY_TASK_COUNT nor SLURM_ARRAY_TASK_MAX"),
        ("auto", slurm(6, 1, 16, SLURM_ARRAY_TASK_STEP="4"), "not one of the 4 tasks of the array"),
        ("auto/0", slurm(1, 1, 2), "auto/N: 0 slices"),
        # Read as 1 before; and a count below 1 was "not one of the -4 tasks".
        (
            "auto",
            slurm(3, 1, 16, SLURM_ARRAY_TASK_STEP="-2"),
            "SLURM_ARRAY_TASK_STEP=-2: an array's step is at least 1",
        ),
        ("auto", {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "-4"}, "the Slurm array's variables give -4"),
        ("auto/two", slurm(1, 1, 2), "'two' is not a whole number"),
        ("auto", {"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "2"}, "SLURM_ARRAY_TASK_ID='x'"),
    ],
)
def test_what_the_environment_cannot_answer_is_refused_by_name(shard, env, message):
    with pytest.raises(ShardEnvError, match=None) as caught:
        resolve(shard, env)
    assert message in str(caught.value)


def test_the_command_line_names_the_option_once(tmp_path, monkeypatch):
    """`dinox run --shard auto/0` said "--shard --shard auto/N: ..."."""
    from click.testing import CliRunner

    from dinox.cli.main import main
    from tests.conftest import TINY

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(TINY.format(name="sh"))
    result = CliRunner(env={"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2"}).invoke(
        main, ["run", "s.yaml", "--shard", "auto/0"]
    )
    assert result.exit_code == 2 and "error: --shard auto/N: 0 slices" in result.stderr, result.stderr
    assert "--shard --shard" not in result.stderr

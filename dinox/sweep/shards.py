"""`--shard auto`: the slice of a sweep this process runs, read from the scheduler that started it.

Slurm job arrays set SLURM_ARRAY_TASK_ID with the array's MIN, MAX, COUNT and STEP (an array may start at 0
or 1, and step: --array=1-16:4); a Kubernetes Indexed Job sets JOB_COMPLETION_INDEX (0-based) and nothing
about its size, so the count comes from `--shard auto/N` or DINOX_SHARD_COUNT. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dinox.errors import DinoxError

COUNT_VAR = "DINOX_SHARD_COUNT"


class ShardEnvError(DinoxError, ValueError):
    """--shard auto where the environment does not say which slice (the message is the whole story)."""


@dataclass(frozen=True)
class Slice:
    index: int  # 1-based, as --shard I/N
    count: int
    source: str  # where it was read, for the run's first line

    @property
    def spec(self) -> str:
        return f"{self.index}/{self.count}"


def resolve(shard: str, env: Mapping[str, str]) -> Slice | None:
    """The slice `--shard auto` or `auto/N` names in `env`; None for an explicit I/N (grid.shard checks it)."""
    if shard != "auto" and not shard.startswith("auto/"):
        return None
    count = _count(shard[len("auto/") :]) if shard.startswith("auto/") else None
    if "SLURM_ARRAY_TASK_ID" in env:
        return _slurm(env, count)
    if "JOB_COMPLETION_INDEX" in env:
        return _kubernetes(env, count)
    raise ShardEnvError(
        f"{shard}: neither SLURM_ARRAY_TASK_ID (a Slurm job array, sbatch --array) nor JOB_COMPLETION_INDEX "
        "(a Kubernetes Indexed Job) is set here; run it as an array task or an indexed pod, or give I/N"
    )


def _count(text: str, name: str = "auto/N") -> int:
    try:
        n = int(text)
    except ValueError:
        raise ShardEnvError(f"{name}: {text!r} is not a whole number of slices") from None
    if n < 1:
        raise ShardEnvError(f"{name}: {n} slices; give at least 1")
    return n


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ShardEnvError(f"{name}={env[name]!r} is not a whole number") from None


def _slurm(env: Mapping[str, str], count: int | None) -> Slice:
    task = _int(env, "SLURM_ARRAY_TASK_ID")
    low = _int(env, "SLURM_ARRAY_TASK_MIN") if "SLURM_ARRAY_TASK_MIN" in env else 0
    step = _int(env, "SLURM_ARRAY_TASK_STEP") if "SLURM_ARRAY_TASK_STEP" in env else 1
    if step < 1:
        raise ShardEnvError(f"SLURM_ARRAY_TASK_STEP={step}: an array's step is at least 1; give --shard I/N")
    if count is None:
        if "SLURM_ARRAY_TASK_COUNT" in env:
            count = _int(env, "SLURM_ARRAY_TASK_COUNT")
        elif "SLURM_ARRAY_TASK_MAX" in env:
            count = (_int(env, "SLURM_ARRAY_TASK_MAX") - low) // step + 1
        else:
            raise ShardEnvError(
                "SLURM_ARRAY_TASK_ID is set but neither SLURM_ARRAY_TASK_COUNT nor SLURM_ARRAY_TASK_MAX: "
                "give the number of slices, --shard auto/N"
            )
        if count < 1:
            raise ShardEnvError(f"the Slurm array's variables give {count} tasks; give --shard I/N")
    offset, rest = divmod(task - low, step)
    where = f"SLURM_ARRAY_TASK_ID={task}, array from {low} step {step}"
    if rest or not 0 <= offset < count:
        raise ShardEnvError(f"{where}: not one of the {count} tasks of the array; give --shard I/N")
    return Slice(offset + 1, count, where)


def _kubernetes(env: Mapping[str, str], count: int | None) -> Slice:
    index = _int(env, "JOB_COMPLETION_INDEX")
    if count is None:
        if COUNT_VAR not in env:
            raise ShardEnvError(
                f"JOB_COMPLETION_INDEX={index} is set but a Kubernetes Job does not say how many completions it "
                f"has: give --shard auto/N (N = spec.completions) or set {COUNT_VAR}"
            )
        count = _count(env[COUNT_VAR], COUNT_VAR)
    if not 0 <= index < count:
        raise ShardEnvError(f"JOB_COMPLETION_INDEX={index}: not below the {count} slices; check spec.completions")
    return Slice(index + 1, count, f"JOB_COMPLETION_INDEX={index}")

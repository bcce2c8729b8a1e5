"""What the run's routine (``routine:`` in the spec: checkpoints, evaluation passes) adds to the schedule, from
the trial's own measurement of one of each. No torch, no MLflow."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from dinox import record as rec
from dinox.decide.budget import Budget, DecisionError
from dinox.spec import params

# The spec fields the trial's params carry (dinox.spec.sections.RoutineSpec).
EVERY_STEPS, EVERY_EPOCHS, EVAL_IMAGES = (
    params.ROUTINE_CHECKPOINT_EVERY_STEPS,
    params.ROUTINE_EVAL_EVERY_EPOCHS,
    params.ROUTINE_EVAL_IMAGES,
)


@dataclass(frozen=True)
class RoutineCost:
    """Over the whole schedule: how many checkpoints and evaluation passes, and what one of each costs."""

    checkpoints: int = 0
    checkpoint_s: float = 0.0
    evals: int = 0
    eval_s: float = 0.0  # one pass: its start, and its images at the measured evaluation rate

    @property
    def seconds(self) -> float:
        return self.checkpoints * self.checkpoint_s + self.evals * self.eval_s

    def describe(self) -> str:
        parts = []
        if self.checkpoints:
            parts.append(f"{self.checkpoints:,} checkpoints x {self.checkpoint_s:.3g} s")
        if self.evals:
            parts.append(f"{self.evals:,} evaluation passes x {self.eval_s:.3g} s")
        return f"{' + '.join(parts)} = {self.seconds / 3600:.3g} h" if parts else ""


def _number(params: Mapping[str, str], key: str) -> float | None:
    try:
        value = float(params.get(key, "None"))
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def unit_costs(params: Mapping[str, str], metrics: Mapping[str, float]) -> tuple[float, float]:
    """(one checkpoint save, one evaluation pass of routine.eval_images), seconds, as the trial measured them;
    0 where its routine has none."""
    eval_images = _number(params, EVAL_IMAGES)
    checkpoint_s = metrics.get(rec.CHECKPOINT_S, 0.0) if _number(params, EVERY_STEPS) else 0.0
    eval_s = 0.0
    if eval_images and _number(params, EVERY_EPOCHS) and metrics.get(rec.EVAL_IMAGES_PER_S):
        eval_s = metrics.get(rec.EVAL_START_S, 0.0) + eval_images / metrics[rec.EVAL_IMAGES_PER_S]
    return checkpoint_s, eval_s


def routine_cost(
    params: Mapping[str, str], metrics: Mapping[str, float], budget: Budget, effective_batch: int
) -> RoutineCost:
    """The routine the trial was measured with, over the budget's schedule (nothing where it has none)."""
    checkpoint_s, eval_s = unit_costs(params, metrics)
    checkpoints = evals = 0
    if checkpoint_s:
        checkpoints = int(budget.images_needed / effective_batch // _number(params, EVERY_STEPS))  # type: ignore[operator]
    if eval_s:
        if budget.epochs is None:
            raise DecisionError(
                "routine.eval_every_epochs: the schedule has no epochs (budget.target_images): give "
                "budget.dataset_size and budget.epochs"
            )
        evals = int(budget.epochs // _number(params, EVERY_EPOCHS))  # type: ignore[operator]
    return RoutineCost(checkpoints, checkpoint_s, evals, eval_s)

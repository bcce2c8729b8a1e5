"""A compute budget: the schedule (images, or epochs of a dataset) and the days it must fit in, from the spec
and the command line, checked by the spec's own rules. No torch, no MLflow."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

SECONDS_PER_DAY = 86400.0


class DecisionError(Exception):
    """Nothing to decide on (no trials, no budget): one line for the user."""


@dataclass(frozen=True)
class Budget:
    days: float
    dataset_size: int | None = None
    epochs: float | None = None
    target_images: int | None = None
    utilization: float = 1.0

    def __post_init__(self) -> None:
        if not self.days > 0:
            raise DecisionError(f"budget days must be > 0, got {self.days}")
        if not 0 < self.utilization <= 1:
            raise DecisionError(f"utilization must be in (0, 1], got {self.utilization}")
        if self.target_images is None and (self.dataset_size is None or self.epochs is None):
            raise DecisionError("budget needs --target-images, or --dataset-size with --epochs")
        if self.target_images is not None and (self.dataset_size is not None or self.epochs is not None):
            raise DecisionError("budget takes --target-images or --dataset-size with --epochs, not both")

    @property
    def images_needed(self) -> float:
        if self.target_images is not None:
            return float(self.target_images)
        return float(self.dataset_size) * float(self.epochs)  # type: ignore[arg-type]

    def days_for(self, images_per_s: float) -> float:
        return self.images_needed / (images_per_s * SECONDS_PER_DAY * self.utilization)

    def images_in_budget(self, images_per_s: float) -> float:
        return images_per_s * SECONDS_PER_DAY * self.utilization * self.days

    def describe(self) -> str:
        schedule = (
            f"{self.target_images:,} images"
            if self.target_images is not None
            else f"{self.epochs:g} epochs of {self.dataset_size:,} images"
        )
        util = f" at {self.utilization:.0%} utilization" if self.utilization != 1 else ""
        return f"{schedule} in {self.days:g} day{'' if self.days == 1 else 's'}{util}"


def merge_budget(
    base: dict[str, Any],
    days: float | None,
    dataset_size: int | None,
    epochs: float | None,
    target_images: int | None,
    utilization: float,
) -> Budget:
    """The spec's budget (`base`, possibly empty) overridden field by field by the options given; a
    schedule given as images replaces one given as epochs, and the other way round."""
    merged = dict(base)
    if days is not None:
        merged["days"] = days
    if target_images is not None:
        merged.update(target_images=target_images, dataset_size=None, epochs=None)
    if dataset_size is not None or epochs is not None:
        merged["target_images"] = None
        merged.update({k: v for k, v in (("dataset_size", dataset_size), ("epochs", epochs)) if v is not None})
    if merged.get("days") is None:
        raise DecisionError(
            "no budget: give --days with --dataset-size and --epochs (or --target-images), or a --spec with one"
        )
    _check_budget(merged, utilization)
    return Budget(
        days=merged["days"],
        dataset_size=merged.get("dataset_size"),
        epochs=merged.get("epochs"),
        target_images=merged.get("target_images"),
        utilization=utilization,
    )


_OPTION = {"days": "--days", "dataset_size": "--dataset-size", "epochs": "--epochs", "target_images": "--target-images"}


def _check_budget(merged: dict[str, Any], utilization: float) -> None:
    """The budget as the spec's own rules see it (finite, positive, bounded), each problem naming its option."""
    from pydantic import ValidationError

    from dinox.spec import BudgetSpec
    from dinox.spec_fields import field_problems

    try:
        BudgetSpec.model_validate({k: v for k, v in merged.items() if v is not None})
    except ValidationError as e:
        problems = [
            f"{_OPTION.get(p.loc[0], p.loc[0]) if p.loc else 'budget'}: {p.message}"
            for p in field_problems(e, BudgetSpec)
        ]
        raise DecisionError("; ".join(problems)) from None
    if not (math.isfinite(utilization) and 0 < utilization <= 1):
        raise DecisionError(f"--utilization: must be in (0, 1], got {utilization}")


def fmt_days(days: float) -> str:
    """Days to a precision that means something: 12.0, 0.54, 0.053."""
    return f"{days:.1f}" if days >= 1 else f"{days:.2g}"

"""A compute budget: the schedule (images, or epochs of a dataset) and the days it must fit in. One model: the
spec's ``budget:`` section (``BudgetSpec``, its fields and the one-schedule rule) plus the utilization a
decision also takes, and what a decision asks of it. No torch, no MLflow, no command-line names: errors name
the budget's fields, and the command line says which option set them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from dinox.errors import DinoxError
from dinox.spec.fields import field_problems
from dinox.spec.sections import BudgetSpec

SECONDS_PER_DAY = 86400.0


class DecisionError(DinoxError):
    """Nothing to decide on, or a budget or policy that cannot be: one line for the user. ``problems`` holds the
    (field, message) pairs where fields are to blame, so a caller can name each field its own way."""

    def __init__(self, message: str, problems: Sequence[tuple[str, str]] = ()):
        super().__init__(message)
        self.problems = list(problems)

    def named(self, names: Mapping[str, str]) -> str:
        """The message with each field under the name a caller gives it (an option, say)."""
        if not self.problems:
            return str(self)
        return "; ".join(f"{names.get(field, field)}: {message}" for field, message in self.problems)


def _problems_of(e: ValidationError, model: type, prefix: str) -> DecisionError:
    problems = [(".".join(p.loc) or prefix, p.message) for p in field_problems(e, model)]
    return DecisionError("; ".join(f"{prefix}.{f}: {m}" if f != prefix else f"{f}: {m}" for f, m in problems), problems)


class Budget(BudgetSpec):
    """The budget a decision is made against: the spec's section, the share of wall time spent in training
    steps, and prices as a mapping (empty: no prices). Raises DecisionError, never pydantic's own error."""

    utilization: float = Field(1.0, gt=0, le=1, description="share of wall time a run spends in training steps")
    prices: dict[str, Annotated[float, Field(gt=0, le=1e6)]] = Field(default_factory=dict)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as e:
            raise _problems_of(e, Budget, "budget") from None

    @model_validator(mode="after")
    def _one_schedule(self) -> Budget:
        if problem := self.schedule_problem():
            raise PydanticCustomError("schedule", problem)
        return self

    @property
    def images_needed(self) -> float:
        if self.target_images is not None:
            return float(self.target_images)
        return float(self.dataset_size) * float(self.epochs)  # type: ignore[arg-type]

    def days_for(self, images_per_s: float, epoch_boundary_s: float = 0.0, routine_s: float = 0.0) -> float:
        """Days for the schedule at `images_per_s`, each of its epochs also paying `epoch_boundary_s` (what the
        loader's epoch boundary adds, measured apart from the timed windows; a schedule given in images has no
        epochs), and the run's routine (its checkpoints and evaluation passes) `routine_s` in all."""
        boundaries = (self.epochs or 0.0) * max(0.0, epoch_boundary_s)
        seconds = self.images_needed / images_per_s + boundaries + max(0.0, routine_s)
        return seconds / (SECONDS_PER_DAY * self.utilization)

    def images_in_budget(self, images_per_s: float) -> float:
        return images_per_s * SECONDS_PER_DAY * self.utilization * self.days

    def price_for(self, device_name: str) -> float | None:
        return self.prices.get(device_name, self.price_per_device_hour)

    def cost(self, days: float, device_name: str, devices: int = 1) -> float | None:
        """The schedule's cost on `devices` of `device_name` taking `days`; None without a price for it."""
        price = self.price_for(device_name)
        return None if price is None else devices * days * 24.0 * price

    def describe(self) -> str:
        schedule = (
            f"{self.target_images:,} images"
            if self.target_images is not None
            else f"{self.epochs:g} epochs of {self.dataset_size:,} images"
        )
        util = f" at {self.utilization:.0%} utilization" if self.utilization != 1 else ""
        cost = f" for at most {fmt_cost(self.max_cost)}" if self.max_cost is not None else ""
        return f"{schedule} in {self.days:g} day{'' if self.days == 1 else 's'}{util}{cost}"


def fmt_days(days: float) -> str:
    """Days to a precision that means something: 12.0, 0.54, 0.053; 1.0 where two figures would round to a
    bare 1 ("1 days"); past 10^5 days, 3 figures (1.2e+05: every digit of 10^300 days would be noise)."""
    if days >= 1e5:
        return f"{days:.3g}"
    return f"{days:.1f}" if days >= 0.995 else f"{days:.2g}"


def fmt_cost(cost: float) -> str:
    """A cost in the prices' own unit (dinox does not know the currency): 1,234 or 12.50."""
    return f"{cost:,.0f}" if cost >= 100 else f"{cost:,.2f}"

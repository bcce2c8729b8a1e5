"""A compute budget: the schedule (images, or epochs of a dataset) and the days it must fit in, from the spec
and the command line, checked by the spec's own rules. No torch, no MLflow."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
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
    price_per_device_hour: float | None = None  # any device without a price of its own in `prices`
    prices: dict[str, float] = field(default_factory=dict)  # dinox.device_name -> price per device-hour
    max_cost: float | None = None  # the whole schedule's cost (devices x days x 24 x price) at most this

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

    def days_for(self, images_per_s: float, epoch_start_s: float = 0.0) -> float:
        """Days for the schedule at `images_per_s`, each of its epochs also paying `epoch_start_s` (the loader's
        epoch boundary, measured apart from the timed windows; a schedule given in images has no epochs)."""
        boundaries = (self.epochs or 0.0) * max(0.0, epoch_start_s)
        return (self.images_needed / images_per_s + boundaries) / (SECONDS_PER_DAY * self.utilization)

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


def merge_budget(
    base: dict[str, Any],
    days: float | None,
    dataset_size: int | None,
    epochs: float | None,
    target_images: int | None,
    utilization: float,
    prices: tuple[str, ...] = (),
    max_cost: float | None = None,
) -> Budget:
    """The spec's budget (`base`, possibly empty) overridden field by field by the options given; a
    schedule given as images replaces one given as epochs, and the other way round. `prices` as --price
    takes them: "NAME=PRICE" for one device name, a bare number for every device."""
    merged = dict(base)
    merged["prices"] = dict(merged.get("prices") or {})
    for item in prices:
        name, _, value = item.rpartition("=")
        try:
            price = float(value)
        except ValueError:
            raise DecisionError(
                f'--price {item!r}: expected NAME=PRICE or a number, e.g. "NVIDIA H100 80GB HBM3=2.5"'
            ) from None
        if name:
            merged["prices"][name.strip()] = price
        else:
            merged["price_per_device_hour"] = price
    if max_cost is not None:
        merged["max_cost"] = max_cost
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
        price_per_device_hour=merged.get("price_per_device_hour"),
        prices=merged["prices"],
        max_cost=merged.get("max_cost"),
    )


_OPTION = {
    "days": "--days",
    "dataset_size": "--dataset-size",
    "epochs": "--epochs",
    "target_images": "--target-images",
    "price_per_device_hour": "--price",
    "prices": "--price",
    "max_cost": "--max-cost",
}


def _check_budget(merged: dict[str, Any], utilization: float) -> None:
    """The budget as the spec's own rules see it (finite, positive, bounded), each problem naming its option."""
    from pydantic import ValidationError

    from dinox.spec.fields import field_problems
    from dinox.spec.sections import BudgetSpec

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


def fmt_cost(cost: float) -> str:
    """A cost in the prices' own unit (dinox does not know the currency): 1,234 or 12.50."""
    return f"{cost:,.0f}" if cost >= 100 else f"{cost:,.2f}"

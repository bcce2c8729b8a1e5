"""What a schedule costs, and what would change the answer: prices per device-hour (budget.prices), the cost
check of budget.max_cost, the what-if figures for the recommended configuration, the throughput a NO-GO
one would need, and days on N devices projected with a measured scaling efficiency. Pure functions on the
decision's own figures; no torch, no MLflow."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dinox.decide.budget import SECONDS_PER_DAY, Budget, fmt_cost
from dinox.store.trial_record import IPS_WINDOWS

if TYPE_CHECKING:
    from dinox.decide.checks import ScalingRow
    from dinox.decide.types import ModelVerdict

DATASET_FACTORS = (0.5, 1.0, 2.0)


def over_cost(cost: float | None, device_name: str, budget: Budget) -> str:
    """Why the cost rules a configuration out under budget.max_cost; "" when it does not."""
    if budget.max_cost is None:
        return ""
    limit = fmt_cost(budget.max_cost)
    if cost is None:
        return f"no price for {device_name or 'its device'} to check budget.max_cost {limit} against"
    if cost > budget.max_cost:
        return f"costs {fmt_cost(cost)} > budget.max_cost {limit}"
    return ""


@dataclass
class WhatIf:
    """The recommended configuration's days (and cost) for a schedule `factor` times the budget's."""

    factor: float
    days: float
    cost: float | None


def what_if(mv: ModelVerdict, budget: Budget) -> list[WhatIf]:
    if mv.span is None:
        return []
    return [WhatIf(f, mv.days * f, budget.cost(mv.days * f, mv.device_name, mv.devices)) for f in DATASET_FACTORS]


@dataclass
class Need:
    """A NO-GO configuration: the throughput it has and the one it would need (days and cost both)."""

    model: str
    device: str
    has_ips: float
    needs_ips: float
    has_unit: str = IPS_WINDOWS  # what has_ips is of: the windows, or real training where it replaced them

    @property
    def factor(self) -> float:
        return self.needs_ips / self.has_ips


def needs(models: list[ModelVerdict], budget: Budget) -> list[Need]:
    out = []
    for mv in models:
        if mv.go or mv.span is None:
            continue
        seconds = budget.days * SECONDS_PER_DAY * budget.utilization
        price = budget.price_for(mv.device_name)
        if budget.max_cost is not None and price is not None:
            # The cost caps the days too: devices x days x 24 x price <= max_cost.
            seconds = min(seconds, budget.max_cost / (mv.devices * 24.0 * price) * SECONDS_PER_DAY * budget.utilization)
        need = Need(mv.label, mv.device, mv.span.forecast_ips, budget.images_needed / seconds, mv.forecast_unit)
        if need.factor > 1:  # an UNSETTLED one fast enough at its forecast needs evidence, not speed
            out.append(need)
    return out


@dataclass
class Projection:
    """A model measured on one device, projected onto N with the efficiency a sweep measured on N."""

    model: str
    device_name: str
    devices: int
    efficiency: float
    single_ips: float
    days: float
    cost: float | None

    @property
    def ips(self) -> float:
        return self.single_ips * self.devices * self.efficiency


def projections(models: list[ModelVerdict], rows: list[ScalingRow], budget: Budget) -> list[Projection]:
    """For each measured scaling (a configuration on 1 and on N devices of one kind), the best single-device
    trial of each model measured on that kind, on N devices at that efficiency (not N times as fast)."""
    out = []
    for row in rows:
        for mv in models:
            if mv.devices != 1 or mv.device_name != row.device_name or mv.ips is None:
                continue
            days = budget.days_for(mv.ips * row.gpus * row.efficiency)
            cost = budget.cost(days, mv.device_name, row.gpus)
            out.append(Projection(mv.label, mv.device_name, row.gpus, row.efficiency, mv.ips, days, cost))
    return out

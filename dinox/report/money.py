"""report.md's sections on hardware and money: a verdict per device, each configuration's cost, what-if
figures for the recommended configuration, what a NO-GO one would need, and scaling projections. Pure
rendering of a Decision."""

from __future__ import annotations

from dinox.decide.budget import fmt_cost, fmt_days
from dinox.decide.verdict import Decision
from dinox.store.trial_record import IPS_REAL, IPS_WINDOWS, REAL_MARK, inert


def sections(d: Decision) -> list[str]:
    return [*_per_device(d), *_costs(d), *_what_if(d), *_projections(d)]


def _cost(value: float | None) -> str:
    return fmt_cost(value) if value is not None else "-"


def _per_device(d: Decision) -> list[str]:
    if not d.per_device:
        return []
    out = [
        "## Per device",
        "",
        "Trials measured on different hardware are decided apart: each device's largest GO model.",
        "",
        f"| device | verdict | largest GO model | forecast {IPS_WINDOWS} | days | cost |",
        "|---|---|---|---|---|---|",
    ]
    for device in d.device_names:
        best = d.largest_go_on(device)
        if best is None or best.span is None:
            open_ = any(mv.device == device for mv in d.unsettled)
            out.append(f"| {inert(device)} | {'UNSETTLED' if open_ else 'NO-GO'} | - | - | - | - |")
            continue
        out.append(
            f"| {inert(device)} | GO | {inert(best.label)} | {best.span.forecast_ips:.1f}"
            f"{REAL_MARK if best.real_forecast else ''} | "
            f"{fmt_days(best.days)} | "
            f"{_cost(best.cost)} |"
        )
    return [*out, ""]


def _costs(d: Decision) -> list[str]:
    priced = [mv for mv in d.models if mv.cost is not None]
    if not priced:
        return []
    b = d.budget
    limit = f" (budget.max_cost {fmt_cost(b.max_cost)})" if b.max_cost is not None else ""
    out = [
        "## Cost",
        "",
        f"The whole schedule on each model's best trial: devices x days x 24 x price per device-hour{limit}.",
        "",
        "| model | device | price/h | days | cost | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for mv in d.models:
        if mv.span is None:
            continue
        price = b.price_for(mv.device_name)
        why = f" ({mv.over_cost})" if mv.over_cost else ""
        out.append(
            f"| {inert(mv.label)} | {inert(mv.device)} | {_cost(price)} | {fmt_days(mv.days)} | {_cost(mv.cost)} | "
            f"{mv.verdict}{inert(why)} |"
        )
    c = d.cheapest
    if c is not None and c.span is not None:
        where = inert(d.where(c))
        out += ["", f"Cheapest that meets the deadline: **{where}**, {fmt_days(c.days)} days for {_cost(c.cost)}."]
    return [*out, ""]


def _what_if(d: Decision) -> list[str]:
    out: list[str] = []
    rec = d.recommended
    if rec is not None and rec.span is not None and d.what_if:
        at = f"at its forecast, {rec.span.forecast_ips:.1f} {rec.forecast_unit}"
        out += ["## What if", "", f"For **{inert(d.where(rec))}** {at}:", ""]
        buys = f"{rec.images_in_budget:,.0f} images" if rec.images_in_budget is not None else "-"
        if rec.epochs_in_budget is not None:
            buys += f" ({rec.epochs_in_budget:.1f} epochs)"
        out += [f"- the {d.budget.days:g}-day budget buys {buys};", ""]
        out += ["| schedule | images | days | cost |", "|---|---|---|---|"]
        out += [
            f"| {w.factor:g}x | {d.budget.images_needed * w.factor:,.0f} | {fmt_days(w.days)} | {_cost(w.cost)} |"
            for w in d.what_if
        ]
        out.append("")
    if d.needs:
        out += _needs(d)
    return out


def _needs(d: Decision) -> list[str]:
    out = [] if d.what_if else ["## What if", ""]
    out += [
        "What each configuration short of a GO would need to meet the deadline at its forecast"
        + (" and budget.max_cost" if d.budget.max_cost is not None else "")
        + ":",
        "",
        f"| model | device | has {IPS_WINDOWS} | needs | faster by |",
        "|---|---|---|---|---|",
    ]
    out += [
        f"| {inert(n.model)} | {inert(n.device)} | {n.has_ips:.1f}{REAL_MARK if n.has_unit == IPS_REAL else ''} | "
        f"{n.needs_ips:.1f} | {n.factor:.2f}x |"
        for n in d.needs
    ]
    return [*out, ""]


def _projections(d: Decision) -> list[str]:
    if not d.projections:
        return []
    out = [
        "## Scaling projection",
        "",
        "Models measured on one device, projected onto N devices of the same kind with the scaling efficiency "
        "a sweep measured there (see Scaling), not as N times as fast:",
        "",
        "| model | device | devices | efficiency | one device | projected img/s | days | cost |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in d.projections:
        out.append(
            f"| {inert(p.model)} | {inert(p.device_name or '-')} | {p.devices} | {p.efficiency:.0%} | "
            f"{p.single_ips:.1f} | {p.ips:.1f} | {fmt_days(p.days)} | {_cost(p.cost)} |"
        )
    return [*out, ""]

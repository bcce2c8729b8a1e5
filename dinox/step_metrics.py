"""The loop's measurements as the trial's record: throughput, step times, the time split, the device's idle
accounting, the ablation costs, the loader ceiling, and the bound label with the rule that gave it.

A metrics processor in torchtitan's sense: the loop (dinox.bench) only measures; this turns its LoopStats
into the MLflow record's names. Every figure is per optimizer step unless its name says otherwise.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from dinox.bench import LoopStats, Window, rate
from dinox.bound import Evidence, classify, costs, fixed_share
from dinox.spec import MeasureSpec


@dataclass
class Summary:
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    bound: str = ""
    step_s: list[float] = field(default_factory=list)


def _idle_share(window: Window | None) -> float | None:
    if window is None or not window.steps:
        return None
    period = sum(s.period for s in window.steps)
    return sum(s.idle for s in window.steps) / period if period > 0 else None


def summarize(stats: LoopStats, m: MeasureSpec, compiled: bool) -> Summary:
    out = Summary(step_s=stats.periods)
    p50 = stats.quantile(0.5)
    out.metrics.update(
        {
            "images_per_s": stats.images_per_s,
            "step_s_p50": p50,
            "step_s_p90": stats.quantile(0.9),
            "data_s": stats.mean("data"),
            "h2d_s": stats.mean("copy"),
            "compute_s": stats.mean("compute"),
            "window_s": stats.window_s,
            "images_per_s_min": min(stats.window_images_per_s),
            "images_per_s_max": max(stats.window_images_per_s),
            "window_spread": stats.spread,
            "windows": len(stats.windows),
            "warmup_s": stats.warmup_s,
            "loader_start_s": stats.loader_start_s,
            "first_step_s": stats.first_step_s,
        }
    )
    if compiled:
        out.metrics["compile_s"] = max(0.0, stats.first_step_s - p50)
    device_timeline = stats.clock != "host"
    if device_timeline and stats.steps:
        busy, idle = stats.mean("busy"), stats.mean("idle")
        idle_total = sum(s.idle for s in stats.steps)
        out.metrics.update(
            {
                "device_busy_s": busy,
                "device_idle_s": idle,
                "device_idle_share": idle / (busy + idle),
                "idle_loader_share": sum(s.idle_loading for s in stats.steps) / idle_total if idle_total else 0.0,
                "device_lag_s": stats.mean("lag"),
            }
        )
    loader_cost, transfer_cost = _ablation(stats, out.metrics)
    # One window cannot disagree with itself: only repeated windows can call a trial unstable.
    out.tags["dinox.unstable"] = str(len(stats.windows) > 1 and stats.spread > m.unstable_threshold).lower()
    out.tags["dinox.step_clock"] = stats.clock
    timed = device_timeline and bool(stats.steps)
    evidence = Evidence(
        period=statistics.fmean(stats.periods),
        data=stats.mean("data"),
        copy=stats.mean("copy"),
        idle=stats.mean("idle") if timed else None,
        idle_loading=stats.mean("idle_loading") if timed else None,
        loader_cost=loader_cost,
        transfer_cost=transfer_cost,
        compute_only_idle_share=_idle_share(stats.compute_only[0]) if device_timeline and stats.compute_only else None,
        fixed_share=out.metrics.get("fixed_share"),
        noise=max(stats.spread, out.metrics.get("ablation_noise", 0.0)),
    )
    out.bound, out.tags["dinox.bound_rule"] = classify(evidence, m.bound_threshold)
    return out


def _disagreement(windows: list[Window]) -> float:
    rates = [w.images_per_s for w in windows]
    return (max(rates) - min(rates)) / statistics.median(rates)


def _span(window: Window) -> float:
    return statistics.fmean(s.forward_backward for s in window.steps)


def _ablation(stats: LoopStats, metrics: dict[str, float]) -> tuple[float | None, float | None]:
    # Each rate from the median step of its windows, against the loader windows run in turn with them (not
    # the timed windows, minutes earlier).
    reference, compute, no_loader = rate(stats.reference), rate(stats.compute_only), rate(stats.no_loader)
    if compute is not None and no_loader is not None:
        metrics["images_per_s_compute_only"], metrics["images_per_s_no_loader"] = compute, no_loader
    half, full = stats.compute_half, stats.compute_only
    if half is not None and full and half.steps and full[0].steps:
        metrics["images_per_s_compute_half"] = half.images_per_s
        metrics["fixed_share"] = fixed_share(statistics.fmean(_span(w) for w in full), _span(half))
    if stats.loader_images_per_s is not None:
        metrics["loader_images_per_s"] = stats.loader_images_per_s
    if stats.ablation_s:
        metrics["ablation_s"] = stats.ablation_s
    pairs = [ws for ws in (stats.reference, stats.compute_only, stats.no_loader) if len(ws) > 1]
    if pairs:  # how far two windows of one kind disagree: a cost within that is not evidence
        metrics["ablation_noise"] = max(_disagreement(ws) for ws in pairs)
    loader_cost, transfer_cost = costs(reference or stats.images_per_s, no_loader, compute)
    if loader_cost is not None:
        metrics["loader_cost"], metrics["transfer_cost"] = loader_cost, transfer_cost  # type: ignore[assignment]
    return loader_cost, transfer_cost

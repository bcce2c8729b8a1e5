"""The loop's measurements as the trial's record: throughput, step times, the time split, the device's idle
accounting, the ablation costs with the intervals the label read, the stage-alone rates, and the bound label
with the rule that gave it and its evidence in words.

A metrics processor in torchtitan's sense: the loop (dinox.measure.loop) only measures; this turns its LoopStats
into the MLflow record's names. Every figure is per optimizer step unless its name says otherwise. The
recorded figures keep docs/record.md's relations exactly: loader_cost = 1 - images_per_s / images_per_s_no_loader
and transfer_cost = 1 - images_per_s_no_loader / images_per_s_compute_only, each rate pooled over its windows.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field

from dinox import record as rec
from dinox.contract import SM_CLOCK_KEY
from dinox.measure.bound import (
    Evidence,
    Stage,
    classify,
    copies_decided,
    direct_decided,
    explain,
    fixed_share,
    rounds_decided,
)
from dinox.measure.windows import LoopStats, Window, held_share, in_process_rate, pooled, spread
from dinox.spec.sections import MeasureSpec


@dataclass
class Summary:
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    bound: str = ""
    step_s: list[float] = field(default_factory=list)


def _idle_share(windows: list[Window]) -> float | None:
    steps = [s for w in windows for s in w.steps]
    period = sum(s.period for s in steps)
    return sum(s.idle for s in steps) / period if steps and period > 0 else None


def _figures(stats: LoopStats, compiled: bool) -> dict[str, float]:
    """The timed windows' figures (throughput, step times, the time split) and the trial's timeline."""
    p50 = stats.quantile(0.5)
    figures = {
        rec.IMAGES_PER_S: stats.images_per_s,
        rec.STEP_S_P50: p50,
        rec.STEP_S_P90: stats.quantile(0.9),
        rec.DATA_S: stats.mean("data"),
        rec.H2D_S: stats.mean("copy"),
        rec.COMPUTE_S: stats.mean("compute"),
        rec.WINDOW_S: stats.window_s,
        rec.IMAGES_PER_S_MIN: min(stats.window_images_per_s),
        rec.IMAGES_PER_S_MAX: max(stats.window_images_per_s),
        rec.WINDOW_SPREAD: stats.spread,
        rec.WINDOWS: len(stats.windows),
        rec.WARMUP_S: stats.warmup_s,
        rec.LOADER_START_S: stats.loader_start_s,
        rec.FIRST_STEP_S: stats.first_step_s,
        rec.FIRST_FETCH_S: stats.first_fetch_s,
        rec.SETTLE_S: stats.settle_s,
        rec.EPOCH_BOUNDARIES: stats.epoch_boundaries,
        rec.EPOCH_START_S: stats.epoch_start_s,
        rec.EPOCH_BOUNDARY_S: stats.epoch_boundary_s,
    }
    if stats.restart_step_s is not None:
        figures[rec.EPOCH_RESTART_STEP_S] = stats.restart_step_s
    if compiled:
        # The first step less its waits for the workers' first batches and less a steady step: compilation
        # (and the autotuning of the compiled kernels), not the loader's start-up.
        figures[rec.COMPILE_S] = max(0.0, stats.first_step_s - stats.first_fetch_s - p50)
    return figures


def summarize(stats: LoopStats, m: MeasureSpec, compiled: bool) -> Summary:
    out = Summary(step_s=stats.periods, metrics=_figures(stats, compiled))
    device_timeline = stats.clock != "host"
    if device_timeline and stats.steps:
        out.metrics.update(_device_split(stats))
    loader, copies = _stages(stats, out.metrics, m.bound_threshold)
    # One window cannot disagree with itself: only repeated windows can call a trial unstable.
    out.tags[rec.UNSTABLE] = str(len(stats.windows) > 1 and stats.spread > m.unstable_threshold).lower()
    out.tags[rec.STEP_CLOCK] = stats.clock
    if stats.window_clocks:
        rates = [round(r, 3) for r in stats.window_images_per_s]
        out.tags[rec.WINDOW_CLOCKS] = json.dumps({"images_per_s": rates, SM_CLOCK_KEY: stats.window_clocks})
    timed = device_timeline and bool(stats.steps)
    evidence = Evidence(
        period=statistics.fmean(stats.periods),
        data=stats.mean("data"),
        copy=stats.mean("copy"),
        idle=stats.mean("idle") if timed else None,
        idle_loading=stats.mean("idle_loading") if timed else None,
        loader=loader,
        copies=copies,
        compute_only_idle_share=_idle_share(stats.compute_only) if device_timeline else None,
        fixed_share=out.metrics.get(rec.FIXED_SHARE),
        host_ahead=_host_ahead(stats.compute_full),
    )
    if evidence.host_ahead is not None:
        out.metrics[rec.HOST_AHEAD_STEPS] = evidence.host_ahead
    out.bound, out.tags[rec.BOUND_RULE] = classify(evidence, m.bound_threshold)
    if why := explain(out.metrics, m.bound_threshold):
        out.tags[rec.BOUND_EVIDENCE] = why
    if loader is not None and loader.ceiling(m.bound_threshold) is None and loader.alone:
        out.tags[rec.BOUND_NOTE] = (
            f"the trial ran faster ({stats.images_per_s:.1f} img/s) than its loader alone "
            f"({loader.alone:.1f} img/s): the loader-alone window was slowed, and is not evidence"
        )
    return out


def decided(
    timed: list[Window],
    no_loader: list[Window],
    compute_only: list[Window],
    copies: Window | None,
    *,
    threshold: float,
    serial: bool,
) -> bool:
    """The loop's `decided`: whether more ablation rounds could change the label, from the timed windows so far,
    the rounds (round i follows timed window i) and the copies alone. `serial`: the loader runs in the step's
    own process on the host's clock (no workers, a CPU), so the timed steps' fetches are the loader alone.

    Before any round only a serial loader can be decided: its own fetches cap it, and with it what the step
    could run without it, which caps the copies too (step_metrics._stages). A worker loader's, or a device's,
    no-loader rate has no cap but a round's: without one the copies' interval would be anything up to all of a
    step, and on a device the compute-only window shows the host's share."""
    rates = lambda ws: [w.images_per_s for w in ws]  # noqa: E731
    if not no_loader and not serial:
        return False
    if rounds_decided(rates(timed[: len(no_loader)]), rates(no_loader), rates(compute_only), threshold):
        return True
    return direct_decided(
        pooled(timed) or 0.0,
        spread(rates(timed)),
        held_share(timed),
        in_process_rate(timed) if serial else None,
        pooled([copies]) if copies is not None and copies.wall_s > 0 else None,
        threshold,
    )


def copies_known(no_loader: Window, copies: Window, *, threshold: float) -> bool:
    """The loop's `copies_decided` on the host's clock: whether the first no-loader window and the copies alone
    already decide the copies' stage (bound.copies_decided)."""
    return copies_decided(no_loader.images_per_s, pooled([copies]) if copies.wall_s > 0 else None, threshold)


def _device_split(stats: LoopStats) -> dict[str, float]:
    """The device's own account of the timed steps: busy, idle, how much of the idle was the loader's, and how
    far the device trailed the host."""
    busy, idle = stats.mean("busy"), stats.mean("idle")
    idle_total = sum(s.idle for s in stats.steps)
    return {
        rec.DEVICE_BUSY_S: busy,
        rec.DEVICE_IDLE_S: idle,
        rec.DEVICE_IDLE_SHARE: idle / (busy + idle),
        rec.IDLE_LOADER_SHARE: sum(s.idle_loading for s in stats.steps) / idle_total if idle_total else 0.0,
        rec.DEVICE_LAG_S: stats.mean("lag"),
    }


def _host_ahead(window: Window | None) -> float | None:
    """How many steps the host ran ahead of the device, on average, in a compute-only window."""
    if window is None or not window.steps:
        return None
    return statistics.fmean(s.lag for s in window.steps) / statistics.fmean(s.period for s in window.steps)


def _span(window: Window) -> float:
    return statistics.fmean(s.forward_backward for s in window.steps)


def _stages(stats: LoopStats, metrics: dict[str, float], threshold: float) -> tuple[Stage | None, Stage | None]:
    """The loader and the copies as the ablation measured them (None, None without ablation windows), their
    figures recorded: the pooled rates and costs, and the interval the label reads."""
    compute, no_loader = pooled(stats.compute_only), pooled(stats.no_loader)
    if stats.loader_images_per_s is not None:
        metrics[rec.LOADER_IMAGES_PER_S] = stats.loader_images_per_s
    if stats.ablation_s:
        metrics[rec.ABLATION_S] = stats.ablation_s
        metrics[rec.ABLATION_ROUNDS] = len(stats.no_loader)  # compute-only windows: none where the copies decided
    half, full = stats.compute_half, stats.compute_full
    if half is not None and full is not None and half.steps and full.steps:
        metrics[rec.IMAGES_PER_S_COMPUTE_HALF] = half.images_per_s
        metrics[rec.FIXED_SHARE] = fixed_share(_span(full), _span(half), half.images_per_step / full.images_per_step)
    if stats.copies_alone is None:  # no ablation windows
        return None, None
    copies_alone = pooled([stats.copies_alone])
    if copies_alone is not None:
        metrics[rec.COPY_IMAGES_PER_S] = copies_alone
    if no_loader is not None:
        metrics[rec.IMAGES_PER_S_NO_LOADER] = no_loader
    if compute is not None:
        metrics[rec.IMAGES_PER_S_COMPUTE_ONLY] = compute
    period = statistics.fmean(stats.periods)
    held = (stats.mean("idle_loading") / period, stats.mean("copy") / period) if stats.steps else (None, None)
    loader = Stage(
        stats.images_per_s,
        no_loader,
        tuple(1.0 - t.images_per_s / h.images_per_s for t, h in zip(stats.windows, stats.no_loader, strict=False)),
        stats.loader_images_per_s,
        held[0],
        serial=stats.loader_ready == 0,
        drift=stats.spread,
    )
    if no_loader is None:  # no round ran (the timed steps decided): the most the step could run without the loader
        most = loader.interval(threshold).high
        copies_with = stats.images_per_s / (1.0 - most) if most < 1.0 else math.inf
    copies = Stage(
        no_loader if no_loader is not None else copies_with,
        compute,
        tuple(1.0 - h.images_per_s / c.images_per_s for h, c in zip(stats.no_loader, stats.compute_only, strict=False)),
        copies_alone,
        held[1],
        drift=stats.spread,
    )
    names = (
        (loader, rec.LOADER_COST, rec.LOADER_COST_LOW, rec.LOADER_COST_HIGH),
        (copies, rec.TRANSFER_COST, rec.TRANSFER_COST_LOW, rec.TRANSFER_COST_HIGH),
    )
    for stage, cost, low, high in names:
        interval = stage.interval(threshold)
        metrics[low], metrics[high] = interval.low, interval.high
        if stage.cost is not None:  # the record's relation to the no-loader and compute-only rates: with a round
            metrics[cost] = stage.cost
    return loader, copies

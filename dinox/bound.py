"""What holds a step back, from what was measured: the bound label and the rule that gave it. No torch.

Three rules, the first whose measurements exist:
- ``ablation`` (every device): the ablation windows' costs. ``loader_cost`` = 1 - images/s / images/s
  without the loader; ``transfer_cost`` = 1 - images/s without the loader / images/s of compute alone.
  io_bound when the loader costs at least the threshold (or the timed windows' own spread, if larger: a
  difference smaller than the noise is not evidence), transfer_bound when the copies do; on a device
  with a timeline of its own, host_bound when the device still idles in the compute-only window (nothing
  to load or copy there: Python, launches, a sync in the model), or when more than half of its
  forward/backward time does not shrink at half the batch (``fixed_share``: launches inside a forward leave
  the device idle where no marker sees it); else compute_bound.
- ``device_events`` (CUDA/MPS without ablation windows): the device's idle share at the step's markers.
  Idle time spent while the host was blocked on the loader makes it io_bound, other idle host_bound; copy
  spans make it transfer_bound.
- ``host_timers`` (the CPU without ablation windows): the share of each step the host waits on the loader
  or copies.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

Bound = Literal["compute_bound", "io_bound", "transfer_bound", "host_bound"]
Rule = Literal["ablation", "device_events", "host_timers"]
BOUNDS: tuple[Bound, ...] = typing.get_args(Bound)
# More than half of a forward/backward's device time independent of the batch: kernel launches and Python set
# its pace (at the same time the device runs half the work in nearly the same time), not the device.
FIXED_SHARE_HOST_BOUND = 0.5


@dataclass(frozen=True)
class Evidence:
    """Mean seconds per optimizer step, and the ablation costs; None where not measured."""

    period: float
    data: float  # host blocked in next(loader)
    copy: float  # copy spans
    idle: float | None = None  # device idle at the markers (a device with its own timeline)
    idle_loading: float | None = None  # ... of which the host was blocked on the loader
    loader_cost: float | None = None
    transfer_cost: float | None = None
    compute_only_idle_share: float | None = None  # device idle share in the compute-only ablation window
    fixed_share: float | None = None  # share of forward/backward time that does not shrink at half the batch
    noise: float = 0.0  # the timed windows' own spread: a cost smaller than that is not evidence


def classify(e: Evidence, threshold: float) -> tuple[Bound, Rule]:
    if e.loader_cost is not None and e.transfer_cost is not None:
        # An ablation window is one more window: it differs from the timed ones by their spread at least.
        margin = max(threshold, e.noise)
        if e.loader_cost >= margin:
            return "io_bound", "ablation"
        if e.transfer_cost >= margin:
            return "transfer_bound", "ablation"
        if e.compute_only_idle_share is not None and e.compute_only_idle_share >= threshold:
            return "host_bound", "ablation"
        if e.fixed_share is not None and e.fixed_share >= FIXED_SHARE_HOST_BOUND:
            return "host_bound", "ablation"
        return "compute_bound", "ablation"
    if e.idle is not None and e.period > 0:
        if e.idle / e.period >= threshold:
            loading = (e.idle_loading or 0.0) / e.idle if e.idle else 0.0
            return ("io_bound" if loading >= 0.5 else "host_bound"), "device_events"
        if e.copy / e.period >= threshold:
            return "transfer_bound", "device_events"
        return "compute_bound", "device_events"
    data_share, copy_share = e.data / e.period, e.copy / e.period
    if max(data_share, copy_share) < threshold:
        return "compute_bound", "host_timers"
    return ("io_bound" if data_share >= copy_share else "transfer_bound"), "host_timers"


def fixed_share(full_span: float, half_span: float) -> float:
    """The batch-independent share of a forward/backward, from its device time at the full and at half the
    batch, under time = fixed + per-image x batch: (2 x half - full) / full, clamped to [0, 1]."""
    return min(1.0, max(0.0, (2.0 * half_span - full_span) / full_span)) if full_span > 0 else 0.0


def costs(
    images_per_s: float, no_loader: float | None, compute_only: float | None
) -> tuple[float | None, float | None]:
    """(loader_cost, transfer_cost) from the timed and the ablation windows' images/s. Noise can make one
    slightly negative (the ablation window ran a little slower): it is reported as measured."""
    if not no_loader or not compute_only:
        return None, None
    return 1.0 - images_per_s / no_loader, 1.0 - no_loader / compute_only

"""What the timed loop measures, as plain records: a window of steps, the trial's windows and ablation rounds
(LoopStats), how many windows to time (Repeats), and the arithmetic on them. No clock and no device here."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dinox.measure.timeline import StepTimes


@dataclass(frozen=True)
class Window:
    """One window of steps between two synchronisations."""

    wall_s: float
    images: int
    steps: list[StepTimes]  # the intervals between consecutive step ends (one fewer than the steps)

    @property
    def images_per_s(self) -> float:
        return self.images / self.wall_s

    @property
    def periods(self) -> list[float]:
        return [s.period for s in self.steps] or [self.wall_s]  # a one-step window: its wall is its period

    @property
    def images_per_step(self) -> float:
        return self.images / (len(self.steps) + 1)


def spread(rates: list[float]) -> float:
    """(fastest - slowest) / median throughput of windows: 0 for one window."""
    return (max(rates) - min(rates)) / statistics.median(rates)


def all_read(readings: list[float | None]) -> list[float]:
    """Each reading where every one was read, else none: a series with a gap (NVML refusing midway) is not
    half-said."""
    return [r for r in readings if r is not None] if None not in readings else []


def pooled(windows: list[Window]) -> float | None:
    """Images/s of windows of one kind: all their images over all their wall time (None: no window)."""
    return sum(w.images for w in windows) / sum(w.wall_s for w in windows) if windows else None


def in_process_rate(windows: list[Window]) -> float | None:
    """Images/s of a loader that runs in the step's own process (no workers), from the timed steps' waits in
    next(loader): each fetch there is the loader's whole work for its batch, done while nothing else runs in
    the process, so a loader-only window would time the same fetches again (seconds a trial, on a slow
    loader). None where no step interval saw a fetch."""
    steps = [(w.images_per_step, s.data) for w in windows for s in w.steps]
    waited = sum(data for _, data in steps)
    return sum(images for images, _ in steps) / waited if waited > 0 else None


def boundary_cost(
    epoch_start_s: float, windows: list[Window], fetches_per_step: int, restart_step_s: float | None = None
) -> float:
    """What an epoch boundary adds to a run's time.

    With workers (`restart_step_s` given): the restart's first batch (`epoch_start_s`, from idle workers) and
    the step that trains on it, less a typical timed step (the median period, its waits for the loader
    included). The step counts because a restart forks new workers (unless persistent): every page the
    training process writes next is copied for it first (copy-on-write), and the new workers fill their
    prefetch beside it; on this project's 2-core box the step after a restart ran 0.39-0.61 s over a typical
    0.26-0.38 s one while its first batch came in 0.02-0.08 s (docs/measuring.md, "Epochs"). Persistent workers pay
    neither, and the charge comes out at the first batch less a steady fetch's wait, as below.

    Without workers (no `restart_step_s`): nothing is forked, and the step after the restart is an ordinary
    one: the restart's first fetch less the wait a steady fetch already pays (its whole batch, in this
    process), which the timed rate holds. Without a timed step: the restart whole."""
    if restart_step_s is not None:
        periods = [p for w in windows for p in w.periods]
        return max(0.0, epoch_start_s + restart_step_s - statistics.median(periods)) if periods else epoch_start_s
    steps = [s for w in windows for s in w.steps]
    if not steps:
        return epoch_start_s
    waited = sum(s.data for s in steps) / (len(steps) * max(1, fetches_per_step))
    return max(0.0, epoch_start_s - waited)


def held_share(windows: list[Window]) -> float | None:
    """The share of the windows' step intervals the device sat idle while the host waited in next(loader)
    (None: no step interval seen)."""
    steps = [s for w in windows for s in w.steps]
    period = sum(s.period for s in steps)
    return sum(s.idle_loading for s in steps) / period if period > 0 else None


@dataclass(frozen=True)
class Repeats:
    """How many timed windows: at least `least`, then more until their spread is at most `threshold`, never
    more than `most`. A fixed count is least == most."""

    least: int
    most: int
    threshold: float = 0.0
    # The ranks of a distributed trial must stop together (each window runs collectives): this turns one
    # rank's answer into all of theirs.
    agree: Callable[[bool], bool] | None = None

    @classmethod
    def fixed(cls, n: int) -> Repeats:
        return cls(n, n)

    def settled(self, rates: list[float]) -> bool:
        n = len(rates)
        done = n >= self.most or (n >= self.least and spread(rates) <= self.threshold)
        return self.agree(done) if self.agree is not None and n < self.most else done

    def label(self, n: int) -> str:
        return f"window {n}/{self.most}" if self.least == self.most else f"window {n} (of {self.least}-{self.most})"


@dataclass(frozen=True)
class LoopStats:
    windows: list[Window]  # the timed windows, in order
    first_step_s: float  # the first warm-up step alone (compilation, autotuning, allocator growth, workers)
    warmup_s: float  # all warm-up steps, the first included
    clock: str  # "host" (synchronous CPU), "cuda_events" or "mps_events"
    loader_start_s: float = 0.0  # iter(loader): starting the workers (persistent ones: once per trial)
    first_fetch_s: float = 0.0  # the first warm-up step's waits for its batches (the workers' first batches)
    # The rounds: after timed window i, compute_only[i] (a device batch reused: no loader, no copy) and
    # no_loader[i] (a host batch reused and copied every micro-batch).
    compute_only: list[Window] = field(default_factory=list)
    no_loader: list[Window] = field(default_factory=list)
    copies_alone: Window | None = None  # only the copies (and device-side preparation) of micro-batches
    loader_images_per_s: float | None = None  # the loader alone, workers warm
    ablation_s: float = 0.0  # wall time of every window that is not a timed one
    compute_full: Window | None = None  # compute only at the full batch, beside ...
    compute_half: Window | None = None  # ... compute only at half the batch (a device with its own timeline)
    epoch_boundaries: int = 0  # loader epochs that ended inside the timed windows
    settle_s: float = 0.0  # untimed: draining the batches ready and a step before each timed window
    epoch_start_s: float = 0.0  # an epoch boundary: the loader's iterator ended and a new one's first batch
    # With workers: the step that trains on that first batch (None: timed in the warm-up's step, no workers)
    restart_step_s: float | None = None
    epoch_boundary_s: float = 0.0  # what the boundary adds to a run's time (boundary_cost)
    loader_ready: int = 0  # batches the loader's workers can hold ready (0: it loads in the step's process)
    window_clocks: list[float] = field(default_factory=list)  # the GPU's SM clock after each timed window ([]: none)

    @property
    def window_s(self) -> float:
        return sum(w.wall_s for w in self.windows)

    @property
    def images(self) -> int:
        return sum(w.images for w in self.windows)

    @property
    def images_per_s(self) -> float:
        return self.images / self.window_s

    @property
    def window_images_per_s(self) -> list[float]:
        return [w.images_per_s for w in self.windows]

    @property
    def spread(self) -> float:
        return spread(self.window_images_per_s)

    @property
    def steps(self) -> list[StepTimes]:
        return [s for w in self.windows for s in w.steps]

    @property
    def periods(self) -> list[float]:
        return [p for w in self.windows for p in w.periods]

    def mean(self, part: str) -> float:
        """Mean of a StepTimes field over the timed steps; 0.0 when no step interval was seen."""
        steps = self.steps
        return statistics.fmean(getattr(s, part) for s in steps) if steps else 0.0

    def quantile(self, q: float) -> float:
        return quantile(self.periods, q)


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default; statistics.quantiles refuses a single value)."""
    return float(np.quantile(values, q))

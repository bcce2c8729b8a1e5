"""The timed step loop: warm-up, timed windows, ablation windows and a loader-only window.

It knows nothing about specs or MLflow: it is handed a loader and three callables. One optimizer step is
``accumulation`` micro-batches (fetch, copy, forward/backward) followed by the optimizer update. The clock is
chosen once, at construction (as timm's benchmark does): on the CPU every call is synchronous and the
markers are the host's clock; on an asynchronous device (CUDA, MPS) the markers are events on the device's
own timeline (dinox.timeline), the host never synchronises inside a window, only at its edges, and so runs
ahead of the device as a real training loop does. A window's wall time between its two edge
synchronisations gives images/s; the step times come from the marker clock.

After the timed windows, short ablation windows answer "what does the input pipeline cost the step?": one
reuses a batch already on the device (no loader, no copy: compute only), one reuses a host batch and copies
it every micro-batch (no loader), each compared with loader windows run in turn with them; on a device
with a timeline of its own, a third computes on half the device batch, which tells a step the device paces
from one the host's kernel launches pace. A last window iterates the loader alone, with the model idle and
the workers warm: the rate the input pipeline can feed. None of them counts in images_per_s.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dinox.timeline import HostEvent, StepTimes, Timeline, WindowRecorder


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


def rate(windows: list[Window]) -> float | None:
    """Images/s of windows of one kind from their median step, all their steps pooled: a burst that slows a
    few steps (a neighbour on a shared machine) moves a window's mean but not this."""
    if not windows:
        return None
    periods = [p for w in windows for p in w.periods]
    return windows[0].images_per_step / statistics.median(periods)


@dataclass(frozen=True)
class LoopStats:
    windows: list[Window]  # the timed windows, in order
    first_step_s: float  # the first warm-up step alone (compilation, autotuning, allocator growth)
    warmup_s: float  # all warm-up steps, the first included
    clock: str  # "host" (synchronous CPU), "cuda_events" or "mps_events"
    loader_start_s: float = 0.0  # iter(loader): starting the workers (persistent ones: once per trial)
    compute_only: list[Window] = field(default_factory=list)  # ablation: a device batch reused, no loader, no copy
    no_loader: list[Window] = field(default_factory=list)  # ablation: a host batch reused and copied every time
    loader_images_per_s: float | None = None  # the loader alone, workers warm
    ablation_s: float = 0.0  # wall time of the ablation and loader windows
    compute_half: Window | None = None  # compute only at half the batch (a device with a timeline of its own)
    reference: list[Window] = field(default_factory=list)  # loader windows run in turn with the ablation ones

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


def timeline_for(device: torch.device) -> tuple[Timeline, str]:
    """The marker clock for a device, chosen once."""
    if device.type == "cuda":
        return Timeline(lambda: torch.cuda.Event(enable_timing=True), lambda: torch.cuda.synchronize(device)), (
            "cuda_events"
        )
    if device.type == "mps":
        mps_event = getattr(getattr(torch.mps, "event", None), "Event", None)
        if mps_event is not None:
            return Timeline(lambda: mps_event(enable_timing=True), torch.mps.synchronize), "mps_events"
        return Timeline(HostEvent, torch.mps.synchronize, device_clock=False), "host"
    return Timeline(HostEvent, lambda: None, device_clock=False), "host"


class _Batches:
    """Endless iteration over a loader; an exhausted loader starts a new epoch as a real run would."""

    def __init__(self, loader: Iterable):
        self._loader = loader
        self._it: Iterator = iter(loader)

    def next(self) -> Any:
        try:
            return next(self._it)
        except StopIteration:
            self._it = iter(self._loader)
            return next(self._it)


class _NoMarkers:
    """Warm-up steps leave no marker."""

    def fetched(self, start: float, end: float) -> None: ...
    def before_copy(self) -> None: ...
    def before_forward(self) -> None: ...
    def after_backward(self) -> None: ...
    def step_end(self) -> None: ...


@dataclass
class Loop:
    """The steps of one trial; `run` returns its LoopStats."""

    loader: Iterable
    to_device: Callable[[Any], Any]
    micro_step: Callable[[Any], None]
    optimizer_step: Callable[[], None]
    device: torch.device
    accumulation: int
    batch_size: int
    timeline: Timeline | None = None  # None: the device's own (tests pass one with fake events)
    clock: str = "host"
    # A device batch cut to half its size (None: no half-batch window). Only where the device keeps a timeline
    # of its own: it tells a forward paced by the device from one paced by the host's launches.
    halve: Callable[[Any], Any] | None = None
    on_phase: Callable[[str], None] | None = None  # told "warm-up", "window 2/3", ...: the live progress line
    buffered: int = field(default=0, init=False)  # batches the loader's workers hold ready
    last_host: Any = field(default=None, init=False)
    last_device: Any = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.timeline is None:
            self.timeline, self.clock = timeline_for(self.device)

    # --- one step ---------------------------------------------------------------------------------------

    def step(self, rec: WindowRecorder | _NoMarkers, source: str = "loader", reused: Any = None) -> None:
        """source: loader (fetch, copy, compute), host (reuse a host batch: copy, compute), device (compute on
        `reused`, a batch already on the device)."""
        perf = self.timeline.host_clock  # type: ignore[union-attr]
        for _ in range(self.accumulation):
            if source == "loader":
                t = perf()
                self.last_host = self.batches.next()
                rec.fetched(t, perf())
            rec.before_copy()
            if source != "device":
                self.last_device = self.to_device(self.last_host)
            rec.before_forward()
            self.micro_step(reused if source == "device" else self.last_device)
            rec.after_backward()
        self.optimizer_step()
        rec.step_end()

    def window(self, steps: int, source: str = "loader", reused: Any = None, batch_size: int | None = None) -> Window:
        rec = self.timeline.window()  # type: ignore[union-attr]
        for _ in range(steps):
            self.step(rec, source, reused)
        rec.close()
        return Window(rec.wall_s, steps * self.accumulation * (batch_size or self.batch_size), rec.steps)

    # --- the whole measurement ----------------------------------------------------------------------------

    def run(
        self,
        warmup_steps: int,
        bench_steps: int,
        repeats: Repeats | int = 1,
        ablation_steps: int = 0,
        loader_batches: int = 0,
        loader_buffered: int = 0,
    ) -> LoopStats:
        """Warm up, time windows of `bench_steps` steps until `repeats` says they settled (an int: that many),
        then (if asked) the two ablation windows of
        `ablation_steps` steps and a loader-only window of `loader_batches` batches, after skipping the
        `loader_buffered` batches the workers had ready."""
        perf = self.timeline.host_clock  # type: ignore[union-attr]
        self.buffered = loader_buffered
        t = perf()
        self.batches = _Batches(self.loader)
        loader_start_s = perf() - t
        self._phase("warm-up")
        first_step_s, warmup_s = self._warm_up(warmup_steps)
        windows = self._timed_windows(bench_steps, Repeats.fixed(repeats) if isinstance(repeats, int) else repeats)
        t = perf()
        reference: list[Window] = []
        compute_only: list[Window] = []
        no_loader: list[Window] = []
        compute_half = None
        if ablation_steps:
            self._phase("ablation windows")
            reference, compute_only, no_loader, compute_half = self._ablation(ablation_steps)
        if loader_batches:
            self._phase("loader alone")
        loader_ips = self._loader_alone(loader_batches) if loader_batches else None
        return LoopStats(
            windows,
            first_step_s,
            warmup_s,
            self.clock,
            loader_start_s,
            compute_only,
            no_loader,
            loader_ips,
            perf() - t if (ablation_steps or loader_batches) else 0.0,
            compute_half,
            reference,
        )

    def _timed_windows(self, steps: int, repeats: Repeats) -> list[Window]:
        windows: list[Window] = []
        while not windows or not repeats.settled([w.images_per_s for w in windows]):
            upto = f"/{repeats.most}" if repeats.least == repeats.most else f" (of {repeats.least}-{repeats.most})"
            self._phase(f"window {len(windows) + 1}{upto}")
            windows.append(self.window(steps))
        return windows

    def _ablation(self, steps: int) -> tuple[list[Window], list[Window], list[Window], Window | None]:
        """A loader window (the reference), the compute-only and the no-loader windows, in turn, twice over,
        `steps` steps each in all: drift and a neighbour's burst on a shared machine fall on all three alike.
        Then, where it applies, the compute-only window at half the batch."""
        rounds = 2 if steps >= 4 else 1
        per = [steps // rounds + (1 if i < steps % rounds else 0) for i in range(rounds)]
        reference, compute, host = [], [], []
        for n in per:
            self._drain()  # the workers refilled their queues meanwhile: a full queue would flatter the loader
            reference.append(self.window(n, "loader"))
            compute.append(self.window(n, "device", self.last_device))
            host.append(self.window(n, "host"))
        half = None
        if self.halve is not None and self.timeline.device_clock and self.batch_size >= 4:  # type: ignore[union-attr]
            half = self.window(steps, "device", self.halve(self.last_device), self.batch_size // 2)
        return reference, compute, host, half

    def _phase(self, text: str) -> None:
        if self.on_phase is not None:
            self.on_phase(text)

    def _warm_up(self, steps: int) -> tuple[float, float]:
        perf, sync = self.timeline.host_clock, self.timeline.synchronize  # type: ignore[union-attr]
        sync()
        t = perf()
        first = 0.0
        for i in range(steps):
            self.step(_NoMarkers())
            if i == 0:
                sync()  # the first step alone: compilation and autotuning live there
                first = perf() - t
        sync()
        return first, perf() - t

    def _drain(self) -> None:
        """Take the batches the workers hold ready, untimed."""
        for _ in range(self.buffered):
            self.batches.next()

    def _loader_alone(self, batches: int) -> float:
        """Images/s the loader delivers with nothing consuming them but this loop."""
        self._drain()  # ready before the clock starts: they would flatter the rate
        perf = self.timeline.host_clock  # type: ignore[union-attr]
        t = perf()
        for _ in range(batches):
            self.batches.next()
        return batches * self.batch_size / (perf() - t)


def run(
    loader: Iterable,
    *,
    to_device: Callable[[Any], Any],
    micro_step: Callable[[Any], None],
    optimizer_step: Callable[[], None],
    device: torch.device,
    accumulation: int,
    batch_size: int,
    warmup_steps: int,
    bench_steps: int,
    repeats: Repeats | int = 1,
    ablation_steps: int = 0,
    loader_batches: int = 0,
    loader_buffered: int = 0,
    timeline: Timeline | None = None,
    halve: Callable[[Any], Any] | None = None,
) -> LoopStats:
    """Warm up, then time windows of `bench_steps` optimizer steps each as `repeats` says (see Loop.run)."""
    loop = Loop(
        loader,
        to_device,
        micro_step,
        optimizer_step,
        device,
        accumulation,
        batch_size,
        timeline,
        "host" if timeline is not None and not timeline.device_clock else "events",
        halve,
    )
    return loop.run(warmup_steps, bench_steps, repeats, ablation_steps, loader_batches, loader_buffered)

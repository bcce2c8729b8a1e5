"""The timed step loop: warm-up, timed optimizer steps, and the data / copy / compute split of each.

It knows nothing about specs or MLflow: it is handed a loader and three callables. One optimizer step is
``accumulation`` micro-batches (fetch, copy, forward/backward) followed by the optimizer update, and the
device is synchronised once, at the end of the step, so each step's wall time is real without adding
syncs inside it. Copy time on CUDA comes from events recorded around the copies and read after that sync.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class StepSplit:
    step_s: float  # wall time of the optimizer step, device synchronised at its end
    data_s: float  # host time blocked waiting for the loader
    h2d_s: float  # host-to-device copy time
    compute_s: float  # the rest: forward, backward, optimizer, launch overhead


@dataclass(frozen=True)
class LoopStats:
    steps: list[StepSplit]  # timed steps only, all windows in order
    windows_s: list[float]  # wall time of each timed window, from its first fetch to its last step's sync
    images_per_window: int  # images through the optimizer in one window
    first_step_s: float  # the first warm-up step alone (compilation, autotuning, allocator growth)
    warmup_s: float  # all warm-up steps, the first included
    loader_start_s: float = 0.0  # iter(loader): starting the workers (persistent ones: once per trial)

    @property
    def window_s(self) -> float:
        return sum(self.windows_s)

    @property
    def images(self) -> int:
        return self.images_per_window * len(self.windows_s)

    @property
    def images_per_s(self) -> float:
        return self.images / self.window_s

    @property
    def window_images_per_s(self) -> list[float]:
        return [self.images_per_window / w for w in self.windows_s]

    @property
    def spread(self) -> float:
        """(fastest - slowest) / median window throughput: 0 for one window."""
        rates = self.window_images_per_s
        return (max(rates) - min(rates)) / quantile(rates, 0.5)

    def mean(self, part: str) -> float:
        return statistics.fmean(getattr(s, part) for s in self.steps)

    def quantile(self, q: float) -> float:
        return quantile([s.step_s for s in self.steps], q)


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default), without numpy."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def classify(data_s: float, h2d_s: float, step_s: float, threshold: float) -> str:
    """io_bound / transfer_bound when waiting on the loader / on copies takes at least `threshold` of a step."""
    data_share, h2d_share = data_s / step_s, h2d_s / step_s
    if max(data_share, h2d_share) < threshold:
        return "compute_bound"
    return "io_bound" if data_share >= h2d_share else "transfer_bound"


class Clock:
    """Device synchronisation and copy timing, chosen once for the device (as timm's benchmark does)."""

    def __init__(self, device: torch.device, max_copies: int):
        self.device = device
        self._cuda = device.type == "cuda"
        if self._cuda:
            self._events = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(max_copies)
            ]
        self._host_copy_s = 0.0
        self._n = 0

    def sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()

    def copy(self, fn: Callable[[Any], Any], batch: Any) -> Any:
        if self._cuda:
            start, end = self._events[self._n]
            start.record()
            out = fn(batch)
            end.record()
        else:
            t = time.perf_counter()
            out = fn(batch)
            self._host_copy_s += time.perf_counter() - t
        self._n += 1
        return out

    def take_copy_s(self) -> float:
        """Copy time since the last call; on CUDA only valid after sync()."""
        if self._cuda:
            total = sum(s.elapsed_time(e) for s, e in self._events[: self._n]) / 1000.0
        else:
            total = self._host_copy_s
        self._host_copy_s, self._n = 0.0, 0
        return total


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
    repeats: int = 1,
) -> LoopStats:
    """Warm up, then time `repeats` back-to-back windows of `bench_steps` optimizer steps each."""
    clock = Clock(device, accumulation)
    perf = time.perf_counter
    t_start = perf()
    batches = _Batches(loader)
    loader_start_s = perf() - t_start

    def step() -> StepSplit:
        t0 = perf()
        data_s = 0.0
        for _ in range(accumulation):
            t = perf()
            batch = batches.next()
            data_s += perf() - t
            micro_step(clock.copy(to_device, batch))
        optimizer_step()
        clock.sync()
        step_s = perf() - t0
        h2d_s = clock.take_copy_s()
        return StepSplit(step_s, data_s, h2d_s, max(0.0, step_s - data_s - h2d_s))

    clock.sync()
    t_warm = perf()
    first_step_s = step().step_s if warmup_steps else 0.0
    for _ in range(warmup_steps - 1):
        step()
    warmup_s = perf() - t_warm

    steps: list[StepSplit] = []
    windows_s: list[float] = []
    for _ in range(repeats):
        t_window = perf()
        steps.extend(step() for _ in range(bench_steps))
        windows_s.append(perf() - t_window)
    return LoopStats(steps, windows_s, bench_steps * accumulation * batch_size, first_step_s, warmup_s, loader_start_s)

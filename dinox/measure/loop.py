"""The timed step loop: warm-up, timed windows each followed by its ablation windows, a copies-alone window,
the half-batch pair and a loader-only window.

It knows nothing about specs or MLflow: it is handed a loader and three callables. One optimizer step is
``accumulation`` micro-batches (fetch, copy, forward/backward) followed by the optimizer update. The clock is
chosen once, at construction (as timm's benchmark does): on the CPU every call is synchronous and the
markers are the host's clock; on an asynchronous device (CUDA, MPS) the markers are events on the device's
own timeline (dinox.measure.timeline), the host never synchronises inside a window, only at its edges, and so runs
ahead of the device as a real training loop does. A window's wall time between its two edge
synchronisations gives images/s; the step times come from the marker clock.

Every loader window starts from a steady pipeline (``Batches.settle``): batches the workers made ready while
nothing consumed them (a long first step, the ablation windows) are taken untimed first, or the window would
eat them at the step's pace and flatter a loader-bound trial.

Each timed window is followed by two short ablation windows, one round: one reuses a host batch and copies it
every micro-batch (no loader), one reuses a batch already on the device (no loader, no copy: compute only).
A round's three windows run back to back, so a neighbour's burst or drift on a shared machine falls on them
alike, and the rounds' spread says how far the costs they give can be trusted; before them the loader's
workers finish what they owe the timed steps (their stage's work, not the round's). The copies alone come
first, after the first timed window; on the host's clock, where the compute-only window shows the copies'
cost and nothing else, copies whose own rate already decides their stage (``copies_decided``) spare every
round its compute-only window. Once the label is decided (``decided``: by the rounds, at least two with both
stages' costs clear of the threshold by the timed windows' spread; or by what the timed steps and the copies
alone showed by themselves, dinox.measure.bound.direct_decided), the later timed windows run without theirs:
ablation is spent until the label is known, and a loader in the step's own process on the CPU whose timed
steps decide the label costs no round at all. After the rounds, on a device with a timeline of its own, the
compute-only windows at the full and at half the batch (a step the device paces from one the host's kernel
launches pace); then an epoch boundary (the iterator restarted from idle workers, as an epoch's end leaves
them, and the step that trains on its first batch, which pays for the new workers' fork; without workers, at
the warm-up's last step, which trains on its first batch); last the loader alone, from a steady pipeline,
with the model idle: the rate the input pipeline can feed. Only the timed windows count in images_per_s.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from dinox.measure.ahead import CopyAhead
from dinox.measure.batches import Batches
from dinox.measure.timeline import HostEvent, Timeline, WindowRecorder
from dinox.measure.windows import LoopStats, Repeats, Window, all_read, boundary_cost, in_process_rate


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


class _NoMarkers:
    """Untimed steps leave no marker."""

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
    # A device batch cut to about half its size, and its images (None: no half-batch pair). Only where the
    # device keeps a timeline of its own: it tells a forward paced by the device from one the host's launches pace.
    halve: Callable[[Any], tuple[Any, int]] | None = None
    on_phase: Callable[[str], None] | None = None  # told "warm-up", "window 2/3", ...: the live progress line
    # Steps that exchange nothing between ranks (DDP's no_sync): the half-batch pair runs inside it, or a
    # batch-independent all-reduce would count as the host's fixed cost.
    local: Callable[[], AbstractContextManager] = contextlib.nullcontext
    ahead: CopyAhead | None = None  # loader.device_prefetch: copies on a side stream, a micro-batch ahead
    # Given the timed windows, the rounds so far and the copies alone: True once more rounds could not change
    # the label (bound.rounds_decided, bound.direct_decided); the timed windows after that run without theirs.
    # None: every window.
    decided: Callable[[list[Window], list[Window], list[Window], Window | None], bool] | None = None
    # Given the first round's no-loader window and the copies alone: True where the copies' own evidence already
    # decides their stage (bound.copies_decided: on the host's clock only, where a compute-only window tells
    # nothing else); every round then runs without its compute-only window. None: every round has one.
    copies_decided: Callable[[Window, Window], bool] | None = None
    # The device's SM clock now (MHz; None where unknown), read after each timed window's end, outside it: a GPU
    # ramping up or throttling across the windows shows there (None: not read, a CPU).
    read_clock: Callable[[], float | None] | None = None
    pending: tuple[Any, Any] | None = field(default=None, init=False)  # the copy issued for the next micro-batch
    settle_s: float = field(default=0.0, init=False)  # untimed: steadying the pipeline before loader windows
    window_clocks: list[float | None] = field(default_factory=list, init=False)  # read_clock after each timed one
    last_host: Any = field(default=None, init=False)
    last_device: Any = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.timeline is None:
            self.timeline, self.clock = timeline_for(self.device)

    # --- one step ---------------------------------------------------------------------------------------

    def step(self, rec: WindowRecorder | _NoMarkers, source: str = "loader", reused: Any = None) -> None:
        """source: loader (fetch, copy, compute), host (reuse a host batch: copy, compute), device (compute on
        `reused`, a batch already on the device)."""
        for _ in range(self.accumulation):
            if source == "device":
                rec.before_copy()
                rec.before_forward()
                self.micro_step(reused)
            else:
                self._copied_micro_step(rec, source)
            rec.after_backward()
        self.optimizer_step()
        rec.step_end()

    def untimed_step(self) -> None:
        """One step from the loader that leaves no marker (a profiled step, a rank keeping pace with one)."""
        self.step(_NoMarkers())

    def _copied_micro_step(self, rec: WindowRecorder | _NoMarkers, source: str) -> None:
        """A micro-batch fetched (from the loader) and copied just before it computes; with `ahead`, taken from
        the side stream while the one after it is fetched and its copy issued (the copy span is then the
        compute stream's wait for it)."""
        if self.ahead is None:
            if source == "loader":
                self._fetch(rec)
            rec.before_copy()
            self.last_device = self.to_device(self.last_host)
        else:
            following = self._issue(rec, source)
            if self.pending is None:  # the first micro-batch: one more ahead of it
                self.pending, following = following, self._issue(rec, source)
            rec.before_copy()
            self.last_device, self.pending = self.ahead.take(self.pending), following
        rec.before_forward()
        self.micro_step(self.last_device)

    def _fetch(self, rec: WindowRecorder | _NoMarkers) -> None:
        perf = self.timeline.host_clock  # type: ignore[union-attr]
        t = perf()
        self.last_host = self.batches.next()
        rec.fetched(t, perf())

    def _issue(self, rec: WindowRecorder | _NoMarkers, source: str) -> tuple[Any, Any]:
        """The next micro-batch on its way: fetched (from the loader) and its copy issued on the side stream."""
        if source == "loader":
            self._fetch(rec)
        return self.ahead.issue(self.last_host)  # type: ignore[union-attr]

    def window(self, steps: int, source: str = "loader", reused: Any = None, images: int | None = None) -> Window:
        """`images`: per micro-batch, where it is not the batch size (the half batch)."""
        rec = self.timeline.window()  # type: ignore[union-attr]
        for _ in range(steps):
            self.step(rec, source, reused)
        rec.close()
        return Window(rec.wall_s, steps * self.accumulation * (images or self.batch_size), rec.steps)

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
        """Warm up; time windows of `bench_steps` steps until `repeats` says they settled (an int: that many),
        each followed (with `ablation_steps`) by a round of ablation windows of half that many steps; then the
        copies alone, the half-batch pair and a loader-only window of `loader_batches` batches (loader workers
        only: without them the timed steps' own fetches are that window). `loader_buffered`: how many batches
        the loader's workers can hold ready."""
        perf = self.timeline.host_clock  # type: ignore[union-attr]
        t = perf()
        self.batches = Batches(self.loader, perf, loader_buffered)
        loader_start_s = perf() - t
        self._phase("warm-up")
        steadied = warmup_steps >= 2  # its last step steadies the first window; a lone one is the workers' start
        first_step_s, first_fetch_s, warmup_s, restarted_s = self._warm_up(warmup_steps, steadied)
        rounds = self._rounds(bench_steps, repeats, math.ceil(ablation_steps / 2), steadied)
        windows, compute_only, no_loader, boundaries, copies = rounds
        t = perf()
        full = half = None
        if ablation_steps:
            self._phase("ablation windows")
            full, half = self._half_batch(ablation_steps)
        epoch_start_s, restart_step_s = self._epoch_start(restarted_s)
        loader_ips = None
        if loader_batches and self.batches.ready:
            self._phase("loader alone")
            loader_ips = self._loader_alone(loader_batches)
        elif loader_batches:  # loading in this process: the timed steps' fetches were the loader alone
            loader_ips = in_process_rate(windows)
        untimed = [*compute_only, *no_loader, *([copies] if copies is not None else [])]
        ablation_s = sum(w.wall_s for w in untimed) + (perf() - t)
        return LoopStats(
            windows=windows,
            first_step_s=first_step_s,
            warmup_s=warmup_s,
            clock=self.clock,
            loader_start_s=loader_start_s,
            first_fetch_s=first_fetch_s,
            compute_only=compute_only,
            no_loader=no_loader,
            copies_alone=copies,
            loader_images_per_s=loader_ips,
            ablation_s=ablation_s if (ablation_steps or loader_batches) else 0.0,
            compute_full=full,
            compute_half=half,
            epoch_boundaries=boundaries,
            settle_s=self.settle_s,
            epoch_start_s=epoch_start_s,
            restart_step_s=restart_step_s,
            epoch_boundary_s=boundary_cost(epoch_start_s, windows, self.accumulation, restart_step_s),
            loader_ready=self.batches.ready,
            window_clocks=all_read(self.window_clocks),
        )

    def _rounds(
        self, steps: int, repeats: Repeats | int, per_round: int, steadied: bool
    ) -> tuple[list[Window], list[Window], list[Window], int, Window | None]:
        """Timed windows until they settle, each from a steady pipeline and followed by its ablation round until
        the label is decided; the copies alone once, after the first timed window, before any round (with the
        timed steps themselves they may decide the label: then no round runs at all). A window that follows
        the one before with nothing between them starts where it ended: the two are one stretch of training,
        in phase with the workers, and steadying the pipeline again would only cost a step. `steadied`: the
        warm-up's last step was taken from a steady pipeline, and the first window follows it."""
        repeats = Repeats.fixed(repeats) if isinstance(repeats, int) else repeats
        windows: list[Window] = []
        compute_only: list[Window] = []
        no_loader: list[Window] = []
        copies: Window | None = None
        boundaries = 0
        decided = alone = False  # alone: the copies decided by their own evidence (no compute-only windows)
        # Since the last timed step something took nothing from the loader (a long first step, a round): the
        # workers' queues filled, and the next window must not eat them.
        disturbed = not steadied
        while not windows or not repeats.settled([w.images_per_s for w in windows]):
            self._phase(repeats.label(len(windows) + 1))
            if disturbed:
                self.steady()
            before = self.batches.epochs_ended
            windows.append(self.window(steps))
            if self.read_clock is not None:
                self.window_clocks.append(self.read_clock())
            boundaries += self.batches.epochs_ended - before
            disturbed = False
            if not per_round or decided:
                continue
            if copies is None:  # first: with the timed steps it may decide the label before any round
                copies, disturbed = self._copies_alone(per_round), True
            # Round i follows timed window i; once decided (the first window's steps may already have), no
            # later window has one.
            decided = self.decided is not None and self.decided(windows, no_loader, compute_only, copies)
            if not decided:
                # What the workers still owe from the timed steps is their stage's work, counted in the timed
                # window: done before the round, it does not slow the windows that run without the stage.
                self.batches.wait_idle()
                no_loader.append(self.window(per_round, "host"))
                if len(no_loader) == 1:
                    alone = self.copies_decided is not None and self.copies_decided(no_loader[0], copies)
                if not alone:
                    compute_only.append(self.window(per_round, "device", self.last_device))
                disturbed = True
        return windows, compute_only, no_loader, boundaries, copies

    def steady(self) -> None:
        """Drain what the workers hold ready, then one untimed step on the batch that had to be waited for (or a
        fresh one): a window starts at a step's end. Every rank takes that step, waited or not."""
        if self.batches.ready:
            t = self.timeline.host_clock()  # type: ignore[union-attr]
            self.batches.settle()
            self.step(_NoMarkers())
            self.settle_s += self.timeline.host_clock() - t  # type: ignore[union-attr]

    def _copies_alone(self, steps: int) -> Window:
        """Only the copies (and the device-side preparation) of `steps` steps' micro-batches, nothing computed."""
        rec = self.timeline.window()  # type: ignore[union-attr]
        for _ in range(steps * self.accumulation):
            self.last_device = self.to_device(self.last_host)
        rec.close()
        return Window(rec.wall_s, steps * self.accumulation * self.batch_size, [])

    def _half_batch(self, steps: int) -> tuple[Window | None, Window | None]:
        """Compute only at the full and at about half the batch, back to back, after an untimed step at the half
        (a new shape compiles and autotunes there, not in the window)."""
        if self.halve is None or not self.timeline.device_clock or self.batch_size < 4:  # type: ignore[union-attr]
            return None, None
        half, images = self.halve(self.last_device)
        with self.local():
            self.step(_NoMarkers(), "device", half)
            full = self.window(steps, "device", self.last_device)
            return full, self.window(steps, "device", half, images)

    def _phase(self, text: str) -> None:
        if self.on_phase is not None:
            self.on_phase(text)

    def _warm_up(self, steps: int, steady_last: bool) -> tuple[float, float, float, float | None]:
        """(the first step, the first step's waits for its batches, all warm-up steps, the epoch start a loader
        without workers timed in the last one or None), seconds. `steady_last`: the last is taken from a steady
        pipeline (what `steady` does before a window, in the warm-up's own count): the first timed window follows
        it, and a trial pays no step beyond the spec's for that."""
        perf, sync = self.timeline.host_clock, self.timeline.synchronize  # type: ignore[union-attr]
        sync()
        t = perf()
        first = first_fetch = 0.0
        restarted = None
        for i in range(steps):
            if steady_last and i == steps - 1 and self.batches.ready:  # as `steady`: the device caught up, then
                sync()  # the workers' queue (no workers: nothing held ready)
                self.batches.settle()
            elif steady_last and i == steps - 1:
                # No workers: an epoch start is the restarted iterator's first fetch in this process, with nothing
                # to be idle first. Timed here, the step trains on that batch; after the rounds it was a batch
                # loaded and thrown away (0.11 / 0.22 s a trial at batch 32 / 64 on the CT grid). Host work, as
                # each steady fetch is: the device need not have caught up first.
                restarted = self.batches.epoch_start(keep=True)
            rec = _FetchTimes() if i == 0 else _NoMarkers()
            self.step(rec)
            if i == 0:
                sync()  # the first step alone: compilation and autotuning live there
                first, first_fetch = perf() - t, rec.waited
        sync()
        return first, first_fetch, perf() - t, restarted  # the restart's fetch in the warm-up, as the first step's

    def _epoch_start(self, restarted_s: float | None) -> tuple[float, float | None]:
        """(the restarted iterator's first batch, the step on it or None), seconds. With workers, both timed
        here (`_restart`); without, nothing is forked and the step after a restart is an ordinary one
        (boundary_cost): the first fetch the warm-up timed (`restarted_s`), else one timed here."""
        if restarted_s is None and self.batches.ready:
            return self._restart()
        return (self.batches.epoch_start() if restarted_s is None else restarted_s), None

    def _restart(self) -> tuple[float, float]:
        """An epoch boundary with workers, as training meets it: (the restarted iterator's first batch, the
        step that trains on it), seconds. Before the loader alone: after the rounds the workers have usually
        caught up (a real epoch's end finds them idle), where the loader alone would leave them owing a full
        prefetch. The step is timed because the restart forked new workers: the pages this process writes next
        are copied first (copy-on-write), while the new workers fill their prefetch on the same cores. It
        starts as an epoch does, with no copy issued ahead."""
        self._phase("epoch start")
        first = self.batches.epoch_start(keep=True)
        self.pending = None
        return first, self.window(1).wall_s

    def _loader_alone(self, batches: int) -> float:
        """Images/s the loader delivers with nothing consuming them but this loop, from a steady pipeline as a
        timed window starts (after the epoch start's step the workers hold batches ready, and a worker still
        starting would slow it)."""
        self.batches.settle()
        self.batches.drop_held()
        perf = self.timeline.host_clock  # type: ignore[union-attr]
        t = perf()
        for _ in range(batches):
            self.batches.next()
        return batches * self.batch_size / (perf() - t)


class _FetchTimes(_NoMarkers):
    """An untimed step that adds up its waits for batches."""

    def __init__(self) -> None:
        self.waited = 0.0

    def fetched(self, start: float, end: float) -> None:
        self.waited += end - start


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
    halve: Callable[[Any], tuple[Any, int]] | None = None,
    ahead: CopyAhead | None = None,
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
        ahead=ahead,
    )
    return loop.run(warmup_steps, bench_steps, repeats, ablation_steps, loader_batches, loader_buffered)

"""The step as the device sees it: markers on the device's own timeline, read without forcing a sync.

Each optimizer step records a marker before each micro-batch's copy, before its forward, after its
backward, and one after the optimizer update. On CUDA (and MPS, where torch has timing events) a marker is
an event recorded on the compute stream: its time is when the device reached it, which is later than when
the host enqueued it whenever the device is behind. On the CPU a marker is the host's clock, read when the
call returns: there the two are the same thing. The bookkeeping is one and the same for both, and is
tested with fake events (tests/measure/test_timeline.py): nothing here needs a GPU.

Between two consecutive step ends the device's time splits exactly into
- busy spans: copies (copy marker -> forward marker) and compute (forward -> backward, and the last
  backward -> the update's end), and
- gaps: step end -> the next step's first copy, a backward -> the next micro-batch's copy, in which the
  device had nothing to do (the host had not enqueued the next work yet: it waited on the loader, or
  Python was slower than the kernels).
Work inside a span that leaves the device idle between kernels (launch overhead within a forward) is not
a gap here: the compute-only ablation windows at the full and at half the batch show it (a forward and
backward whose time does not shrink with the batch is paced by the host, not by the device).

Events are read lazily: a step's once its end has completed (checked with a non-blocking query when a
later step is enqueued), the rest at the window's end, after the one synchronisation at the window's edge.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class Event(Protocol):
    def record(self) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end: Event) -> float: ...  # milliseconds, as torch.cuda.Event


class HostEvent:
    """A marker on the host's clock: complete as soon as it is recorded."""

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: HostEvent) -> float:
        return (end.t - self.t) * 1000.0


@dataclass(frozen=True)
class StepTimes:
    """One optimizer step on the marker clock, seconds. `period` is the interval between the previous step's
    end and this one's; busy + idle == period."""

    period: float
    copy: float  # copy spans
    forward_backward: float  # forward/backward spans
    update: float  # the optimizer update: the last backward -> the step's end
    idle: float  # gaps between spans
    idle_loading: float  # the part of the gaps during which the host was blocked in next(loader)
    data: float  # host seconds blocked in next(loader) for this step's micro-batches
    lag: float  # device time of the step's end - host time when its update was enqueued (0 on the host clock)

    @property
    def compute(self) -> float:
        return self.forward_backward + self.update

    @property
    def busy(self) -> float:
        return self.copy + self.compute


@dataclass
class _Pending:
    copy: list[Event] = field(default_factory=list)
    forward: list[Event] = field(default_factory=list)
    backward: list[Event] = field(default_factory=list)
    end: Event | None = None
    fetches: list[tuple[float, float]] = field(default_factory=list)  # host (start, end) of each next()
    enqueued: float = 0.0  # host time once the update was enqueued


class Timeline:
    """Markers for one window of steps. `new_event` makes an Event; `host_clock` is the host's clock (seconds,
    the same one the loop times fetches with); `synchronize` waits for the device (at the window's edges
    only)."""

    def __init__(
        self,
        new_event: Callable[[], Event],
        synchronize: Callable[[], None],
        host_clock: Callable[[], float] = time.perf_counter,
        device_clock: bool = True,
    ):
        self.new_event, self.synchronize, self.host_clock = new_event, synchronize, host_clock
        self.device_clock = device_clock  # False: markers are the host's clock (CPU), there is no lag
        self._pool: list[Event] = []

    def _event(self) -> Event:
        event = self._pool.pop() if self._pool else self.new_event()
        event.record()
        return event

    def window(self) -> WindowRecorder:
        """Synchronise, then start a window at this instant on both clocks."""
        self.synchronize()
        return WindowRecorder(self, self._event(), self.host_clock())

    def recycle(self, events: list[Event]) -> None:
        self._pool.extend(events)


class WindowRecorder:
    """The markers of one window; `close()` synchronises once and returns every step's times."""

    def __init__(self, timeline: Timeline, start: Event, host_start: float):
        self.tl, self.start, self.host_start = timeline, start, host_start
        self.steps: list[StepTimes] = []
        self._pending: deque[_Pending] = deque()
        self._current = _Pending()
        self._last_end: tuple[Event, float] | None = None  # previous step's end event and its device time
        self.wall_s = 0.0

    # --- the loop calls these, in order, for every micro-batch and step --------------------------------

    def fetched(self, start: float, end: float) -> None:
        self._current.fetches.append((start, end))

    def before_copy(self) -> None:
        self._current.copy.append(self.tl._event())

    def before_forward(self) -> None:
        self._current.forward.append(self.tl._event())

    def after_backward(self) -> None:
        self._current.backward.append(self.tl._event())

    def step_end(self) -> None:
        step = self._current
        step.end = self.tl._event()
        step.enqueued = self.tl.host_clock()
        self._pending.append(step)
        self._current = _Pending()
        # A step whose end the device has passed can be read now: no sync, and the events go back to the pool.
        while len(self._pending) > 1 and self._pending[0].end.query():  # type: ignore[union-attr]
            self._resolve(self._pending.popleft())

    def close(self) -> WindowRecorder:
        self.tl.synchronize()
        self.wall_s = self.tl.host_clock() - self.host_start
        while self._pending:
            self._resolve(self._pending.popleft())
        return self

    # --- reading ---------------------------------------------------------------------------------------

    def _at(self, event: Event) -> float:
        """Seconds since the window's start marker, on the marker clock."""
        return self.start.elapsed_time(event) / 1000.0

    def _resolve(self, step: _Pending) -> None:
        end = self._at(step.end)  # type: ignore[arg-type]
        done = [*step.copy, *step.forward, *step.backward]
        if self._last_end is not None:
            self.steps.append(self._times(step, self._last_end[1], end))
            done.append(self._last_end[0])
        self._last_end = (step.end, end)  # type: ignore[assignment]
        self.tl.recycle(done)

    def _times(self, step: _Pending, previous_end: float, end: float) -> StepTimes:
        copies = [self._at(e) for e in step.copy]
        forwards = [self._at(e) for e in step.forward]
        backwards = [self._at(e) for e in step.backward]
        gaps = [(previous_end, copies[0])] + [(backwards[i - 1], copies[i]) for i in range(1, len(copies))]
        copy = sum(f - c for c, f in zip(copies, forwards, strict=True))
        forward_backward = sum(b - f for f, b in zip(forwards, backwards, strict=True))
        # Marker times are relative to the window start, which was recorded at host time host_start.
        fetches = [(a - self.host_start, b - self.host_start) for a, b in step.fetches]
        loading = sum(_overlap(gap, fetch) for gap in gaps for fetch in fetches)
        lag = end - (step.enqueued - self.host_start) if self.tl.device_clock else 0.0
        return StepTimes(
            period=end - previous_end,
            copy=copy,
            forward_backward=forward_backward,
            update=end - backwards[-1],
            idle=sum(max(0.0, b - a) for a, b in gaps),
            idle_loading=loading,
            data=sum(b - a for a, b in step.fetches),
            lag=lag,
        )


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))

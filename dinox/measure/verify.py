"""`dinox verify`'s child: the trial's own device, loader, model, optimizer and step (TrialRun's), trained for
real for a bounded slice, as a training run goes: the data as it is (a file set is never repeated to fit
windows, so its epochs end where a real run's do), steps back to back, the device synchronised only at the
end of each epoch (where a run logs its loss), of each quarter of the slice's time (its own pace, `Quarters`) and
of the slice. No windows, no ablation, no settling.

Run as ``python -m dinox.measure.verify TRIAL_JSON RESULT_JSON``; ``slice.json`` beside TRIAL_JSON says how
long: ``{"seconds": S, "epochs": E, "epoch_images": N, "device_name": D}`` (stop at whichever of S seconds or E
epochs comes first; N: a synthetic set's epoch, where its spec gives no data.num_samples; D: the device the
trial was measured on, "" where its record names none). The result is a TrialResult: metrics under the verify_
names of dinox.record, the epochs as JSON in dinox.verify_epochs; ``skipped``, untrained, where this machine's
device is not D (its error says both).
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dinox import record as rec
from dinox.contract import SLICE_FILE, SM_CLOCK_KEY, TrialResult
from dinox.measure import device, routine, runtime
from dinox.measure.batches import Batches
from dinox.measure.trial import TrialRun, run_child
from dinox.measure.windows import all_read, pooled
from dinox.spec.data_sources import SyntheticData
from dinox.spec.sections import TrialSpec


class VerifyRun(TrialRun):
    """A trial's setup, then its steps for a slice of real training instead of timed windows."""

    def __init__(
        self, spec: TrialSpec, seconds: float, epochs: float | None, epoch_images: int, device_name: str = "", **kw
    ) -> None:
        super().__init__(spec, **kw)
        self.seconds, self.epochs, self.epoch_images = seconds, epochs, epoch_images
        self.device_name = device_name  # the trial's: its forecast is of that device's step
        self.check_windows: dict[str, list[float]] = {}  # each check window's images/s, by phase
        self.clocks: dict[str, list[float]] = {}  # the GPU's SM clock (MHz) at each check window's end, by phase

    def _samples_needed(self) -> int:
        """A synthetic set without a length of its own gets the epoch asked for; any other set stays its own
        length (0: never repeated)."""
        data = self.spec.data
        return self.epoch_images if isinstance(data, SyntheticData) and data.num_samples is None else 0

    def measure(self) -> TrialResult:
        try:
            self.setup()
        except OtherDevice as e:
            return TrialResult("skipped", error=str(e), tags=self.tags)
        with runtime.gc_for_windows(self.spec, self.runtime_seen):  # the collector as the trial's windows had it
            return self._train()

    def _setup_device(self) -> None:
        """The trial's device, and before any data or model: the one its forecast was measured on (another GPU
        model, or a GPU where the trial had a CPU, trains another step, whatever the check windows then say)."""
        super()._setup_device()
        own = self.tags.get(rec.DEVICE_NAME, "")
        if self.device_name and own and own != self.device_name:
            raise OtherDevice(
                f"this machine trains on {own}, the trial was measured on {self.device_name}: its forecast is that "
                "device's step; verify on a machine with the trial's device"
            )

    def _train(self) -> TrialResult:
        loop = self.make_loop()
        clock, sync = loop.timeline.host_clock, loop.timeline.synchronize  # type: ignore[union-attr]
        lo = self.spec.loader
        loop.batches = Batches(self.loader, clock, lo.num_workers * (lo.prefetch_factor or 2))
        per_step = self.spec.size * self.accumulation * self.world
        self._warm_up(loop)
        self.metrics[rec.VERIFY_CHECK_IMAGES_PER_S] = self._check_windows(loop, "before")
        budget = self._agreed_steps()
        start = clock()  # the windows' edges synchronised the device
        if self.on_phase is not None:
            self.on_phase("training")
        epochs: list[dict[str, float]] = []
        steps, epoch_steps, epoch_start, first_steps, step_s = 0, 0, start, [], []
        quarters = Quarters(start, self._expected_s())
        ended = loop.batches.epochs_ended
        first = True  # the slice's first epoch began before it: the warm-up's and check windows' steps
        while True:
            t = clock()
            loop.untimed_step()
            took = clock() - t
            steps += 1
            epoch_steps += 1
            opens_epoch = loop.batches.epochs_ended > ended
            if opens_epoch:  # an epoch ended inside this step: the next one has begun
                sync()
                now = clock()
                if epoch_steps > 1 or not first:  # a first epoch the check windows ended is none of the slice's
                    epochs.append({"images": (epoch_steps - 1) * per_step, "wall_s": now - epoch_start - took})
                    epochs[-1].update(self._clock())
                    if first:
                        epochs[-1]["partial"] = 1.0
                first = False
                first_steps.append(took)
                ended, epoch_steps, epoch_start = loop.batches.epochs_ended, 1, now - took
                routine_s = self._routine_after_epoch(ended)
            else:
                step_s.append(took)
                routine_s = 0.0
            routine_s += self._routine_after_step(steps)
            quarters.step(per_step, took if opens_epoch else None, routine_s)
            if quarters.due(clock()):
                sync()
                quarters.close(clock())
            done = steps >= budget if budget is not None else clock() - start >= self.seconds
            if done or (self.epochs is not None and ended >= self.epochs):
                break
        sync()
        end = clock()
        wall = end - start
        quarters.close(end)
        self._quarters(quarters, step_s)
        epochs.append({"images": epoch_steps * per_step, "wall_s": clock() - epoch_start, "partial": 1.0})
        epochs[-1].update(self._clock())
        self._report(steps, per_step, wall, epochs, first_steps, step_s)
        return self._after_slice(loop)

    def _warm_up(self, loop) -> None:  # noqa: ANN001 - a measure.loop.Loop
        """The trial's warm-up steps, untimed but for their sum, the device caught up at their end."""
        if self.on_phase is not None:
            self.on_phase("warm-up")
        t = loop.timeline.host_clock()
        for _ in range(self.spec.measure.warmup_steps):
            loop.untimed_step()
        loop.timeline.synchronize()
        self.metrics[rec.VERIFY_WARMUP_S] = loop.timeline.host_clock() - t

    def _after_slice(self, loop) -> TrialResult:  # noqa: ANN001 - a measure.loop.Loop
        """The check windows after the slice, each one's rate (and GPU clock) kept, the memory, the loader let go."""
        self.metrics[rec.VERIFY_CHECK_AFTER_IMAGES_PER_S] = self._check_windows(loop, "after")
        windows: dict[str, object] = dict(self.check_windows)
        if self.clocks:
            windows[SM_CLOCK_KEY] = self.clocks
        self.tags[rec.VERIFY_CHECK_WINDOWS] = json.dumps(windows, separators=(",", ":"))
        self._record_memory()
        self.let_go_of_loader()
        return TrialResult("ok", metrics=self.metrics, tags=self.tags)

    def _agreed_steps(self) -> int | None:
        """The steps every rank trains (hardware.gpus > 1), or the rank whose clock ran out first would leave the
        others waiting in their all-reduce: the slice's seconds at the check windows' step rate, the most any rank
        asks for, agreed once before the slice (no collective inside it, which would sync the device each step).
        None for one rank, whose clock ends the slice as a run's would, and for a slice of epochs alone."""
        if self.world == 1 or not math.isfinite(self.seconds):
            return None
        rates = self.check_windows["before"]  # this rank's own images/s
        steps_per_s = len(rates) / sum(1 / r for r in rates) / (self.spec.size * self.accumulation)
        return device.all_max(self.dev)(max(1, math.ceil(self.seconds * steps_per_s)))

    def _expected_s(self) -> float:
        """How long the slice should train, for its quarters' edges: its seconds, or its epochs at the check
        windows' pace where the loader has a length (inf: no quarters)."""
        if math.isfinite(self.seconds):
            return self.seconds
        try:
            batches = len(self.loader)  # type: ignore[arg-type]  # this rank's micro-batches an epoch
        except TypeError:  # an iterable set (webdataset) has no length
            return math.inf
        rate = self.metrics.get(rec.VERIFY_CHECK_IMAGES_PER_S)  # this rank's
        if not rate or self.epochs is None:
            return math.inf
        return self.epochs * batches * self.spec.size / rate

    def _quarters(self, quarters: Quarters, step_s: list[float]) -> None:
        """The slice's own pace in its quarters, its slowest and its fastest, and its steps' time (the wall less
        each epoch start's excess over a typical step and the routine): where the box changed speed while the
        slice trained, its quarters differ (dinox.verify.outcome reads them)."""
        typical = sorted(step_s)[len(step_s) // 2] if step_s else 0.0
        rates = quarters.rates(typical)
        if len(rates) < 2:
            return
        self.metrics[rec.VERIFY_QUARTER_SLOW_IMAGES_PER_S] = min(rates)
        self.metrics[rec.VERIFY_QUARTER_FAST_IMAGES_PER_S] = max(rates)
        self.metrics[rec.VERIFY_STEADY_S] = quarters.steady_s(typical)

    def _check_windows(self, loop, when: Literal["before", "after"]) -> float:  # noqa: ANN001 - a measure.loop.Loop
        """As many windows as the trial timed at least, timed as it timed them (bench_steps, each from a steady
        pipeline), and their pooled rate: once right after the warm-up (the process as young as the trial's
        was), once right after the slice (as old as the slice's bulk). Where they run outside the trial's own
        windows, this process (or the box) is not as the trial found it, and a miss is not the forecast's alone
        (dinox.verify.run reads both). A window that crossed an epoch boundary is taken again (the trial's never
        cross one), up to as many retakes as windows. Their steps train like the rest; those after are outside
        the slice."""
        if self.on_phase is not None:
            self.on_phase("check windows" if when == "before" else "check windows after")
        windows, retakes = [], self.spec.measure.window_bounds[0]
        clocks: list[float | None] = []
        while len(windows) < self.spec.measure.window_bounds[0]:
            loop.steady()
            before = loop.batches.epochs_ended
            window = loop.window(self.spec.measure.bench_steps)
            if loop.batches.epochs_ended == before or retakes == 0:
                windows.append(window)
                clocks.append(device.sm_clock_mhz(self.dev))
            else:
                retakes -= 1
        self.check_windows[when] = [round(w.images_per_s, 3) for w in windows]
        if read := all_read(clocks):
            self.clocks[when] = read
        return pooled(windows) or 0.0

    def _clock(self) -> dict[str, float]:
        """An epoch's SM clock at its end, where the device has one NVML reads."""
        mhz = device.sm_clock_mhz(self.dev)
        return {SM_CLOCK_KEY: mhz} if mhz is not None else {}

    def _routine_after_step(self, steps: int) -> float:
        """routine.checkpoint_every_steps: a checkpoint saved as the run saves it, inside the slice's time; its
        seconds (0 where none was due)."""
        every = self.spec.routine.checkpoint_every_steps if self.spec.routine is not None else None
        if not every or steps % every:
            return 0.0
        took, _size = routine.save(self)
        self.metrics[rec.VERIFY_CHECKPOINTS] = self.metrics.get(rec.VERIFY_CHECKPOINTS, 0.0) + 1
        self.metrics[rec.VERIFY_CHECKPOINT_S] = self.metrics.get(rec.VERIFY_CHECKPOINT_S, 0.0) + took
        return took

    def _routine_after_epoch(self, ended: int) -> float:
        """routine.eval_every_epochs: an evaluation pass of routine.eval_images at the end of every E-th epoch
        (the images per rank, as a distributed evaluation shares them); its seconds (0 where none was due)."""
        r = self.spec.routine
        if r is None or not r.eval_every_epochs or ended % r.eval_every_epochs:
            return 0.0
        batches = max(1, math.ceil(r.eval_images / (self.spec.size * self.world)))  # type: ignore[operator]
        _start_s, took = routine.eval_pass(self, batches)
        self.metrics[rec.VERIFY_EVALS] = self.metrics.get(rec.VERIFY_EVALS, 0.0) + 1
        self.metrics[rec.VERIFY_EVAL_S] = self.metrics.get(rec.VERIFY_EVAL_S, 0.0) + took
        return took

    def _report(
        self,
        steps: int,
        per_step: int,
        wall: float,
        epochs: list[dict[str, float]],
        first_steps: list[float],
        step_s: list[float],
    ) -> None:
        m = self.metrics
        m[rec.VERIFY_STEPS] = float(steps)
        m[rec.VERIFY_IMAGES] = float(steps * per_step)
        m[rec.VERIFY_WALL_S] = wall
        # The steps' own rate: the routine's time (checkpoints, evaluation) is in the wall, not in the rate.
        routine_s = m.get(rec.VERIFY_CHECKPOINT_S, 0.0) + m.get(rec.VERIFY_EVAL_S, 0.0)
        m[rec.VERIFY_IMAGES_PER_S] = steps * per_step / max(wall - routine_s, 1e-9)
        m[rec.VERIFY_EPOCHS_ENDED] = float(len(first_steps))
        if first_steps and step_s:
            # An epoch's first step, over a step in the middle of one: the loader's restart as the run met it
            # (host time; on an asynchronous device the first step also waits for the queue to drain).
            typical = sorted(step_s)[len(step_s) // 2]
            m[rec.VERIFY_EPOCH_BOUNDARY_S] = sum(first_steps) / len(first_steps) - typical
        self.tags[rec.VERIFY_EPOCHS] = json.dumps(epochs, separators=(",", ":"))


@dataclass
class Quarters:
    """The slice in four parts of about equal time, each closed with the device synchronised (three syncs more
    than the epochs' in a slice: a run that logs its loss syncs more often), so each part's pace is the
    device's, not the host's running ahead. A part's pace leaves out what the forecast charges apart: the
    routine's time, and each epoch start's excess over a typical step. A box whose cores change speed for tens
    of seconds at a time (this project's 2-core VM, scripts/bench_box.py) shows in them; the check windows
    around the slice see only its ends."""

    start: float
    length: float  # the slice's expected seconds (inf: one part, no quarters)
    closed: list[tuple[float, float, float, int]] = field(default_factory=list)  # (wall, images, aside, starts)
    images: float = 0.0
    aside: float = 0.0  # the routine's seconds and the epoch-first steps' own, in the part so far
    starts: int = 0  # epoch-first steps in the part so far
    edge: float = 0.0  # where the last part closed

    def __post_init__(self) -> None:
        self.edge = self.start

    def step(self, images: float, first_took: float | None, routine_s: float) -> None:
        self.images += images
        self.aside += routine_s + (first_took or 0.0)
        self.starts += first_took is not None

    def due(self, now: float) -> bool:
        return len(self.closed) < 3 and now - self.start >= self.length * (len(self.closed) + 1) / 4

    def close(self, now: float) -> None:
        if self.images:
            self.closed.append((now - self.edge, self.images, self.aside, self.starts))
        self.edge, self.images, self.aside, self.starts = now, 0.0, 0.0, 0

    def _steady(self, typical: float) -> list[tuple[float, float]]:
        """Each part's (images, seconds of steps at their own pace): an epoch start counts as a typical step."""
        return [(images, wall - aside + starts * typical) for wall, images, aside, starts in self.closed]

    def rates(self, typical: float) -> list[float]:
        return [images / s for images, s in self._steady(typical) if s > 0]

    def steady_s(self, typical: float) -> float:
        return sum(s for _images, s in self._steady(typical))


class OtherDevice(Exception):
    """This machine's device is not the one the trial was measured on."""


def read_slice(trial_json: str) -> tuple[float, float | None, int, str]:
    data = json.loads((Path(trial_json).parent / SLICE_FILE).read_text())
    seconds, epochs, epoch_images = float(data["seconds"]), data.get("epochs"), int(data.get("epoch_images") or 0)
    return seconds, epochs, epoch_images, str(data.get("device_name") or "")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m dinox.measure.verify TRIAL_JSON RESULT_JSON")
    from dinox.isolate import lifeline

    lifeline.die_with_parent(lifeline.env_parent())
    seconds, epochs, epoch_images, device_name = read_slice(sys.argv[1])

    def make(spec, marks, metrics, tags, on_phase, out_dir):  # noqa: ANN001, ANN202 - run_child's seam
        run = VerifyRun(
            spec, seconds, epochs, epoch_images, device_name, marks=marks, metrics=metrics, tags=tags, on_phase=on_phase
        )
        return run.measure()

    code = run_child(sys.argv[1], sys.argv[2], measure_with=make)
    os._exit(code)

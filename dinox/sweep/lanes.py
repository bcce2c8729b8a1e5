"""Trials side by side (`dinox run --devices`): a lane is the slots one trial runs on, the fork server that
forks its child and the variables the child gets; the scheduler hands free slots to trials in grid order.

A trial takes as many slots as it has ranks (`hardware.gpus`), waits until that many are free, and gives
them back when it is recorded.
Trials run on worker threads; the main thread only schedules, so a Ctrl-C (which Python delivers to the main
thread) reaches it at once, and it stops every trial in flight through `stop`. An exception in a worker (the
workdir filling up) stops the sweep the same way. Torch-free, MLflow-free.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from dinox import record as rec
from dinox.isolate import slots as devices
from dinox.isolate.forkserver import ForkServer
from dinox.isolate.slots import DevicesError, Slot
from dinox.plan.footprint import Machine
from dinox.plan.grid import Trial


class Stopping(Exception):
    """Raised in a lane whose child ended because the sweep is stopping: its result is not recorded."""


@dataclass(frozen=True)
class Lane:
    """Where one trial runs: no slots is the machine as it is (one trial at a time, as without --devices)."""

    slots: tuple[Slot, ...] = ()
    server: ForkServer | None = None
    env: dict[str, str] = field(default_factory=dict)

    def gpus_of(self, trial: Trial, machine: Machine | None) -> tuple[str, ...] | None:
        """The UUIDs of the GPUs `trial` runs on in this lane, for its system metrics; None where the machine's
        are unknown, () for a CPU trial."""
        if machine is None or not machine.cuda_uuids:
            return None
        if trial.spec.hardware.device == "cpu":
            return ()
        return devices.trial_gpus(self.slots, trial.spec.hardware.gpus, machine.cuda_uuids)

    def tags(self, concurrent: int) -> dict[str, str]:
        if not self.slots:
            return {}
        return {rec.SLOT: "+".join(s.label for s in self.slots), rec.CONCURRENT_TRIALS: str(concurrent)}


class Lanes:
    """The sweep's slots, all served by the sweep's one fork server (it forks several children at once)."""

    def __init__(self, slots: list[Slot], server: ForkServer | None, uuids: Sequence[str] = ()):
        self.slots, self.server, self.uuids = slots, server, tuple(uuids)

    @classmethod
    def resolve(
        cls, request: devices.Request, machine: Machine | None, trials: Sequence[Trial], server: ForkServer | None
    ) -> Lanes:
        """The slots on this machine. Raises DevicesError when the machine lacks them, or a trial cannot run
        on them."""
        slots = devices.resolve(
            request, machine.cuda_devices if machine else None, devices.affinity(), machine.cuda_numa if machine else ()
        )
        for t in trials:
            if request.kind == "cpu" and t.spec.hardware.device not in ("cpu", "auto"):
                raise DevicesError(
                    f"CPU slots run CPU trials only; {t.label} asks for hardware.device: {t.spec.hardware.device}"
                )
            if t.spec.hardware.gpus > len(slots):
                need = t.spec.hardware.gpus
                raise DevicesError(f"{t.label} needs hardware.gpus: {need} slots, there are {len(slots)}")
        return cls(slots, server, machine.cuda_uuids if machine else ())

    def lane(self, slots: Sequence[Slot]) -> Lane:
        server = self.server if len(slots) == 1 else None  # several ranks: torchrun
        return Lane(tuple(slots), server, devices.child_env(slots, os.environ, self.uuids))

    def describe(self) -> str:
        shares = ", ".join(f"{s.label} on cores {devices.format_cores(s.cores)}" for s in self.slots)
        n = len(self.slots)
        return f"{n} trial{'s' if n > 1 else ''} at a time: {shares}"


class SlotPool:
    """The free slots; taken in grid order, lowest first, given back by the lane that held them."""

    def __init__(self, slots: Sequence[Slot]):
        self.free = list(slots)
        self.order = {s.label: i for i, s in enumerate(slots)}
        self.lock = threading.Lock()

    def take(self, n: int) -> list[Slot] | None:
        with self.lock:
            if len(self.free) < n:
                return None
            taken, self.free = self.free[:n], self.free[n:]
            return taken

    def give(self, slots: Sequence[Slot]) -> None:
        with self.lock:
            self.free = sorted([*self.free, *slots], key=lambda s: self.order[s.label])


def side_by_side(
    trials: Sequence[Trial],
    lanes: Lanes,
    slots_for: Callable[[Trial], int],
    work: Callable[[Trial, Lane | None], None],
    stop: Callable[[], None],
) -> None:
    """Run `work` for every trial, each on `slots_for(trial)` free slots (0: on this thread, no lane: a
    trial already recorded), as many at once as the slots allow. On an interrupt or a worker's exception:
    `stop`, wait for the lanes to come back, raise it."""
    pool = SlotPool(lanes.slots)
    running: set[Future] = set()

    def in_lane(trial: Trial, slots: list[Slot]) -> None:
        try:
            work(trial, lanes.lane(slots))
        finally:
            pool.give(slots)

    with ThreadPoolExecutor(len(lanes.slots), thread_name_prefix="dinox-lane") as executor:
        try:
            for trial in trials:
                need = slots_for(trial)
                if need == 0:
                    work(trial, None)
                    continue
                while (slots := pool.take(need)) is None:
                    if not running:  # Lanes.resolve refuses a trial wider than the slots
                        raise RuntimeError(f"{trial.label} needs {need} slots, only {len(pool.free)} are free")
                    running = _settle(running)
                running.add(executor.submit(in_lane, trial, slots))
            while running:
                running = _settle(running)
        except BaseException:
            stop()
            wait(running)
            raise


def _settle(running: set[Future]) -> set[Future]:
    """Wait a little for a lane to finish; a lane's exception is raised here, in the main thread."""
    done, pending = wait(running, timeout=0.2, return_when=FIRST_COMPLETED)
    for f in done:
        f.result()
    return pending

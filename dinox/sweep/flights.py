"""The runs a sweep has open (trials and probes), and the lock under which lanes share the sweep's state.

One trial at a time or several side by side (`--devices`), a lane holds `lock` whenever it touches the store,
the journal, the CSV or the pruner, and lets go of it only while its child runs (`run_child`): so the sweep's
bookkeeping needs no other care for threads. An interrupt ends every child in flight (`stop`), and the runs
still open are what `_abort` marks KILLED.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dinox.isolate import runner
from dinox.plan.grid import Trial
from dinox.store.journal import new_result_id
from dinox.sweep.lanes import Lane, Stopping


@dataclass
class InFlight:
    """A trial (or probe) whose run is open: what an interrupt or a failure must close."""

    trial: Trial
    result_id: str
    run_id: str | None = None
    closed: bool = False  # its result is in the store: nothing left to kill
    started: float = field(default_factory=time.time)
    monitor: Any = None  # its system metrics, sampled while it runs
    pid: int | None = None  # its child's, once spawned (the leader of the child's own session)
    concurrent: int = 1  # the most trials measured at once while its child ran, itself included

    def stop_monitor(self) -> None:
        if self.monitor is not None:
            with contextlib.suppress(Exception):  # the store may be failing: the result matters, not these
                self.monitor.finish()
            self.monitor = None


class Flights:
    """The sweep's open runs, the lock lanes share, and the stop that ends every child in flight."""

    def __init__(self, on_spawn: Callable[[Trial, int], None] | None):
        self.on_spawn = on_spawn
        self.lock = threading.Lock()
        self.stopping = False
        self._open: dict[str, InFlight] = {}
        self._measuring: set[str] = set()  # the flights whose child runs now

    def open(self, trial: Trial) -> InFlight:
        flight = InFlight(trial, new_result_id())
        self._open[flight.result_id] = flight
        return flight

    def done(self, flight: InFlight) -> None:
        del self._open[flight.result_id]

    def __iter__(self) -> Iterator[InFlight]:
        return iter(tuple(self._open.values()))

    def stop(self) -> None:
        """From the scheduler (main thread), on an interrupt or a lane's failure: end every child in flight.
        Their lanes come back with Stopping and record nothing (a child that had written its result is
        recorded)."""
        self.stopping = True
        for flight in self:
            _kill(flight.pid)

    def run_child(
        self,
        trial_dir: Path,
        lane: Lane,
        flight: InFlight,
        on_phase: Callable[[str], None] | None,
        probe: bool = False,
    ) -> runner.ChildOutcome:
        """The one long wait of a trial, without the lock: the other lanes record theirs meanwhile. Raises
        Stopping when the sweep stopped before it ran, or ended it. Call with the lock held."""
        if self.stopping:
            raise Stopping
        self._measuring.add(flight.result_id)
        for f in self:
            if f.result_id in self._measuring:
                f.concurrent = max(f.concurrent, len(self._measuring))

        def spawned(pid: int) -> None:
            flight.pid = pid
            if self.stopping:  # stopped between the check above and the fork
                _kill(pid)
            if self.on_spawn is not None and not probe:
                self.on_spawn(flight.trial, pid)

        self.lock.release()
        try:
            outcome = runner.run_trial(
                flight.trial, trial_dir, spawned, server=lane.server, on_phase=on_phase, env=lane.env
            )
        finally:
            self.lock.acquire()
            self._measuring.discard(flight.result_id)
            flight.pid = None  # reaped: its number may be another process's now
        if self.stopping and outcome.result.status in ("crashed", "timeout"):
            raise Stopping  # ended by `stop`: no result of its own; a child that wrote one is recorded
        return outcome

    def locked(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` called under the lock (a callback from a lane's child watcher, which runs without it)."""

        def call(*args: Any) -> Any:
            with self.lock:
                return fn(*args)

        return call


def _kill(pid: int | None) -> None:
    """A trial's child and its loader workers (its own session): gone now."""
    if pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

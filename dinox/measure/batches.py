"""The loader as the timed loop sees it: endless (an exhausted loader starts a new epoch, as a real run's
would, and the epochs that ended are counted), and steady before a window is timed. No device here."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

# A fetch that took longer than this (and 10x the quickest of its drain) waited for a batch: the workers had
# none ready. A ready batch comes off the queue in 0.1-2 ms here, even with the cores busy.
WAITED_S = 0.005


class Batches:
    """Endless iteration over a loader: an exhausted loader starts a new epoch as a real run would, and the
    epochs that ended are counted. `ready` is how many batches the workers can hold ready (workers x
    prefetch_factor; 0: loading in the main process, which holds none)."""

    def __init__(self, loader: Iterable, clock: Callable[[], float], ready: int = 0):
        self._loader, self._clock, self.ready = loader, clock, ready
        self._it: Iterator = iter(loader)
        self._held: Any = None
        self.epochs_ended = 0

    def next(self) -> Any:
        if self._held is not None:
            batch, self._held = self._held, None
            return batch
        try:
            return next(self._it)
        except StopIteration:
            self.epochs_ended += 1
            self._it = iter(self._loader)
            return next(self._it)

    def settle(self) -> None:
        """Take the batches the workers hold ready, untimed, until one has to be waited for, and keep that one
        for the next fetch: the window that follows starts in the workers' steady state, in phase with them.
        A loader that keeps ahead even now is drained twice its queue and left at that."""
        if not self.ready:
            return
        quickest = math.inf
        for _ in range(2 * self.ready):
            waiting = self.batches_waiting()
            t = self._clock()
            batch = self.next()
            took = self._clock() - t
            # Counted where the iterator lets it be (nothing was waiting: this fetch waited for its batch), else
            # timed: a slow fetch waited. The count holds on a loaded box, where a ready batch's fetch can be
            # slowed past any threshold by the scheduler alone, and the window would then eat the backlog.
            waited = waiting == 0 if waiting is not None else took > max(WAITED_S, 10 * quickest)
            if waited:
                self._held = batch
                return
            quickest = min(quickest, took)

    def batches_waiting(self) -> int | None:
        """Batches the loader's workers have finished and the loop has not taken yet (None: not countable).

        DataLoader has no public count of them: its multiprocessing iterator keeps them in its result queues
        (the workers', and the pin-memory thread's where one runs) and, arrived out of order, in _task_info.
        Read from those (torch 2.x), never relied on: a loader without them is timed instead."""
        info = getattr(self._it, "_task_info", None)
        queued = self._queued()
        if self._held is not None or queued is None or not isinstance(info, dict):
            return None
        return queued + sum(1 for v in info.values() if isinstance(v, tuple) and len(v) == 2)

    def _queued(self) -> int | None:
        """Finished batches still in the iterator's result queues (None: not countable)."""
        it = self._it
        queues = {id(q): q for q in (getattr(it, "_worker_result_queue", None), getattr(it, "_data_queue", None))}
        if None in queues.values():
            return None
        try:
            return sum(q.qsize() for q in queues.values())
        except (NotImplementedError, OSError, AttributeError):  # qsize is missing on macOS's sem_getvalue
            return None

    def wait_idle(self) -> None:
        """Wait, untimed, until the workers have finished every batch they were asked for. Before an epoch
        start: how a real epoch's end finds them (its sampler spent, every index handed out and loaded);
        mid-epoch they still owe their prefetched batches, and a restart would wait for those first: up to
        prefetch_factor batch loads a worker that no real boundary pays. Before an ablation round: the batches
        they owe are the timed steps' loading, which must not crowd the windows that run without the loader.
        Bounded; uncountable (not torch's iterator, or no workers): no wait."""
        for _ in range(5000):  # 1 ms apart: at most ~5 s, never a hang on a stuck worker
            owed, queued = getattr(self._it, "_tasks_outstanding", None), self._queued()
            if not isinstance(owed, int) or queued is None or queued >= owed:
                return
            time.sleep(0.001)

    def drop_held(self) -> None:
        self._held = None

    def epoch_start(self, keep: bool = False) -> float:
        """Seconds from ending an epoch to the next epoch's first batch: the old iterator let go (its workers
        shut down, unless persistent), a new one started (non-persistent workers forked again), its first
        batch made, from workers idle as a real epoch's end leaves them. What a boundary adds to a run is
        reckoned from this (windows.boundary_cost). `keep`: that first batch is the next fetch's (a step trains
        on it), not thrown away."""
        self._held = None
        self.wait_idle()
        t = self._clock()
        self._it = None  # type: ignore[assignment]  # the DataLoader iterator's __del__ shuts its workers down
        self._it = iter(self._loader)
        first = next(self._it)
        seconds = self._clock() - t
        self._held = first if keep else None
        return seconds

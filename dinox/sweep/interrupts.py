"""SIGTERM and SIGINT during a sweep: raised as Interrupted in the main thread so cleanup runs as for Ctrl-C,
and ignored while that cleanup closes what is open (a second Ctrl-C must not leave runs RUNNING)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(BaseException):
    """SIGTERM / SIGINT. A BaseException, like KeyboardInterrupt, so no `except Exception` swallows it."""

    def __init__(self, signame: str):
        super().__init__(f"interrupted by {signame}")
        self.signame = signame


class SweepStopped(Interrupted):
    """The sweep was stopped after it opened: `killed` trials in flight were marked KILLED with it. Under
    `mlflow run` (`adopted`) the sweep's run is mlflow run's own, and mlflow run marks it FAILED once dinox
    exits 130, whatever dinox set: the message says so instead of promising KILLED."""

    def __init__(self, why: str, killed: int, adopted: bool = False):
        BaseException.__init__(self, why)
        self.signame, self.killed, self.adopted = why, killed, adopted

    def __str__(self) -> str:
        trials = f"the {self.killed} trials in flight" if self.killed > 1 else "the trial in flight"
        if self.adopted:
            owner = "the sweep's run is mlflow run's own, which marks it FAILED as dinox exits 130"
            return f"{self.signame}; {trials} marked KILLED; {owner}" if self.killed else f"{self.signame}; {owner}"
        what = f"{trials} and the sweep are" if self.killed else "the sweep is"
        return f"{self.signame}; {what} marked KILLED"


class ClosingInterrupted(SweepStopped):
    """A signal while a sweep that had measured every trial was closing: every trial is recorded, and the sweep's
    run was closed FINISHED, without its plot where the signal came before it was made."""

    def __init__(self, why: str, adopted: bool = False, plotted: bool = False):
        super().__init__(why, 0, adopted)
        self.plotted = plotted

    def __str__(self) -> str:
        plot = "with its plot" if self.plotted else "without its plot"
        if self.adopted:
            closed = f"{plot}; the sweep's run is mlflow run's own, which marks it FAILED as dinox exits 130"
        else:
            closed = f"its run closed FINISHED {plot}"
        return f"{self.signame} while the sweep was closing: every trial is recorded, {closed}"


@contextlib.contextmanager
def _handled(handler: Callable[[int, object], None] | int) -> Iterator[None]:
    """SIGTERM and SIGINT go to `handler` inside the block; the handlers before it come back after."""
    old = {s: signal.signal(s, handler) for s in _SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def signals_raise() -> contextlib.AbstractContextManager[None]:
    """SIGTERM (and SIGINT) raise Interrupted in the main thread, so cleanup runs as for Ctrl-C."""

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    return _handled(handler)


def signals_noted(seen: list[str]) -> contextlib.AbstractContextManager[None]:
    """SIGTERM and SIGINT noted in `seen`, not acted on, until the block is done: what must not be cut short (the
    parent run's close) finishes, and the caller then honours the signal."""
    return _handled(lambda signum, _frame: seen.append(signal.Signals(signum).name))


def signals_ignored() -> contextlib.AbstractContextManager[None]:
    """SIGTERM and SIGINT dropped until the block is done (a cleanup that a second Ctrl-C must not cut)."""
    return _handled(signal.SIG_IGN)

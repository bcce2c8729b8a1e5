"""The store, best effort: a failure is reported and the sweep goes on; an interrupt is never a failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from dinox.store.recorder import SweepRecorder
from dinox.sweep.best_effort import BestEffortStore
from dinox.sweep.interrupts import Interrupted
from dinox.sweep.outputs import SweepReport


def _store() -> tuple[BestEffortStore, list[str], SweepReport]:
    said: list[str] = []
    report = SweepReport("", "", Path())
    return BestEffortStore(SweepRecorder("sqlite:///unused.db"), None, said.append, report), said, report


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), Interrupted("SIGTERM")])
def test_a_ctrl_c_a_library_wrapped_in_its_own_error_stops_the_sweep_as_one(stop):
    """A Ctrl-C (or the sweep's SIGTERM) that met a C extension's init inside a store call comes out as that
    library's error ("ImportError: initialization failed"): read as a store outage, the sweep went on and the
    interrupt was lost. It is raised as itself, and nothing is counted as a failure of the store."""
    store, said, report = _store()

    def wrapped() -> None:
        try:
            raise stop
        except BaseException as e:
            raise ImportError("initialization failed") from e

    with pytest.raises(type(stop)) as raised:
        store.call(wrapped)
    assert raised.value is stop
    assert said == [] and report.store_failures == 0 and not store.down


def test_a_failed_call_is_reported_once_and_the_sweep_goes_on():
    store, said, report = _store()

    def down() -> None:
        raise ConnectionError("connection refused")

    assert store.call(down) == (False, None)
    assert store.call(down) == (False, None)
    assert report.store_failures == 2 and store.down
    assert len(said) == 1 and said[0].startswith("warning: tracking store sqlite:///unused.db failed ("), said

"""Trials forked from the fork server: still one process per trial, with the same fault handling as a
fresh interpreter, and a trial's death never harms the next one or the server."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from dinox import record as rec
from dinox.isolate import runner
from dinox.isolate.forkserver import ForkServer
from dinox.plan import grid
from tests.isolate.test_runner import group_gone, one_trial


@pytest.fixture(scope="module")
def server():
    s = ForkServer()
    s.start()
    yield s
    s.close()


def test_forked_trial_measures_and_leaves_no_process(server, write_spec, tmp_path):
    pids: list[int] = []
    parents: list[int] = []

    def on_spawn(pid: int) -> None:
        pids.append(pid)
        parents.append(psutil.Process(pid).ppid())

    trial = one_trial(write_spec, "loader: {num_workers: 2}\n")
    runner.run_trial(trial, tmp_path / "warm", server=server)  # the first one waits for the server's imports
    r = runner.run_trial(trial, tmp_path / "t", on_spawn, server=server).result
    assert r.status == "ok", r.error
    # A fork of the zygote, whose imports were done (the warm trial waited for them), not an interpreter
    # importing torch; its start-up and teardown recorded as parts of its wall.
    assert parents == [server.proc.pid] and r.tags[rec.ISOLATION] == "fork", (parents, r.tags)
    assert pids[0] != server.proc.pid and group_gone(pids[0])
    m = r.metrics
    assert 0 <= m["startup_s"] and 0 <= m["teardown_s"], m
    assert m["startup_s"] + m["setup_s"] + m["measure_s"] + m["teardown_s"] <= m["trial_wall_s"], m


@pytest.mark.parametrize("fault", ["abort", "hang"])
def test_a_dying_or_hung_forked_trial_does_not_harm_the_next(server, write_spec, tmp_path, fault):
    trial = one_trial(write_spec)
    if fault == "hang":
        s = trial.spec
        trial = grid.Trial(
            0, 1, {}, s.model_copy(update={"measure": s.measure.model_copy(update={"timeout_s": 3.0})}), "x"
        )
    sig = signal.SIGABRT if fault == "abort" else signal.SIGSTOP
    zygote, woke = psutil.Process(server.proc.pid), []

    def on_spawn(pid: int) -> None:
        threading.Timer(0.2, os.kill, args=(pid, sig)).start()
        if fault == "hang":  # while the stopped child lives on, the zygote's wakeups (each a switch) in a second
            time.sleep(1.0)
            woke.append(zygote.num_ctx_switches().voluntary)
            time.sleep(1.0)
            woke.append(zygote.num_ctx_switches().voluntary)

    r = runner.run_trial(trial, tmp_path / "bad", on_spawn, server=server).result
    assert r.status == ("crashed" if fault == "abort" else "timeout"), r.error
    if fault == "hang":
        # Asleep on the child's pidfd, not polling every 20 ms (50 wakeups a second, beside the trial it serves).
        assert len(woke) == 2 and woke[1] - woke[0] < 5, woke
    if fault == "abort":
        assert "child killed by SIGABRT" in r.error and "Fatal Python error: Aborted" in r.error
    assert server.proc.poll() is None  # the server lives on
    after = runner.run_trial(one_trial(write_spec, name="after"), tmp_path / "good", server=server).result
    assert after.status == "ok", after.error


def test_a_dead_server_is_replaced(write_spec, tmp_path):
    s = ForkServer()
    s.start()
    try:
        os.killpg(s.proc.pid, signal.SIGKILL)
        s.proc.wait()
        r = runner.run_trial(one_trial(write_spec), tmp_path / "t", server=s).result
        assert r.status == "ok", r.error
    finally:
        s.close()

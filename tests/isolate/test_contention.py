"""A busy box read before the trials: what dinox's children then do with OpenMP's waiting threads."""

from __future__ import annotations

import subprocess
import sys

from dinox.isolate import contention


def test_a_user_s_own_policy_is_kept():
    assert contention.omp_env({"OMP_WAIT_POLICY": "ACTIVE"}) == {contention.WHY_VAR: "the user's"}
    assert contention.recorded({"OMP_WAIT_POLICY": "ACTIVE", contention.WHY_VAR: "the user's"}) == "ACTIVE (the user's)"
    assert contention.recorded({}) == "unset"


def test_two_spinning_processes_read_as_a_busy_box():
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        busy = contention.busy_cores(interval=0.5)
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    assert busy >= contention.BUSY_CORES, busy


def test_the_policy_follows_the_reading(monkeypatch):
    monkeypatch.setattr(contention, "_measured", lambda: 1.2)
    env = contention.omp_env({})
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert contention.recorded(env) == "PASSIVE (set by dinox: 1.2 cores busy before the trials)"
    assert "1.2 cores in use by other processes" in contention.notice({})
    monkeypatch.setattr(contention, "_measured", lambda: 0.1)
    assert "OMP_WAIT_POLICY" not in contention.omp_env({}) and contention.notice({}) == ""

"""A busy box read before the trials: what dinox's children then do with OpenMP's waiting threads."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from dinox.isolate import contention

BUSY_SINCE = contention._busy_since  # the `box` fixture stubs it; a test of the spans between marks uses it


@pytest.fixture
def box(monkeypatch):
    """The box's readings, in order, as busy_cores would give them; the module's last reading forgotten."""
    readings: list[float] = []
    monkeypatch.setattr(contention, "_last", None)
    monkeypatch.setattr(contention, "_trial_start", None)
    monkeypatch.setattr(contention, "_over_trial", None)
    monkeypatch.setattr(contention, "_since", None)
    monkeypatch.setattr(contention, "_held", None)
    monkeypatch.setattr(contention, "busy_cores", lambda: readings.pop(0))
    monkeypatch.setattr(contention, "_busy_since", lambda start: None)  # every reading from `readings`
    return readings


def test_a_user_s_own_policy_is_kept(box):
    assert contention.omp_env({"OMP_WAIT_POLICY": "ACTIVE"}) == {contention.WHY_VAR: "the user's"}
    assert contention.recorded({"OMP_WAIT_POLICY": "ACTIVE", contention.WHY_VAR: "the user's"}) == "ACTIVE (the user's)"
    assert contention.recorded({}) == "unset"
    assert contention.follow({"OMP_WAIT_POLICY": "ACTIVE"}, "trial 1") == ""  # never read: `box` holds none


def test_a_held_policy_is_the_trial_s_whatever_the_box_reads(box):
    """`dinox verify` holds the policy its trial's record names: its child trains the step the trial measured."""
    box.extend([2.0, 0.0])  # busy now, then quiet: neither is read while a policy is held
    why = contention.WHY_VAR
    assert contention.hold("unset (the box was quiet: 0.1 cores busy when read)")
    assert contention.omp_env({}) == {why: "as its trial ran: the box was quiet: 0.1 cores busy when read"}
    assert contention.hold("PASSIVE (set by dinox: 1.0 cores busy when read)")
    env = contention.omp_env({})
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", why: "as its trial ran: set by dinox: 1.0 cores busy when read"}
    assert contention.recorded(env) == "PASSIVE (as its trial ran: set by dinox: 1.0 cores busy when read)"
    assert contention.hold("active (the user's)") and contention.omp_env({})["OMP_WAIT_POLICY"] == "ACTIVE"
    assert contention.omp_env({"OMP_WAIT_POLICY": "PASSIVE"}) == {why: "the user's"}  # one set now is still theirs
    assert contention.hold("PASSIVE (a\nforged\x1b[2Jline)")
    assert contention.omp_env({})[why] == "as its trial ran: a forged [2Jline"  # the store's text, printable
    assert box == [2.0, 0.0]  # the box was never read
    for damaged in ("", "spin (x)", "PASSIVE; rm -rf /", "(unset)"):
        assert not contention.hold(damaged), damaged  # nothing held (not the last one): the box is read
    assert contention.omp_env({})["OMP_WAIT_POLICY"] == "PASSIVE" and box == [0.0]


@contextlib.contextmanager
def neighbours(n: int):
    """`n` processes spinning a core each that are not this one's descendants (a shell starts them and exits,
    as another user's would be); killed by pid after."""
    spin = f'"{sys.executable}" -c "while True: pass" >/dev/null 2>&1 & echo $!'
    out = subprocess.run(
        ["sh", "-c", f"for i in $(seq {n}); do {spin}; done"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pids = [int(pid) for pid in out.split()]
    try:
        yield pids
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)


def test_two_spinning_processes_read_as_a_busy_box():
    with neighbours(2):
        busy = contention.busy_cores(interval=0.5)
    assert busy >= contention.BUSY_CORES, busy


def test_this_process_s_own_descendants_are_its_own_work_and_a_neighbour_s_are_not():
    """The fork server importing torch while the sweep opens, a trial's loader workers: dinox's own work. The
    reading subtracts every descendant's CPU time (a grandchild's too), and nothing of another user's."""
    import psutil

    # A child shell that waits on its own spinning child: the spinner is this process's grandchild.
    tree = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "while True: pass"; :'])
    try:
        with neighbours(1) as (neighbour,):
            grandchild = None
            for _ in range(100):
                kids = psutil.Process(tree.pid).children()
                if kids:
                    grandchild = kids[0].pid
                    break
                time.sleep(0.05)
            assert psutil.pid_exists(neighbour)  # spinning while the reading is taken
            own = contention._own_cpu(psutil.Process())
    finally:
        tree.kill()
        for kid in psutil.Process(tree.pid).children() if tree.poll() is None else []:
            kid.kill()
        tree.wait()
        if grandchild is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(grandchild, signal.SIGKILL)
    assert grandchild is not None and {os.getpid(), tree.pid, grandchild} <= set(own), own
    # By its pid, not by its command line: a box with other spinners (the busy-box runs of the suite) has more.
    assert neighbour not in own, (neighbour, own)


def test_the_policy_follows_the_reading(box):
    box += [1.2]
    env = contention.omp_env({})
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert contention.recorded(env) == "PASSIVE (set by dinox: 1.2 cores busy when read)"
    assert "1.2 cores in use by other processes" in contention.notice({})
    box += [0.1]
    contention.reread()
    assert "OMP_WAIT_POLICY" not in contention.omp_env({}) and contention.notice({}) == ""


def test_a_neighbour_that_comes_and_goes_between_trials_is_followed_without_flapping(box):
    box += [0.0, 0.9, 0.4, 0.2, 0.4]
    assert contention.notice({}) == ""  # quiet at the first reading
    became = contention.follow({}, "trial 2 bs=8 w=0")
    assert became.startswith("dinox: the box became busy before trial 2 bs=8 w=0 (0.9 cores in use"), became
    assert contention.omp_env({})["OMP_WAIT_POLICY"] == "PASSIVE"
    assert contention.follow({}, "trial 3") == ""  # 0.4: under the threshold, not quiet enough to spin again
    assert contention.omp_env({})["OMP_WAIT_POLICY"] == "PASSIVE"
    quiet = contention.follow({}, "trial 4")
    assert quiet.startswith("dinox: the box is quiet again before trial 4 (0.2 cores"), quiet
    assert "OMP_WAIT_POLICY" not in contention.omp_env({})
    assert contention.follow({}, "trial 5") == ""  # 0.4 from spinning: not busy enough to sleep


def test_the_reading_before_a_trial_is_what_others_used_while_the_last_one_ran(box, monkeypatch):
    """No quarter second of its own between trials: the box's and the tree's CPU seconds at the trial's start
    and end (here given), the tree's own work taken out."""
    monkeypatch.setattr(contention, "_busy_since", BUSY_SINCE)
    ended = contention.Mark(9.9, 99.0, 5.0)  # the readings' ends, a moment apart: no span to read on from
    marks = [ended, ended, ended, contention.Mark(10.0, 100.0, 5.0), contention.Mark(20.0, 125.0, 13.0)]
    monkeypatch.setattr(contention, "mark", lambda: marks.pop(0))
    box += [0.0, 0.0]  # the sweep's first reading and trial 1's (here a moment apart: a quarter second each)
    assert contention.follow({}, "trial 1") == ""  # quiet when read, and the trial starts
    contention.trial_ended({})  # 10 s: the box 25 CPU s busy, 8 of them this tree's: 1.7 cores others'
    line = contention.follow({}, "trial 2")
    assert line.startswith("dinox: the box became busy before trial 2 (1.7 cores"), line
    assert not box and not marks  # trial 2's reading is the trial's span: no quarter second of its own


def test_busy_between_takes_the_tree_s_own_seconds_out_and_never_reads_below_zero():
    start = contention.Mark(0.0, 50.0, 10.0)
    assert contention.busy_between(start, contention.Mark(2.0, 54.0, 13.0)) == 0.5
    assert contention.busy_between(start, contention.Mark(2.0, 52.0, 13.0)) == 0.0


def test_the_first_trial_s_reading_is_what_others_used_since_the_sweep_s_first_one(monkeypatch):
    """The first reading (a quarter second, for the fork server's environment) and the first trial's come seconds
    apart, the store opened and torch imported between them: the second reads that span instead of a quarter
    second of its own, as the readings between trials read the trial before."""
    for name in ("_last", "_trial_start", "_over_trial", "_since"):
        monkeypatch.setattr(contention, name, None)
    readings = [0.1]
    monkeypatch.setattr(contention, "busy_cores", lambda: readings.pop(0))
    # After the quarter second; 3 s later, before trial 1 (the box 6.0 CPU s busy, 2.4 of them this tree's);
    # at trial 1's start.
    marks = [contention.Mark(1.0, 50.0, 1.0), contention.Mark(4.0, 56.0, 3.4), contention.Mark(4.0, 56.0, 3.4)]
    monkeypatch.setattr(contention, "mark", lambda: marks.pop(0))
    assert "OMP_WAIT_POLICY" not in contention.omp_env({})  # quiet at the first reading (0.1)
    line = contention.follow({}, "trial 1")
    assert line.startswith("dinox: the box became busy before trial 1 (1.2 cores"), line
    assert not readings and not marks  # one quarter second of its own, not two

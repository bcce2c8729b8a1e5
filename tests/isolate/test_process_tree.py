"""The parent's watch on a trial's process tree: what it reads of its memory, and what it leaves alone."""

from __future__ import annotations

import subprocess
import sys
import time

from dinox.isolate.process_tree import TreeMemory, kill_group


def _started(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return proc


def test_a_lone_trial_process_is_not_read_and_one_with_workers_is_summed():
    """A trial without loader workers: its own getrusage peak is exact, so the parent spends nothing reading its
    PSS (10-20 ms of kernel time a read, taken from the trial's cores); with a worker, the tree is summed."""
    lone = _started("import time; print('up', flush=True); time.sleep(60)")
    with_worker = _started(
        "import subprocess, sys, time\n"
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "time.sleep(0.5); print('up', flush=True); time.sleep(60)"
    )
    try:
        alone, tree = TreeMemory(lone.pid), TreeMemory(with_worker.pid)
        for memory in (alone, tree):
            memory.maybe_sample(time.time(), force=True)
        assert alone.peak_bytes == 0
        assert tree.peak_bytes > 2 * 1024 * 1024  # two interpreters' private pages at least
    finally:
        for proc in (lone, with_worker):
            kill_group(proc)
            proc.wait()


def test_a_child_made_by_any_thread_of_the_trial_counts_as_its_child():
    """The lone-process check reads every thread's /proc children list: a loader worker started from another
    thread (one still running, or one that has ended, whose children pass to a live thread) is seen."""
    for thread_lives in (True, False):
        proc = _started(
            "import subprocess, sys, threading, time\n"
            "def start(): subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
            + ("; time.sleep(60)\n" if thread_lives else "\n")
            + "threading.Thread(target=start, daemon=True).start()\n"
            "time.sleep(0.5); print('up', flush=True); time.sleep(60)"
        )
        try:
            memory = TreeMemory(proc.pid)
            memory.maybe_sample(time.time(), force=True)
            assert memory.peak_bytes > 2 * 1024 * 1024, f"thread_lives={thread_lives}"
        finally:
            kill_group(proc)
            proc.wait()


def test_a_killed_tree_is_gone_when_kill_group_returns_a_stopped_one_and_its_orphans_included():
    """A trial frozen by SIGSTOP cannot answer SIGTERM, so its group is SIGKILLed. SIGKILL is sent, not done: the
    worker it orphans is gone only once init has reaped it (here up to two seconds later), and a trial started
    meanwhile would share the box, its memory or its GPU with it. kill_group once returned at the SIGKILL, and the
    runner's own test then found the timed-out trial's group still there (a flake under load)."""
    import os
    import signal

    proc = _started(
        "import subprocess, sys, time\n"
        "w = subprocess.Popen([sys.executable, '-c', 'b = bytearray(64 << 20); import time; time.sleep(60)'])\n"
        "time.sleep(0.5); print('up', flush=True); time.sleep(60)"
    )
    os.killpg(proc.pid, signal.SIGSTOP)
    kill_group(proc)
    proc.wait()
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return
    raise AssertionError(f"process group {proc.pid} still has a process after kill_group returned")

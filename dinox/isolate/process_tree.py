"""A child's process tree: its peak memory (PSS over every process in it) and ending it whole (the child's
process group and the groups its descendants made, SIGTERM then SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import psutil

from dinox.isolate.forkserver import ForkedChild

TERM_GRACE_S = 3.0
# After SIGKILL, how long to wait for the groups to empty: a killed process still frees its memory (a loader
# worker's gigabytes, a GPU context) before it is gone, and an orphan waits for init to reap it. The next
# trial must not start beside them; a process stuck in the kernel (D state) is not waited for longer.
KILL_WAIT_S = 10.0


class TreeMemory:
    """Peak memory of a process and its descendants, as the sum of PSS (proportional set size).

    PSS counts a page shared by the trial and its forked loader workers once in total rather than once
    per process, which summed RSS would do. Reading it costs 10-20 ms per torch process here (the kernel walks
    its page tables for smaps_rollup), and a sampler that takes CPU from a trial that uses every core slows
    it (at 5% of a core: 4% fewer images/s of ResNet-18 on 2 cores, scripts/bench_fidelity.py), so the
    interval adapts to keep it under ~1% of one core. The trial process's own peak comes exactly from its
    getrusage; sampling adds its loader workers, and a trial without any (num_workers 0) is not read at all:
    its own peak is all there is (runner takes the larger of the two).
    """

    def __init__(self, pid: int):
        self.pid = pid
        self.peak_bytes = 0
        self._next = 0.0
        self._interval = 1.0

    def maybe_sample(self, now: float, force: bool = False) -> None:
        if now < self._next and not force:
            return
        t = time.perf_counter()
        total = 0
        if _childless(self.pid):  # the trial alone: its getrusage peak is exact, and free
            self._next = now + self._interval
            return
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for proc in procs:
            total += _pss_bytes(proc)
        self.peak_bytes = max(self.peak_bytes, total)
        cost = time.perf_counter() - t
        self._interval = max(1.0, 100 * cost)
        self._next = now + self._interval


def _childless(pid: int) -> bool:
    """Whether `pid` has no child process, from its threads' /proc children lists: ~10 us a thread, where
    psutil's children() reads the stat of every process on the host (~1 ms here among 70, ten times that on
    a busy node), once a second on the cores the trial measures. False where the lists cannot be read."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
        for tid in tids:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                if f.read().strip():
                    return False
    except OSError:
        return False
    return True


def _pss_bytes(proc: psutil.Process) -> int:
    """Proportional set size (shared pages split between the processes that share them: a forked trial and
    its workers are not counted N times over); psutil reads Linux's smaps_rollup for it. RSS elsewhere."""
    try:
        info = proc.memory_full_info()
    except psutil.Error:
        try:
            return proc.memory_info().rss
        except psutil.Error:
            return 0
    return getattr(info, "pss", info.rss)


def kill_group(proc: subprocess.Popen | ForkedChild) -> None:
    """SIGTERM the child's process group, and the groups of its descendants (torchrun starts each rank in
    a session of its own), then SIGKILL whatever is left of them, and wait until it is gone (KILL_WAIT_S)."""
    proc.poll()  # reap an exited child first: an unreaped zombie still counts as a group member
    groups = {proc.pid} | _descendant_groups(proc.pid)  # gathered first: a killed parent orphans them
    alive = _signalled({g for g in groups if _group_alive(g)}, signal.SIGTERM)
    alive = _signalled(_left(proc, alive, time.time() + TERM_GRACE_S), signal.SIGKILL)
    _left(proc, alive, time.time() + KILL_WAIT_S)


def _signalled(groups: set[int], signum: signal.Signals) -> set[int]:
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signum)
    return groups


def _left(proc: subprocess.Popen | ForkedChild, groups: set[int], deadline: float) -> set[int]:
    """The groups still holding a process at `deadline`, or none as soon as they are empty (our own child
    reaped meanwhile)."""
    while groups and time.time() < deadline:
        proc.poll()
        groups = {g for g in groups if _group_alive(g)}
        if groups:
            time.sleep(0.02)
    return groups


def _descendant_groups(pid: int) -> set[int]:
    own = os.getpgrp()
    groups = set()
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return groups
    for child in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            pgid = os.getpgid(child.pid)
            if pgid != own:
                groups.add(pgid)
    return groups


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True

"""Processes that die with their parent, and telling whether a recorded process is still there.

A sweep's children (the fork server, each trial, its DataLoader workers, torchrun and its ranks) run in
sessions of their own so a timeout can end a trial's whole group. The price: when ``dinox run`` itself is
SIGKILLed (the OOM killer, a closed SSH session), nothing ends them, and a hung trial would compute forever.
Each of them therefore asks the kernel for SIGKILL when its parent dies (Linux ``PR_SET_PDEATHSIG``), so
the whole tree goes down with the sweep. A sweep records its host, pid and the pid's start time, so a later
``dinox run`` or ``dinox sync`` can tell that a sweep still marked RUNNING has no process any more.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "DINOX_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int | None = None, signum: int = signal.SIGKILL) -> bool:
    """SIGKILL (or `signum`) this process when its parent dies. If the parent is already gone (it died before
    the request took effect, or is not `expected_parent`), exit at once. Returns whether the kernel supports
    it (Linux). The kernel watches the parent *thread* that forked this process: parents start children from
    their main thread."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent or parent == 1 or (expected_parent is not None and parent != expected_parent):
        os._exit(1)  # orphaned already: nobody would ever read what this process does
    return True


def env_parent() -> int | None:
    """The parent a child was started by, as child_env recorded it."""
    value = os.environ.pop(PARENT_ENV, "")  # popped: this process's own children have another parent
    return int(value) if value.isdigit() else None


def worker_init(_worker_id: int) -> None:
    """DataLoader worker_init_fn: a loader worker dies with its trial (a hung one would otherwise go on)."""
    die_with_parent()


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child that calls die_with_parent: this process as its expected parent."""
    return dict(os.environ if env is None else env, **{PARENT_ENV: str(os.getpid())})


def _exec_main(argv: list[str]) -> None:
    """``python -m dinox.isolate.lifeline -- COMMAND...``: COMMAND, dying with whoever started this (torchrun)."""
    if not argv or argv[0] != "--" or len(argv) < 2:
        sys.exit("usage: python -m dinox.isolate.lifeline -- COMMAND [ARGS...]")
    die_with_parent(env_parent())
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    _exec_main(sys.argv[1:])

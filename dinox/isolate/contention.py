"""A busy box, read before the trials, and what dinox's children do about it. No torch.

torch's OpenMP threads spin while they wait for each other (libgomp's default). Beside another process's
work they then burn their time slices waiting on a thread that is not running, and a trial in a session of
its own (as dinox's are, so a timeout can end its whole group; Linux's autogroup scheduler then gives the
session one share of the box) measures that: ResNet-18 at 32 px on this 2-core box, one core kept busy by
another session, 1.4 img/s with spinning threads, 62-75 with sleeping ones (quiet: 110). A label or a rate
read from that is the neighbour's, not the workload's. So where other processes keep at least half a core
of the children's cores busy, the children run with ``OMP_WAIT_POLICY=PASSIVE`` (threads sleep when they
wait). On a quiet box torch's default stays: there passive threads cost a small CPU step ~half its rate (same
model; ~10 % at 96 px, batch 32), which a user's own loop does not pay. A value the user set is theirs and is
kept. Each trial records what it ran with (``dinox.omp_wait_policy``).

The box is read before the first child starts and again before each trial that runs alone (``reread``): a
neighbour that arrives after the first reading made the quickstart's first trial read 1.7 img/s (quiet: 66),
settled, with its threads spinning. Once the children sleep, the box must fall below half the threshold
before they spin again, so a box that hovers at it does not flip the policy (and restart the fork server)
at every trial.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass

# Other processes' work on the children's cores, in cores, from which waiting threads must sleep; and below
# which they spin again once they sleep.
BUSY_CORES = 0.5
QUIET_AGAIN = BUSY_CORES / 2
WHY_VAR = "DINOX_OMP_WHY"  # how the policy came to be, for the child's record


def busy_cores(interval: float = 0.25) -> float:
    """Cores' worth of CPU time other processes used over `interval` on the cores this process may use. This
    process and its descendants are not others: the fork server importing torch, a trial ending."""
    import psutil

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    me = psutil.Process()
    before = _own_cpu(me)
    per_cpu = psutil.cpu_percent(interval=interval, percpu=True)
    after = _own_cpu(me)
    mine = sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items()) / interval
    used = sum(p for i, p in enumerate(per_cpu) if cores is None or i in cores) / 100.0
    return max(0.0, used - mine)


def _own_cpu(me) -> dict[int, float]:
    """CPU seconds of this process and each of its descendants, by pid (one that started since counts whole)."""
    import psutil

    out: dict[int, float] = {}
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            out[proc.pid] = times.user + times.system
    return out


@dataclass(frozen=True)
class Reading:
    busy: float  # cores other processes kept busy
    passive: bool  # the children's threads sleep when they wait


_last: Reading | None = None


def _read(was_passive: bool) -> Reading:
    try:
        busy = busy_cores()
    except Exception:  # noqa: BLE001 - no reading (no /proc, psutil refused): the box counts as quiet
        busy = 0.0
    return Reading(busy, busy >= (QUIET_AGAIN if was_passive else BUSY_CORES))


def _reading() -> Reading:
    global _last
    if _last is None:
        _last = _read(was_passive=False)
    return _last


def reread() -> None:
    """Read the box again: the next `omp_env` answers for the box as it is now."""
    global _last
    _last = _read(was_passive=_last is not None and _last.passive)


def omp_env(parent: Mapping[str, str]) -> dict[str, str]:
    """What dinox adds to a child's environment for OpenMP's waiting threads, and why (see the module)."""
    if "OMP_WAIT_POLICY" in parent:
        return {WHY_VAR: "the user's"}
    now = _reading()
    if not now.passive:
        return {WHY_VAR: f"the box was quiet: {now.busy:.1f} cores busy when read"}
    return {"OMP_WAIT_POLICY": "PASSIVE", WHY_VAR: f"set by dinox: {now.busy:.1f} cores busy when read"}


def recorded(env: Mapping[str, str]) -> str:
    """The child's record of it: "PASSIVE (set by dinox: 1.0 cores busy when read)", "unset (the box was
    quiet: ...)"."""
    policy = env.get("OMP_WAIT_POLICY", "") or "unset"
    why = env.get(WHY_VAR, "")
    return f"{policy} ({why})" if why else policy


def notice(parent: Mapping[str, str]) -> str:
    """One line for the sweep's terminal where dinox changed the policy; "" where it did not."""
    if "OMP_WAIT_POLICY" in parent or not _reading().passive:
        return ""
    return (
        f"dinox: the box is busy ({_reading().busy:.1f} cores in use by other processes): the trials run with "
        "OMP_WAIT_POLICY=PASSIVE (torch's waiting threads sleep instead of spinning beside them); their "
        "figures are this box's as it is now"
    )


def follow(parent: Mapping[str, str], before: str) -> str:
    """Read the box again before trial `before` (its label); one line for the terminal where the children's
    policy changed since the last reading, "" where it did not (or the user set it)."""
    if "OMP_WAIT_POLICY" in parent:
        return ""
    was = _reading().passive
    reread()
    now = _reading()
    if now.passive == was:
        return ""
    if now.passive:
        return (
            f"dinox: the box became busy before {before} ({now.busy:.1f} cores in use by other processes): from "
            "here the trials run with OMP_WAIT_POLICY=PASSIVE"
        )
    return (
        f"dinox: the box is quiet again before {before} ({now.busy:.1f} cores in use by other processes): from "
        "here the trials run with OpenMP's default (waiting threads spin, as in your own loop)"
    )

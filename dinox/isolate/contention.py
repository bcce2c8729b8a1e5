"""A busy box, read once before the first child starts, and what dinox's children do about it. No torch.

torch's OpenMP threads spin while they wait for each other (libgomp's default). Beside another process's
work they then burn their time slices waiting on a thread that is not running, and a trial in a session of
its own (as dinox's are, so a timeout can end its whole group; Linux's autogroup scheduler then gives the
session one share of the box) measures that: ResNet-18 at 32 px on this 2-core box, one core kept busy by
another session, 1.4 img/s with spinning threads, 62-75 with sleeping ones (quiet: 110). A label or a rate
read from that is the neighbour's, not the workload's. So where other processes keep at least half a core
of the children's cores busy before the first child starts, the children run with ``OMP_WAIT_POLICY=PASSIVE``
(threads sleep when they wait). On a quiet box torch's default stays: there passive threads cost a small
CPU step ~half its rate (same model; ~10 % at 96 px, batch 32), which a user's own loop does not pay. A
value the user set is theirs and is kept. Each trial records what it ran with (``dinox.omp_wait_policy``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

# Other processes' work on the children's cores, in cores, from which waiting threads must sleep.
BUSY_CORES = 0.5
WHY_VAR = "DINOX_OMP_WHY"  # how the policy came to be, for the child's record


def busy_cores(interval: float = 0.25) -> float:
    """Cores' worth of CPU time other processes used over `interval` on the cores this process may use."""
    import psutil

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    me = psutil.Process()
    before = sum(me.cpu_times()[:2])
    per_cpu = psutil.cpu_percent(interval=interval, percpu=True)
    mine = (sum(me.cpu_times()[:2]) - before) / interval
    used = sum(p for i, p in enumerate(per_cpu) if cores is None or i in cores) / 100.0
    return max(0.0, used - mine)


@functools.cache
def _measured() -> float:
    try:
        return busy_cores()
    except Exception:  # noqa: BLE001 - no reading (no /proc, psutil refused): the box counts as quiet
        return 0.0


def omp_env(parent: Mapping[str, str]) -> dict[str, str]:
    """What dinox adds to a child's environment for OpenMP's waiting threads, and why (see the module)."""
    if "OMP_WAIT_POLICY" in parent:
        return {WHY_VAR: "the user's"}
    busy = _measured()
    if busy < BUSY_CORES:
        return {WHY_VAR: f"the box was quiet: {busy:.1f} cores busy before the trials"}
    return {"OMP_WAIT_POLICY": "PASSIVE", WHY_VAR: f"set by dinox: {busy:.1f} cores busy before the trials"}


def recorded(env: Mapping[str, str]) -> str:
    """The child's record of it: "PASSIVE (set by dinox: 1.0 cores busy before the trials)", "unset (the box
    was quiet: ...)"."""
    policy = env.get("OMP_WAIT_POLICY", "") or "unset"
    why = env.get(WHY_VAR, "")
    return f"{policy} ({why})" if why else policy


def notice(parent: Mapping[str, str]) -> str:
    """One line for the sweep's terminal where dinox changed the policy; "" where it did not."""
    env = omp_env(parent)
    if env.get("OMP_WAIT_POLICY") != "PASSIVE" or "OMP_WAIT_POLICY" in parent:
        return ""
    return (
        f"dinox: the box is busy ({_measured():.1f} cores in use by other processes): the trials run with "
        "OMP_WAIT_POLICY=PASSIVE (torch's waiting threads sleep instead of spinning beside them); their "
        "figures are this box's as it is now"
    )

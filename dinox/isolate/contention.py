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

The box is read before the first child starts, and again before each trial that runs alone (``follow``):
a neighbour that arrived after the first reading made the quickstart's first trial read 1.7 img/s (quiet:
66), settled, with its threads spinning. The reading before a trial is what other processes used while the
trial before it ran (``trial_ended``), so it costs no time; before the first trial, what they used since the
first reading, while the store opened and the fork server imported torch (a quarter second of its own only
where that span was shorter). Once the children sleep, the box must fall below half the threshold before they
spin again, so a box that hovers at it does not flip the policy (and restart the fork server) at every trial.
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


@dataclass(frozen=True)
class Mark:
    """The box's CPU seconds on this process's cores, and this process tree's own, at one moment."""

    at: float
    box: float  # busy CPU seconds of the cores this process may use, since boot
    own: float  # CPU seconds of this process and its descendants, the reaped ones' included


def mark() -> Mark:
    import time

    import psutil

    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    box = 0.0
    for i, t in enumerate(psutil.cpu_times(percpu=True)):
        if cores is None or i in cores:  # busy as psutil counts it: all but idle and iowait (guest is in user)
            idle = t.idle + getattr(t, "iowait", 0.0) + getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
            box += sum(t) - idle
    return Mark(time.monotonic(), box, sum(_own_cpu(psutil.Process()).values()))


def busy_between(start: Mark, end: Mark) -> float:
    """Cores' worth of CPU time other processes used between two marks. This process and its descendants are
    not others (the fork server importing torch, a trial and its loader workers): a child reaped meanwhile is
    in its parent's children's times, so the tree's total holds its whole life."""
    return max(0.0, (end.box - start.box - (end.own - start.own)) / max(end.at - start.at, 1e-9))


def busy_cores(interval: float = 0.25) -> float:
    """Cores' worth of CPU time other processes used over `interval` on the cores this process may use."""
    import time

    start = mark()
    time.sleep(interval)
    return busy_between(start, mark())


def _own_cpu(me) -> dict[int, float]:
    """CPU seconds of this process and each of its descendants, by pid, with the children each has reaped."""
    import psutil

    out: dict[int, float] = {}
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            out[proc.pid] = t.user + t.system + t.children_user + t.children_system
    return out


@dataclass(frozen=True)
class Reading:
    busy: float  # cores other processes kept busy
    passive: bool  # the children's threads sleep when they wait


_last: Reading | None = None
# Between `follow` and `trial_ended`: the mark at a trial's start; then what other processes used over the
# trial, which the next `follow` takes instead of reading the box for a quarter second of its own.
_trial_start: Mark | None = None
_over_trial: float | None = None
_since: Mark | None = None  # the moment the last quarter-second reading ended, which the next may read on from
MIN_SPAN_S = 0.25  # a span shorter than a reading: the next `follow` reads the box itself


def _decide(busy: float, was_passive: bool) -> Reading:
    return Reading(busy, busy >= (QUIET_AGAIN if was_passive else BUSY_CORES))


def _read(was_passive: bool) -> Reading:
    global _since
    try:
        busy = busy_cores()
    except Exception:  # noqa: BLE001 - no reading (no /proc, psutil refused): the box counts as quiet
        busy = 0.0
    with contextlib.suppress(Exception):  # no mark: the next reading takes its own quarter second
        _since = mark()
    return _decide(busy, was_passive)


def _busy_since(start: Mark | None) -> float | None:
    """What other processes used from `start` until now, where that span is long enough to be a reading."""
    if start is None:
        return None
    with contextlib.suppress(Exception):
        end = mark()
        if end.at - start.at >= MIN_SPAN_S:
            return busy_between(start, end)
    return None


def _reading() -> Reading:
    global _last
    if _last is None:
        _last = _read(was_passive=False)
    return _last


def reread() -> None:
    """Read the box again (or take the reading over the last trial, else since the last reading): the next
    `omp_env` answers for it."""
    global _last, _over_trial, _since
    was = _last is not None and _last.passive
    since, _since = _since, None
    busy = _over_trial if _over_trial is not None else _busy_since(since)
    _last = _decide(busy, was) if busy is not None else _read(was)
    _over_trial = None


def trial_ended(parent: Mapping[str, str]) -> None:
    """The trial `follow` was called before has ended, its child reaped: what other processes used while it
    ran is the next `follow`'s reading."""
    global _trial_start, _over_trial
    start, _trial_start = _trial_start, None
    if start is not None and "OMP_WAIT_POLICY" not in parent:
        _over_trial = _busy_since(start)  # None (too short, no mark): the next `follow` reads the box itself


# The policies a record may name (OpenMP's two; "unset": torch's default, which spins a while).
POLICIES = ("PASSIVE", "ACTIVE", "unset")
_held: tuple[str, str, str] | None = None  # (policy, why, whose) pinned by `hold`: every child then runs with it


def _parse(recorded_text: str) -> tuple[str, str] | None:
    """(policy, why) of `recorded`'s text, e.g. "PASSIVE (set by dinox: 1.0 cores busy when read)"; None where
    it names no policy. The why is the store's text: made printable and cut short."""
    policy, _, why = recorded_text.partition(" (")
    policy = policy.strip()
    if policy.upper() in ("PASSIVE", "ACTIVE"):
        policy = policy.upper()
    if policy not in POLICIES:
        return None
    return policy, "".join(c if c.isprintable() else " " for c in why.removesuffix(")").strip()[:200])


def policy_of(recorded_text: str) -> str:
    """The policy a record's text names ("PASSIVE", "ACTIVE", "unset"); "" where it names none."""
    parsed = _parse(recorded_text)
    return parsed[0] if parsed else ""


def hold(recorded_text: str, whose: str = "its trial ran") -> bool:
    """Give every child from here the policy a record says its measurement ran with (`recorded`'s text),
    whatever the box reads now: `dinox verify` trains the step its forecast measured (`whose` names that
    measurement in the child's record), and its check windows say whether the box moved since. A policy the
    user sets now is still theirs. False, nothing held, where the text names no policy (an older trial, a
    damaged tag): the box is read as for any child."""
    global _held
    parsed = _parse(recorded_text)
    _held = (*parsed, whose) if parsed else None
    return _held is not None


def held_notice(recorded_text: str, parent: Mapping[str, str], whose: str = "the trial's") -> str:
    """One line for `dinox verify`'s terminal where holding the policy its forecast was measured with (`whose`
    measurement: the trial's, or its head-to-head rounds') makes the slice's threads sleep because dinox found
    the box busy then; "" where it does not (or the user set a policy now)."""
    held = _parse(recorded_text)
    if "OMP_WAIT_POLICY" in parent or held is None or held[0] != "PASSIVE" or "set by dinox" not in held[1]:
        return ""
    return (
        f"its threads sleep when they wait (OMP_WAIT_POLICY=PASSIVE), as {whose} did on a busy box: the step "
        "measured, which a quiet box runs faster with torch's own policy"
    )


def omp_env(parent: Mapping[str, str]) -> dict[str, str]:
    """What dinox adds to a child's environment for OpenMP's waiting threads, and why (see the module)."""
    if "OMP_WAIT_POLICY" in parent:
        return {WHY_VAR: "the user's"}
    if _held is not None:
        policy, why, whose = _held
        held = {WHY_VAR: f"as {whose}: {why}" if why else f"as {whose}"}
        return held if policy == "unset" else {"OMP_WAIT_POLICY": policy, **held}
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
    """Read the box again before trial `before` (its label): what other processes used while the last trial
    ran (`trial_ended`), else a quarter second read now. One line for the terminal where the children's policy
    changed since the last reading, "" where it did not (or the user set it)."""
    if "OMP_WAIT_POLICY" in parent:
        return ""
    global _trial_start
    was = _reading().passive
    reread()
    now = _reading()
    with contextlib.suppress(Exception):  # no mark: the next `follow` reads the box itself
        _trial_start = mark()
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

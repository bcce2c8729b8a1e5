"""`dinox head-to-head` top to bottom: the leaders' trials from the spec, rounds that measure each of them once,
back to back, in an order that reverses every round, each measurement recorded as a run the moment it ends,
and a look after rounds 5, 7 and 9 at whether the order is settled (dinox.decide.head_to_head has the rule).

A round measures the trial's timed windows only, as real training runs them (no ablation window between
them, no profile, no routine, no batch search: a `batch.size: auto` trial runs at the batch its search
found). Each measurement is a child of its own, forked from one fork server that imported torch once.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dinox import record as rec
from dinox.decide.head_to_head import GROUP_FORMAT, LOOKS, MAX_ROUNDS, HeadToHead, Round
from dinox.errors import DinoxError
from dinox.isolate import contention
from dinox.isolate.forkserver import ForkServer
from dinox.isolate.runner import run_trial
from dinox.plan.grid import Trial
from dinox.store.readback import log_beside
from dinox.store.trial_record import TrialRecord, store_text
from dinox.verify.step import NO_BATCH, as_measured


class HeadToHeadError(DinoxError):
    """What stops a head-to-head: one line for the user, exit 2 (the rounds recorded so far stay)."""


@dataclass(frozen=True)
class Leader:
    """A trial taking part: its record in the store and its trial as the spec declares it now."""

    record: TrialRecord
    trial: Trial

    @property
    def name(self) -> str:
        return self.record.run_name or self.record.run_id


def round_trial(leader: Leader) -> Trial:
    """The trial as a round measures it: its timed windows only, at the batch it was measured with."""
    trial = as_measured(leader.trial.windows_only(), leader.record)
    if trial is None:
        raise HeadToHeadError(f"{leader.name}: {NO_BATCH}")
    return trial


def order_of_round(leaders: list[Leader], number: int) -> list[Leader]:
    """A B C in odd rounds, C B A in even ones: a drift through two rounds favours no one."""
    return leaders if number % 2 else leaders[::-1]


def head_to_head(
    uri: str,
    leaders: list[Leader],
    workdir: Path,
    max_rounds: int = MAX_ROUNDS,
    say: Callable[[str], None] = print,
) -> HeadToHead:
    """Measure the leaders in rounds until their order is settled or `max_rounds` have run; each measurement
    is recorded as it ends (dinox.role = head_to_head), so an interruption keeps the rounds done."""
    _one_device(leaders)
    host = re.sub(r"[^A-Za-z0-9.-]", "_", os.uname().nodename)[:64]  # it names a folder
    group = f"{time.strftime(GROUP_FORMAT, time.gmtime())}-{host}-{os.getpid()}"
    h = HeadToHead(group, names={x.record.run_id: x.name for x in leaders})
    folder = workdir / "head-to-head" / group
    trials = {x.record.run_id: round_trial(x) for x in leaders}
    server = ForkServer()
    server.start()
    try:
        for number in range(1, max_rounds + 1):
            # The box read again before each round (both leaders of a round under one OpenMP policy): a
            # neighbour that arrived since would make spinning threads measure it, not the leaders.
            if line := server.follow_the_box(f"round {number}"):
                say(line)
            for x in order_of_round(leaders, number):
                h.rounds.append(_measure(uri, group, number, x, trials[x.record.run_id], folder, server))
                r = h.rounds[-1]
                say(f"round {number}: {x.name}: {r.images_per_s:.1f} img/s (windows {r.slow_ips:.1f}-{r.fast_ips:.1f})")
            contention.trial_ended(os.environ)  # what the box did over the round: the next round's reading
            if (number in LOOKS or number == max_rounds) and h.settled():
                break
    finally:
        server.close()
    return h


def _one_device(leaders: list[Leader]) -> None:
    """Leaders measured on two devices (shards of one sweep on two hosts) have no machine that measures them
    both again as they were: refused before anything runs. Each round's device is then held against theirs."""
    named = [(x, x.record.tags.get(rec.DEVICE_NAME, "")) for x in leaders]
    devices = {device for _x, device in named if device}
    if len(devices) > 1:
        each = "; ".join(f"{x.name} on {device}" for x, device in named if device)
        raise HeadToHeadError(
            store_text(f"the leaders were measured on different devices ({each}): no one machine measures them again")
        )


def _measure(uri: str, group: str, number: int, x: Leader, trial: Trial, folder: Path, server: ForkServer) -> Round:
    try:
        (folder / f"round{number}").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HeadToHeadError(f"cannot write {folder}: {e.strerror or e}") from None
    outcome = run_trial(trial, folder / f"round{number}" / trial.trial_id, server=server)
    result = outcome.result
    m = result.metrics
    if result.status != "ok" or not m.get(rec.IMAGES_PER_S):
        raise HeadToHeadError(
            f"{x.name} ended {result.status} in round {number}: {result.error} (its log: {outcome.log_path}); "
            "the rounds before it are recorded"
        )
    theirs, own = x.record.tags.get(rec.DEVICE_NAME, ""), result.tags.get(rec.DEVICE_NAME, "")
    if theirs and own and own != theirs:  # decide would plan the trial with another device's figures
        raise HeadToHeadError(
            store_text(
                f"this machine measures on {own}, {x.name} was measured on {theirs}: its rounds would replace its "
                "figures with another device's; measure head to head on a machine with its device (this "
                "measurement was not recorded)"
            )
        )
    kept = {k: m[k] for k in _KEPT if k in m}
    kept[rec.ROUND] = number
    tags = {rec.REMEASURES: x.record.run_id, rec.HEAD_TO_HEAD: group, rec.TRIAL_ID: trial.trial_id}
    tags.update({k: v for k, v in result.tags.items() if k in _TAGS_KEPT})
    note = f"round {number} of head-to-head {group}: {x.name} measured again, {m[rec.IMAGES_PER_S]:.1f} img/s"
    name = f"head-to-head {x.name} round {number}"[:250]
    log_beside(uri, x.record.experiment_id, "head_to_head", name, {}, kept, tags, note)
    windows = int(m.get(rec.WINDOWS, 1))
    slow, fast = m.get(rec.IMAGES_PER_S_MIN, m[rec.IMAGES_PER_S]), m.get(rec.IMAGES_PER_S_MAX, m[rec.IMAGES_PER_S])
    policy = result.tags.get(rec.OMP_WAIT_POLICY, "")
    return Round(x.record.run_id, number, m[rec.IMAGES_PER_S], slow, fast, windows, policy)


# What a round keeps of its child's result: the windows' rate and range, and what the box did meanwhile.
_KEPT = (
    rec.IMAGES_PER_S,
    rec.IMAGES_PER_S_MIN,
    rec.IMAGES_PER_S_MAX,
    rec.WINDOWS,
    rec.WINDOW_SPREAD,
    rec.STEP_S_P50,
    rec.STEP_S_P90,
    rec.PEAK_MEM_RESERVED_GB,
    rec.DEVICE_MEM_TOTAL_GB,
)
_TAGS_KEPT = (rec.DEVICE_NAME, rec.DEVICE, rec.TORCH_VERSION, rec.UNSTABLE, rec.OMP_WAIT_POLICY)

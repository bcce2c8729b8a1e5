"""One trial from the results of its ranks (hardware.gpus > 1, launched by torchrun). No torch here.

Each rank measures its own windows and writes its own result; DDP's all-reduce keeps them in lock step.
The trial's figures are global: images through all ranks per second of the slowest rank's wall time (and
every other rate summed over the ranks), the largest rank's peak memory, the slowest rank's step times,
costs and bound. The status rules hold across ranks: one rank's OOM makes the trial oom, one rank's
exception error, a rank that died without a result crashed (or timeout). A rank killed by a signal (the
OOM killer, a segfault) is the cause even when a peer reports first: the peer's error ("connection reset
by peer" in its collective) is the consequence, so the trial is crashed.
"""

from __future__ import annotations

import re
import signal

from dinox import record as rec
from dinox.contract import TrialResult, one_line


def result_name(base: str, rank: int) -> str:
    return f"{base}.rank{rank}"


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)", re.S)


def exit_codes(torchrun_log: str) -> dict[int, int]:
    """Each failed rank's exit code, from the failure report torchrun prints when a rank fails."""
    return {int(rank): int(code) for rank, code in _FAILURE.findall(torchrun_log)}


def merge(
    results: dict[int, TrialResult | None],
    world: int,
    missing_status: str,
    missing_why: str,
    exits: dict[int, int] | None = None,
) -> TrialResult:
    """The trial's result from each rank's (None: the rank left none); `exits`: torchrun's exit codes."""
    present = {r: res for r, res in results.items() if res is not None}
    # Killed by a signal other than torchrun's own SIGTERM (with which it stops the survivors).
    died = {r: -code for r, code in (exits or {}).items() if r not in present and code < 0 and -code != signal.SIGTERM}
    if died and missing_status != "timeout":
        r = min(died)
        peers = [f"rank {q}: {res.error}" for q, res in sorted(present.items()) if res.error]
        return TrialResult("crashed", error=one_line("; ".join([f"rank {r} killed by {_signame(died[r])}", *peers])))
    for status in ("oom", "error"):
        failed = sorted(r for r, res in present.items() if res.status == status)
        if failed:
            first = present[failed[0]]
            others = [r for r in range(world) if r not in present]
            tail = f"; rank(s) {', '.join(map(str, others))} stopped by torchrun" if others else ""
            return TrialResult(
                status,
                error=one_line(f"rank {failed[0]}: {first.error}{tail}"),
                metrics=dict(first.metrics),
                tags=dict(first.tags),
                marks=dict(first.marks),
            )
    if skipped := sorted(r for r, res in present.items() if res.status == "skipped"):  # not run: another device
        return present[skipped[0]]
    missing = [r for r in range(world) if r not in present]
    if missing:
        return TrialResult(
            missing_status, error=one_line(f"rank(s) {', '.join(map(str, missing))} left no result: {missing_why}")
        )
    if any(rec.VERIFY_WALL_S in res.metrics for res in present.values()):
        return _merge_verified(present, world)
    return _merge_ok(present, world)


def _merge_verified(ranks: dict[int, TrialResult], world: int) -> TrialResult:
    """A verification's ranks: the slowest rank's slice (its wall is the slice's), each figure by the rule the
    record declares for it (rec.VERIFY_RANKS)."""
    slowest = max(ranks.values(), key=lambda res: res.metrics.get(rec.VERIFY_WALL_S, 0.0))
    m = _by_rules(dict(slowest.metrics), ranks, rec.VERIFY_RANKS)
    tags = dict(slowest.tags) | {rec.WORLD_SIZE: str(world)}
    return TrialResult("ok", metrics=m, tags=tags, marks=dict(ranks[0].marks))


def _by_rules(m: dict[str, float], ranks: dict[int, TrialResult], rules: dict[str, rec.RankRule]) -> dict[str, float]:
    """`m` (the slowest rank's figures) with each figure a rule sums, takes the largest of, or averages over the
    ranks so combined; "slowest" and "pace" are the caller's."""
    for key, rule in rules.items():
        values = [res.metrics[key] for res in ranks.values() if key in res.metrics]
        if rule == "sum" and len(values) == len(ranks):
            m[key] = sum(values)
        elif rule == "max" and values:
            m[key] = max(values)
        elif rule == "mean" and len(values) == len(ranks):
            m[key] = sum(values) / len(values)
    return m


def _merge_ok(ranks: dict[int, TrialResult], world: int) -> TrialResult:
    # The slowest rank sets the pace: its split and step times describe the trial.
    slowest = max(ranks.values(), key=lambda res: res.metrics[rec.WINDOW_S])
    m = dict(slowest.metrics)
    window = slowest.metrics[rec.WINDOW_S]
    images = sum(res.metrics[rec.IMAGES_PER_S] * res.metrics[rec.WINDOW_S] for res in ranks.values())
    m[rec.IMAGES_PER_S] = images / window
    m[rec.WINDOW_S] = window
    m = _by_rules(m, ranks, rec.RANKS)  # every other metric by its declared rule; "slowest" is the copy above
    for r, res in sorted(ranks.items()):
        for key in rec.PER_RANK:
            if key in res.metrics:
                m[rec.per_rank(r, key)] = res.metrics[key]
    tags = dict(ranks[0].tags)
    tags[rec.WORLD_SIZE] = str(world)
    tags[rec.UNSTABLE] = str(any(res.tags.get(rec.UNSTABLE) == "true" for res in ranks.values())).lower()
    return TrialResult(
        "ok",
        bound=slowest.bound,
        metrics=m,
        tags=tags,
        step_s=list(slowest.step_s),
        marks=dict(ranks[0].marks),
        artifacts=list(ranks[0].artifacts),
    )


def _signame(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"

"""The contract between the parent and the child, shared by every room: what a trial produces (TrialResult,
a plain JSON record the child writes, the parent reads and the store logs), the files beside it, the closed
sets it names (statuses, bounds), the units figures are in, and how a process is referred to. Beside
dinox.record (the MLflow record's names) and dinox.errors; no torch, no MLflow, no room of dinox here."""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from dinox import record as rec
from dinox.writes import write_whole

GIB = 2**30  # every *_gb figure dinox reports is GiB

# How a trial's time was spent, as its label says (dinox.measure.bound decides it).
Bound = Literal["compute_bound", "io_bound", "transfer_bound", "host_bound", "inconclusive"]
BOUNDS: tuple[Bound, ...] = typing.get_args(Bound)

# The file beside result.json where a trial says which phase it is in (setup, warm-up, window 2/3, ...).
PHASE_FILE = "phase"
# The file beside result.json where a profiled trial records its measurement before the profile starts: the
# parent takes it when the profile does not finish (the time limit, a crash), so a profile never costs it.
PROVISIONAL_FILE = "result.provisional.json"
PROFILE_CUT = "the profile did not finish"
# The file beside a `dinox verify` child's trial.json that says how long to train (dinox.measure.verify).
SLICE_FILE = "slice.json"
# The file beside a trial's trial.json with the plan's training FLOPs per image ({"flops_per_image": F}), from
# which the child derives TFLOP/s and MFU beside its throughput; absent where the plan has no figure.
COST_FILE = "cost.json"
# In a verify child's check windows (rec.VERIFY_CHECK_WINDOWS, {"before": [img/s...], "after": [...]}) and in each
# of its epochs (rec.VERIFY_EPOCHS), on a GPU NVML reads: the SM clock in MHz at each one's end, under this key.
SM_CLOCK_KEY = "sm_clock_mhz"

Status = Literal["ok", "oom", "error", "crashed", "timeout", "skipped"]
STATUSES: tuple[Status, ...] = typing.get_args(Status)
# Statuses a resumed sweep does not measure again: the trial has its answer (a launcher counts these too).
FINAL: tuple[Status, ...] = ("ok", "oom", "skipped")


@dataclass
class TrialResult:
    status: Status
    error: str = ""  # one line: what went wrong
    bound: Bound | Literal[""] = ""  # for ok trials
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)  # environment and applied settings
    step_s: list[float] = field(default_factory=list)  # each timed optimizer step, seconds
    # Wall-clock (time.time()) marks of the child's phases, so the parent can split the trial's time
    # into start-up, setup and measurement without trusting either side's clock alone.
    marks: dict[str, float] = field(default_factory=dict)
    # Files the child wrote for the run to keep (measure.profile's trace): absolute paths, logged as artifacts.
    artifacts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown trial status {self.status!r}")
        if self.bound and self.bound not in BOUNDS:
            raise ValueError(f"unknown bound {self.bound!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrialResult:
        return cls(**json.loads(text))

    def write_atomic(self, path: str | Path) -> None:
        # rename is atomic: the parent never reads half a result, even if the child dies mid-write.
        write_whole(path, self.to_json())


def range_gap(before: tuple[float, float], after: tuple[float, float]) -> float:
    """How far apart two measurements of one trial lie, each its slowest and fastest window: 0.0 where the two
    ranges share a rate (no move shown), else the higher range's slowest window over the lower range's fastest,
    as a ratio's distance from 1: the least the box moved beyond what each measurement's own windows spread.
    Two trials whose ranges lie closer than this are not ordered by them."""
    (a, b), (c, d) = before, after
    return c / b - 1 if b < c else a / d - 1 if d < a else 0.0


@dataclass(frozen=True)
class DriftCheck:
    """A sweep's first ok trial measured again once its last trial is done (timed windows only): the box's
    drift while the sweep ran, kept on that trial's run (rec.DRIFT_CHECK, as JSON) for decide to read."""

    images_per_s: float
    slow_ips: float  # its slowest and fastest window, images/s
    fast_ips: float
    windows: int
    seconds_after: float  # from when the trial was recorded to the end of this measurement

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def parse(cls, text: str | None) -> DriftCheck | None:
        """The check as recorded, or None where the tag is absent or not one (a store another tool wrote)."""
        try:
            data = json.loads(text or "")
            check = cls(**data) if isinstance(data, dict) else None
        except (ValueError, TypeError):
            return None
        if check is None or not isinstance(check.windows, int) or isinstance(check.windows, bool):
            return None
        rates = (check.images_per_s, check.slow_ips, check.fast_ips, check.seconds_after)
        if any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) for x in rates):
            return None
        if check.windows < 2 or not 0 < check.slow_ips <= check.images_per_s <= check.fast_ips:
            return None
        return check


def one_line(text: str, limit: int = 500) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


@dataclass(frozen=True)
class ProcessRef:
    """A process as a sweep records it: host, pid, and the pid's start time (pids are reused)."""

    host: str
    pid: int
    started: float  # seconds since the epoch, as psutil reports it

    @classmethod
    def me(cls) -> ProcessRef:
        import psutil

        return cls(socket.gethostname(), os.getpid(), psutil.Process().create_time())

    def tags(self) -> dict[str, str]:
        return {rec.HOST: self.host, rec.PID: str(self.pid), rec.PID_STARTED: f"{self.started:.3f}"}

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> ProcessRef | None:
        with contextlib.suppress(KeyError, ValueError):
            return cls(tags[rec.HOST], int(tags[rec.PID]), float(tags[rec.PID_STARTED]))
        return None

    def gone(self) -> bool | None:
        """True when the process no longer runs; None when that cannot be known from here (another host)."""
        if self.host != socket.gethostname():
            return None
        import psutil

        try:
            return abs(psutil.Process(self.pid).create_time() - self.started) > 1.0
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            return None

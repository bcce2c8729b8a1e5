"""What a trial produces: a plain, JSON-serialisable record shared by the child and the parent.

No torch and no MLflow here: the child writes it, the parent reads it, tracking logs it.
"""

from __future__ import annotations

import json
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from dinox.measure.bound import BOUNDS, Bound
from dinox.writes import write_whole

# The file beside result.json where a trial says which phase it is in (setup, warm-up, window 2/3, ...).
PHASE_FILE = "phase"
# The file beside result.json where a profiled trial records its measurement before the profile starts: the
# parent takes it when the profile does not finish (the time limit, a crash), so a profile never costs it.
PROVISIONAL_FILE = "result.provisional.json"
PROFILE_CUT = "the profile did not finish"
# The file beside a `dinox verify` child's trial.json that says how long to train (dinox.measure.verify).
SLICE_FILE = "slice.json"

Status = Literal["ok", "oom", "error", "crashed", "timeout", "skipped"]
STATUSES: tuple[Status, ...] = typing.get_args(Status)


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


def one_line(text: str, limit: int = 500) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


_OOM_MARKERS = (
    "out of memory",  # CUDA / HIP / MPS allocators
    "can't allocate memory",  # CPU allocator under a data-segment limit
    "cannot allocate memory",
    "unable to allocate",  # numpy
    "cudnn_status_alloc_failed",  # cuDNN's own workspace or handle, near the cap
    "cublas_status_alloc_failed",  # cuBLAS's handle or workspace, near the cap
)
# cuDNN's frontend says the first when no engine's workspace fits (pytorch#108645) as well as for a configuration
# no engine supports, and the second for a handle created with no memory left as well as for a broken install:
# an OOM only when the trial's memory is near what it may use.
NEAR_FULL_MARKERS = ("unable to find an engine", "cudnn_status_not_initialized")
NEAR_FULL = 0.9


def is_oom(exc: BaseException, memory_share: float | None = None) -> bool:
    """Whether an exception is the device (or host) running out of memory; `memory_share`: the trial's peak
    reserved memory over what it may use, where known."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    if any(marker in text for marker in NEAR_FULL_MARKERS):
        return memory_share is not None and memory_share >= NEAR_FULL
    return any(marker in text for marker in _OOM_MARKERS)


def describe_exception(exc: BaseException) -> str:
    """One line for dinox.error. An exception re-raised from a DataLoader worker carries the worker's whole
    traceback in its message; its last line (the original exception) is what says what went wrong."""
    text = str(exc)
    if "Original Traceback" in text:
        head = text.splitlines()[0].removesuffix(".")  # "Caught DataError in DataLoader worker process 0"
        last = [ln for ln in text.splitlines() if ln.strip()][-1].strip()
        return one_line(f"{last} ({head.removeprefix('Caught ')})")
    return one_line(f"{type(exc).__name__}: {text}")

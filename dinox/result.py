"""What a trial produces: a plain, JSON-serialisable record shared by the child and the parent.

No torch and no MLflow here: the child writes it, the parent reads it, tracking logs it.
"""

from __future__ import annotations

import json
import os
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from dinox.bound import BOUNDS, Bound

# The file beside result.json where a trial says which phase it is in (setup, warm-up, window 2/3, ...).
PHASE_FILE = "phase"

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
        tmp = Path(f"{path}.tmp{os.getpid()}")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)


def one_line(text: str, limit: int = 500) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."

"""`batch.size: auto`: the search for the largest physical batch that fits. No torch, no processes here.

The search only proposes sizes and reads verdicts; the sweep runs each probe as a trial of its own (its own
process, recorded as a run). Doubling from auto_min finds a batch that does not fit, bisection then narrows
the boundary until it is known to within half the safety margin, and the probe budget is a hard cap:
ceil(log2(auto_max / auto_min)) + 2 probes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dinox import record as rec
from dinox.contract import GIB, TrialResult
from dinox.measure.result import NEAR_FULL_MARKERS
from dinox.plan.footprint import Estimates
from dinox.spec.sections import TrialSpec


@dataclass
class BatchSearch:
    low: int  # auto_min
    high: int  # auto_max
    margin: float  # auto_margin
    divides: int | None = None  # the chosen size must divide this (batch.effective / gpus)
    multiple: int = 1  # every size probed or chosen is a multiple of this (2: Mixup pairs the batch)
    probes: list[tuple[int, bool]] = field(default_factory=list)  # (size, fitted), in probe order

    @classmethod
    def for_spec(cls, spec: TrialSpec) -> BatchSearch:
        b = spec.batch
        divides = b.effective // spec.hardware.gpus if b.effective is not None else None
        high = min(b.auto_max, divides) if divides is not None else b.auto_max
        multiple = 2 if getattr(spec.data, "mixup", None) is not None else 1
        return cls(b.auto_min, max(high, b.auto_min), b.auto_margin, divides, multiple)

    @property
    def budget(self) -> int:
        return math.ceil(math.log2(self.high / self.low)) + 2

    @property
    def fit(self) -> int | None:
        """The largest probed size that fitted."""
        return max((s for s, ok in self.probes if ok), default=None)

    @property
    def failed(self) -> int | None:
        """The smallest probed size that did not fit."""
        return min((s for s, ok in self.probes if not ok), default=None)

    def next_size(self) -> int | None:
        """The next size to probe, or None when the search is over."""
        if len(self.probes) >= self.budget:
            return None
        fit, failed = self.fit, self.failed
        if fit is None:
            return self.low if failed is None else None  # auto_min itself did not fit: nothing does
        if failed is None:
            top = self.high - self.high % self.multiple
            return None if fit >= top else min(2 * fit, top)
        if failed - fit <= max(self.multiple, fit * self.margin / 2):
            return None  # known to within half the margin: more probes would not change the choice much
        middle = (fit + failed) // 2
        middle -= middle % self.multiple
        return middle if middle > fit else None

    def bound_by_host(self, spec: TrialSpec, estimates: Estimates) -> str:
        """On the CPU without hardware.memory_limit_gb nothing stops the doubling but the kernel's OOM killer,
        after it has driven the machine out of memory: stay within what the memory plan puts in the host's
        available memory. What was bounded, in words ("" when nothing was)."""
        machine = estimates.machine
        if machine is None or machine.device != "cpu" or spec.hardware.memory_limit_gb is not None:
            return ""
        import psutil

        available = psutil.virtual_memory().available / GIB
        fit = estimates.largest_fit(spec, available)
        if fit is None or fit >= self.high:
            return ""
        self.high = max(self.low, fit)
        return f"batch.size auto: at most {self.high}, what the memory plan puts in this host's {available:.1f} GiB"

    def record(self, size: int, fitted: bool) -> None:
        self.probes.append((size, fitted))

    def chosen(self) -> int | None:
        """The size to measure: the largest fit less the margin, a multiple of 8 from 64 up (tensor-core
        shapes, at a cost under 12%), and a divisor of batch.effective when that is fixed. None when
        nothing fitted."""
        fit = self.fit
        if fit is None:
            return None
        size = max(self.multiple, math.floor(fit * (1 - self.margin)))
        if self.divides is not None:
            fitting = [d for d in range(1, size + 1) if self.divides % d == 0 and d % self.multiple == 0]
            return max(fitting, default=None)
        return size - size % 8 if size >= 64 else size - size % self.multiple

    def describe(self) -> str:
        return " ".join(f"{s}:{'ok' if ok else 'oom'}" for s, ok in self.probes)

    def annotate(self, result: TrialResult) -> None:
        """What the search found, on the trial's result: its probes and the largest batch that fit."""
        result.tags[rec.BATCH_AUTO_PROBES] = self.describe()
        result.metrics[rec.BATCH_AUTO_PROBES_M] = float(len(self.probes))
        if self.fit is not None:
            result.metrics[rec.BATCH_AUTO_FIT] = float(self.fit)

    def nothing_fits(self) -> TrialResult:
        error = f"batch.size auto: not even batch.auto_min={self.low} fits (probes {self.describe()})"
        if self.fit is not None:  # something fits, but no size within the margin divides the effective batch
            even = "is even (Mixup) and " if self.multiple == 2 else ""
            error = (
                f"batch.size auto: {self.fit} fits, but no size within the margin {even}divides "
                f"batch.effective / gpus = {self.divides} (probes {self.describe()})"
            )
        return TrialResult("oom", error=error)


def probe_spec(spec: TrialSpec, size: int) -> TrialSpec:
    """A probe: the trial at one physical batch, no accumulation, two optimizer steps (the second holds the
    optimizer state and fresh gradients at once: the steady-state peak), and no ablation windows, no profile and
    no routine (checkpoints, evaluation): a probe asks whether the batch fits, not what holds it back."""
    batch = spec.batch.model_copy(update={"size": size, "effective": None, "accumulation": None})
    update = {"warmup_steps": 1, "bench_steps": 1, "repeats": 1, "ablation": False, "profile": None}
    measure = spec.measure.model_copy(update=update)
    return spec.model_copy(update={"batch": batch, "measure": measure, "routine": None})


def killed_for_memory(result: TrialResult, search: BatchSearch | None = None) -> bool:
    """A probe that did not fit though it is not `oom`: SIGKILLed (the kernel's OOM killer's doing; a sweep
    stops its children with SIGTERM); or, once a smaller batch of the same trial has fitted, cuDNN finding no
    engine (pytorch#108645: no engine's workspace fits at the cap's edge, while the probe's own peak, taken
    before the failing request, reads below the near-full share the trial's own rule asks)."""
    if result.status == "crashed" and "SIGKILL" in result.error:
        return True
    near_full = any(marker in result.error.lower() for marker in NEAR_FULL_MARKERS)
    return result.status == "error" and near_full and search is not None and search.fit is not None

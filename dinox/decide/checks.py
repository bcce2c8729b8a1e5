"""Checks beside the verdict: each trial's predicted memory against what it measured, and how a multi-device
trial scales against the same configuration on one device."""

from __future__ import annotations

from dataclasses import dataclass

from dinox import record as rec
from dinox.decide.grouping import model_key
from dinox.spec import params
from dinox.spec.sections import ROLES
from dinox.store.trial_record import TrialRecord


@dataclass
class ScalingRow:
    """A multi-device trial against the single-device trial of the same configuration."""

    run: str
    model: str
    gpus: int
    images_per_s: float  # global
    single_images_per_s: float
    device_name: str = ""  # the kind of device both were measured on (dinox.device_name)

    @property
    def efficiency(self) -> float:
        return self.images_per_s / (self.gpus * self.single_images_per_s)


@dataclass
class MemoryCheck:
    """A trial's predicted device memory (dinox plan) beside what it measured."""

    run: str
    model: str
    batch: int | None
    predicted_gb: float
    measured_gb: float | None  # peak allocated (CUDA) or the process's peak resident set (CPU)
    status: str
    predicted_oom: bool

    @property
    def ratio(self) -> float | None:
        return self.measured_gb / self.predicted_gb if self.measured_gb and self.predicted_gb else None


def memory_checks(records: list[TrialRecord]) -> list[MemoryCheck]:
    out = []
    for r in records:
        predicted = r.metrics.get(rec.PREDICTED_DEVICE_MEM_GB)
        if predicted is None or r.status not in ("ok", "oom"):
            continue
        measured = r.metrics.get(rec.PEAK_MEM_ALLOCATED_GB) if r.status == "ok" else None
        out.append(
            MemoryCheck(
                r.run_name or r.run_id,
                model_key(r)[0],
                r.batch_size,
                predicted,
                measured,
                r.status,
                rec.PREDICTED_OOM in r.tags,
            )
        )
    return sorted(out, key=lambda c: (c.model, c.batch or 0, c.run))


def scaling(records: list[TrialRecord]) -> list[ScalingRow]:
    """Scaling efficiency = global images/s / (N x images/s of the same configuration on one device). The
    effective batch grows with the devices, so it is not part of "the same configuration"."""
    free = {params.HARDWARE_GPUS, params.BATCH_EFFECTIVE}
    single: dict[tuple, float] = {}
    multi: list[tuple[tuple, TrialRecord, int]] = []
    for r in records:
        if r.status != "ok" or rec.IMAGES_PER_S not in r.metrics:
            continue
        key = tuple(sorted((k, v) for k, v in r.params.items() if k not in free and ROLES.describes(k)))
        key += ((rec.DEVICE_NAME, r.tags.get(rec.DEVICE_NAME, "")),)  # never one kind against another
        gpus = r.param_int(params.HARDWARE_GPUS) or 1
        if gpus == 1:
            single[key] = max(single.get(key, 0.0), r.metrics[rec.IMAGES_PER_S])
        else:
            multi.append((key, r, gpus))
    return [
        ScalingRow(
            r.run_name or r.run_id,
            model_key(r)[0],
            gpus,
            r.metrics[rec.IMAGES_PER_S],
            single[key],
            r.tags.get(rec.DEVICE_NAME, ""),
        )
        for key, r, gpus in multi
        if key in single
    ]

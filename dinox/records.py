"""A trial as read back from the tracking store: the DESIGN.md record, nothing dinox-specific beyond it.

Runs logged by another tool with the same names (params ``batch.size``, metrics ``images_per_s``, tag
``dinox.status`` ...) read the same way, so ``decide`` works on them too.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TrialRecord:
    run_id: str
    experiment_id: str
    run_name: str = ""
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return self.tags.get("dinox.status", "")

    def param_int(self, name: str) -> int | None:
        value = self.params.get(name)
        try:
            return int(float(value)) if value not in (None, "", "None") else None
        except ValueError:
            return None

    def param_bool(self, name: str) -> bool | None:
        value = self.params.get(name)
        return None if value is None else value.strip().lower() in ("true", "1", "yes")

    @property
    def batch_size(self) -> int | None:
        return self.param_int("batch.size")

    @property
    def effective_batch(self) -> int | None:
        """Images per optimizer step: the logged value, else size x accumulation x gpus."""
        effective = self.param_int("batch.effective")
        if effective is not None:
            return effective
        size = self.batch_size
        if size is None:
            return None
        return size * (self.param_int("batch.accumulation") or 1) * (self.param_int("hardware.gpus") or 1)

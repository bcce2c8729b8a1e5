"""Pruning by monotonicity: a batch that ran out of memory means every larger batch of the same
configuration (all else equal) would too, so those are recorded as skipped instead of run.

"The same configuration" is every param that bounds memory (``dinox.spec.roles``: the model's shape, precision,
optimizer state, the device), the same key decide draws its OOM boundaries with. Only OOM prunes: an error or
a crash says nothing about larger batches.
"""

from __future__ import annotations

from dinox.spec.sections import ROLES, TrialSpec


class Pruner:
    def __init__(self) -> None:
        self._oom: dict[tuple, tuple[int, str]] = {}  # memory key -> (smallest batch that OOMed, its run)

    def observe(self, params: dict[str, str], batch_size: int | None, status: str, run_id: str) -> None:
        if status != "oom" or batch_size is None:
            return
        key = ROLES.memory_key(params)
        if key not in self._oom or batch_size < self._oom[key][0]:
            self._oom[key] = (batch_size, run_id)

    def reason(self, spec: TrialSpec) -> str | None:
        """Why this trial would run out of memory without running it, or None."""
        if spec.batch.auto:
            return None  # the batch search finds its own boundary
        seen = self._oom.get(ROLES.memory_key(spec.flat_params()))
        if seen is None or spec.size <= seen[0]:
            return None
        size, run_id = seen
        where = f" (run {run_id})" if run_id else ""
        return (
            f"pruned: batch.size {spec.size} > {size}, which ran out of memory with the same "
            f"configuration{where}; --no-prune runs it"
        )

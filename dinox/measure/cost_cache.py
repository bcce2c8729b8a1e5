"""A model's cost on the meta device, kept between sweeps in the user's cache (dinox.writes.cache_dir).

The estimate child's meta-device step (parameters, FLOPs, saved activations) is a pure function of the model
and objective sections, timm's fused-attention switch, and the code that builds and counts them: torch,
timm and dinox's own. Keyed by all of these, a resumed sweep, `--remeasure-unsettled`, a second shard on the
same host or the next sweep of the same model skips it (0.8 s for a ViT-Tiny, 3 s for the study's ViT-L
DINOv2 step, on this 2-core box). Never for the team's own step (objective kind python): its code is
theirs, and this key would not see it change. A file that cannot be read back as a cost is recomputed and
written again; a cache that cannot be written costs only the time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
from dataclasses import fields
from pathlib import Path
from typing import Any

import timm
import torch

import dinox
from dinox.plan.footprint import ModelCost
from dinox.spec.objectives import PythonObjective
from dinox.spec.sections import TrialSpec
from dinox.writes import cache_dir, write_whole

_FIELDS = frozenset(f.name for f in fields(ModelCost))


@functools.cache
def _source_digest() -> str:
    """Every module of the installed dinox, names and bytes: a change to how a cost is counted is a new key."""
    root = Path(dinox.__file__).parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def path_for(spec: TrialSpec) -> Path | None:
    """The cache file of this trial's model cost; None where it is not kept (the team's own step)."""
    if isinstance(spec.objective, PythonObjective):
        return None
    fused = spec.model.fused_attention
    material = {
        "model": spec.model.model_dump(mode="json"),
        "objective": spec.objective.model_dump(mode="json"),
        "fused_attention": timm.layers.use_fused_attn() if fused is None else fused,
        "torch": torch.__version__,
        "timm": timm.__version__,
        "dinox": _source_digest(),
    }
    key = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
    return cache_dir() / "costs" / f"{key}.json"


def load(path: Path | None) -> dict[str, Any] | None:
    """The cost kept at `path`, as ModelCost's fields; None where there is none or it is not a cost."""
    if path is None:
        return None
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or set(kept) != _FIELDS:
        return None
    numbers = [v for v in kept.values() if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(numbers) != len(kept) or not all(math.isfinite(v) and v >= 0 for v in numbers):
        return None
    return kept


def save(path: Path | None, cost: dict[str, Any]) -> None:
    """Keep `cost` at `path`, whole or not at all; a cache that cannot be written is left as it is."""
    if path is None:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, json.dumps(cost))

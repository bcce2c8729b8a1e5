"""`--shrink`: a spec's grid and pipeline, made small enough to try end to end on the machine at hand.

Lightning's ``fast_dev_run`` is the habit: see every trial start, measure, record and be decided on, in minutes,
before the real box runs it for hours. Each sweep point keeps its place in the grid, its data source, its
objective's shape (crop counts, heads), its loader, precision and compile settings; what makes a step slow
shrinks: the model's depth and width (for the timm families named below), image and crop sizes, the DINO head,
the physical batches (all divided by one factor, so the grid's order and ratios survive), the steps and windows
measured. A device this machine certainly lacks becomes ``auto``. The trials are marked ``shrunk: true`` (a param
and the ``dinox.shrunk`` tag), their experiment is the spec's name with ``_shrunk``, their run names end in
``shrunk``: a shrunk figure is never read as the study's, and ``dinox decide`` refuses it unless told.

A pure function of the raw mappings, before validation, so every rule of a spec still holds for the result.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from dinox.plan.machine import without_torch

SUFFIX = "_shrunk"
BATCH_MAX = 8  # the largest physical batch after shrinking
IMAGE_PX = 64  # image and global crops at most this (a multiple of the patch below it)
LOCAL_PX = 32  # DINO's local crops at most this
# Timed windows a trial: two, the fewest that show a spread. A settled GO needs three, and a shrunk trial never
# gives one (`decide --shrunk` exits 3 whatever it reads), so a third window would cost a third more for nothing.
WINDOWS = 2

# (what a name starts with, the kwargs that make its family small). Only families whose timm builders let
# kwargs override their shape (`**dict(model_args, **kwargs)`); any other model is kept at its size, and said so.
_FAMILIES: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    # 96 wide: SwiGLU's packed hidden (embed_dim x 5.33 in DINOv2's giant) must stay even.
    (("vit_", "deit", "eva", "beit", "flexivit"), {"depth": 2, "embed_dim": 96, "num_heads": 2}),
    (("resnet", "resnext", "wide_resnet", "seresnet", "resnetv2"), {"layers": [1, 1, 1, 1]}),
    (("convnext",), {"depths": [1, 1, 1, 1], "dims": [32, 64, 128, 256]}),
)
_DINO_HEAD = {"out_dim": 1024, "head_hidden_dim": 256, "head_bottleneck_dim": 64}
# (most, the field's default where it has a number): a default above the cap is capped too.
_MEASURE = {"warmup_steps": (2, 5), "bench_steps": (5, 20), "ablation_steps": (5, None), "profile_steps": (2, None)}
_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Shrink:
    factor: int  # the grid's largest physical batch over BATCH_MAX: what every other batch figure is divided by
    sizes: dict[int, int]  # each physical batch of the grid -> its shrunk size


def of(base: dict[str, Any], points: list[dict[str, Any]]) -> Shrink:
    """The grid's physical batches, each divided by one factor (its largest then BATCH_MAX), kept in order and
    apart (two sizes never become one trial) and even where they were even (Mixup pairs images)."""
    found = {v for batch in (base.get("batch"), *[_batch_of(p) for p in points]) for v in _sizes(batch)}
    factor = max(1, math.ceil(max(found, default=1) / BATCH_MAX))
    sizes: dict[int, int] = {}
    last = 0
    for size in sorted(found):
        unit = 2 if size % 2 == 0 else 1
        small = max(unit, round(size / factor / unit) * unit, last + 1)
        small += small % unit  # an even size stays even
        sizes[size] = last = small
    return Shrink(factor, sizes)


def _batch_of(point: dict[str, Any]) -> dict[str, Any]:
    return {k.split(".", 1)[1]: v for k, v in point.items() if k.startswith("batch.")}


def _sizes(batch: Any) -> list[int]:
    return [v for v in (batch.get("size"),) if _number(v)] if isinstance(batch, dict) else []


def apply(raw: dict[str, Any], shrink: Shrink) -> None:
    """Shrink one sweep point's raw mapping in place (a value of the wrong type is left for validation)."""
    model = _section(raw, "model")
    patch = _patch(model)
    _model(model)
    _cap(model, "img_size", _px(IMAGE_PX, patch), default=224)
    objective = raw.get("objective")
    if isinstance(objective, dict) and objective.get("kind") in ("dino", "dinov2"):
        for key, most in _DINO_HEAD.items():
            _cap(objective, key, most, default=math.inf)
        _cap(objective, "global_crop_size", _px(IMAGE_PX, patch))
        _cap(objective, "local_crop_size", _px(LOCAL_PX, patch), default=96)
    _device(raw)
    _batch(_section(raw, "batch"), shrink, _section(raw, "hardware").get("gpus", 1))
    measure = _section(raw, "measure")
    for key, (most, default) in _MEASURE.items():
        _cap(measure, key, most, default)
    _cap(measure, "timeout_s", _TIMEOUT_S, default=1800.0)
    for key, default in (("min_repeats", 3), ("max_repeats", 5), ("repeats", None)):
        _cap(measure, key, WINDOWS, default)
    if isinstance(name := raw.get("name"), str):
        raw["name"] = shrunk_name(name)
    raw["shrunk"] = True


def shrunk_name(name: str) -> str:
    """The experiment of a shrunk sweep: the spec's name and `_shrunk`, within the name's 100 characters."""
    return name[: 100 - len(SUFFIX)] + SUFFIX


def _section(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.setdefault(key, {})
    return value if isinstance(value, dict) else {}


def _patch(model: dict[str, Any]) -> int:
    """The patch size images must be a multiple of: the kwargs' where they set one, else the name's (1: none)."""
    kwargs, name = model.get("kwargs"), model.get("name")
    if isinstance(kwargs, dict) and _number(kwargs.get("patch_size")):
        return kwargs["patch_size"]
    match = re.search(r"patch(\d+)", name) if isinstance(name, str) else None
    return int(match.group(1)) if match else 1


def _px(most: int, patch: int) -> int:
    return max(patch, most // patch * patch)


def _model(model: dict[str, Any]) -> None:
    name = model.get("name")
    if not isinstance(name, str):
        return
    for prefixes, small in _FAMILIES:
        if name.startswith(prefixes):
            kwargs = model.setdefault("kwargs", {})
            if isinstance(kwargs, dict):
                kwargs.update(small)
            return


def family_kept(name: str) -> bool:
    """True where --shrink keeps the model at its size (its family is not one it knows how to shrink)."""
    return not any(name.startswith(prefixes) for prefixes, _ in _FAMILIES)


def _cap(section: dict[str, Any], key: str, most: int | float, default: int | float | None = None) -> None:
    value = section.get(key, default)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > most:
        section[key] = most


def _batch(batch: dict[str, Any], shrink: Shrink, gpus: Any) -> None:
    if _number(size := batch.get("size")):
        batch["size"] = shrink.sizes.get(size, max(1, round(size / shrink.factor)))
    for key in ("auto_min", "auto_max", "effective"):
        if _number(value := batch.get(key)):
            batch[key] = max(1, round(value / shrink.factor))
    size, effective, gpus = batch.get("size"), batch.get("effective"), gpus if _number(gpus) else 1
    if _number(effective) and _number(size):  # still a whole number of physical batches on every device
        step = size * gpus
        accumulation = batch.get("accumulation")
        batch["effective"] = step * accumulation if _number(accumulation) else max(step, effective // step * step)


def _number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _device(raw: dict[str, Any]) -> None:
    hardware = _section(raw, "hardware")
    kind = hardware.get("device", "auto")
    if not isinstance(kind, str) or not without_torch(kind):
        return
    hardware["device"] = "auto"
    hardware.pop("memory_limit_gb", None)  # a GPU's cap means nothing off it
    hardware["gpus"] = 1
    if isinstance(data := raw.get("data"), dict) and data.get("decode_device") == "cuda":
        data["decode_device"] = "cpu"


def summary(doc_base: dict[str, Any], points: list[dict[str, Any]], first: Any) -> str:
    """One line for the terminal: what --shrink made of the spec (`first`: the first trial's spec, shrunk)."""
    shrink = of(doc_base, points)
    model = first.model
    shape = ", ".join(f"{k} {v}" for k, v in model.kwargs.items()) if not family_kept(model.name) else ""
    parts = [
        f"{model.name} at {shape} (timm kwargs)"
        if shape
        else f"{model.name} kept at its size (--shrink knows "
        "the vit, deit, eva, beit, resnet, resnext and convnext families)",
        f"{model.img_size} px",
        "batches " + ", ".join(f"{a}->{b}" for a, b in shrink.sizes.items()) if shrink.sizes else "",
        f"{first.measure.warmup_steps} warm-up + {first.measure.bench_steps} timed steps a window, {_windows(first)}",
        f"experiment {first.name}",
    ]
    return "shrunk (--shrink): " + "; ".join(p for p in parts if p)


def _windows(spec: Any) -> str:
    low, high = spec.measure.window_bounds
    return f"{high} window{'s' if high > 1 else ''}" if low == high else f"{low}-{high} windows"

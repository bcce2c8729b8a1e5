"""Rules that span fields: pydantic checks each field's shape, these check that a trial's fields agree.

Each rule names the field to fix, so ``grid`` can point at its line in the file. Torch-free, like the spec.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from dinox.record import param_problem
from dinox.spec.data_sources import CtPngData, ImageFolderData, WebDatasetData
from dinox.spec.fields import FieldProblem, field_problems
from dinox.spec.objectives import DinoObjective, Dinov2Objective
from dinox.spec.sections import TrialSpec

Rule = tuple[str, str]  # (field path, message)

# Keys dinox sets on timm.create_model itself; accepting them in model.kwargs would let two places
# disagree about the same knob.
RESERVED_MODEL_KWARGS = {
    "pretrained": "weights are never downloaded; dinox always builds with pretrained=False",
    "img_size": "set model.img_size instead",
    "num_classes": "set objective.num_classes instead",
    # Each of these makes timm read a file or a hub: a spec measures an untrained model and reads nothing else.
    "checkpoint_path": "dinox measures untrained models; it never loads a checkpoint",
    "pretrained_cfg": "dinox never loads pretrained weights or their configuration",
    "pretrained_cfg_overlay": "dinox never loads pretrained weights or their configuration",
    "cache_dir": "dinox never downloads anything",
}


def check_trial(raw: dict[str, Any]) -> TrialSpec | list[FieldProblem]:
    """Validate one expanded trial mapping: the TrialSpec, or everything wrong with it."""
    try:
        trial = TrialSpec.model_validate(raw)
    except ValidationError as e:
        return field_problems(e, TrialSpec)
    problems = consistency_problems(trial) + _params(trial)
    if problems:
        return [FieldProblem(tuple(path.split(".")), message) for path, message in problems]
    return trial


def consistency_problems(t: TrialSpec) -> list[Rule]:
    """Contradictions inside one valid-shaped trial, as (field path, message)."""
    checks = (_auto_batch, _fixed_batch, _loader, _model, _measure, _optimizer, _hardware, _data, _objective, _budget)
    return [problem for check in checks for problem in check(t)]


def _params(t: TrialSpec) -> list[Rule]:
    """Every param the trial's run will carry, as MLflow must take it (a model.kwargs key is free-form)."""
    return [(name, why) for name, value in t.flat_params().items() if (why := param_problem(name, value))]


def _auto_batch(t: TrialSpec) -> list[Rule]:
    b, gpus = t.batch, t.hardware.gpus
    if not b.auto:
        return []
    out = []
    if b.accumulation is not None and b.effective is not None:
        why = (
            "with batch.size auto give batch.accumulation (the effective batch follows from the batch found) "
            "or batch.effective (the accumulation follows), not both"
        )
        out.append(("batch.accumulation", why))
    if b.auto_min > b.auto_max:
        out.append(("batch.auto_min", f"{b.auto_min} > batch.auto_max {b.auto_max}"))
    elif b.effective is not None and b.effective % gpus:
        out.append(("batch.effective", f"{b.effective} is not a multiple of hardware.gpus {gpus}"))
    elif b.effective is not None and b.auto_min * gpus > b.effective:
        out.append(("batch.auto_min", f"{b.auto_min} x hardware.gpus {gpus} > batch.effective {b.effective}"))
    return out


def _fixed_batch(t: TrialSpec) -> list[Rule]:
    b, gpus = t.batch, t.hardware.gpus
    if b.auto or b.effective is None:
        return []
    per_step = b.size * gpus
    if b.effective % per_step:
        why = f"{b.effective} is not a multiple of batch.size {b.size} x hardware.gpus {gpus} = {per_step}"
        return [("batch.effective", why)]
    if b.accumulation is not None and b.accumulation * per_step != b.effective:
        why = (
            f"{b.accumulation} does not match batch.effective {b.effective} / (batch.size {b.size} x "
            f"hardware.gpus {gpus}) = {b.effective // per_step}; give one of them"
        )
        return [("batch.accumulation", why)]
    return []


def _loader(t: TrialSpec) -> list[Rule]:
    lo = t.loader
    out = []
    if lo.num_workers == 0 and lo.prefetch_factor is not None:
        why = (
            f"{lo.prefetch_factor} needs loader.num_workers > 0 (this trial has 0 workers); leave it "
            "unset when sweeping workers through 0, torch then prefetches 2 batches per worker"
        )
        out.append(("loader.prefetch_factor", why))
    if lo.num_workers == 0 and lo.persistent_workers:
        out.append(("loader.persistent_workers", "true needs loader.num_workers > 0"))
    if t.hardware.device == "cpu" and lo.pin_memory:
        out.append(("loader.pin_memory", "true has no effect with hardware.device cpu"))
    return out


def _model(t: TrialSpec) -> list[Rule]:
    out = [(f"model.kwargs.{key}", why) for key, why in RESERVED_MODEL_KWARGS.items() if key in t.model.kwargs]
    if t.model.compile is not False and t.measure.warmup_steps == 0:
        why = "0 with model.compile on would put compilation inside the timed steps; use at least 1"
        out.append(("measure.warmup_steps", why))
    return out


def _measure(t: TrialSpec) -> list[Rule]:
    m = t.measure
    if m.repeats is None and m.min_repeats > m.max_repeats:  # a fixed count overrides both
        return [("measure.min_repeats", f"{m.min_repeats} > measure.max_repeats {m.max_repeats}")]
    return []


def _optimizer(t: TrialSpec) -> list[Rule]:
    if t.optimizer.momentum is not None and t.optimizer.name != "sgd":
        return [("optimizer.momentum", f"applies to sgd only, not {t.optimizer.name}")]
    return []


def _hardware(t: TrialSpec) -> list[Rule]:
    hw = t.hardware
    if hw.gpus > 1 and hw.device == "mps":
        return [("hardware.gpus", f"{hw.gpus}: MPS has one device; multi-device trials need cuda or cpu")]
    return []


def _data(t: TrialSpec) -> list[Rule]:
    d = t.data
    out = _image_pipeline(t) if isinstance(d, (ImageFolderData, WebDatasetData)) else []
    if not isinstance(d, (CtPngData, WebDatasetData)):
        return out
    if d.window_level_min > d.window_level_max:
        out.append(("data.window_level_min", f"{d.window_level_min} > window_level_max {d.window_level_max}"))
    if d.window_width_min > d.window_width_max:
        out.append(("data.window_width_min", f"{d.window_width_min} > window_width_max {d.window_width_max}"))
    return out


def _image_pipeline(t: TrialSpec) -> list[Rule]:
    d, out = t.data, []
    if d.mixup is not None and isinstance(t.objective, DinoObjective):  # type: ignore[union-attr]
        out.append(("data.mixup", "Mixup / CutMix mixes class targets: it needs a classification objective"))
    elif d.mixup is not None and not t.batch.auto and t.size % 2:  # type: ignore[union-attr]
        out.append(("data.mixup", f"timm's Mixup pairs images: batch.size {t.size} must be even"))
    elif d.mixup is not None and t.batch.auto and t.batch.auto_min % 2:  # type: ignore[union-attr]
        out.append(("batch.auto_min", f"{t.batch.auto_min}: with data.mixup every probed batch must be even"))
    if getattr(d, "decode_device", "cpu") == "cuda":
        if isinstance(t.objective, DinoObjective):
            out.append(("data.decode_device", "cuda decodes one view per image; DINO's multi-crop needs cpu"))
        if t.hardware.device not in ("auto", "cuda"):
            out.append(("data.decode_device", f"cuda decodes on the GPU; this trial runs on {t.hardware.device}"))
        if d.augment is not None and d.augment.auto_augment is not None:  # type: ignore[union-attr]
            out.append(("data.augment.auto_augment", "timm's policies work on PIL images, not GPU-decoded ones"))
    return out


def _objective(t: TrialSpec) -> list[Rule]:
    o = t.objective
    if isinstance(o, DinoObjective) and o.global_crops + o.local_crops < 2:
        return [("objective.local_crops", "DINO compares views: global_crops + local_crops must be >= 2")]
    if isinstance(o, Dinov2Objective) and o.mask_ratio_min > o.mask_ratio_max:
        why = f"{o.mask_ratio_min} is above mask_ratio_max {o.mask_ratio_max}: a range from the smaller"
        return [("objective.mask_ratio_min", why)]
    if isinstance(o, Dinov2Objective) and o.global_crops < 2:
        return [("objective.global_crops", "DINOv2 compares each global crop with another: 2 at least")]
    return []


def _budget(t: TrialSpec) -> list[Rule]:
    problem = t.budget.schedule_problem() if t.budget is not None else ""
    return [("budget", problem)] if problem else []

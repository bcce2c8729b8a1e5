"""The objective section: what one training step computes. dinox's classification, DINO and DINOv2 steps, or a
team's own (``kind: python``); ``Objective`` picks one by ``kind`` (classification where it is left out)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, JsonValue, NonNegativeInt, PositiveFloat, PositiveInt, Tag

from dinox.spec.base import MAX_PIXELS, Section, entry_name, sane_kwargs, tag_or
from dinox.spec.roles import CONFIG, SHAPE, STEER


class ClassificationObjective(Section):
    kind: Annotated[Literal["classification"], SHAPE] = "classification"
    num_classes: Annotated[PositiveInt, SHAPE] = Field(1000, le=10_000_000)
    label_smoothing: Annotated[float, CONFIG] = Field(0.0, ge=0.0, lt=1.0)


class DinoObjective(Section):
    """DINO self-distillation: a student and an EMA teacher on the same backbone, multi-crop views."""

    kind: Annotated[Literal["dino"], SHAPE] = "dino"
    out_dim: Annotated[PositiveInt, SHAPE] = Field(65536, le=1_048_576, description="prototypes of the DINO head")
    head_hidden_dim: Annotated[PositiveInt, SHAPE] = Field(2048, le=65_536)
    head_bottleneck_dim: Annotated[PositiveInt, SHAPE] = Field(256, le=65_536)
    head_layers: Annotated[int, SHAPE] = Field(3, ge=2, le=16)
    global_crops: Annotated[PositiveInt, SHAPE] = Field(2, le=64)
    global_crop_size: Annotated[PositiveInt | None, SHAPE] = Field(
        None, le=MAX_PIXELS, description="null: model.img_size"
    )
    global_crop_min_scale: Annotated[float, CONFIG] = Field(0.32, gt=0.0, le=1.0)
    local_crops: Annotated[NonNegativeInt, SHAPE] = Field(8, le=64)
    local_crop_size: Annotated[PositiveInt, SHAPE] = Field(
        96, le=MAX_PIXELS, description="a multiple of the patch size for ViTs (98 for /14)"
    )
    local_crop_max_scale: Annotated[float, CONFIG] = Field(0.32, gt=0.0, le=1.0)
    student_temp: Annotated[PositiveFloat, CONFIG] = Field(0.1, le=100.0)
    teacher_temp: Annotated[PositiveFloat, CONFIG] = Field(0.04, le=100.0)
    center_momentum: Annotated[float, CONFIG] = Field(0.9, ge=0.0, lt=1.0)
    teacher_momentum: Annotated[float, CONFIG] = Field(0.996, ge=0.0, lt=1.0)


class Dinov2Objective(DinoObjective):
    """DINOv2's recipe (facebookresearch/dinov2, ssl_default_config.yaml's defaults): DINO's head and multi-crop,
    plus iBOT on masked patch tokens of the global crops (block masks, the head shared with DINO's unless
    ibot_separate_head), KoLeo on the student's class tokens, centering or Sinkhorn-Knopp for the teacher,
    gradient clipping, layer-wise learning-rate decay and a stochastic depth that skips the dropped samples'
    compute. Each switches off on its own (ibot: false, koleo_weight: 0, clip_grad: null, layerwise_decay: 1,
    drop_path: 0, drop_path_skip: false for timm's DropPath, which zeroes but still computes)."""

    kind: Annotated[Literal["dinov2"], SHAPE] = "dinov2"  # type: ignore[assignment]
    ibot: Annotated[bool, SHAPE] = Field(True, description="iBOT's masked-patch loss (its head runs on every step)")
    ibot_separate_head: Annotated[bool, SHAPE] = Field(False, description="a head of its own (ViT-L/g configs)")
    mask_sample_probability: Annotated[float, SHAPE] = Field(0.5, ge=0.0, le=1.0)
    mask_ratio_min: Annotated[float, SHAPE] = Field(0.1, ge=0.0, le=1.0)
    mask_ratio_max: Annotated[float, SHAPE] = Field(0.5, ge=0.0, le=1.0)
    koleo_weight: Annotated[float, CONFIG] = Field(0.1, ge=0.0, le=100.0, description="0: no KoLeo term")
    centering: Annotated[Literal["centering", "sinkhorn_knopp"], CONFIG] = "centering"
    clip_grad: Annotated[PositiveFloat | None, CONFIG] = Field(3.0, le=1e6, description="null: no clipping")
    layerwise_decay: Annotated[float, CONFIG] = Field(0.9, gt=0.0, le=1.0, description="1: one learning rate")
    patch_embed_lr_mult: Annotated[float, CONFIG] = Field(0.2, gt=0.0, le=1.0)
    drop_path: Annotated[float, SHAPE] = Field(0.3, ge=0.0, lt=1.0, description="the student's, every block")
    drop_path_skip: Annotated[bool, SHAPE] = Field(
        True, description="above 0.1, compute each residual branch only for the samples kept (DINOv2's)"
    )
    teacher_momentum: Annotated[float, CONFIG] = Field(0.992, ge=0.0, lt=1.0)
    teacher_temp: Annotated[PositiveFloat, CONFIG] = Field(0.07, le=100.0)


class PythonObjective(Section):
    """The team's own training step: `entry` names a callable that receives what dinox decided (the model
    section, the device, the precision, `options`) and returns an object with dinox's objective protocol
    (dinox.measure.objectives.Objective). It gets the batches dinox's data section yields: (images, labels)."""

    kind: Annotated[Literal["python"], SHAPE] = "python"
    entry: Annotated[str, AfterValidator(entry_name), SHAPE] = Field(
        description="module:callable, imported in the trial's own process (never by decide, sync or the UI)"
    )
    path: Annotated[str, STEER] = Field(
        ".", min_length=1, max_length=4096, description="the folder the module is imported from (the working one)"
    )
    options: Annotated[dict[str, JsonValue], AfterValidator(sane_kwargs), SHAPE] = Field(
        default_factory=dict, description="passed to the entry as context.options"
    )
    num_classes: Annotated[PositiveInt, SHAPE] = Field(
        1000, le=10_000_000, description="the labels the data yields are in [0, num_classes)"
    )
    # Set by dinox from the entry's source when the spec is expanded (a value written here is replaced): a
    # change in the team's code is a different trial, never a resumed one.
    code: Annotated[str | None, SHAPE] = Field(None, description="set by dinox: sha256 of the entry's source")
    file: Annotated[str | None, STEER] = Field(None, description="set by dinox: the file the entry's module is in")


Objective = Annotated[
    Annotated[ClassificationObjective, Tag("classification")]
    | Annotated[DinoObjective, Tag("dino")]
    | Annotated[Dinov2Objective, Tag("dinov2")]
    | Annotated[PythonObjective, Tag("python")],
    tag_or("kind", "classification"),
]

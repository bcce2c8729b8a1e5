"""The spec's data sources: synthetic images, CT slices (PNG or shards), image folders, a team's own dataset;
and the image pipeline's knobs, timm's training transform and timm's Mixup, named as timm names them.
Torch-free."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    Field,
    JsonValue,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Tag,
)
from pydantic_core import PydanticCustomError

from dinox.spec.base import MAX_SEED, Section, entry_name, sane_kwargs, tag_or
from dinox.spec.roles import CONFIG, STEER


class SyntheticData(Section):
    source: Annotated[Literal["synthetic"], CONFIG] = "synthetic"
    num_samples: Annotated[PositiveInt | None, CONFIG] = Field(
        None, le=10**12, description="dataset length; null: exactly what the measured steps consume (no epoch edge)"
    )
    seed: Annotated[NonNegativeInt, CONFIG] = Field(0, le=MAX_SEED)
    sample_delay_ms: Annotated[NonNegativeFloat, CONFIG] = Field(
        0.0, le=60_000.0, description="a wait added to every sample: a slow disk or decoder, as a what-if"
    )
    pixels: Annotated[Literal["uint8", "float32"], CONFIG] = Field(
        "uint8",
        description="uint8 images, normalised on the device as timm's loaders and a real decoder's pipeline do "
        "(a quarter of float32's bytes through the loader and the copies); float32: made float in the worker",
    )


class _HuWindow(Section):
    # A random HU window per view, as in the loader study: level and width drawn uniformly.
    window_level_min: Annotated[float, CONFIG] = Field(-700.0, ge=-32768, le=32767)
    window_level_max: Annotated[float, CONFIG] = Field(100.0, ge=-32768, le=32767)
    window_width_min: Annotated[PositiveFloat, CONFIG] = Field(300.0, le=65536)
    window_width_max: Annotated[PositiveFloat, CONFIG] = Field(2000.0, le=65536)
    # PIL by default: as fast as torchvision.io on 16-bit PNG here (scripts/bench_decode.py), whose decoders
    # torchvision 0.29 deprecates.
    decoder: Annotated[Literal["pil", "torchvision"], CONFIG] = Field("pil", description="PNG (or JPEG) decoding")


class CtPngData(_HuWindow):
    """CT slices from `dinox preprocess`: each sample stacks slices z-1, z, z+1 of its series."""

    source: Annotated[Literal["ct_png"], CONFIG] = "ct_png"
    index_csv: Annotated[str, CONFIG] = Field(min_length=1, description="the index.csv that dinox preprocess wrote")
    root: Annotated[str | None, CONFIG] = Field(
        None, description="folder png_path is relative to; null: the folder above _index/"
    )
    subset_size: Annotated[PositiveInt | None, CONFIG] = Field(
        None, le=10**12, description="use only this many slices (drawn with seed)"
    )
    seed: Annotated[NonNegativeInt, CONFIG] = Field(0, le=MAX_SEED)
    inflation: Annotated[PositiveInt, CONFIG] = Field(
        1, le=10**9, description="repeat the (sub)set this many times, without copying files"
    )


def _shards(value: str) -> str:
    from dinox.spec import shard_urls

    why = shard_urls.problem(value)
    if why:
        raise PydanticCustomError("shards", why)
    return value


_AUTO_AUGMENT = r"^(rand|augmix|original|originalr|v0|v0r|3a)(-[a-z]+[0-9.]*)*$"


class AugmentSpec(Section):
    """timm's training transform, ``timm.data.create_transform(is_training=True)``, knob for knob: a random
    resized crop, flips, colour jitter, an auto-augment policy, interpolation; random erasing runs on the
    device batch, as timm's prefetching loader runs it."""

    scale: tuple[float, float] = Field((0.08, 1.0), description="RandomResizedCrop's area range")
    ratio: tuple[float, float] = Field((0.75, 1.3333333333333333), description="RandomResizedCrop's aspect range")
    hflip: float = Field(0.5, ge=0.0, le=1.0)
    vflip: float = Field(0.0, ge=0.0, le=1.0)
    color_jitter: float = Field(0.4, ge=0.0, le=10.0, description="0: off (ignored when auto_augment is set)")
    auto_augment: str | None = Field(
        None, max_length=200, pattern=_AUTO_AUGMENT, description="a timm policy, e.g. rand-m9-mstd0.5"
    )
    interpolation: Literal["bilinear", "bicubic", "random"] = "bilinear"
    re_prob: float = Field(0.0, ge=0.0, le=1.0, description="random erasing probability (on the device batch)")
    re_mode: Literal["const", "rand", "pixel"] = "const"
    re_count: PositiveInt = Field(1, le=16)


class MixupSpec(Section):
    """``timm.data.Mixup`` on the device batch, inside the step, as timm's train.py applies it (the loss then
    takes soft targets). Needs a classification objective and an even batch."""

    mixup_alpha: NonNegativeFloat = Field(0.8, le=100.0)
    cutmix_alpha: NonNegativeFloat = Field(1.0, le=100.0)
    prob: float = Field(1.0, ge=0.0, le=1.0)
    switch_prob: float = Field(0.5, ge=0.0, le=1.0)
    mode: Literal["batch", "pair", "elem"] = "batch"
    label_smoothing: float = Field(0.1, ge=0.0, lt=1.0)


class _ImagePipeline(Section):
    # An image's pipeline: decoded (PIL or torchvision.io), timm's transform, timm's Mixup on the device.
    augment: Annotated[AugmentSpec | None, CONFIG] = Field(None, description="null: resize and center crop only")
    mixup: Annotated[MixupSpec | None, CONFIG] = Field(None, description="null: no Mixup / CutMix")


class ImageFolderData(_ImagePipeline):
    """An ImageNet-style tree, root/<class>/<image>, JPEG or PNG: classes are the sorted folder names."""

    source: Annotated[Literal["image_folder"], CONFIG] = "image_folder"
    root: Annotated[str, CONFIG] = Field(min_length=1, description="the folder of class folders")
    decoder: Annotated[Literal["pil", "torchvision"], CONFIG] = Field(
        "pil", description="PIL, or torchvision.io.decode_image"
    )
    decode_device: Annotated[Literal["cpu", "cuda"], CONFIG] = Field(
        "cpu", description="cuda: workers hand over the encoded bytes, the step decodes them with nvJPEG"
    )
    seed: Annotated[NonNegativeInt, CONFIG] = Field(0, le=MAX_SEED)


class WebDatasetData(_HuWindow, _ImagePipeline):
    """Tar shards streamed with webdataset, split across workers and hosts: CT slices from `dinox shards`, or
    images (`jpg`/`png` with `cls`, as `dinox shards --image-folder` and other tools write them)."""

    source: Annotated[Literal["webdataset"], CONFIG] = "webdataset"
    shards: Annotated[str, AfterValidator(_shards), CONFIG] = Field(
        min_length=1,
        max_length=4096,
        description="a folder of .tar shards, a glob, a brace pattern a-{000..009}.tar, or http(s):// URLs",
    )
    shuffle_buffer: Annotated[NonNegativeInt, CONFIG] = Field(1000, le=10_000_000)
    seed: Annotated[NonNegativeInt, CONFIG] = Field(0, le=MAX_SEED)


class PythonData(Section):
    """The team's own dataset: `entry` names a callable that receives a context (the image size, channels,
    classes, the objective's views, `options`) and returns a torch Dataset (map-style or iterable) whose
    samples the DataLoader batches as the objective takes them: (image, label) for classification and a
    team's own step, (list of views, label) for DINO."""

    source: Annotated[Literal["python"], CONFIG] = "python"
    entry: Annotated[str, AfterValidator(entry_name), CONFIG] = Field(
        description="module:callable, imported in the trial's own process (never by decide, sync or the UI)"
    )
    path: Annotated[str, STEER] = Field(
        ".", min_length=1, max_length=4096, description="the folder the module is imported from (the working one)"
    )
    options: Annotated[dict[str, JsonValue], AfterValidator(sane_kwargs), CONFIG] = Field(
        default_factory=dict, description="passed to the entry as context.options"
    )
    normalize: Annotated[bool, CONFIG] = Field(
        False,
        description="the samples are uint8 images (0-255): dinox normalises them on the device, as timm's loaders "
        "do; false: they reach the step as the dataset made them",
    )
    code: Annotated[str | None, CONFIG] = Field(None, description="set by dinox: sha256 of the entry's source")
    file: Annotated[str | None, STEER] = Field(None, description="set by dinox: the file the entry's module is in")


DataSource = Annotated[
    Annotated[SyntheticData, Tag("synthetic")]
    | Annotated[CtPngData, Tag("ct_png")]
    | Annotated[WebDatasetData, Tag("webdataset")]
    | Annotated[ImageFolderData, Tag("image_folder")]
    | Annotated[PythonData, Tag("python")],
    tag_or("source", "synthetic"),
]

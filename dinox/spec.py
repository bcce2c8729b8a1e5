"""The user-facing spec: pydantic models, safe YAML loading, errors that name file, line and field path.

A spec file is a single-valued training configuration plus an optional ``sweep`` section. This module
validates one *trial* (a configuration with every sweep value filled in); ``grid.py`` expands the sweep and
asks this module to validate each point. Torch is never imported here: specs are checked before any child
process exists.
"""

from __future__ import annotations

import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    NonNegativeFloat,
    NonNegativeInt,
    PlainValidator,
    PositiveFloat,
    PositiveInt,
    Tag,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from dinox.roles import BATCH, CONFIG, DECISION, MEASURE, MEMORY, SEARCH, SHAPE, STEER, RoleTable, shown

Precision = Literal["fp32", "tf32", "bf16-mixed", "fp16-mixed"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
DeviceKind = Literal["auto", "cuda", "cpu", "mps"]

# Keys dinox sets on timm.create_model itself; accepting them in model.kwargs would let two places
# disagree about the same knob.
_RESERVED_MODEL_KWARGS = {
    "pretrained": "weights are never downloaded; dinox always builds with pretrained=False",
    "img_size": "set model.img_size instead",
    "num_classes": "set objective.num_classes instead",
    # Each of these makes timm read a file or a hub: a spec measures an untrained model and reads nothing else.
    "checkpoint_path": "dinox measures untrained models; it never loads a checkpoint",
    "pretrained_cfg": "dinox never loads pretrained weights or their configuration",
    "pretrained_cfg_overlay": "dinox never loads pretrained weights or their configuration",
    "cache_dir": "dinox never downloads anything",
}


class _Section(BaseModel):
    # frozen: a validated trial is a value; extra=forbid: a typo is an error, never a silent default.
    # allow_inf_nan=False: "inf" and "nan" are never sizes, rates or times.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# Upper bounds: what no real trial exceeds, so an absurd number (2**64 + 1 warm-up steps, a timeout of 3e302 s)
# is an error that names its field, not an overflow deep in a trial or a decision.
MAX_PIXELS = 16_384  # image and crop sides
MAX_BATCH = 1_048_576
MAX_STEPS = 1_000_000
MAX_SEED = 2**63 - 1
MAX_IMAGES = 10**16  # a schedule: 100 epochs of 10^14 images


def _timm_name(value: str) -> str:
    # timm reads "hf-hub:org/name" and "local-dir:/path" from a hub or a folder; dinox builds registered
    # architectures only (a pretrained tag after a dot, vit_base_patch16_224.augreg_in1k, is fine).
    if ":" in value or "/" in value or "\\" in value:
        raise PydanticCustomError(
            "timm_name", "a timm architecture name (hf-hub: and local-dir: sources are never loaded)"
        )
    return value


def _sane_kwargs(value: dict[str, JsonValue]) -> dict[str, JsonValue]:
    # Free-form, but numbers in it are model sizes and rates: finite and not astronomically large.
    def check(v: JsonValue) -> None:
        if isinstance(v, float) and not (math.isfinite(v) and abs(v) <= 1e9):
            raise PydanticCustomError("kwarg_number", f"{v} is not a usable model argument (finite, at most 1e9)")
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 10**9:
            raise PydanticCustomError("kwarg_number", f"{v} is not a usable model argument (at most 1e9)")
        for item in v.values() if isinstance(v, dict) else v if isinstance(v, list) else ():
            check(item)

    check(value)
    return value


class ModelSpec(_Section):
    name: Annotated[str, AfterValidator(_timm_name), SHAPE] = Field(
        min_length=1, max_length=200, description="any timm model name; weights are never downloaded"
    )
    kwargs: Annotated[dict[str, JsonValue], AfterValidator(_sane_kwargs), SHAPE] = Field(
        default_factory=dict, description="passed to timm.create_model (embed_dim, depth, num_heads, ...)"
    )
    img_size: Annotated[PositiveInt, shown(SHAPE)] = Field(224, le=MAX_PIXELS)
    grad_checkpointing: Annotated[bool, shown(SHAPE)] = False
    compile: Annotated[bool | CompileMode, shown(MEMORY)] = Field(
        False, description="false | true | a torch.compile mode"
    )
    channels_last: Annotated[bool, shown(MEMORY)] = False


class ClassificationObjective(_Section):
    kind: Annotated[Literal["classification"], SHAPE] = "classification"
    num_classes: Annotated[PositiveInt, SHAPE] = Field(1000, le=10_000_000)
    label_smoothing: Annotated[float, CONFIG] = Field(0.0, ge=0.0, lt=1.0)


class DinoObjective(_Section):
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


def _tag_or(key: str, default: str):
    """A discriminator that reads `key`, defaulting to `default`: `objective: {num_classes: 10}` is a
    classification objective, `data: {seed: 1}` synthetic data, without writing the tag."""

    def pick(value: Any) -> str:
        if isinstance(value, dict):
            return str(value.get(key, default))
        return str(getattr(value, key, default))

    return Discriminator(pick)


Objective = Annotated[
    Annotated[ClassificationObjective, Tag("classification")] | Annotated[DinoObjective, Tag("dino")],
    _tag_or("kind", "classification"),
]


def _batch_size(value: Any) -> int | str:
    # One message for the two forms, instead of pydantic's one error per union member.
    if value == "auto":
        return "auto"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PydanticCustomError("int_type", "Input should be a valid integer or 'auto'")
    if value <= 0:
        raise PydanticCustomError("greater_than", "Input should be greater than 0")
    if value > MAX_BATCH:
        raise PydanticCustomError("less_than_equal", f"Input should be less than or equal to {MAX_BATCH}")
    return value


class BatchSpec(_Section):
    size: Annotated[int | Literal["auto"], PlainValidator(_batch_size), shown(BATCH)] = Field(
        32, description="physical batch per device and micro-step; auto: the largest that fits, less auto_margin"
    )
    accumulation: Annotated[PositiveInt | None, shown(CONFIG)] = Field(
        None, le=100_000, description="micro-batches per optimizer step"
    )
    effective: Annotated[PositiveInt | None, shown(CONFIG)] = Field(
        None, le=10**9, description="images per optimizer step (size x accumulation x gpus); derives accumulation"
    )
    auto_min: Annotated[PositiveInt, SEARCH] = Field(
        1, le=MAX_BATCH, description="size auto: the first batch probed (then doubled)"
    )
    auto_max: Annotated[PositiveInt, SEARCH] = Field(
        1024, le=MAX_BATCH, description="size auto: the largest batch probed"
    )
    auto_margin: Annotated[float, SEARCH] = Field(
        0.10, ge=0.0, lt=1.0, description="size auto: the share of the largest fitting batch left unused"
    )

    @property
    def auto(self) -> bool:
        return self.size == "auto"


class OptimizerSpec(_Section):
    name: Annotated[Literal["adamw", "sgd"], MEMORY] = "adamw"
    lr: Annotated[PositiveFloat, CONFIG] = Field(1.0e-3, le=100.0)
    weight_decay: Annotated[NonNegativeFloat, CONFIG] = Field(0.05, le=100.0)
    momentum: Annotated[float | None, MEMORY] = Field(None, ge=0.0, lt=1.0, description="sgd only (default 0.9)")
    fused: Annotated[bool | None, shown(MEMORY)] = Field(
        None, description="null: fused kernels where the device supports them"
    )


class LoaderSpec(_Section):
    num_workers: Annotated[NonNegativeInt, shown(CONFIG)] = Field(0, le=1024)
    pin_memory: Annotated[bool, shown(CONFIG)] = False
    prefetch_factor: Annotated[PositiveInt | None, shown(CONFIG)] = Field(
        None, le=1024, description="batches per worker; null: 2 (torch)"
    )
    persistent_workers: Annotated[bool, shown(CONFIG)] = False


class SyntheticData(_Section):
    source: Annotated[Literal["synthetic"], CONFIG] = "synthetic"
    num_samples: Annotated[PositiveInt | None, CONFIG] = Field(
        None, le=10**12, description="dataset length; null: exactly what the measured steps consume (no epoch edge)"
    )
    seed: Annotated[NonNegativeInt, CONFIG] = Field(0, le=MAX_SEED)
    sample_delay_ms: Annotated[NonNegativeFloat, CONFIG] = Field(
        0.0, le=60_000.0, description="a wait added to every sample: a slow disk or decoder, as a what-if"
    )


class _HuWindow(_Section):
    # A random HU window per view, as in the loader study: level and width drawn uniformly.
    window_level_min: Annotated[float, CONFIG] = Field(-700.0, ge=-32768, le=32767)
    window_level_max: Annotated[float, CONFIG] = Field(100.0, ge=-32768, le=32767)
    window_width_min: Annotated[PositiveFloat, CONFIG] = Field(300.0, le=65536)
    window_width_max: Annotated[PositiveFloat, CONFIG] = Field(2000.0, le=65536)
    # PIL by default: as fast as torchvision.io on 16-bit PNG here (scripts/bench_decode.py), whose decoders
    # torchvision 0.29 deprecates.
    decoder: Annotated[Literal["pil", "torchvision"], CONFIG] = Field("pil", description="16-bit PNG decoding")


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
    from dinox import shard_urls

    why = shard_urls.problem(value)
    if why:
        raise PydanticCustomError("shards", why)
    return value


class WebDatasetData(_HuWindow):
    """Tar shards from `dinox shards`, streamed with webdataset, split across workers and hosts."""

    source: Annotated[Literal["webdataset"], CONFIG] = "webdataset"
    shards: Annotated[str, AfterValidator(_shards), CONFIG] = Field(
        min_length=1,
        max_length=4096,
        description="a folder of .tar shards, a glob, a brace pattern a-{000..009}.tar, or http(s):// URLs",
    )
    shuffle_buffer: Annotated[NonNegativeInt, CONFIG] = Field(1000, le=10_000_000)
    seed: Annotated[NonNegativeInt, CONFIG] = Field(0, le=MAX_SEED)


DataSource = Annotated[
    Annotated[SyntheticData, Tag("synthetic")]
    | Annotated[CtPngData, Tag("ct_png")]
    | Annotated[WebDatasetData, Tag("webdataset")],
    _tag_or("source", "synthetic"),
]


class HardwareSpec(_Section):
    device: Annotated[DeviceKind, MEMORY] = "auto"
    gpus: Annotated[PositiveInt, MEMORY] = Field(
        1, le=1024, description="ranks per trial: > 1 launches torchrun with DDP (NCCL; gloo on cpu)"
    )
    memory_limit_gb: Annotated[PositiveFloat | None, MEMORY] = Field(
        None, le=1e6, description="cap per trial in GiB: CUDA memory fraction, or a data-segment limit on CPU"
    )
    peak_tflops: Annotated[PositiveFloat | None, STEER] = Field(None, le=1e6)


class MeasureSpec(_Section):
    warmup_steps: Annotated[NonNegativeInt, MEASURE] = Field(5, le=MAX_STEPS)
    bench_steps: Annotated[PositiveInt, MEASURE] = Field(
        20, le=MAX_STEPS, description="timed optimizer steps per window"
    )
    repeats: Annotated[PositiveInt, MEASURE] = Field(
        3, le=1000, description="timed windows, back to back; their spread measures stability"
    )
    unstable_threshold: Annotated[PositiveFloat, STEER] = Field(
        0.10,
        le=10.0,
        description="(fastest - slowest) / median window throughput above which a trial is tagged unstable",
    )
    timeout_s: Annotated[PositiveFloat, STEER] = Field(
        1800.0, le=30 * 86400.0, description="hard limit on the whole child process (at most 30 days)"
    )
    ablation: Annotated[bool, STEER] = Field(
        True,
        description="after the timed windows: a compute-only and a no-loader window (loader_cost, transfer_cost) "
        "and a loader-only window (loader_images_per_s)",
    )
    ablation_steps: Annotated[PositiveInt | None, STEER] = Field(
        None, le=MAX_STEPS, description="steps of each ablation window; null: measure.bench_steps"
    )
    bound_threshold: Annotated[float, STEER] = Field(
        0.10,
        gt=0.0,
        lt=1.0,
        description="share of step time waiting on the loader (or copying) that makes a trial io_bound "
        "(or transfer_bound)",
    )


class BudgetSpec(_Section):
    days: PositiveFloat = Field(le=3650.0, description="compute budget in days (at most ten years)")
    dataset_size: PositiveInt | None = Field(None, le=10**14)
    epochs: PositiveFloat | None = Field(None, le=1e6)
    target_images: PositiveInt | None = Field(None, le=MAX_IMAGES)


class SweepSpec(_Section):
    grid: dict[str, Annotated[list[JsonValue], Field(min_length=1)]] = Field(
        default_factory=dict, description="cartesian product over dotted paths"
    )
    cases: list[Annotated[dict[str, JsonValue], Field(min_length=1)]] = Field(
        default_factory=list, description="values that change together; crossed with grid"
    )


_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,99}")


def _experiment_name(value: str) -> str:
    # The name is also a folder of the sweep's journal: "." or ".." would be the parent folder.
    if not _NAME.fullmatch(value):
        raise PydanticCustomError("experiment_name", "1 to 100 letters, digits, '_', '.' or '-', not starting with '.'")
    return value


class TrialSpec(_Section):
    """One grid point: every knob single-valued."""

    name: Annotated[str, AfterValidator(_experiment_name), STEER] = Field(
        description="MLflow experiment name, also a folder name: letters, digits, _ . - (not first: .)"
    )
    model: ModelSpec
    objective: Objective = ClassificationObjective()
    precision: Annotated[Precision, shown(MEMORY)] = "fp32"
    batch: BatchSpec = BatchSpec()
    optimizer: OptimizerSpec = OptimizerSpec()
    loader: LoaderSpec = LoaderSpec()
    data: DataSource = SyntheticData()
    hardware: HardwareSpec = HardwareSpec()
    measure: MeasureSpec = MeasureSpec()
    budget: Annotated[BudgetSpec | None, DECISION] = None

    @property
    def size(self) -> int:
        """The physical batch; a trial with batch.size auto has none until the sweep has probed for it."""
        if self.batch.size == "auto":
            raise ValueError("batch.size is auto: resolve it first (dinox.autobatch)")
        return self.batch.size

    @property
    def accumulation(self) -> int:
        if self.batch.accumulation is not None:
            return self.batch.accumulation
        if self.batch.effective is not None:
            return self.batch.effective // (self.size * self.hardware.gpus)
        return 1

    @property
    def effective_batch(self) -> int:
        return self.size * self.accumulation * self.hardware.gpus

    def with_batch(self, size: int) -> TrialSpec:
        """This trial at a concrete physical batch; batch.effective, when given, sets the accumulation."""
        return self.model_copy(update={"batch": self.batch.model_copy(update={"size": size})})

    def flat_params(self) -> dict[str, str]:
        """The trial as dotted names -> strings: the MLflow params, and the input of the trial id."""
        data = self.model_dump(mode="json")
        if not self.batch.auto:
            data["batch"]["accumulation"] = self.accumulation
            data["batch"]["effective"] = self.effective_batch
        flat: dict[str, str] = {}
        _flatten(data, "", flat)
        # The search bounds mean nothing for a fixed batch: they would only make equal trials look different.
        dropped = ("decision",) if self.batch.auto else ("decision", "search")
        return {k: v for k, v in flat.items() if ROLES.role(k) not in dropped}


def _flatten(value: Any, prefix: str, out: dict[str, str]) -> None:
    if isinstance(value, dict) and value:
        for key in sorted(value):
            _flatten(value[key], f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = "{}" if isinstance(value, dict) else str(value)


# Each field's role (dinox.roles), walked once: the trial id, OOM pruning, decide's groups and the footprint read it.
ROLES = RoleTable.of(TrialSpec)


# --- consistency rules that span fields (pydantic checks the shape, these check the meaning) ---------


def consistency_problems(t: TrialSpec) -> list[tuple[str, str]]:
    """Contradictions inside one valid-shaped trial, as (field path, message)."""
    problems: list[tuple[str, str]] = []
    b, lo, hw = t.batch, t.loader, t.hardware
    if b.auto:
        if b.accumulation is not None and b.effective is not None:
            problems.append(
                (
                    "batch.accumulation",
                    "with batch.size auto give batch.accumulation (the effective "
                    "batch follows from the batch found) or batch.effective (the "
                    "accumulation follows), not both",
                )
            )
        if b.auto_min > b.auto_max:
            problems.append(("batch.auto_min", f"{b.auto_min} > batch.auto_max {b.auto_max}"))
        elif b.effective is not None and b.effective % hw.gpus:
            problems.append(("batch.effective", f"{b.effective} is not a multiple of hardware.gpus {hw.gpus}"))
        elif b.effective is not None and b.auto_min * hw.gpus > b.effective:
            problems.append(
                ("batch.auto_min", f"{b.auto_min} x hardware.gpus {hw.gpus} > batch.effective {b.effective}")
            )
    elif b.effective is not None:
        per_step = b.size * hw.gpus
        if b.effective % per_step:
            problems.append(
                (
                    "batch.effective",
                    f"{b.effective} is not a multiple of batch.size {b.size} x hardware.gpus {hw.gpus} = {per_step}",
                )
            )
        elif b.accumulation is not None and b.accumulation * per_step != b.effective:
            problems.append(
                (
                    "batch.accumulation",
                    f"{b.accumulation} does not match batch.effective {b.effective} / (batch.size {b.size} x "
                    f"hardware.gpus {hw.gpus}) = {b.effective // per_step}; give one of them",
                )
            )
    if lo.num_workers == 0:
        if lo.prefetch_factor is not None:
            problems.append(
                (
                    "loader.prefetch_factor",
                    f"{lo.prefetch_factor} needs loader.num_workers > 0 (this trial has 0 workers); leave it "
                    "unset when sweeping workers through 0, torch then prefetches 2 batches per worker",
                )
            )
        if lo.persistent_workers:
            problems.append(("loader.persistent_workers", "true needs loader.num_workers > 0"))
    if t.model.compile is not False and t.measure.warmup_steps == 0:
        problems.append(
            (
                "measure.warmup_steps",
                "0 with model.compile on would put compilation inside the timed steps; use at least 1",
            )
        )
    for key, why in _RESERVED_MODEL_KWARGS.items():
        if key in t.model.kwargs:
            problems.append((f"model.kwargs.{key}", why))
    if t.optimizer.momentum is not None and t.optimizer.name != "sgd":
        problems.append(("optimizer.momentum", f"applies to sgd only, not {t.optimizer.name}"))
    if hw.gpus > 1 and hw.device == "mps":
        problems.append(("hardware.gpus", f"{hw.gpus}: MPS has one device; multi-device trials need cuda or cpu"))
    if hw.device == "cpu" and lo.pin_memory:
        problems.append(("loader.pin_memory", "true has no effect with hardware.device cpu"))
    if isinstance(t.data, (CtPngData, WebDatasetData)):
        d = t.data
        if d.window_level_min > d.window_level_max:
            problems.append(("data.window_level_min", f"{d.window_level_min} > window_level_max {d.window_level_max}"))
        if d.window_width_min > d.window_width_max:
            problems.append(("data.window_width_min", f"{d.window_width_min} > window_width_max {d.window_width_max}"))
    if isinstance(t.objective, DinoObjective):
        o = t.objective
        if o.global_crops + o.local_crops < 2:
            problems.append(("objective.local_crops", "DINO compares views: global_crops + local_crops must be >= 2"))
    if t.budget is not None:
        bu = t.budget
        by_epochs = bu.dataset_size is not None or bu.epochs is not None
        if bu.target_images is not None and by_epochs:
            problems.append(("budget", "give target_images or dataset_size with epochs, not both"))
        elif bu.target_images is None and (bu.dataset_size is None or bu.epochs is None):
            problems.append(("budget", "needs target_images, or dataset_size together with epochs"))
    return problems


# --- errors ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    path: str
    message: str
    line: int | None = None
    context: str | None = None  # which trials, when the problem comes from sweep values

    def render(self, file: str) -> str:
        where = f"{file}:{self.line}" if self.line else file
        ctx = f" [{self.context}]" if self.context else ""
        path = f"{self.path}: " if self.path else ""
        return f"{where}: {path}{self.message}{ctx}"


class SpecError(Exception):
    """Bad input. Rendered as one line per problem: ``file:line: field.path: message``."""

    def __init__(self, file: str, problems: list[Problem]):
        self.file = file
        self.problems = problems
        super().__init__(self.render())

    def render(self, limit: int = 20) -> str:
        lines = [p.render(self.file) for p in self.problems[:limit]]
        if len(self.problems) > limit:
            lines.append(f"{self.file}: ... and {len(self.problems) - limit} more problems")
        return "\n".join(lines)


# --- loading ---------------------------------------------------------------------------------------


@dataclass
class SpecDocument:
    """A parsed spec file before expansion: the base mapping, the sweep, and where each key sits."""

    path: str
    text: str
    base: dict[str, Any]
    sweep: SweepSpec
    lines: dict[tuple[str, ...], int] = field(default_factory=dict)

    def line_of(self, path: tuple[str, ...]) -> int | None:
        # The deepest key that exists in the file: an unknown nested value still points at its parent.
        for n in range(len(path), 0, -1):
            if path[:n] in self.lines:
                return self.lines[path[:n]]
        return None


MAX_SPEC_BYTES = 1_000_000
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 32


def load(path: str | Path) -> SpecDocument:
    """Read and safely parse a spec file; validate the sweep section's shape. Raises SpecError."""
    name = str(path)
    try:
        raw_bytes = Path(path).read_bytes()
    except OSError as e:
        raise SpecError(name, [Problem("", f"cannot read spec: {e.strerror or e}")]) from None
    if len(raw_bytes) > MAX_SPEC_BYTES:
        raise SpecError(name, [Problem("", f"spec is {len(raw_bytes)} bytes; the limit is {MAX_SPEC_BYTES}")])
    try:
        text = raw_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(name, [Problem("", f"spec is not UTF-8 text ({e.reason} at byte {e.start})")]) from None
    depth_problem = _nesting_problem(text)
    if depth_problem is not None:
        raise SpecError(name, [depth_problem])
    try:
        # SafeLoader only: a spec can never construct python objects (no !!python tags). Composed once:
        # the node tree gives the line numbers, and the same tree is constructed into the data.
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(name, [Problem("", f"not valid YAML: {problem}", mark.line + 1 if mark else None)]) from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise SpecError(name, [Problem("", f"a spec is a YAML mapping of sections; this is {got}")])
    if node is not None and _expanded_size(node, MAX_YAML_NODES) > MAX_YAML_NODES:
        raise SpecError(
            name,
            [
                Problem(
                    "",
                    f"the YAML expands to more than {MAX_YAML_NODES} values through "
                    "anchors and aliases; a spec needs far fewer",
                )
            ],
        )
    lines: dict[tuple[str, ...], int] = {}
    duplicates: list[Problem] = []
    if node is not None:
        _index_lines(node, (), lines, duplicates)
    if duplicates:
        # PyYAML keeps the last of two equal keys; a section written twice would silently lose the first.
        raise SpecError(name, duplicates)
    sweep_raw = data.pop("sweep", None) or {}
    try:
        sweep = SweepSpec.model_validate(sweep_raw)
    except ValidationError as e:
        doc = SpecDocument(name, text, data, SweepSpec(), lines)
        raise SpecError(name, problems_from_validation(e, doc, ("sweep",), SweepSpec)) from None
    doc = SpecDocument(name, text, data, sweep, lines)
    _check_sweep_paths(doc)
    return doc


def _nesting_problem(text: str) -> Problem | None:
    """Mappings and lists nested deeper than MAX_YAML_DEPTH. PyYAML composes a document recursively, so a
    2 KB file nested 500 deep ends in a RecursionError; its event stream is flat, so it is read first."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    line = event.start_mark.line + 1 if event.start_mark else None
                    return Problem(
                        "", f"YAML nested more than {MAX_YAML_DEPTH} levels deep; a spec needs far fewer", line
                    )
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.YAMLError:
        return None  # the loader reports it, with its line
    return None


def _expanded_size(node: yaml.Node, limit: int) -> int:
    """Nodes visited with every alias expanded, stopping past `limit`: PyYAML shares aliased nodes, so a
    "billion laughs" document is small in memory, but anything that walks it (validation) would not be."""
    seen, stack = 0, [node]
    while stack and seen <= limit:
        n = stack.pop()
        seen += 1
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                stack += (k, v)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
    return seen


def _index_lines(
    node: yaml.Node, path: tuple[str, ...], out: dict[tuple[str, ...], int], duplicates: list[Problem]
) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if (*path, key) in out:
                first = out[(*path, key)]
                duplicates.append(Problem(".".join((*path, key)), f"duplicate key (first given on line {first})", line))
            out[(*path, key)] = line
            _index_lines(value_node, (*path, key), out, duplicates)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[(*path, str(i))] = item.start_mark.line + 1
            _index_lines(item, (*path, str(i)), out, duplicates)


def _check_sweep_paths(doc: SpecDocument) -> None:
    problems: list[Problem] = []
    grid_keys = set(doc.sweep.grid)
    located: list[tuple[str, tuple[str, ...]]] = [(k, ("sweep", "grid", k)) for k in doc.sweep.grid]
    for i, case in enumerate(doc.sweep.cases):
        located += [(k, ("sweep", "cases", str(i), k)) for k in case]
        both = sorted(grid_keys & set(case))
        if both:
            problems.append(
                Problem(
                    f"sweep.cases[{i}]",
                    f"{', '.join(both)} is also swept by sweep.grid; sweep it in one place",
                    doc.line_of(("sweep", "cases", str(i))),
                )
            )
    for dotted, where in located:
        message = path_problem(dotted)
        if message:
            section = "sweep.grid" if where[1] == "grid" else f"sweep.cases[{where[2]}]"
            problems.append(Problem(f"{section}[{dotted!r}]", message, doc.line_of(where)))
    if problems:
        raise SpecError(doc.path, problems)


def path_problem(dotted: str) -> str | None:
    """Why a dotted sweep path does not name a field of a trial, or None if it does."""
    parts = dotted.split(".")
    if parts[0] in ("sweep", "name"):
        return f"{parts[0]} cannot be swept"
    model: Any = TrialSpec
    for i, part in enumerate(parts):
        fields = _model_fields(model)
        if fields is None:
            # Inside a free-form mapping (model.kwargs): any key is data.
            return None
        if part not in fields:
            return f"no field {part!r} in {'.'.join(parts[:i]) or 'the spec'}{_did_you_mean(part, fields)}"
        model = fields[part]
    return None


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """Every pydantic model inside an annotation, through Optional, unions and Annotated wrappers."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in models_in(arg)]
    return []


def _model_fields(annotation: Any) -> dict[str, Any] | None:
    """Field name -> annotation of the model(s) in an annotation (a union's members merged), else None."""
    models = models_in(annotation)
    if not models:
        return None
    return {k: f.annotation for m in models for k, f in m.model_fields.items()}


def _did_you_mean(word: str, options: Any) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass(frozen=True)
class FieldProblem:
    """A problem at a field location, before it is tied to a file line or a trial."""

    loc: tuple[str, ...]
    message: str


_UNION_TAGS = {"bool", "int", "float", "str", "none", "list", "dict"}


def _is_union_tag(part: str) -> bool:
    # pydantic adds the union member it tried to an error's location ("bool", "literal['a','b']", ...).
    return part in _UNION_TAGS or "[" in part


def _clean_loc(root: Any, loc: tuple[str, ...]) -> tuple[str, ...]:
    """The field path of an error: without the member tags pydantic adds inside unions ("bool",
    "literal[...]", or a discriminator value such as "dino")."""
    out: list[str] = []
    model: Any = root
    for part in loc:
        if _is_union_tag(part):
            continue
        fields = _model_fields(model) if model is not None else None
        if fields is not None and part in fields:
            out.append(part)
            model = fields[part]
        elif fields is not None and part in _discriminator_values(model):
            continue
        else:
            out.append(part)
            model = None
    return tuple(out)


def _discriminator_values(annotation: Any) -> set[str]:
    """The tags of a union of models: the values of their Literal fields (kind, source)."""
    models = models_in(annotation)
    if len(models) < 2:
        return set()
    return {
        str(v)
        for m in models
        for f in m.model_fields.values()
        if typing.get_origin(f.annotation) is Literal
        for v in typing.get_args(f.annotation)
    }


def field_problems(err: ValidationError, root: Any) -> list[FieldProblem]:
    """pydantic errors as field problems: one per field, with a did-you-mean for unknown keys and the value."""
    grouped: dict[tuple[str, ...], tuple[list[str], Any]] = {}
    for e in err.errors(include_url=False):
        loc = _clean_loc(root, tuple(str(p) for p in e["loc"]))
        message = e["msg"]
        if e["type"] == "extra_forbidden":
            owner = _model_fields_at(root, loc[:-1])
            message = "unknown field" + (_did_you_mean(loc[-1], owner) if owner else "")
        elif e["type"] == "union_tag_invalid":
            ctx = e.get("ctx", {})
            expected = [t.strip(" '") for t in str(ctx.get("expected_tags", "")).split(",")]
            tag = str(ctx.get("tag"))
            message = f"{tag!r} is not one of {', '.join(expected)}{_did_you_mean(tag, expected)}"
            e = {**e, "input": None}
        shown = e.get("input") if e["type"] not in ("missing", "extra_forbidden") else None
        messages, _ = grouped.setdefault(loc, ([], shown))
        if message not in messages:
            messages.append(message)
    out = []
    for loc, (messages, shown) in grouped.items():
        text = "; or ".join(messages)
        if shown is not None and not isinstance(shown, (dict, list)):
            got = repr(shown)
            text += f" (got {got if len(got) <= 80 else got[:76] + '...'})"
        out.append(FieldProblem(loc, text))
    return out


def problems_from_validation(
    err: ValidationError, doc: SpecDocument, prefix: tuple[str, ...] = (), root: Any = TrialSpec
) -> list[Problem]:
    return [
        Problem(".".join((*prefix, *fp.loc)), fp.message, doc.line_of((*prefix, *fp.loc)))
        for fp in field_problems(err, root)
    ]


def _model_fields_at(root: Any, loc: tuple[str, ...]) -> dict[str, Any] | None:
    model: Any = root
    for part in loc:
        fields = _model_fields(model)
        if fields is None or part not in fields:
            return None
        model = fields[part]
    return _model_fields(model)


def check_trial(raw: dict[str, Any]) -> TrialSpec | list[FieldProblem]:
    """Validate one expanded trial mapping: the TrialSpec, or everything wrong with it."""
    try:
        trial = TrialSpec.model_validate(raw)
    except ValidationError as e:
        return field_problems(e, TrialSpec)
    problems = consistency_problems(trial)
    if problems:
        return [FieldProblem(tuple(path.split(".")), message) for path, message in problems]
    return trial

"""The user-facing spec as pydantic models: one trial, every knob single-valued, each field with its role.

A spec file is such a configuration plus an optional ``sweep`` section: ``spec_file`` reads it safely and
points at lines, ``grid`` expands the sweep, ``spec_rules`` checks that a trial's fields agree, ``roles`` says
what each field is for. Torch is never imported here: specs are checked before any child process exists.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    JsonValue,
    NonNegativeFloat,
    NonNegativeInt,
    PlainValidator,
    PositiveFloat,
    PositiveInt,
)
from pydantic_core import PydanticCustomError

from dinox.spec.base import MAX_BATCH, MAX_IMAGES, MAX_PIXELS, MAX_STEPS, Section, sane_kwargs
from dinox.spec.data_sources import DataSource, SyntheticData
from dinox.spec.fields import models_in
from dinox.spec.objectives import (
    ClassificationObjective,
    Objective,
)
from dinox.spec.roles import (
    BATCH,
    CONFIG,
    DECISION,
    MEASURE,
    MEMORY,
    SEARCH,
    SHAPE,
    STEER,
    Param,
    RoleTable,
    added,
    shown,
)
from dinox.spec.routine import RoutineSpec
from dinox.spec.runtime import RuntimeSpec

Precision = Literal["fp32", "fp32-strict", "tf32", "bf16-mixed", "fp16-mixed"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
DeviceKind = Literal["auto", "cuda", "cpu", "mps"]


def _timm_name(value: str) -> str:
    # timm reads "hf-hub:org/name" and "local-dir:/path" from a hub or a folder; dinox builds registered
    # architectures only (a pretrained tag after a dot, vit_base_patch16_224.augreg_in1k, is fine).
    if ":" in value or "/" in value or "\\" in value:
        raise PydanticCustomError(
            "timm_name", "a timm architecture name (hf-hub: and local-dir: sources are never loaded)"
        )
    return value


class ModelSpec(Section):
    name: Annotated[str, AfterValidator(_timm_name), SHAPE] = Field(
        min_length=1, max_length=200, description="any timm model name; weights are never downloaded"
    )
    kwargs: Annotated[dict[str, JsonValue], AfterValidator(sane_kwargs), SHAPE] = Field(
        default_factory=dict, description="passed to timm.create_model (embed_dim, depth, num_heads, ...)"
    )
    img_size: Annotated[PositiveInt, shown(SHAPE)] = Field(224, le=MAX_PIXELS)
    grad_checkpointing: Annotated[bool, shown(SHAPE)] = False
    compile: Annotated[bool | CompileMode, shown(MEMORY)] = Field(
        False, description="false | true | a torch.compile mode"
    )
    channels_last: Annotated[bool, shown(MEMORY)] = False
    fused_attention: Annotated[bool | None, added(MEMORY)] = Field(
        None, description="timm's fused attention (F.scaled_dot_product_attention): true / false; null: timm's default"
    )


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


class BatchSpec(Section):
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


class OptimizerSpec(Section):
    name: Annotated[Literal["adamw", "sgd"], MEMORY] = "adamw"
    lr: Annotated[PositiveFloat, CONFIG] = Field(1.0e-3, le=100.0)
    weight_decay: Annotated[NonNegativeFloat, CONFIG] = Field(0.05, le=100.0)
    momentum: Annotated[float | None, MEMORY] = Field(None, ge=0.0, lt=1.0, description="sgd only (default 0.9)")
    fused: Annotated[bool | None, shown(MEMORY)] = Field(
        None, description="null: fused kernels where the device supports them"
    )
    set_to_none: Annotated[bool | None, added(MEMORY)] = Field(
        None, description="zero_grad(set_to_none=...): false zeroes the gradients in place; null: true (torch)"
    )


class LoaderSpec(Section):
    num_workers: Annotated[NonNegativeInt, shown(CONFIG)] = Field(0, le=1024)
    pin_memory: Annotated[bool, shown(CONFIG)] = False
    prefetch_factor: Annotated[PositiveInt | None, shown(CONFIG)] = Field(
        None, le=1024, description="batches per worker; null: 2 (torch)"
    )
    persistent_workers: Annotated[bool, shown(CONFIG)] = False
    device_prefetch: Annotated[bool, added(CONFIG)] = Field(
        False,
        description="copy (and finish on the device) the next micro-batch on a side CUDA stream while the current "
        "one computes, as timm's PrefetchLoader (train.py's default); false: in series on the compute stream, as a "
        "loop that calls .to(device, non_blocking=True) itself",
    )
    non_blocking: Annotated[bool | None, added(CONFIG)] = Field(
        None,
        description="copies to the device with non_blocking=...; null: as pin_memory (a non-blocking copy "
        "needs pinned memory to overlap); no effect on a CPU device",
    )


class HardwareSpec(Section):
    device: Annotated[DeviceKind, MEMORY] = "auto"
    gpus: Annotated[PositiveInt, MEMORY] = Field(
        1, le=1024, description="ranks per trial: > 1 launches torchrun with DDP (NCCL; gloo on cpu)"
    )
    memory_limit_gb: Annotated[PositiveFloat | None, MEMORY] = Field(
        None, le=1e6, description="cap per trial in GiB: CUDA memory fraction, or a data-segment limit on CPU"
    )
    peak_tflops: Annotated[PositiveFloat | None, STEER] = Field(None, le=1e6)


class MeasureSpec(Section):
    warmup_steps: Annotated[NonNegativeInt, MEASURE] = Field(5, le=MAX_STEPS)
    bench_steps: Annotated[PositiveInt, MEASURE] = Field(
        20, le=MAX_STEPS, description="timed optimizer steps per window"
    )
    min_repeats: Annotated[PositiveInt, MEASURE] = Field(
        3,
        le=1000,
        description="timed windows at least (fewer than 3 never gives a settled GO); more while their spread "
        "exceeds unstable_threshold",
    )
    max_repeats: Annotated[PositiveInt, MEASURE] = Field(
        5, le=1000, description="timed windows at most; a trial still unsettled then is tagged unstable"
    )
    repeats: Annotated[PositiveInt | None, MEASURE] = Field(
        None,
        le=1000,
        description="a fixed number of timed windows, overriding min/max_repeats; null: min_repeats to max_repeats",
    )
    unstable_threshold: Annotated[PositiveFloat, STEER] = Field(
        0.10,
        le=10.0,
        description="(fastest - slowest) / median window throughput above which a trial is tagged unstable, "
        "and below which its windows have settled",
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
    profile: Annotated[bool | None, added(STEER)] = Field(
        None,
        description="after the measured windows, a few steps under torch.profiler: a gzipped Chrome/Perfetto trace "
        "kept with the run and a table of the top ops (never inside the measured windows); null: no profile",
    )
    profile_steps: Annotated[PositiveInt | None, added(STEER)] = Field(
        None, le=100, description="steps the profiler records; null: 3"
    )
    bound_threshold: Annotated[float, STEER] = Field(
        0.10,
        gt=0.0,
        lt=1.0,
        description="share of step time waiting on the loader (or copying) that makes a trial io_bound "
        "(or transfer_bound)",
    )

    @property
    def profiled_steps(self) -> int:
        """The steps measure.profile records (0: none)."""
        return (self.profile_steps or 3) if self.profile else 0

    @property
    def window_bounds(self) -> tuple[int, int]:
        """The fewest and the most timed windows."""
        if self.repeats is not None:
            return self.repeats, self.repeats
        return self.min_repeats, self.max_repeats


class BudgetSpec(Section):
    days: PositiveFloat = Field(le=3650.0, description="compute budget in days (at most ten years)")
    dataset_size: PositiveInt | None = Field(None, le=10**14)
    epochs: PositiveFloat | None = Field(None, le=1e6)
    target_images: PositiveInt | None = Field(None, le=MAX_IMAGES)
    price_per_device_hour: PositiveFloat | None = Field(
        None, le=1e6, description="price of one device for one hour, for devices not named in prices"
    )
    prices: dict[str, Annotated[float, Field(gt=0, le=1e6)]] | None = Field(
        None, description="price per device-hour by device name (the dinox.device_name tag)"
    )
    max_cost: PositiveFloat | None = Field(None, le=1e12, description="the whole schedule's cost at most this")

    def schedule_problem(self, names: Mapping[str, str] | None = None) -> str:
        """Why the schedule is not one schedule ("" when it is): images, or a dataset's epochs, exactly one.
        `names` renames the fields in the message (the command line names its options)."""
        n = {k: (names or {}).get(k, k) for k in ("target_images", "dataset_size", "epochs")}
        by_epochs = self.dataset_size is not None or self.epochs is not None
        if self.target_images is not None and by_epochs:
            return f"give {n['target_images']} or {n['dataset_size']} with {n['epochs']}, not both"
        if self.target_images is None and (self.dataset_size is None or self.epochs is None):
            return f"needs {n['target_images']}, or {n['dataset_size']} together with {n['epochs']}"
        return ""


class SweepSpec(Section):
    grid: dict[str, Annotated[list[JsonValue], Field(min_length=1)]] = Field(
        default_factory=dict, description="cartesian product over dotted paths"
    )
    cases: list[Annotated[dict[str, JsonValue], Field(min_length=1)]] = Field(
        default_factory=list, description="values that change together; crossed with grid"
    )
    ladder: list[Annotated[dict[str, JsonValue], Field(min_length=1)]] = Field(
        default_factory=list,
        description="an ablation ladder: changes applied cumulatively to the base, one trial per rung (the first: "
        "the base itself); crossed with grid, not with cases",
    )
    drift_check: bool = Field(
        True,
        description="after the last trial, the sweep's first ok trial measured again (its timed windows only): "
        "how far the box drifted while the sweep ran; decide does not order the sweep's trials by less",
    )


_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,99}")


def _experiment_name(value: str) -> str:
    # The name is also a folder of the sweep's journal: "." or ".." would be the parent folder.
    if not _NAME.fullmatch(value):
        raise PydanticCustomError("experiment_name", "1 to 100 letters, digits, '_', '.' or '-', not starting with '.'")
    return value


class TrialSpec(Section):
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
    runtime: RuntimeSpec | None = None
    routine: RoutineSpec | None = None
    budget: Annotated[BudgetSpec | None, DECISION] = None
    shrunk: Annotated[bool | None, added(MEASURE)] = Field(
        None,
        description="set by --shrink: the spec made small to try here (dinox.plan.shrink); decide will not plan "
        "from such trials unless told (--shrunk); null: the spec as written",
    )

    @property
    def size(self) -> int:
        """The physical batch; a trial with batch.size auto has none until the sweep has probed for it."""
        if self.batch.size == "auto":
            raise ValueError("batch.size is auto: resolve it first (dinox.sweep.batch_search)")
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
        _drop_absent_sections(self, data)
        if not self.batch.auto:
            data["batch"]["accumulation"] = self.accumulation
            data["batch"]["effective"] = self.effective_batch
        flat: dict[str, str] = {}
        _flatten(data, "", flat)
        # The search bounds mean nothing for a fixed batch: they would only make equal trials look different.
        dropped = ("decision",) if self.batch.auto else ("decision", "search")
        return {k: v for k, v in flat.items() if ROLES.role(k) not in dropped}


def _drop_absent_sections(model: BaseModel, data: dict[str, Any]) -> None:
    """An optional section left out (data.augment: null), or a knob added later left null, is no param at all:
    adding one to the spec leaves the ids and params of the trials that do not use it as they were."""
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        marker = next((m for m in info.metadata if isinstance(m, Param)), None)
        if value is None and (models_in(info.annotation) or (marker is not None and marker.added)):
            data.pop(name, None)  # a knob added later, left unset, is no param either
        elif isinstance(value, BaseModel):
            _drop_absent_sections(value, data[name])


def _flatten(value: Any, prefix: str, out: dict[str, str]) -> None:
    if isinstance(value, dict) and value:
        for key in sorted(value):
            _flatten(value[key], f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = "{}" if isinstance(value, dict) else str(value)


# Each field's role (dinox.spec.roles), walked once: the trial id, OOM pruning, decide's groups and the footprint
# read it.
ROLES = RoleTable.of(TrialSpec)

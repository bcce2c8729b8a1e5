"""What a trial will cost before it runs: FLOPs per image, device memory, loader host RAM. No torch here.

The model-dependent figures (parameters, FLOPs, tensors saved for backward) come from ``dinox.estimate``, a
child process that runs one training step on the meta device; this module turns them into a memory plan
for a trial and a verdict against the memory it will have, and turns throughput into TFLOPs and MFU.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dinox import record as rec
from dinox.contract import GIB, TrialResult
from dinox.plan import peaks
from dinox.spec.sections import ROLES, TrialSpec

if TYPE_CHECKING:
    from dinox.plan.grid import Trial

# Under autocast the tensors saved for backward are mostly 16-bit (matmul and attention inputs) but not all
# (LayerNorm inputs, softmax statistics, the loss stay fp32): about this share of the fp32 figure.
MIXED_ACTIVATION_SHARE = 0.6
# Optimizer state per trainable parameter, bytes (fp32): AdamW keeps two moments, SGD one momentum buffer.
OPTIMIZER_BYTES = {"adamw": 8, "sgd": 4}
# The share of a device's (or capped) memory a plan may use before it calls a trial a predicted OOM: the
# estimate leaves out allocator fragmentation, cuDNN/cuBLAS workspaces and temporaries.
HEADROOM = 0.95


@dataclass(frozen=True)
class ModelCost:
    """Measured once per model on the meta device (no memory, no compute)."""

    params: int  # the backbone's parameters ("the model's size")
    trainable_params: int  # what the optimizer updates (a DINO head included)
    frozen_params: int  # weights without gradients (a DINO teacher)
    flops_per_image: float  # one training step (forward + backward), no recomputation, per sample
    saved_bytes_per_image: float  # fp32 tensors saved for backward per sample, at the trial's checkpointing
    sample_bytes: int  # one sample as the loader hands it over (all views, float32, and its label)


@dataclass(frozen=True)
class Machine:
    """What the estimate process saw of the machine the sweep runs on."""

    device: str  # cpu / cuda / mps
    device_name: str
    device_total_gb: float | None  # None: unknown (mps)
    host_total_gb: float
    runtime_gb: float  # a process with torch and timm imported, before any model (what the CPU adds)
    kinds: tuple[str, ...] = ("cpu",)  # the device kinds this machine has: cpu, and cuda / mps where torch sees them
    has: str = ""  # the same in words, for a message: "only a CPU (torch.cuda.is_available() is False)"
    cuda_devices: int = 0  # how many CUDA devices torch sees (--devices all)
    cuda_numa: tuple[int, ...] = ()  # each one's NUMA node, -1 where the machine does not say
    cuda_uuids: tuple[str, ...] = ()  # each one's UUID (GPU-...): the same device for NVML and every child
    matmul_tflops: float | None = None  # fp32 matmul rate measured on the device (0.1 s): a step's floor

    def missing(self, kinds: set[str]) -> list[str]:
        """The device kinds asked for (auto always resolves) that this machine lacks."""
        return sorted(k for k in kinds - {"auto"} if k not in self.kinds)


@dataclass(frozen=True)
class MemoryPlan:
    weights_gb: float
    grads_gb: float
    optimizer_gb: float
    activations_gb: float
    batch_gb: float
    runtime_gb: float  # on the CPU only: the process itself counts against host memory
    loader_host_gb: float  # batches in flight in the loader (workers x prefetch) and pinned copies
    device_limit_gb: float | None
    host_limit_gb: float
    over: str  # "" or why it is predicted not to fit

    @property
    def device_gb(self) -> float:
        return (
            self.weights_gb + self.grads_gb + self.optimizer_gb + self.activations_gb + self.batch_gb + self.runtime_gb
        )

    def metrics(self) -> dict[str, float]:
        return {
            rec.PREDICTED_DEVICE_MEM_GB: self.device_gb,
            rec.PREDICTED_ACTIVATIONS_GB: self.activations_gb,
            rec.PREDICTED_LOADER_HOST_GB: self.loader_host_gb,
        }


def estimate_key(spec: TrialSpec) -> str:
    """Trials with the same key share a ModelCost: the params whose role is the model's shape (dinox.spec.roles),
    and model.fused_attention (what attention saves for backward)."""
    params = spec.flat_params()
    fused = ((FUSED, params[FUSED]),) if FUSED in params else ()
    return json.dumps(ROLES.shape_key(params) + fused)


FUSED = "model.fused_attention"


def plan_memory(spec: TrialSpec, cost: ModelCost, machine: Machine) -> MemoryPlan:
    mixed = spec.precision in ("bf16-mixed", "fp16-mixed")
    b = spec.size
    all_params = cost.trainable_params + cost.frozen_params
    weights = (4 + (2 if mixed else 0)) * all_params  # fp32 weights, and autocast's 16-bit copies
    grads = 4 * cost.trainable_params
    optimizer = OPTIMIZER_BYTES[spec.optimizer.name] * cost.trainable_params
    activations = cost.saved_bytes_per_image * b * (MIXED_ACTIVATION_SHARE if mixed else 1.0)
    batch = cost.sample_bytes * b
    workers = spec.loader.num_workers
    in_flight = workers * (spec.loader.prefetch_factor or 2) if workers else 1
    pinned = 1 if spec.loader.pin_memory and machine.device == "cuda" else 0
    loader_host = (in_flight + pinned) * batch
    on_cpu = machine.device == "cpu"
    limit = spec.hardware.memory_limit_gb
    device_limit = machine.host_total_gb if on_cpu else machine.device_total_gb
    if limit is not None:
        device_limit = min(limit, device_limit) if device_limit is not None else limit
    plan = MemoryPlan(
        weights_gb=weights / GIB,
        grads_gb=grads / GIB,
        optimizer_gb=optimizer / GIB,
        activations_gb=activations / GIB,
        batch_gb=batch / GIB,
        runtime_gb=machine.runtime_gb if on_cpu else 0.0,
        loader_host_gb=loader_host / GIB,
        device_limit_gb=device_limit,
        host_limit_gb=machine.host_total_gb,
        over="",
    )
    reasons = []
    if device_limit is not None and plan.device_gb > HEADROOM * device_limit:
        where = "host memory" if on_cpu and limit is None else "the memory limit" if limit else "device memory"
        reasons.append(f"device {plan.device_gb:.1f} GiB > {HEADROOM:.0%} of {where} ({device_limit:.1f} GiB)")
    ranks = spec.hardware.gpus  # each rank: its own loader, and on the CPU its own copy of everything
    host_use = ranks * (plan.loader_host_gb + (plan.device_gb if on_cpu else 0.0))
    if host_use > HEADROOM * machine.host_total_gb:
        reasons.append(
            f"host {host_use:.1f} GiB (loader {plan.loader_host_gb:.1f} GiB) > {HEADROOM:.0%} of "
            f"{machine.host_total_gb:.1f} GiB"
        )
    return replace(plan, over="; ".join(reasons))


def compute_metrics(
    flops_per_image: float, images_per_s: float, device_name: str, precision: str, override: float | None
) -> tuple[dict[str, float], dict[str, str]]:
    """TFLOPs achieved and MFU against one device's peak (metrics), and where the peak came from (tags): the
    trial's child calls it beside its throughput, each rank for its own (rec.RANKS sums the TFLOPs and averages
    the MFU)."""
    achieved = flops_per_image * images_per_s / 1e12
    metrics = {rec.FLOPS_PER_IMAGE: flops_per_image, rec.TFLOPS: achieved}
    tags: dict[str, str] = {}
    peak = peaks.peak_for(device_name, precision, override)
    if peak is not None:
        metrics[rec.PEAK_TFLOPS] = peak[0]
        metrics[rec.MFU] = achieved / peak[0]
        tags[rec.PEAK_SOURCE] = peak[1]
    return metrics, tags


SLOW_STEP_S = 60.0  # a step floor above this is said before a sweep starts


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


@dataclass
class Estimates:
    """The estimate child's answer for a set of trials; empty when it could not run."""

    machine: Machine | None
    costs: dict[str, ModelCost]
    errors: dict[str, str]  # estimate key (or "machine") -> why there is no figure

    @staticmethod
    def request(specs: list[TrialSpec]) -> dict[str, dict]:
        """What the estimate child needs: one spec per distinct estimate key."""
        return {"specs": {estimate_key(s): s.model_dump(mode="json") for s in specs}}

    @classmethod
    def parse(cls, data: dict | None, failure: str = "") -> Estimates:
        if data is None:
            return cls(None, {}, {"machine": failure or "the estimate process gave no result"})
        machine = None
        if "machine" in data:
            m = data["machine"]
            machine = Machine(
                **{
                    **m,
                    "kinds": tuple(m.get("kinds", ("cpu",))),
                    "cuda_numa": tuple(m.get("cuda_numa", ())),
                    "cuda_uuids": tuple(m.get("cuda_uuids", ())),
                }
            )
        costs = {k: ModelCost(**v) for k, v in data.get("costs", {}).items()}
        return cls(machine, costs, dict(data.get("errors", {})))

    def cost(self, spec: TrialSpec) -> ModelCost | None:
        return self.costs.get(estimate_key(spec))

    def memory(self, spec: TrialSpec) -> MemoryPlan | None:
        cost = self.cost(spec)
        return plan_memory(spec, cost, self.machine) if cost is not None and self.machine is not None else None

    def predicted_ooms(self, trials: list[Trial]) -> list[Trial]:
        """The trials (of a fixed batch) the memory plan predicts to run out of memory."""
        fixed = [t for t in trials if not t.spec.batch.auto]
        return [t for t in fixed if (plan := self.memory(t.spec)) is not None and plan.over]

    def step_floor_s(self, spec: TrialSpec) -> float | None:
        """The least one optimizer step of `spec` can take on one device: its training FLOPs at the device's
        measured fp32 matmul rate, the fastest work a device does (real layers are slower, lower precision
        faster on a GPU). None without a model cost or a measured rate."""
        cost = self.cost(spec)
        rate = self.machine.matmul_tflops if self.machine is not None else None
        if cost is None or not rate or spec.batch.auto:
            return None
        return cost.flops_per_image * spec.batch.size * spec.accumulation / (rate * 1e12)

    def slow_steps(self, trials: list[Trial], over_s: float = SLOW_STEP_S) -> list[str]:
        """A line on what a trial of hours will cost, for `plan` and `run` to say before it starts (the
        headline spec's ViT-g on a CPU: no warm-up step finished in 5 minutes, and nothing said why)."""
        floors = [(f, t) for t in trials if (f := self.step_floor_s(t.spec)) is not None and f > over_s]
        if not floors or self.machine is None:
            return []
        floor, t = max(floors, key=lambda p: p[0])
        m = t.spec.measure
        steps = m.warmup_steps + m.window_bounds[0] * m.bench_steps
        return [
            f"note: {len(floors)} trial(s) take at least {_duration(over_s)} a step on {self.machine.device_name}: "
            f"#{t.index + 1} ({t.label}) at least {_duration(floor)} a step and {_duration(floor * steps)} for its "
            f"{steps} steps, at this device's measured fp32 matmul rate ({self.machine.matmul_tflops:.3g} TFLOP/s); "
            "a spec for another machine: `dinox plan` there, or hardware.device on this one"
        ]

    def largest_fit(self, spec: TrialSpec, limit_gb: float) -> int | None:
        """The largest physical batch the memory plan puts within HEADROOM of `limit_gb` (None: no plan), from
        its two parts: what any batch costs, and what each image adds."""
        cost = self.cost(spec)
        if cost is None or self.machine is None:
            return None
        one, two = (plan_memory(spec.with_batch(b), cost, self.machine).device_gb for b in (1, 2))
        per_image, fixed = two - one, 2 * one - two
        return max(0, int((HEADROOM * limit_gb - fixed) / per_image)) if per_image > 0 else None

    def why_missing(self, spec: TrialSpec) -> str:
        return self.errors.get(estimate_key(spec)) or self.errors.get("machine", "")


def annotate(result: TrialResult, plan: MemoryPlan | None) -> None:
    """The memory plan next to the measured peaks (TFLOPs and MFU the child derived itself: COST_FILE)."""
    if plan is not None:
        result.metrics.update(plan.metrics())
        if plan.over:
            result.tags[rec.PREDICTED_OOM] = plan.over

"""The estimate child: parameters, training FLOPs and saved activations of each model, on the meta device.

Run as ``python -m dinox.measure.estimate REQUEST_JSON RESULT_JSON`` (or forked by the fork server). The request maps
estimate keys to trial specs; the result holds a ModelCost per key (or why it could not be had) and what
the process saw of the machine. On the meta device a training step allocates nothing and computes nothing,
so a ViT-g costs a fraction of a second: FLOPs come from torch.utils.flop_counter over one forward and
backward without checkpointing (recomputation is not useful work), saved activations from the
saved-tensor hooks of autograd; where the model uses fused attention (timm's default, model.fused_attention),
attention saves what a flash kernel saves, not the N x N probabilities of the math path the meta device runs.
With checkpointing, each checkpointed segment is run plainly under its own
hook instead, so the estimate is what checkpointing keeps: the tensors saved outside the segments, every
segment's inputs, and the largest segment's activations (recomputed, one at a time, in backward). A cost
is kept in the user's cache and read back by the next sweep of the same model (dinox.measure.cost_cache);
the result lists those under "cached". MLflow is never imported here.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import psutil
import timm
import torch
import torch.utils.checkpoint
from torch.utils.flop_counter import FlopCounterMode

from dinox import record as rec
from dinox.contract import GIB, one_line
from dinox.data.views import view_plan
from dinox.isolate import lifeline
from dinox.measure import cost_cache, models, objectives, runtime
from dinox.plan.footprint import Machine, ModelCost
from dinox.spec.objectives import DinoObjective, PythonObjective
from dinox.spec.sections import ModelSpec, TrialSpec

SAMPLES = 2  # BatchNorm needs more than one sample in training mode


_CHECKPOINT_OPTIONS = ("use_reentrant", "preserve_rng_state", "context_fn", "determinism_check", "debug")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _Saved:
    """Bytes autograd saves for backward, each storage once (a ReLU output saved by the ReLU and by the next
    layer is one tensor in memory), parameters left out (a layer saves its weight: counted as weights)."""

    def __init__(self, parameters: set[int]):
        self.parameters = parameters
        self.storages: dict[int, int] = {}
        self._alive: list[torch.Tensor] = []  # keeps storages alive, so their ids are not reused meanwhile

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in self.parameters:
            self.storages[key] = storage.nbytes()
            self._alive.append(t)
        return t

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def _storage_ids(tensors: Any) -> set[int]:
    return {t.untyped_storage()._cdata for t in tensors}


@contextlib.contextmanager
def _segments_measured(inputs: list[int], segments: list[int], parameters: set[int]) -> Iterator[None]:
    """torch.utils.checkpoint.checkpoint (which timm calls for every checkpointed block or stage) replaced by
    a plain call that records the segment's input bytes and the bytes its own operations save."""
    original = torch.utils.checkpoint.checkpoint

    def measured(function: Any, *args: Any, **kwargs: Any) -> Any:
        for option in _CHECKPOINT_OPTIONS:
            kwargs.pop(option, None)
        inputs.append(sum(_nbytes(a) for a in args if isinstance(a, torch.Tensor)))
        saved = _Saved(parameters)
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
            out = function(*args, **kwargs)
        segments.append(saved.total)
        return out

    torch.utils.checkpoint.checkpoint = measured  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.utils.checkpoint.checkpoint = original


class _FusedAttention(torch.autograd.Function):
    """What flash and memory-efficient attention keep for backward: q, k, v, the output and the softmax's
    log-sum-exp per query (float32), never the N x N probabilities that the math path (all the meta device
    has) saves."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = q.new_empty(*q.shape[:-1], v.shape[-1])
        ctx.save_for_backward(q, k, v, out, q.new_empty(q.shape[:-1], dtype=torch.float32))
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v, _out, _lse = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@contextlib.contextmanager
def _fused_attention(on: bool) -> Iterator[None]:
    """F.scaled_dot_product_attention as a fused kernel stores for backward, where the model uses it (timm's
    fused_attn, model.fused_attention) and it has no mask (a mask can send it down the math path)."""
    original = torch.nn.functional.scaled_dot_product_attention

    def fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None, *args: Any, **kw: Any) -> Any:
        if attn_mask is not None or args or kw.get("is_causal"):
            return original(q, k, v, attn_mask, *args, **kw)
        return _FusedAttention.apply(q, k, v)

    if on:
        torch.nn.functional.scaled_dot_product_attention = fused  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


def _step(spec: TrialSpec, grad_checkpointing: bool, fused: bool = False) -> tuple[float, float, dict[str, int]]:
    """(training FLOPs, bytes saved for backward, parameter counts) of one step of SAMPLES samples; `fused`:
    attention saves what a fused kernel saves (the FLOPs are then not counted: the plain step counts them)."""
    dino = isinstance(spec.objective, DinoObjective)  # multi-crop views (DINOv2's too)
    num_classes = 0 if dino else spec.objective.num_classes  # type: ignore[union-attr]
    plan = view_plan(spec)
    model_spec = spec.model.model_copy(update={"grad_checkpointing": grad_checkpointing})
    with torch.device("meta"):
        objective, model = _objective(spec, model_spec, num_classes, plan.sizes)
    chans = models.in_chans(spec.model)
    views = [torch.empty(SAMPLES, chans, s, s, device="meta") for s in plan.sizes]
    images: Any = views if dino else views[0]
    labels = torch.zeros(SAMPLES, dtype=torch.long, device="meta")
    everything = {id(p): p for m in _modules(objective) for p in m.parameters()}
    parameters = _storage_ids(everything.values())
    saved = _Saved(parameters)
    inputs: list[int] = []
    segments: list[int] = []
    counter = FlopCounterMode(display=False)
    with (
        counter,
        _fused_attention(fused),
        _segments_measured(inputs, segments, parameters),
        torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t),
    ):
        objective.loss((images, labels)).backward()
    kept = saved.total + sum(inputs) + max(segments, default=0)
    trainable = sum(p.numel() for p in objective.parameters())
    counts = {
        "params": sum(p.numel() for p in (model.parameters() if model is not None else everything.values())),
        "trainable": trainable,
        "frozen": sum(p.numel() for p in everything.values()) - trainable,
    }
    return float(counter.get_total_flops()), float(kept), counts


def _objective(
    spec: TrialSpec, model_spec: ModelSpec, num_classes: int, sizes: list[int]
) -> tuple[Any, torch.nn.Module | None]:
    """The trial's objective on the meta device, and its model (the backbone; None for a user's step, whose
    every module is its model), a user's step built there by its own entry."""
    o = spec.objective
    if isinstance(o, PythonObjective):
        from dinox.measure import user_step

        context = user_step.Context(model_spec, torch.device("meta"), spec.precision, num_classes, o.options)
        return user_step.build(o, context), None
    model = models.build(model_spec, num_classes, sizes)
    model.train()
    return objectives.build(model, o), model


def _modules(objective: Any) -> list[torch.nn.Module]:
    return objective.modules()


def cost_of(spec: TrialSpec) -> ModelCost:
    before = timm.layers.use_fused_attn()
    runtime.before_model(spec)  # model.fused_attention, as the trial builds it
    try:
        fused = timm.layers.use_fused_attn()
        flops, saved, counts = _step(spec, grad_checkpointing=False)
        if spec.model.grad_checkpointing or fused:
            _flops, saved, _counts = _step(spec, spec.model.grad_checkpointing, fused)
    finally:
        timm.layers.set_fused_attn(before)
    chans = models.in_chans(spec.model)
    sample_bytes = sum(chans * s * s * 4 for s in view_plan(spec).sizes) + 8
    return ModelCost(
        params=counts["params"],
        trainable_params=counts["trainable"],
        frozen_params=counts["frozen"],
        flops_per_image=flops / SAMPLES,
        saved_bytes_per_image=saved / SAMPLES,
        sample_bytes=sample_bytes,
    )


def machine(device_kind: str) -> Machine:
    from dinox.measure.device import (
        available_kinds,
        cuda_numa_nodes,
        cuda_uuids,
        environment_tags,
        resolve_device,
        rss_bytes,
    )

    runtime = rss_bytes(peak=False) / GIB  # a fresh process's, as the trial's peak counts it
    host = psutil.virtual_memory().total / GIB
    kinds, has = available_kinds()
    numa = cuda_numa_nodes()
    gpus = {"cuda_devices": len(numa), "cuda_numa": numa, "cuda_uuids": cuda_uuids()}
    try:
        device = resolve_device(device_kind)
    except RuntimeError:
        # Planning here for another box (a laptop for a GPU node): no device size, but hardware.memory_limit_gb
        # and host RAM still give a plan.
        return Machine(device_kind, "(not on this machine)", None, host, runtime, kinds, has, **gpus)
    name = environment_tags(device)[rec.DEVICE_NAME]
    total: float | None = None
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory / GIB
    elif device.type == "cpu":
        total = host
    return Machine(device.type, name, total, host, runtime, kinds, has, **gpus, matmul_tflops=matmul_tflops(device))


def matmul_tflops(device: torch.device, seconds: float = 0.1) -> float | None:
    """The device's fp32 matmul rate, measured for about `seconds`: the fastest work it does, so FLOPs over
    it give a step's floor. None where it cannot be measured."""
    try:
        n = 2048 if device.type == "cuda" else 512
        a = torch.randn(n, n, device=device)
        b = torch.randn(n, n, device=device)
        torch.mm(a, b)  # the first call pays for lazy loading and kernel choice
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            torch.mm(a, b)
            sync()
            done += 1
        return 2 * n**3 * done / (time.perf_counter() - start) / 1e12
    except RuntimeError:
        return None


def run_child(request_json: str, result_json: str, forked: bool = False) -> int:
    if forked:  # the machine's runtime figure counts what a fresh process holds
        from dinox.measure.device import forked_from

        forked_from(os.getppid())
    request = json.loads(open(request_json).read())
    out: dict[str, Any] = {"costs": {}, "errors": {}}
    t0 = time.time()
    specs = {key: TrialSpec.model_validate(value) for key, value in request["specs"].items()}
    try:
        first = next(iter(specs.values()), None)
        out["machine"] = asdict(machine(first.hardware.device if first else "auto"))
    except Exception as exc:  # noqa: BLE001 - no machine figures: the plan says so, the sweep goes on
        traceback.print_exc()
        out["errors"]["machine"] = one_line(f"{type(exc).__name__}: {exc}", 300)
    out["cached"] = []
    for key, spec in specs.items():
        try:
            kept = cost_cache.path_for(spec)
            cost = cost_cache.load(kept)
            if cost is None:
                cost = asdict(cost_of(spec))
                cost_cache.save(kept, cost)
            else:
                out["cached"].append(key)
            out["costs"][key] = cost
        except Exception as exc:  # noqa: BLE001 - a model the meta device cannot run gets no estimate
            traceback.print_exc()
            out["errors"][key] = one_line(f"{type(exc).__name__}: {exc}", 300)
    out["seconds"] = time.time() - t0
    tmp = f"{result_json}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, result_json)
    sys.stdout.flush()
    sys.stderr.flush()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m dinox.measure.estimate REQUEST_JSON RESULT_JSON")
    # Dies with the sweep that started it (or, as a rank, with torchrun), even if that one is SIGKILLed.
    lifeline.die_with_parent(lifeline.env_parent())
    os._exit(run_child(sys.argv[1], sys.argv[2]))

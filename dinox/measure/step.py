"""The training step itself: what the timed windows time and what `dinox verify` trains with, one object, so
the step measured is the step trained.

A batch to the device (with the data's device-side preparation), a micro-batch's forward and backward under
the precision's autocast (and its scaler), the optimizer update (gradient clipping where the objective asks,
zero_grad, the objective's after-step: an EMA teacher, a centre), and the helpers the loop's ablation
windows need (the half batch, the steps that exchange nothing between ranks, copies on a side stream).
Built by dinox.measure.trial once the device, loader and model exist; nothing here reads a file or a clock.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from dinox import record as rec
from dinox.data.device_prep import DevicePrep
from dinox.measure.ahead import CopyAhead, cuda_streams
from dinox.spec.sections import TrialSpec


def build_optimizer(spec: TrialSpec, params: list, dev: torch.device) -> tuple[torch.optim.Optimizer, bool]:
    """The optimizer, and whether its kernels are fused."""
    o = spec.optimizer
    # Fused kernels by default where they are the norm in real training (CUDA); elsewhere torch's default.
    fused = o.fused if o.fused is not None else dev.type == "cuda"
    extra = {"fused": True} if fused else {}
    if params and isinstance(params[0], dict):  # an objective's groups: scales of the spec's rate and decay
        params = [
            {"params": g["params"], "lr": o.lr * g["lr_scale"], "weight_decay": o.weight_decay * g["wd_scale"]}
            for g in params
        ]
    if o.name == "adamw":
        return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay, **extra), fused
    momentum = 0.9 if o.momentum is None else o.momentum
    return torch.optim.SGD(params, lr=o.lr, weight_decay=o.weight_decay, momentum=momentum, **extra), fused


class TrainStep:
    """One trial's step functions over its device, objective and optimizer."""

    # what the trial built (its setup steps)
    spec: TrialSpec
    dev: torch.device
    objective: Any  # dinox.measure.objectives' module with its loss, or the team's own (measure.user_step)
    optimizer: torch.optim.Optimizer
    autocast_dtype: torch.dtype | None
    scaler: Any  # torch.amp.GradScaler for fp16-mixed, else None
    prep: DevicePrep | None
    non_blocking: bool
    ddp: Any  # DistributedDataParallel, under torchrun
    # derived from the spec
    accumulation: int
    set_to_none: bool
    # what the steps leave behind
    micro_count: int
    last_loss: torch.Tensor | None

    def __init__(
        self,
        spec: TrialSpec,
        dev: torch.device,
        objective: Any,
        optimizer: torch.optim.Optimizer,
        autocast_dtype: torch.dtype | None,
        scaler: Any,
        prep: DevicePrep | None,
        non_blocking: bool,
        ddp: Any = None,
    ) -> None:
        self.spec, self.dev, self.objective, self.optimizer = spec, dev, objective, optimizer
        self.autocast_dtype, self.scaler = autocast_dtype, scaler
        self.prep, self.non_blocking, self.ddp = prep, non_blocking, ddp
        self.accumulation = spec.accumulation
        set_to_none = spec.optimizer.set_to_none
        self.set_to_none = True if set_to_none is None else set_to_none
        self.micro_count, self.last_loss = 0, None

    def autocast(self) -> contextlib.AbstractContextManager:
        dtype = self.autocast_dtype
        return torch.autocast(self.dev.type, dtype=dtype or torch.float32, enabled=dtype is not None)

    def _move(self, x: torch.Tensor) -> torch.Tensor:
        return self._layout(x.to(self.dev, non_blocking=self.non_blocking))

    def _layout(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last) if self.spec.model.channels_last and x.dim() == 4 else x

    def to_device(self, batch: Any) -> Any:
        images, labels = batch
        prep = self.prep
        if prep is not None and prep.decode_on_device:
            # Encoded bytes stay on the host, where the device's decoder reads them from.
            images = self._layout(prep.images(images))
        else:
            images = [self._move(v) for v in images] if isinstance(images, (list, tuple)) else self._move(images)
            images = prep.images(images) if prep is not None else images
        return images, labels.to(self.dev, non_blocking=self.non_blocking)

    def halve(self, batch: Any) -> tuple[Any, int]:
        """The first half of a device batch (each of DINO's views, and the labels), and its size: even where
        Mixup runs (timm's Mixup pairs the batch with its flip and refuses an odd one)."""
        images, labels = batch
        n = labels.shape[0] // 2
        if self.prep is not None and self.prep.mixup is not None:
            n -= n % 2
        views = [v[:n] for v in images] if isinstance(images, (list, tuple)) else [images[:n]]
        if self.spec.model.compile is not False:
            # A second batch size would make dynamo recompile with a dynamic batch dimension (automatic dynamic
            # shapes): the half would run another kind of graph than the full. Static, as the full one is.
            for v in views:
                torch._dynamo.mark_static(v, 0)
        return (views if isinstance(images, (list, tuple)) else views[0], labels[:n]), n

    def micro_step(self, batch: Any) -> None:
        self.micro_count += 1
        # Under DDP, gradients are all-reduced on the last micro-batch of a step only, as Lightning does.
        last = self.micro_count % self.accumulation == 0
        sync = self.ddp.no_sync() if self.ddp is not None and not last else contextlib.nullcontext()
        if self.prep is not None and self.prep.mixup is not None:
            batch = self.prep.mixup(*batch)  # on the device batch, inside the step, as timm's train.py does
        with sync:
            with self.autocast():
                loss = self.objective.loss(batch) / self.accumulation
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        self.last_loss = loss.detach()  # no .item(): that would synchronise inside the step

    def optimizer_step(self) -> None:
        clip = getattr(self.objective, "grad_clip", None)
        if clip:  # DINOv2's clip_grad: on the true gradients, so unscaled first where a scaler scaled them
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.objective.parameters(), clip)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=self.set_to_none)
        self.objective.after_optimizer_step()

    def copy_ahead(self) -> tuple[CopyAhead | None, dict[str, str]]:
        """loader.device_prefetch: copies on a side CUDA stream, a micro-batch ahead. Elsewhere nothing runs
        beside the step (the CPU has no streams), and the tag says the copies ran in series."""
        applied = self.spec.loader.device_prefetch and self.dev.type == "cuda"
        tags = {rec.DEVICE_PREFETCH: "side_stream" if applied else "in_series"}
        return (CopyAhead(self.to_device, cuda_streams(self.dev)) if applied else None), tags

    def local(self) -> contextlib.ExitStack:
        """Steps that exchange nothing between ranks: DDP's no_sync and the objective's own (DINO's centre)."""
        stack = contextlib.ExitStack()
        if self.ddp is not None:
            stack.enter_context(self.ddp.no_sync())
        stack.enter_context(self.objective.local())
        return stack

    def loss_value(self) -> float:
        """The last micro-batch's loss, as the whole step's (nan before any step)."""
        loss = self.last_loss
        return float(loss.float() * self.accumulation) if loss is not None else float("nan")

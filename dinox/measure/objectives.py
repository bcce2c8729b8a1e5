"""Training objectives: what one micro-batch computes, and what follows each optimizer step.

``Objective`` is the seam: what a training step is to dinox, declared once. dinox's two implement it
(classification and DINO, below), and a ``kind: python`` spec's entry returns one (dinox.measure.user_step).
Each takes a batch ``(x, y)``: for classification (and a user's step) ``x`` is an image tensor; for DINO it is
the list of multi-crop views (global crops first), and ``y`` is ignored.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dinox.measure.dinov2 import Dinov2
from dinox.measure.heads import DINOHead, attribute_modules
from dinox.spec.objectives import ClassificationObjective, DinoObjective, Dinov2Objective


@runtime_checkable
class Objective(Protocol):
    """What dinox needs of a training step. The loop calls ``loss`` under its autocast and backward, steps the
    optimizer over ``parameters``, then calls ``after_optimizer_step`` (an EMA, a schedule); ``compile`` and
    ``distribute`` hand each module that trains to torch.compile / DistributedDataParallel (the spec decides
    whether they are called). ``modules``, ``local``, ``evaluate`` and ``state`` have defaults for a user's
    step (OPTIONAL): its nn.Module attributes, no exchange to leave out, the loss, the modules' weights."""

    def parameters(self) -> Iterable[nn.Parameter]: ...
    def loss(self, batch: Any) -> torch.Tensor: ...
    def after_optimizer_step(self) -> None: ...
    def compile(self, compile_fn: Callable[[nn.Module], nn.Module]) -> None: ...
    def distribute(self, wrap: Callable[[nn.Module], nn.Module]) -> nn.Module: ...
    def modules(self) -> list[nn.Module]: ...
    def local(self) -> contextlib.AbstractContextManager: ...
    def evaluate(self, batch: Any) -> Any: ...
    def state(self) -> dict[str, Any]: ...


# What a user's step must define itself, and what dinox supplies where it does not. Three more are read where
# present: ``param_groups()`` (dicts of params with ``lr_scale`` / ``wd_scale``: per-group learning rates, as
# DINOv2's layer-wise decay), ``grad_clip`` (a max gradient norm the loop clips to, after unscaling) and
# ``collate(base)`` (the loader's collate with what the recipe's own adds, run in the loader's workers:
# DINOv2's masks; `base` is None for torch's default).
REQUIRED = ("parameters", "loss", "after_optimizer_step", "compile", "distribute")
OPTIONAL = ("modules", "local", "evaluate", "state")


class Classification:
    """Supervised classification: cross-entropy on the model's logits; on soft targets (timm's
    SoftTargetCrossEntropy) when Mixup / CutMix made them, as timm's train.py does."""

    def __init__(self, model: nn.Module, spec: ClassificationObjective, soft_targets: bool = False):
        self.model = model
        if soft_targets:
            from timm.loss import SoftTargetCrossEntropy

            self.loss_fn: nn.Module = SoftTargetCrossEntropy()
        else:
            self.loss_fn = nn.CrossEntropyLoss(label_smoothing=spec.label_smoothing)

    def parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def compile(self, compile_fn) -> None:
        self.model = compile_fn(self.model)

    def distribute(self, wrap) -> nn.Module:
        """Wrap what trains in DistributedDataParallel; returns the wrapper (for no_sync)."""
        self.model = wrap(self.model)
        return self.model

    def loss(self, batch: Any) -> torch.Tensor:
        images, labels = batch
        return self.loss_fn(self.model(images), labels)

    def after_optimizer_step(self) -> None:
        """Nothing: classification pays for no work outside the optimizer step."""

    def modules(self) -> list[nn.Module]:
        return attribute_modules(self)

    def local(self) -> contextlib.AbstractContextManager:
        """Steps that exchange nothing between ranks: classification's loss exchanges nothing."""
        return contextlib.nullcontext()

    def evaluate(self, batch: Any) -> torch.Tensor:
        """An evaluation pass's work on a batch: the model's logits (under no_grad, in eval mode)."""
        return self.model(batch[0])

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds of the objective: the model's weights."""
        return {"model": self.model.state_dict()}


class _Branch(nn.Module):
    def __init__(self, backbone: nn.Module, head: nn.Module):
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, views: list[torch.Tensor]) -> torch.Tensor:
        # Views of one resolution go through the backbone together (DINO's MultiCropWrapper).
        feats, start = [], 0
        while start < len(views):
            end = start
            while end < len(views) and views[end].shape[-1] == views[start].shape[-1]:
                end += 1
            feats.append(self.backbone(torch.cat(views[start:end])))
            start = end
        return self.head(torch.cat(feats))


class Dino:
    """Student and EMA teacher on one timm backbone; the teacher sees global crops only."""

    def __init__(self, backbone: nn.Module, spec: DinoObjective):
        self.spec = spec
        head = DINOHead(
            backbone.num_features, spec.out_dim, spec.head_hidden_dim, spec.head_bottleneck_dim, spec.head_layers
        )
        device = next(backbone.parameters()).device
        self.student = _Branch(backbone, head).to(device)
        self.teacher = copy.deepcopy(self.student)
        if hasattr(self.teacher.backbone, "set_grad_checkpointing"):
            self.teacher.backbone.set_grad_checkpointing(False)  # no backward through the teacher
        for p in self.teacher.parameters():
            p.requires_grad = False
        self.center = torch.zeros(1, spec.out_dim, device=device)
        self.reduce_center = True  # off inside `local`
        self._student_params = [p for p in self.student.parameters()]
        self._teacher_params = [p for p in self.teacher.parameters()]
        self.model = self.student

    def parameters(self) -> list[nn.Parameter]:
        return [p for p in self.student.parameters() if p.requires_grad]

    def compile(self, compile_fn) -> None:
        """The backbones; under DDP the whole student, wrapper and all (compile(DDP(student)))."""
        if isinstance(self.student, _Branch):
            self.student.backbone = compile_fn(self.student.backbone)
        else:
            self.student = compile_fn(self.student)
        self.teacher.backbone = compile_fn(self.teacher.backbone)

    def distribute(self, wrap) -> nn.Module:
        """The student (backbone and head) under DistributedDataParallel; the teacher needs no gradients,
        and its EMA reads the same parameter tensors, which DDP does not copy."""
        self.student = wrap(self.student)
        return self.student

    def loss(self, batch: Any) -> torch.Tensor:
        views, _ = batch
        g = self.spec.global_crops
        with torch.no_grad():
            teacher_out = self.teacher(views[:g]).float()
        student_out = self.student(views).float()
        s = self.spec
        # Teacher: centred and sharpened; student: tempered. Cross-entropy between every teacher view and
        # every student view but the same one, averaged (DINO's loss).
        teacher_probs = F.softmax((teacher_out - self.center) / s.teacher_temp, dim=-1).chunk(g)
        student_logp = F.log_softmax(student_out / s.student_temp, dim=-1).chunk(len(views))
        total, terms = student_out.new_zeros(()), 0
        for i, q in enumerate(teacher_probs):
            for v, logp in enumerate(student_logp):
                if v != i:
                    total = total + torch.sum(-q * logp, dim=-1).mean()
                    terms += 1
        with torch.no_grad():
            batch_center = teacher_out.mean(dim=0, keepdim=True)
            if self.reduce_center and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                # The centre is the mean over every rank's teacher outputs, as DINO's update_center takes it:
                # one more all-reduce per micro-batch, which a distributed DINO step pays.
                dist.all_reduce(batch_center)
                batch_center /= dist.get_world_size()
            self.center.mul_(s.center_momentum).add_(batch_center, alpha=1 - s.center_momentum)
        return total / terms

    def modules(self) -> list[nn.Module]:
        return attribute_modules(self)

    @contextlib.contextmanager
    def local(self) -> Iterator[None]:
        """Steps that exchange nothing between ranks (the half-batch pair, under DDP's no_sync): the centre's
        all-reduce is left out too, or it would count as the host's batch-independent cost."""
        was, self.reduce_center = self.reduce_center, False
        try:
            yield
        finally:
            self.reduce_center = was

    def evaluate(self, batch: Any) -> torch.Tensor:
        """An evaluation pass's work on a batch: the teacher backbone's features of the first global crop, what
        DINO's k-NN evaluation computes."""
        return self.teacher.backbone(batch[0][0])

    def state(self) -> dict[str, Any]:
        """What DINO's checkpoint holds: student, teacher and the centre."""
        return {"student": self.student.state_dict(), "teacher": self.teacher.state_dict(), "center": self.center}

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        m = self.spec.teacher_momentum
        torch._foreach_mul_(self._teacher_params, m)
        torch._foreach_add_(self._teacher_params, self._student_params, alpha=1 - m)


def build(model: nn.Module, spec: ClassificationObjective | DinoObjective, soft_targets: bool = False) -> Objective:
    if isinstance(spec, Dinov2Objective):
        return Dinov2(model, spec)
    if isinstance(spec, DinoObjective):
        return Dino(model, spec)
    return Classification(model, spec, soft_targets)

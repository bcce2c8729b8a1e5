"""Training objectives: what one micro-batch computes, and what follows each optimizer step."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dinox.spec import ClassificationObjective


class Classification:
    """Supervised classification: cross-entropy on the model's logits."""

    def __init__(self, model: nn.Module, spec: ClassificationObjective):
        self.model = model
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=spec.label_smoothing)

    def parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def loss(self, batch: Any) -> torch.Tensor:
        images, labels = batch
        return self.loss_fn(self.model(images), labels)

    def after_optimizer_step(self) -> None:
        """Hook for work every optimizer step pays for (an EMA teacher, for example)."""


def build(model: nn.Module, spec: ClassificationObjective) -> Classification:
    if spec.kind == "classification":
        return Classification(model, spec)
    raise ValueError(f"objective.kind: {spec.kind!r} is not supported")

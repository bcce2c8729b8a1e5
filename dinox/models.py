"""Build timm models from a model spec. Weights are never downloaded (pretrained=False, always)."""

from __future__ import annotations

import difflib

import timm
import torch
from torch import nn

from dinox.spec import ModelSpec


class ModelBuildError(ValueError):
    pass


def build(spec: ModelSpec, num_classes: int) -> nn.Module:
    if not timm.is_model(spec.name):
        close = difflib.get_close_matches(spec.name, timm.list_models(), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ModelBuildError(f"model.name: unknown timm model {spec.name!r}{hint}")
    kwargs = dict(spec.kwargs)
    try:
        model = timm.create_model(
            spec.name, pretrained=False, num_classes=num_classes, img_size=spec.img_size, **kwargs
        )
    except TypeError as e:
        # CNNs (resnet, convnext, ...) take any input size and have no img_size argument.
        if "img_size" not in str(e):
            raise
        model = timm.create_model(spec.name, pretrained=False, num_classes=num_classes, **kwargs)
    if spec.grad_checkpointing:
        if not hasattr(model, "set_grad_checkpointing"):
            raise ModelBuildError(f"model.grad_checkpointing: {spec.name} does not support it")
        model.set_grad_checkpointing(True)
    return model


def in_chans(spec: ModelSpec) -> int:
    value = spec.kwargs.get("in_chans", 3)
    return int(value) if isinstance(value, (int, float)) else 3


def count_params_m(model: nn.Module) -> float:
    return sum(p.numel() for p in model.parameters()) / 1e6


def compile_model(model: nn.Module, setting: bool | str) -> nn.Module:
    mode = None if setting is True else str(setting)
    return torch.compile(model, mode=mode)  # type: ignore[return-value]

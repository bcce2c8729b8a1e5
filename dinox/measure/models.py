"""Build timm models from a model spec. Weights are never downloaded (pretrained=False, always)."""

from __future__ import annotations

import timm
import torch
from torch import nn

from dinox.errors import DinoxError
from dinox.plan import model_names
from dinox.spec.sections import ModelSpec


class ModelBuildError(DinoxError, ValueError):
    pass


def unknown_model(name: str) -> str | None:
    """Why `name` is not a timm model (the message dinox validate gives), or None when it is one."""
    return None if timm.is_model(name) else model_names.unknown_model(name, timm.list_models())


def build(spec: ModelSpec, num_classes: int, input_sizes: list[int] | None = None) -> nn.Module:
    """A timm model; num_classes=0 gives a backbone returning pooled features. `input_sizes` lists every
    resolution it will see (DINO's global and local crops); ViTs then get dynamic_img_size."""
    problem = unknown_model(spec.name)
    if problem:
        raise ModelBuildError(f"model.name: {problem}")
    kwargs = dict(spec.kwargs)
    sizes = sorted(set(input_sizes or [spec.img_size]))
    # Only models that take these arguments get them: CNNs (resnet, convnext, ...) accept any input size
    # and have neither img_size nor dynamic_img_size.
    optional = {"img_size": spec.img_size}
    if sizes != [spec.img_size]:
        optional["dynamic_img_size"] = True
    while True:
        try:
            model = timm.create_model(spec.name, pretrained=False, num_classes=num_classes, **optional, **kwargs)
            break
        except TypeError as e:
            dropped = next((k for k in optional if f"'{k}'" in str(e)), None)
            if dropped is None:
                raise
            del optional[dropped]
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if patch is not None:
        bad = [s for s in sizes if s % patch[0]]
        if bad:
            raise ModelBuildError(
                f"input size {bad[0]} is not a multiple of {spec.name}'s patch size {patch[0]} "
                f"(e.g. {round(bad[0] / patch[0]) * patch[0]}); set model.img_size / the crop sizes to multiples"
            )
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

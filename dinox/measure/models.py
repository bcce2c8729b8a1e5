"""Build timm models from a model spec. Weights are never downloaded (pretrained=False, always)."""

from __future__ import annotations

from collections.abc import Callable

import timm
import torch
from torch import nn

from dinox import record as rec
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
    """torch.compile with static shapes: each input shape the model meets (DINO's global and local crops, the
    half batch) gets a graph of its own, as a run with fixed crop sizes has. torch's default would, at the
    second shape, recompile to one automatic-dynamic graph that then serves every resolution (and
    mark_static does not survive the torch.cat that batches a resolution's views)."""
    mode = None if setting is True else str(setting)
    return torch.compile(model, mode=mode, dynamic=False)  # type: ignore[return-value]


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (each recompile adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class GraphCount:
    """A compiled trial's phases, with dynamo's graph count read at each (as the loop tells them, between
    windows): what warm-up built (compile_graphs), and what the timed windows and their rounds compiled after
    it (recompiles_in_windows: 0 with static shapes; a recompile inside them is part of their time)."""

    def __init__(self, on_phase: Callable[[str], None] | None):
        self.metrics: dict[str, float] = {}  # what it read: the trial takes them once the windows are over
        self.on_phase = on_phase

    def phase(self, text: str) -> None:
        if text.startswith("window") and rec.COMPILE_GRAPHS not in self.metrics:
            self.metrics[rec.COMPILE_GRAPHS] = float(compiled_graphs())
        elif not text.startswith("window"):
            self.end()
        if self.on_phase is not None:
            self.on_phase(text)

    def end(self) -> None:
        """The windows are over (the first phase after them, or the loop's end)."""
        if rec.COMPILE_GRAPHS in self.metrics and rec.RECOMPILES_IN_WINDOWS not in self.metrics:
            self.metrics[rec.RECOMPILES_IN_WINDOWS] = float(compiled_graphs() - self.metrics[rec.COMPILE_GRAPHS])

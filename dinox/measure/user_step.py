"""A team's own training step (`objective: {kind: python, entry: "mypkg.recipe:build"}`), measured by dinox.

The entry is a callable taking a ``Context`` (what dinox decided: the model section, the device, the precision,
the spec's ``options``) and returning an object with dinox's objective protocol (dinox.measure.objectives.
Objective). dinox keeps everything else: loader, precision (the loss runs under its autocast), optimizer,
windows, ablations, isolation, memory, profile, record. It is imported here only, in a trial's child, in the
estimate child (`dinox plan`) and in ``python -m dinox.measure.entry_check`` (validate): never in the parent.

Every way an entry can be wrong is one ``EntryError`` line naming the entry: not importable (with the
user's own file:line), no such name, not callable, a build that raises, a result without the protocol.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from dinox import entrypoints
from dinox.entrypoints import EntryError
from dinox.measure import models, objectives
from dinox.spec.objectives import PythonObjective
from dinox.spec.sections import ModelSpec


@dataclass(frozen=True)
class Context:
    """What dinox decided, handed to the entry. ``timm_model()`` builds the spec's model section as dinox
    builds it (pretrained=False); a team's own model ignores it."""

    model: ModelSpec
    device: torch.device
    precision: str  # the spec's precision: dinox applies it (autocast, GradScaler) around ``loss``
    num_classes: int  # the labels the data yields are in [0, num_classes)
    options: dict[str, Any] = field(default_factory=dict)

    def timm_model(self, num_classes: int | None = None) -> nn.Module:
        model = models.build(self.model, self.num_classes if num_classes is None else num_classes)
        return model.to(self.device)


def build(o: PythonObjective, context: Context) -> UserObjective:
    """The entry called with `context`, its result checked against the protocol. Raises EntryError."""
    target, root = entrypoints.load(o.entry, o.path, "objective.entry")
    made = entrypoints.call(target, context, o.entry, root, "objective.entry")
    missing = [m for m in objectives.REQUIRED if not callable(getattr(made, m, None))]
    if made is None or missing:
        what = "None" if made is None else entrypoints.a(type(made).__name__)
        lacks = f" without {', '.join(missing)}" if made is not None else ""
        raise EntryError(
            f"objective.entry {o.entry}: returned {what}{lacks}; it must return an object with "
            f"{', '.join(objectives.REQUIRED)} (dinox.measure.objectives.Objective)"
        )
    return UserObjective(made)


class UserObjective:
    """The user's step as dinox's loop sees it: its own methods, dinox's defaults for the OPTIONAL ones."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.grad_clip = getattr(inner, "grad_clip", None)
        if callable(getattr(inner, "param_groups", None)):
            self.param_groups = inner.param_groups
        if callable(getattr(inner, "collate", None)):
            self.collate = inner.collate

    def parameters(self) -> Iterable[nn.Parameter]:
        return self.inner.parameters()

    def loss(self, batch: Any) -> torch.Tensor:
        return self.inner.loss(batch)

    def after_optimizer_step(self) -> None:
        self.inner.after_optimizer_step()

    def compile(self, compile_fn: Callable[[nn.Module], nn.Module]) -> None:
        self.inner.compile(compile_fn)

    def distribute(self, wrap: Callable[[nn.Module], nn.Module]) -> nn.Module:
        return self.inner.distribute(wrap)

    def modules(self) -> list[nn.Module]:
        own = getattr(self.inner, "modules", None)
        return list(own()) if callable(own) else objectives.attribute_modules(self.inner)

    def local(self) -> contextlib.AbstractContextManager:
        own = getattr(self.inner, "local", None)
        return own() if callable(own) else contextlib.nullcontext()

    def evaluate(self, batch: Any) -> Any:
        own = getattr(self.inner, "evaluate", None)
        return own(batch) if callable(own) else self.inner.loss(batch)

    def state(self) -> dict[str, Any]:
        own = getattr(self.inner, "state", None)
        return own() if callable(own) else {f"module{i}": m.state_dict() for i, m in enumerate(self.modules())}

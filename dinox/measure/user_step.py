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
import importlib
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dinox.contract import one_line
from dinox.errors import DinoxError
from dinox.measure import models, objectives
from dinox.spec.objectives import PythonObjective
from dinox.spec.sections import ModelSpec


class EntryError(DinoxError, ValueError):
    """The objective's entry cannot give a step: one line, at validate (exit 2) or as the trial's error."""


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


def load(o: PythonObjective) -> Callable[[Context], Any]:
    """The entry's callable, its module imported from the objective's path. Raises EntryError."""
    module_name, _, name = o.entry.partition(":")
    root = str(Path(o.path).resolve())
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        module = importlib.import_module(module_name)
    except BaseException as e:  # noqa: BLE001 - a SystemExit or KeyboardInterrupt in its import is its failure too
        if isinstance(e, KeyboardInterrupt):
            raise
        raise EntryError(f"objective.entry {o.entry}: importing {module_name} failed: {_where(e, root)}") from None
    target = getattr(module, name, None)
    if target is None:
        found = getattr(module, "__file__", module_name)
        raise EntryError(f"objective.entry {o.entry}: {found} has no {name!r}")
    if not callable(target):
        raise EntryError(f"objective.entry {o.entry}: {name} is {_a(type(target).__name__)}, not a callable")
    return target


def build(o: PythonObjective, context: Context) -> UserObjective:
    """The entry called with `context`, its result checked against the protocol. Raises EntryError."""
    target, root = load(o), str(Path(o.path).resolve())
    try:
        made = target(context)
    except Exception as e:  # noqa: BLE001 - the team's code: its failure, said in one line with its place
        raise EntryError(f"objective.entry {o.entry}: the call raised {_where(e, root)}") from None
    missing = [m for m in objectives.REQUIRED if not callable(getattr(made, m, None))]
    if made is None or missing:
        what = "None" if made is None else f"{_a(type(made).__name__)}"
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


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _where(e: BaseException, root: str) -> str:
    """`TypeError: message (recipe.py:12)`: the exception and the innermost frame of the user's own code (in
    the folder the entry is imported from), where there is one."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith(root + "/")]
    place = f" ({frames[-1].filename[len(root) + 1 :]}:{frames[-1].lineno})" if frames else ""
    message = str(e)
    if isinstance(e, SyntaxError) and e.filename:  # its own text already says where, less plainly
        place, message = f" ({e.filename.removeprefix(root + '/')}:{e.lineno})", str(e.msg)
    return one_line(f"{type(e).__name__}: {message}{place}", 400)

"""What each spec field is for, declared once on the field and read everywhere else.

Every leaf field of the spec carries one `Param` marker in its annotation (``fused: Annotated[bool | None, MEMORY]``).
The lists that used to be written by hand in five places derive from it here: which params make a trial's id,
which bound its memory (OOM pruning, decide's OOM boundary), which change the model's cost (the footprint
estimate), which describe its configuration (decide's tables). Adding a field is one edit: its declaration.

No torch and no spec import here: ``spec`` imports this module for the markers and builds its table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from dinox.spec.fields import models_in

# From the widest reach to the narrowest:
#   shape    changes the model's parameters, FLOPs or tensors saved for backward (the footprint estimate)
#   memory   changes peak device memory beyond the shape (precision, optimizer state, the device)
#   batch    the physical batch: the axis along which memory grows, so the one OOM pruning walks
#   config   changes the work but not its memory (loader, data, learning rate)
#   measure  how the trial is measured (steps, repeats): part of its id, not of its configuration
#   search   the batch search's bounds: part of the id only while batch.size is auto
#   steer    how long it may take and how its figures are read: never part of its id
#   decision read by `dinox decide` only (the budget): not a trial parameter at all
Role = Literal["shape", "memory", "batch", "config", "measure", "search", "steer", "decision"]

_IDENTIFIES: frozenset[Role] = frozenset({"shape", "memory", "batch", "config", "measure", "search"})
_DESCRIBES: frozenset[Role] = frozenset({"shape", "memory", "batch", "config"})
_BOUNDS_MEMORY: frozenset[Role] = frozenset({"shape", "memory"})


@dataclass(frozen=True)
class Param:
    """A field's role, whether decide's tables always show it (else only when it varies), and whether it came
    after trials were recorded: such a knob identifies a trial only away from its default, so the trials
    measured before it existed keep their ids (a resumed sweep recognises them)."""

    role: Role
    shown: bool = False
    added: bool = False


SHAPE, MEMORY, BATCH, CONFIG = Param("shape"), Param("memory"), Param("batch"), Param("config")
MEASURE, SEARCH, STEER, DECISION = Param("measure"), Param("search"), Param("steer"), Param("decision")


def shown(p: Param) -> Param:
    return Param(p.role, shown=True, added=p.added)


def added(p: Param) -> Param:
    return Param(p.role, p.shown, added=True)


def _marker(field_info: Any) -> Param | None:
    return next((m for m in field_info.metadata if isinstance(m, Param)), None)


class RoleTable:
    """Dotted param name -> Param, walked from a model's fields (a union's members merged)."""

    def __init__(self, params: dict[str, Param], defaults: dict[str, str] | None = None):
        self.params = params
        self.defaults = defaults or {}  # an added knob's default, as flat params write it

    @classmethod
    def of(cls, root: type[BaseModel]) -> RoleTable:
        out: dict[str, Param] = {}
        defaults: dict[str, str] = {}
        cls._walk(root, "", out, defaults)
        return cls(out, defaults)

    @classmethod
    def _walk(cls, model: type[BaseModel], prefix: str, out: dict[str, Param], defaults: dict[str, str]) -> None:
        for name, info in model.model_fields.items():
            path = f"{prefix}{name}"
            marker, members = _marker(info), models_in(info.annotation)
            if members and marker is None:
                for member in members:
                    cls._walk(member, f"{path}.", out, defaults)
            elif marker is None:
                raise TypeError(f"{model.__name__}.{name} has no role (dinox.spec.roles): declare one")
            elif out.setdefault(path, marker) != marker:
                raise TypeError(f"{path}: union members declare different roles")
            elif marker.added:
                defaults[path] = str(info.default)

    def of_param(self, name: str) -> Param | None:
        """A param's declaration; a key inside a free-form mapping (model.kwargs.depth) takes the mapping's.
        None for what is not a spec field (the parent run's spec.name, an older record's params)."""
        while name:
            if name in self.params:
                return self.params[name]
            name = name.rpartition(".")[0]
        return None

    def role(self, name: str) -> Role | None:
        p = self.of_param(name)
        return p.role if p else None

    def identifies(self, name: str, value: str | None = None) -> bool:
        """Part of the trial id: a resumed sweep recognises a trial by these, whatever else was edited. An added
        knob at its default (`value`) is not: the trials recorded before it existed keep their ids."""
        if self.role(name) not in _IDENTIFIES:
            return False
        return not (value is not None and name in self.defaults and self.defaults[name] == value)

    def describes(self, name: str) -> bool:
        """Part of the workload a trial runs, so of the configuration decide groups and shows."""
        return self.role(name) in _DESCRIBES

    def bounds_memory(self, name: str) -> bool:
        return self.role(name) in _BOUNDS_MEMORY

    def memory_key(self, params: dict[str, str]) -> tuple[tuple[str, str], ...]:
        """Trials with equal keys share one OOM boundary over the physical batch."""
        return tuple(sorted((k, v) for k, v in params.items() if self.bounds_memory(k)))

    def shape_key(self, params: dict[str, str]) -> tuple[tuple[str, str], ...]:
        """Trials with equal keys share one model cost (parameters, FLOPs, saved tensors)."""
        return tuple(sorted((k, v) for k, v in params.items() if self.role(k) == "shape"))

    def shown_keys(self) -> list[str]:
        return [k for k, p in self.params.items() if p.shown]

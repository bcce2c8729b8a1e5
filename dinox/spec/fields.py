"""The spec's pydantic models as field paths: does a dotted path name a field, and which field a pydantic
error is about (without the union member tags pydantic adds), with a did-you-mean for a typo.

Generic over the root model, so the trial, the sweep and the budget share it; no dinox imports.
"""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ValidationError


def path_problem(root: Any, dotted: str) -> str | None:
    """Why a dotted path does not name a field of `root`, or None if it does."""
    parts = dotted.split(".")
    model: Any = root
    for i, part in enumerate(parts):
        fields = _model_fields(model)
        if fields is None:
            # Inside a free-form mapping (model.kwargs): any key is data.
            return None
        if part not in fields:
            return f"no field {part!r} in {'.'.join(parts[:i]) or 'the spec'}{_did_you_mean(part, fields)}"
        model = fields[part]
    return None


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """Every pydantic model inside an annotation, through Optional, unions and Annotated wrappers."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in models_in(arg)]
    return []


def _model_fields(annotation: Any) -> dict[str, Any] | None:
    """Field name -> annotation of the model(s) in an annotation (a union's members merged), else None."""
    models = models_in(annotation)
    if not models:
        return None
    return {k: f.annotation for m in models for k, f in m.model_fields.items()}


def _did_you_mean(word: str, options: Any) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass(frozen=True)
class FieldProblem:
    """A problem at a field location, before it is tied to a file line or a trial."""

    loc: tuple[str, ...]
    message: str


_UNION_TAGS = {"bool", "int", "float", "str", "none", "list", "dict"}


def _is_union_tag(part: str) -> bool:
    # pydantic adds the union member it tried to an error's location ("bool", "literal['a','b']", ...).
    return part in _UNION_TAGS or "[" in part


def _clean_loc(root: Any, loc: tuple[str, ...]) -> tuple[str, ...]:
    """The field path of an error: without the member tags pydantic adds inside unions ("bool",
    "literal[...]", or a discriminator value such as "dino")."""
    out: list[str] = []
    model: Any = root
    for part in loc:
        if _is_union_tag(part):
            continue
        fields = _model_fields(model) if model is not None else None
        if fields is not None and part in fields:
            out.append(part)
            model = fields[part]
        elif fields is not None and part in _discriminator_values(model):
            continue
        else:
            out.append(part)
            model = None
    return tuple(out)


def _discriminator_values(annotation: Any) -> set[str]:
    """The tags of a union of models: the values of their Literal fields (kind, source)."""
    models = models_in(annotation)
    if len(models) < 2:
        return set()
    return {
        str(v)
        for m in models
        for f in m.model_fields.values()
        if typing.get_origin(f.annotation) is Literal
        for v in typing.get_args(f.annotation)
    }


def field_problems(err: ValidationError, root: Any) -> list[FieldProblem]:
    """pydantic errors as field problems: one per field, with a did-you-mean for unknown keys and the value."""
    grouped: dict[tuple[str, ...], tuple[list[str], Any]] = {}
    for e in err.errors(include_url=False):
        raw = tuple(str(p) for p in e["loc"])
        # A key of the user's own that looks like a union tag ("x[0]" at the top) is still the key at fault.
        loc = _clean_loc(root, raw) or raw[-1:]
        message = e["msg"]
        if e["type"] == "extra_forbidden":
            owner = _model_fields_at(root, loc[:-1])
            if owner and loc[-1] in owner:  # a field of another member of a union (data.shards on synthetic data)
                message = f"not a field here: {loc[-1]!r} belongs to {_members_with(root, loc[:-1], loc[-1])}"
            else:
                message = "unknown field" + (_did_you_mean(loc[-1], owner) if owner else "")
        elif e["type"] == "union_tag_invalid":
            ctx = e.get("ctx", {})
            expected = [t.strip(" '") for t in str(ctx.get("expected_tags", "")).split(",")]
            tag = str(ctx.get("tag"))
            message = f"{tag!r} is not one of {', '.join(expected)}{_did_you_mean(tag, expected)}"
            e = {**e, "input": None}
        shown = e.get("input") if e["type"] not in ("missing", "extra_forbidden") else None
        messages, _ = grouped.setdefault(loc, ([], shown))
        if message not in messages:
            messages.append(message)
    out = []
    for loc, (messages, shown) in grouped.items():
        text = "; or ".join(messages)
        if shown is not None and not isinstance(shown, (dict, list)):
            got = repr(shown)
            text += f" (got {got if len(got) <= 80 else got[:76] + '...'})"
        out.append(FieldProblem(loc, text))
    return out


def _members_with(root: Any, loc: tuple[str, ...], name: str) -> str:
    """Which members of the union at `loc` have the field `name`, by their tag where they have one
    ("source: webdataset")."""
    model: Any = root
    for part in loc:
        model = (_model_fields(model) or {}).get(part)
    names = []
    for member in models_in(model):
        if name in member.model_fields:
            tag = next((f"{k}: {f.default}" for k, f in member.model_fields.items() if k in ("source", "kind")), None)
            names.append(tag or member.__name__)
    return " or ".join(names) or "another kind of section"


def _model_fields_at(root: Any, loc: tuple[str, ...]) -> dict[str, Any] | None:
    model: Any = root
    for part in loc:
        fields = _model_fields(model)
        if fields is None or part not in fields:
            return None
        model = fields[part]
    return _model_fields(model)

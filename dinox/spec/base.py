"""What every section of the spec shares: frozen, strict models, the upper bounds no real trial exceeds, and
the discriminator that lets a union's tag be left out. Torch-free."""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Discriminator, JsonValue
from pydantic_core import PydanticCustomError


class Section(BaseModel):
    # frozen: a validated trial is a value; extra=forbid: a typo is an error, never a silent default.
    # allow_inf_nan=False: "inf" and "nan" are never sizes, rates or times.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# Upper bounds: what no real trial exceeds, so an absurd number (2**64 + 1 warm-up steps, a timeout of 3e302 s)
# is an error that names its field, not an overflow deep in a trial or a decision.
MAX_PIXELS = 16_384  # image and crop sides
MAX_BATCH = 1_048_576
MAX_STEPS = 1_000_000
MAX_SEED = 2**63 - 1
MAX_IMAGES = 10**16  # a schedule: 100 epochs of 10^14 images


def tag_or(key: str, default: str):
    """A discriminator that reads `key`, defaulting to `default`: `objective: {num_classes: 10}` is a
    classification objective, `data: {seed: 1}` synthetic data, without writing the tag."""

    def pick(value: Any) -> str:
        if isinstance(value, dict):
            return str(value.get(key, default))
        return str(getattr(value, key, default))

    return Discriminator(pick)


def sane_kwargs(value: dict[str, JsonValue]) -> dict[str, JsonValue]:
    # Free-form, but numbers in it are model sizes and rates: finite and not astronomically large.
    def check(v: JsonValue) -> None:
        if isinstance(v, float) and not (math.isfinite(v) and abs(v) <= 1e9):
            raise PydanticCustomError("kwarg_number", f"{v} is not a usable model argument (finite, at most 1e9)")
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 10**9:
            raise PydanticCustomError("kwarg_number", f"{v} is not a usable model argument (at most 1e9)")
        for item in v.values() if isinstance(v, dict) else v if isinstance(v, list) else ():
            check(item)

    check(value)
    return value


_ENTRY = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def entry_name(value: str) -> str:
    if not _ENTRY.fullmatch(value):
        raise PydanticCustomError("entry", "module:callable, e.g. mypkg.recipe:build (dotted names, one colon)")
    return value

"""The spec's `routine:` section: what the real run does besides its steps (checkpoints, evaluation passes),
which its time pays for. The trial times one of each (dinox.measure.routine), `dinox decide` charges them over
the schedule (dinox.decide.routine), `dinox verify` runs them at this cadence."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, PositiveInt, model_validator
from pydantic_core import PydanticCustomError

from dinox.spec.base import Section
from dinox.spec.roles import MEASURE


def _plain_path(value: str) -> str:
    # The folder reaches a file write and the terminal: printable characters only.
    if not value or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise PydanticCustomError("plain_path", "a folder path of printable characters")
    return value


class RoutineSpec(Section):
    """What the real run does besides its steps, which its time pays for: a checkpoint every N optimizer steps
    and an evaluation pass every E epochs. A trial with a routine also measures one checkpoint save and an
    evaluation window; `dinox verify` runs them at this cadence; `dinox decide` adds them to the schedule."""

    checkpoint_every_steps: Annotated[PositiveInt | None, MEASURE] = Field(
        None, le=10**9, description="a checkpoint (model, optimizer and scaler state) every N optimizer steps"
    )
    checkpoint_dir: Annotated[str | None, AfterValidator(_plain_path), MEASURE] = Field(
        None,
        max_length=1000,
        description="the folder the run writes its checkpoints to (its disk is what a save costs); "
        "default: the trial's own folder",
    )
    eval_every_epochs: Annotated[PositiveInt | None, MEASURE] = Field(
        None, le=10**6, description="an evaluation pass every E epochs (at the end of the epoch)"
    )
    eval_images: Annotated[PositiveInt | None, MEASURE] = Field(
        None, le=10**12, description="images in one evaluation pass (forward only, no gradients)"
    )

    @model_validator(mode="after")
    def _together(self) -> RoutineSpec:
        if (self.eval_every_epochs is None) != (self.eval_images is None):
            raise PydanticCustomError("eval_pair", "eval_every_epochs and eval_images: give both or neither")
        if self.checkpoint_dir is not None and self.checkpoint_every_steps is None:
            raise PydanticCustomError("checkpoint_dir", "checkpoint_dir without checkpoint_every_steps saves nothing")
        return self

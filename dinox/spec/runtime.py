"""The spec's `runtime:` section: process-wide settings (cuDNN, the matmul precision, the CUDA allocator,
Python's gc) that the trial's child applies before the model is built (dinox.measure.runtime)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from dinox.spec.base import Section
from dinox.spec.roles import CONFIG, MEMORY, added


class RuntimeSpec(Section):
    """Process-wide settings, applied in the trial's child before the model is built. Left out (the default),
    nothing is changed and no param is written; each field left null likewise."""

    cudnn_benchmark: Annotated[bool | None, added(CONFIG)] = Field(
        None, description="torch.backends.cudnn.benchmark; null: true on CUDA (fixed shapes); no effect off CUDA"
    )
    matmul_precision: Annotated[Literal["highest", "high", "medium"] | None, added(CONFIG)] = Field(
        None, description="torch.set_float32_matmul_precision; null: from precision (tf32: high, else highest)"
    )
    expandable_segments: Annotated[bool | None, added(MEMORY)] = Field(
        None,
        description="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:..., set before the first CUDA allocation; "
        "no effect off CUDA",
    )
    gc: Annotated[Literal["enabled", "disabled", "frozen"] | None, added(CONFIG)] = Field(
        None,
        description="Python's garbage collector: enabled; disabled during the timed windows; frozen "
        "(gc.freeze() after setup: the model's objects are never scanned again); null: enabled",
    )

"""Is the device a spec asks for on this machine? Two answers, one message.

Before anything runs, `dinox run` asks without torch: a spec for `cuda` on a machine with no GPU driver, or
for `mps` off macOS, is refused at once, before the store is opened. Where a driver is present, the estimate
child (torch imported) gives the exact answer (a CPU-only torch, no visible device) before any run opens.
"""

from __future__ import annotations

import os
import sys

from dinox.errors import DinoxError, shell_word

# What a GPU driver leaves on Linux: NVIDIA's proc entry and device nodes, WSL2's GPU paravirtualisation,
# Jetson's memory manager, ROCm's kernel fusion driver. Any of them: the estimate child gives the answer.
_GPU_DRIVER_PATHS = (
    "/proc/driver/nvidia/version",
    "/dev/nvidia0",
    "/dev/nvidiactl",
    "/dev/dxg",
    "/dev/nvmap",
    "/dev/kfd",
)


class DeviceMissing(DinoxError, ValueError):
    """The spec asks for a device kind this machine does not have: bad input, refused before any run."""


def without_torch(kind: str) -> str:
    """What this machine has, in words, when it certainly lacks `kind`; "" when it may have it."""
    if kind == "cuda" and not any(os.path.exists(p) for p in _GPU_DRIVER_PATHS):
        return "no GPU driver (none of " + ", ".join(_GPU_DRIVER_PATHS) + ")"
    if kind == "mps" and sys.platform != "darwin":
        return f"no Apple GPU (this is {sys.platform}, MPS is macOS only)"
    return ""


def missing_problem(kind: str, has: str, spec_path: str) -> str:
    """What is wrong with `hardware.device: kind` here, and the two ways out."""
    return (
        f"{kind} is not on this machine, which has {has}; set hardware.device: auto to run the spec here, or "
        f"`dinox plan {shell_word(spec_path)}` plans it for the spec's hardware without running it"
    )


def missing_message(spec_path: str, kind: str, has: str, line: int | None = None) -> str:
    where = f"{spec_path}:{line}" if line else spec_path
    return f"{where}: hardware.device: {missing_problem(kind, has, spec_path)}"

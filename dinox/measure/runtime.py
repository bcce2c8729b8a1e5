"""The process-wide settings a spec may ask for (`runtime:`, `model.fused_attention`, `loader.non_blocking`,
`optimizer.set_to_none`), applied in the trial's child at the point each must be set, and read back from
torch, timm and Python afterwards into the `dinox.runtime` tag: what the trial ran with, not what was asked.

A knob left null changes nothing (dinox's defaults stay: cuDNN benchmark on CUDA, the matmul precision from
`precision`, torch's allocator and gc as they are, timm's fused attention as timm sets it)."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator

import timm.layers
import torch

from dinox.spec.sections import TrialSpec

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


def before_device(spec: TrialSpec) -> None:
    """Before the first CUDA allocation: the caching allocator reads its configuration once, when it starts
    (the fork server never touches CUDA, so a forked child's allocator has not started yet)."""
    r = spec.runtime
    if r is not None and r.expandable_segments is not None:
        setting = f"expandable_segments:{r.expandable_segments}"
        other = [p for p in os.environ.get(ALLOC_CONF, "").split(",") if p and not p.startswith("expandable_segments")]
        os.environ[ALLOC_CONF] = ",".join([*other, setting])


def after_precision(spec: TrialSpec) -> None:
    """After `device.apply_precision` set dinox's defaults for the precision: the knobs that override them."""
    r = spec.runtime
    if r is None:
        return
    if r.cudnn_benchmark is not None:
        torch.backends.cudnn.benchmark = r.cudnn_benchmark
    if r.matmul_precision is not None:
        torch.set_float32_matmul_precision(r.matmul_precision)


def before_model(spec: TrialSpec) -> None:
    """timm reads its fused-attention switch when each attention layer is built."""
    if spec.model.fused_attention is not None:
        timm.layers.set_fused_attn(spec.model.fused_attention)


@contextlib.contextmanager
def gc_for_windows(spec: TrialSpec, seen: dict[str, str]) -> Iterator[None]:
    """Python's collector during the windows: `disabled` turns it off for them (and back on after), `frozen`
    moves everything built so far out of its reach; what held inside goes into `seen`."""
    mode = spec.runtime.gc if spec.runtime is not None else None
    if mode == "frozen":
        gc.freeze()
    was = gc.isenabled()
    if mode == "disabled":
        gc.disable()
    try:
        seen["gc_in_windows"] = "enabled" if gc.isenabled() else "disabled"
        seen["gc_frozen_objects"] = str(gc.get_freeze_count())
        yield
    finally:
        if was:
            gc.enable()


def allocator_settings() -> str:
    """The caching allocator's configuration as torch parsed it (a misspelt key in the environment is not in
    it); the environment's text where this torch cannot say (a private call, torch >= 2.9)."""
    read = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    if read is not None:
        try:
            return str(read())
        except RuntimeError:
            pass
    return os.environ.get(ALLOC_CONF, "")


def applied(device: torch.device, non_blocking: bool, set_to_none: bool, seen: dict[str, str]) -> str:
    """What the trial ran with, read back: one line for the `dinox.runtime` tag."""
    values = {
        "cudnn_benchmark": str(torch.backends.cudnn.benchmark),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "matmul_tf32": str(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_tf32": str(torch.backends.cudnn.allow_tf32),
        "alloc_conf": allocator_settings() or "-",
        "fused_attention": str(timm.layers.use_fused_attn()),
        "non_blocking": str(non_blocking),
        "set_to_none": str(set_to_none),
        **seen,
    }
    if device.type != "cuda":  # said in the record: these change nothing here
        values["cpu_no_op"] = "cudnn_benchmark,cudnn_tf32,matmul_tf32,alloc_conf,non_blocking"
    return " ".join(f"{k}={v}" for k, v in values.items())

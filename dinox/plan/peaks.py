"""Peak dense TFLOPs of common accelerators, for MFU (model FLOPs utilisation). No torch here.

Figures are the vendors' dense (no structured sparsity) tensor-core peaks, in the precision class a trial's
math runs in: fp32 (CUDA cores: a ViT's matmuls under `precision: fp32`, torch's default), tf32 (`tf32`, or a
ResNet's convolutions under `fp32`, where torch leaves cuDNN's TF32 on), and 16-bit (bf16/fp16 with fp32
accumulation, what autocast uses). The class is the one the trial read back (`math_class`). A device the
table does not know gets no MFU unless the spec gives `hardware.peak_tflops`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    match: tuple[str, ...]  # all of these words, case-insensitive, in the device name ("a100" is not "a1000")
    label: str
    fp32: float
    tf32: float
    bf16: float


# Most specific first: "H100 PCIe" must win over "H100".
PEAKS: tuple[Peak, ...] = (
    Peak(("h100", "pcie"), "NVIDIA H100 PCIe", 51.2, 378.0, 756.0),
    Peak(("h100", "nvl"), "NVIDIA H100 NVL", 60.0, 417.5, 835.0),
    Peak(("h100",), "NVIDIA H100 SXM", 66.9, 494.7, 989.4),
    Peak(("h200", "nvl"), "NVIDIA H200 NVL", 60.0, 417.5, 835.0),  # the NVL boards' lower clocks (600 W)
    Peak(("h200",), "NVIDIA H200 SXM", 66.9, 494.7, 989.4),
    Peak(("gh200",), "NVIDIA GH200 (its H100-class GPU)", 66.9, 494.7, 989.4),  # "NVIDIA GH200 480GB": no "h200" word
    Peak(("a100",), "NVIDIA A100", 19.5, 156.0, 312.0),
    Peak(("rtx", "5090"), "NVIDIA GeForce RTX 5090", 104.8, 104.8, 209.5),
    Peak(("rtx", "4090"), "NVIDIA GeForce RTX 4090", 82.6, 82.6, 165.2),
    Peak(("mi300x",), "AMD Instinct MI300X", 163.4, 653.7, 1307.4),
    # Strix Halo (Ryzen AI Max+ 395): 40 RDNA 3.5 CUs at 2.9 GHz; WMMA doubles the 16-bit rate.
    Peak(("8060s",), "AMD Radeon 8060S (Strix Halo)", 29.7, 29.7, 59.4),
    Peak(("gfx1151",), "AMD Radeon 8060S (Strix Halo)", 29.7, 29.7, 59.4),
)


def precision_class(precision: str) -> str:
    """The table's column for a math class ("fp32", "tf32", "bf16"; fp16 runs at bf16's rate) or a spec
    precision (mixed precisions run their matmuls in 16 bits)."""
    return {"fp32": "fp32", "fp32-strict": "fp32", "tf32": "tf32"}.get(precision, "bf16")


# Convolutions hold more than this share of a model's parameters: its math is cuDNN's (ResNets), else the
# matmuls' (ViTs, whose one convolution is the patch embedding). Parameters stand in for FLOPs.
CONV_SHARE = 0.5


def math_class(precision: str, matmul_tf32: bool, cudnn_tf32: bool, conv_share: float) -> str:
    """The precision class a trial's math ran in, from the switches it ran with (read back in the child):
    16-bit under autocast; else TF32 where the switch of the kernels that do most of its work (cuDNN's for a
    convolutional model, the matmuls' for the rest) allowed it, else fp32. torch's defaults for fp32 leave
    cuDNN's TF32 on and the matmuls' off: a ResNet's "fp32" convolutions run in TF32, a ViT's matmuls do not."""
    if precision in ("bf16-mixed", "fp16-mixed"):
        return "bf16" if precision == "bf16-mixed" else "fp16"
    tf32 = cudnn_tf32 if conv_share > CONV_SHARE else matmul_tf32
    return "tf32" if tf32 else "fp32"


# A MIG slice ("NVIDIA A100-SXM4-40GB MIG 3g.20gb") has that many of the card's 7 compute slices.
_MIG = re.compile(r"\bmig\s+(\d)g\.", re.IGNORECASE)
MIG_SLICES = 7


def lookup(device_name: str, precision: str) -> tuple[float, str] | None:
    """(peak TFLOPs, where the figure comes from) for a device name as torch reports it, or None. A MIG slice
    gets its share of the card's peak, not the whole card's."""
    words = set(re.split(r"[^a-z0-9]+", device_name.lower()))
    cls = precision_class(precision)
    for peak in PEAKS:
        if all(part in words for part in peak.match):
            figure, source = getattr(peak, cls), f"{peak.label} {cls} dense peak"
            if mig := _MIG.search(device_name):
                slices = int(mig.group(1))
                return figure * slices / MIG_SLICES, f"{source} x {slices}/{MIG_SLICES} (MIG {slices}g slice)"
            return figure, source
    return None


def peak_for(device_name: str, precision: str, override: float | None) -> tuple[float, str] | None:
    if override is not None:
        return override, "hardware.peak_tflops"
    return lookup(device_name, precision)

"""Peak dense TFLOPs of common accelerators, for MFU (model FLOPs utilisation). No torch here.

Figures are the vendors' dense (no structured sparsity) tensor-core peaks, in the precision class a trial's
matmuls run in: fp32 (CUDA cores; what `precision: fp32` gets with TF32 off), tf32, and 16-bit (bf16/fp16
with fp32 accumulation, what autocast uses). A device the table does not know gets no MFU unless the spec
gives `hardware.peak_tflops`.
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
    Peak(("h200",), "NVIDIA H200 SXM", 66.9, 494.7, 989.4),
    Peak(("a100",), "NVIDIA A100", 19.5, 156.0, 312.0),
    Peak(("rtx", "5090"), "NVIDIA GeForce RTX 5090", 104.8, 104.8, 209.5),
    Peak(("rtx", "4090"), "NVIDIA GeForce RTX 4090", 82.6, 82.6, 165.2),
    Peak(("mi300x",), "AMD Instinct MI300X", 163.4, 653.7, 1307.4),
    # Strix Halo (Ryzen AI Max+ 395): 40 RDNA 3.5 CUs at 2.9 GHz; WMMA doubles the 16-bit rate.
    Peak(("8060s",), "AMD Radeon 8060S (Strix Halo)", 29.7, 29.7, 59.4),
    Peak(("gfx1151",), "AMD Radeon 8060S (Strix Halo)", 29.7, 29.7, 59.4),
)


def precision_class(precision: str) -> str:
    return {"fp32": "fp32", "tf32": "tf32"}.get(precision, "bf16")


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

"""Reading DICOM for ``dinox preprocess``, trusting nothing: headers, geometry, Hounsfield units, the walk.

Every value comes from a file someone else wrote. A tag that does not hold what the standard says (a DS
that is not a number, a PixelSpacing with one value) raises TagError naming the tag and the value; a file
that is not a regular file (a FIFO would block a read forever) or a folder that cannot be listed is
counted with its reason. Torch-free: pydicom and numpy only.
"""

from __future__ import annotations

import math
import os
import stat
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dinox.errors import DinoxError

if TYPE_CHECKING:
    from pydicom import Dataset


class TagError(DinoxError, ValueError):
    """A header value that cannot be used: says which tag and what it held."""


@dataclass
class Slice:
    path: Path
    position: float
    instance: int


def header(path: Path):
    import pydicom
    from pydicom.errors import InvalidDicomError

    try:
        return pydicom.dcmread(path, stop_before_pixels=True), ""
    except InvalidDicomError:
        return None, "not a DICOM file"
    except Exception as e:  # noqa: BLE001 - truncated or garbled headers raise many kinds of errors
        return None, f"unreadable DICOM header ({type(e).__name__})"


def _shown(value: object) -> str:
    """A tag's value as DICOM writes it (multiple values joined by backslashes), quoted and bounded."""
    if isinstance(value, (list, tuple)) or type(value).__name__ == "MultiValue":
        value = "\\".join(str(v) for v in value)  # type: ignore[union-attr]
    text = " ".join(str(value).split())
    return f"'{text if len(text) <= 40 else text[:37] + '...'}'"


def number(ds, keyword: str, default: float | None = None) -> float | None:
    """A numeric tag as a finite float; `default` when absent or empty. Raises TagError."""
    try:
        value = getattr(ds, keyword, None)
    except Exception as e:  # noqa: BLE001 - pydicom converts raw values lazily, on access
        raise TagError(f"malformed {keyword} ({type(e).__name__})") from None
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TagError(f"malformed {keyword} {_shown(value)}") from None
    if not math.isfinite(number):
        raise TagError(f"malformed {keyword} {_shown(value)}")
    return number


def numbers(ds, keyword: str, n: int) -> list[float] | None:
    """A multi-valued numeric tag of exactly n finite values; None when absent. Raises TagError."""
    try:
        value = getattr(ds, keyword, None)
    except Exception as e:  # noqa: BLE001
        raise TagError(f"malformed {keyword} ({type(e).__name__})") from None
    if value is None or value == "":
        return None
    items = list(value) if isinstance(value, (list, tuple)) or type(value).__name__ == "MultiValue" else [value]
    try:
        numbers = [float(v) for v in items]
    except (TypeError, ValueError):
        numbers = []
    if len(numbers) != n or not all(math.isfinite(v) for v in numbers):
        raise TagError(f"malformed {keyword} {_shown(value)} (needs {n} numbers)")
    return numbers


def slice_of(path: Path, ds) -> Slice:
    """Where the slice sits along the series' normal: the projection of ImagePositionPatient on the cross
    product of the ImageOrientationPatient row and column vectors (correct also for tilted gantries);
    SliceLocation, then InstanceNumber as fallbacks. Raises TagError."""
    instance = number(ds, "InstanceNumber", 0.0)
    if not float(instance).is_integer():  # type: ignore[arg-type]
        raise TagError(f"malformed InstanceNumber {_shown(instance)}")
    ipp, iop = numbers(ds, "ImagePositionPatient", 3), numbers(ds, "ImageOrientationPatient", 6)
    if ipp is not None and iop is not None:
        normal = np.cross(np.array(iop[:3]), np.array(iop[3:]))
        position = float(np.dot(normal, np.array(ipp)))
    else:
        position = number(ds, "SliceLocation")
    return Slice(path, instance if position is None else position, int(instance))  # type: ignore[arg-type]


def pixels_hu(path: Path, rows: int, cols: int) -> tuple[np.ndarray | None, str]:
    """The slice in Hounsfield units (float32), or None with the reason it cannot be had."""
    import pydicom
    from pydicom.pixels import apply_modality_lut

    try:
        ds = pydicom.dcmread(path)
    except Exception as e:  # noqa: BLE001
        return None, f"unreadable DICOM ({type(e).__name__})"
    if "PixelData" not in ds:
        return None, "no pixel data"
    if (ds.Rows, ds.Columns) != (rows, cols):
        return None, f"size {ds.Rows}x{ds.Columns} differs from the series' {rows}x{cols}"
    try:
        number(ds, "RescaleSlope", 1.0), number(ds, "RescaleIntercept", 0.0)  # a malformed tag, said plainly
    except TagError as e:
        return None, str(e)
    why = _undecodable(ds)
    if why:
        return None, why
    try:
        pixels = ds.pixel_array
    except Exception as e:  # noqa: BLE001 - pydicom raises several types for data it cannot decode
        return (
            None,
            f"pixel data cannot be decoded ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})",
        )
    if pixels.ndim != 2:
        return None, f"pixel array of shape {pixels.shape} (multi-frame or colour) is not a CT slice"
    # Rescale slope and intercept, or a Modality LUT Sequence where the file has one instead.
    return apply_modality_lut(pixels, ds).astype(np.float32), ""


def _undecodable(ds: Dataset) -> str:
    """Why the pixel data cannot be decoded, known before trying: no decoder plugin for its compression
    (pydicom names the plugins that would do), or fewer bytes than Rows x Columns need."""
    from pydicom.pixels import get_decoder

    syntax = ds.file_meta.get("TransferSyntaxUID") if hasattr(ds, "file_meta") else None
    if syntax is not None and syntax.is_compressed:
        try:
            decoder = get_decoder(syntax)
        except NotImplementedError:
            return f"compressed ({syntax.name}): pydicom has no decoder for it"
        if decoder.is_available:
            return ""
        plugins = [dep.split(" - ")[0] for dep in decoder.missing_dependencies]
        hint = f"; pip install one of: {', '.join(plugins)}" if plugins else ""
        return f"compressed ({syntax.name}) and no decoder installed{hint}"
    frames = int(ds.get("NumberOfFrames", 1) or 1)
    needed = ds.Rows * ds.Columns * int(ds.get("SamplesPerPixel", 1)) * int(ds.get("BitsAllocated", 16)) // 8
    if len(ds.PixelData) < needed * frames:
        return "pixel data shorter than Rows x Columns (truncated file?)"
    return ""


@dataclass
class Walk:
    """The regular files under a root; what is not one, or cannot be read, is counted with its reason."""

    root: Path
    not_regular: Counter[str] = field(default_factory=Counter)
    unreadable: dict[str, str] = field(default_factory=dict)

    def files(self) -> Iterator[Path]:
        def failed(e: OSError) -> None:
            where = Path(e.filename).relative_to(self.root).as_posix() if e.filename else "?"
            self.unreadable[where or "."] = e.strerror or type(e).__name__

        for dirpath, dirnames, filenames in os.walk(self.root, onerror=failed):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                path = Path(dirpath) / name
                try:
                    mode = os.stat(path).st_mode
                except OSError as e:
                    self.not_regular[f"unreadable ({e.strerror or type(e).__name__})"] += 1
                    continue
                if not stat.S_ISREG(mode):  # a FIFO would block the header read forever
                    self.not_regular["not a regular file (FIFO, socket or device)"] += 1
                    continue
                yield path

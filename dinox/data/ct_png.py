"""CT slices from the 16-bit PNGs and index.csv that ``dinox preprocess`` writes.

Each sample stacks slices z-1, z, z+1 of its series as three channels (clamped at the series' ends),
converts to HU, and becomes the objective's views under a random HU window. ``subset_size`` + ``seed``
pick a fixed subset of slices and ``inflation`` repeats it without copying files, as in the loader study.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision.transforms.v2 import functional as F

from dinox.data.files import HU_OFFSET, DataError, check_pixels, default_root, neighbours, read_index
from dinox.data.views import HuWindow, ViewPlan, make_views, one_thread


def decode_png16_bytes(data: bytes, decoder: str, name: str) -> np.ndarray:
    """A 16-bit PNG's bytes as its stored values (HU + 32768), uint16 [H, W]; `name` says where it came from."""
    check_pixels(data, name)
    try:
        if decoder == "torchvision":
            from torchvision.io import ImageReadMode, decode_png

            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            return decode_png(buf, mode=ImageReadMode.UNCHANGED)[0].numpy()
        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im)
    except Exception as e:  # noqa: BLE001 - a corrupt file fails the trial with its name, whatever raised
        raise DataError(f"cannot decode {name}: {type(e).__name__}: {e}") from e


def decode_png16(path: str | Path, decoder: str) -> np.ndarray:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise DataError(f"cannot decode {path}: {type(e).__name__}: {e}") from e
    return decode_png16_bytes(data, decoder, str(path))


def to_hu(stored: np.ndarray, size: int | None) -> torch.Tensor:
    """Stored slices, uint16 [3, H, W], as float32 HU, resized to size x size first if a size is given.
    One pass widens the 16-bit values to float and the offset comes off the resized image: this box, a
    256 px slice to 64 px, 0.30 ms against 0.43 ms through int32. Resizing the 16-bit image in PIL before
    widening was slower still (0.60 ms; torchvision's antialiased resize of the float image is the faster
    kernel), so the widening stays first."""
    image = torch.from_numpy(stored.astype(np.float32))
    if size is not None:
        image = F.resize(image, [size, size], antialias=True)
    return image.sub_(HU_OFFSET)


class CtPngSlices(Dataset):
    def __init__(
        self,
        index_csv: str,
        root: str | None,
        plan: ViewPlan,
        window: HuWindow,
        *,
        decoder: str,
        subset_size: int | None,
        seed: int,
        inflation: int,
        num_classes: int,
    ):
        self.root = Path(root) if root else default_root(index_csv)
        self.series, slices = neighbours(read_index(index_csv, self.root))
        if subset_size is not None:
            if subset_size > len(slices):
                raise DataError(f"{subset_size} > the {len(slices)} slices in {index_csv}", "data.subset_size")
            slices = random.Random(seed).sample(slices, subset_size)
        self.slices = slices
        self.plan, self.window, self.decoder = plan, window, decoder
        self.inflation = inflation
        self.num_classes = num_classes

    def __len__(self) -> int:
        return len(self.slices) * self.inflation

    def hu(self, index: int) -> torch.Tensor:
        """Slices z-1, z, z+1 (clamped at the ends) in HU, float32 [3, H, W], at a classification model's
        input size."""
        s, z = self.slices[index % len(self.slices)]
        paths = self.series[s]
        picks = (paths[max(z - 1, 0)], paths[z], paths[min(z + 1, len(paths) - 1)])
        stored = np.stack([decode_png16(self.root / p, self.decoder) for p in picks])
        return to_hu(stored, self.plan.full_size)  # multi-crop views crop the full slice

    def __getitem__(self, index: int):
        if not 0 <= index < len(self):
            raise IndexError(index)
        s, z = self.slices[index % len(self.slices)]
        # No labels in CT pre-training: classification gets a fixed pseudo-label, for throughput only.
        with one_thread():
            return make_views(self.hu(index), self.plan, self.window), (s * 7919 + z) % self.num_classes

"""DINOv2's iBOT masks, drawn where DINOv2 draws them: in the loader's collate (``data/collate.py``'s
collate_data_and_cast, with ``data/masking.py``'s MaskingGenerator), so in its workers where the loader has
them and in the training process where it has none. The draw is part of the recipe's cost: with its masks
picked from a bank drawn once, dinox's step ran 2.7 % faster than a loop written from DINOv2's own code, and
drawn here, 0.3 % (the median's 95 % interval -0.8 to +1.3 %: docs/performance.md, scripts/bench_dinov2.py
--in-process).

The masks ride in the batch's label place (a DINO step has no labels), as a ``MaskDraw`` the loop's copies,
pinning and half batch carry as they carry a label tensor; the indices of the masked patches and their weights
are made in the collate too, as DINOv2 makes them, so the step itself runs no boolean indexing on the device.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate


class MaskingGenerator:
    """dinov2/data/masking.py as DINOv2 runs it, its Python loops included (they are what the recipe pays):
    rectangles of `min_num_patches` or more, aspect 0.3 to 3.3, each adding at most `max_num_patches`, until
    the count is reached or ten tries in a row add nothing."""

    def __init__(self, side: int, max_num_patches: float, min_num_patches: int = 4, min_aspect: float = 0.3):
        self.height = self.width = side
        self.max_num_patches = max_num_patches
        self.min_num_patches = min_num_patches
        self.log_aspect_ratio = (math.log(min_aspect), math.log(1 / min_aspect))

    def _mask(self, mask: np.ndarray, max_mask_patches: float) -> int:
        delta = 0
        for _ in range(10):
            target_area = random.uniform(self.min_num_patches, max_mask_patches)
            aspect_ratio = math.exp(random.uniform(*self.log_aspect_ratio))
            h = round(math.sqrt(target_area * aspect_ratio))
            w = round(math.sqrt(target_area / aspect_ratio))
            if w < self.width and h < self.height:
                top, left = random.randint(0, self.height - h), random.randint(0, self.width - w)
                if 0 < h * w - mask[top : top + h, left : left + w].sum() <= max_mask_patches:
                    for i in range(top, top + h):
                        for j in range(left, left + w):
                            if not mask[i, j]:
                                mask[i, j] = True
                                delta += 1
            if delta > 0:
                break
        return delta

    def __call__(self, count: int = 0) -> np.ndarray:
        mask = np.zeros((self.height, self.width), dtype=bool)
        done = 0
        while done < count:
            delta = self._mask(mask, min(count - done, self.max_num_patches))
            if delta == 0:
                break
            done += delta
        return mask


@dataclass
class MaskDraw:
    """One batch's masks: `masks` (its global crops, crop-major as the step concatenates them, x patches), the
    flat indices of the masked patches, each one's weight (one over its crop's masked count), the rows the heads
    run on (DINOv2's upperbound: the same shapes every step) and the first half of the batch's (the loop's
    half-batch window)."""

    masks: torch.Tensor
    picked: torch.Tensor
    weights: torch.Tensor
    rows: int
    crops: int
    half: MaskDraw | None = None

    @classmethod
    def of(cls, masks: torch.Tensor, rows: int, crops: int, half: MaskDraw | None = None) -> MaskDraw:
        counts = masks.sum(dim=1)
        picked = masks.flatten().nonzero().flatten()[:rows]  # a half batch's share may pass its own upperbound
        weights = (1.0 / counts.clamp(min=1).float()).repeat_interleave(counts)[:rows]
        return cls(masks, picked, weights, rows, crops, half)

    @property
    def shape(self) -> torch.Size:
        """Samples first, as a label tensor's: the loop's half batch reads it."""
        return torch.Size([self.masks.shape[0] // self.crops])

    def __getitem__(self, part: slice) -> MaskDraw:
        """The half batch's draw (the first half of each crop's samples, cut when the batch was collated)."""
        if self.half is None or part != slice(None, self.half.shape[0]):
            raise IndexError(f"a batch's masks give its first half only, not {part}")
        return self.half

    def to(self, device: torch.device | str, non_blocking: bool = False) -> MaskDraw:
        moved = (t.to(device, non_blocking=non_blocking) for t in (self.masks, self.picked, self.weights))
        half = self.half.to(device, non_blocking) if self.half is not None else None
        return MaskDraw(*moved, self.rows, self.crops, half)

    def pin_memory(self) -> MaskDraw:
        pinned = (t.pin_memory() for t in (self.masks, self.picked, self.weights))
        return MaskDraw(*pinned, self.rows, self.crops, self.half.pin_memory() if self.half is not None else None)


@dataclass(frozen=True)
class Masking:
    """What a draw needs: the patch grid of a global crop, the global crops a sample has, the share of crops
    masked and the range of their masked ratio (DINOv2's mask_sample_probability and mask_ratio_min_max)."""

    side: int
    crops: int
    probability: float
    ratio: tuple[float, float]

    def upperbound(self, crops: int) -> int:
        """DINOv2's padded row count for `crops` global crops: each masked crop at the top of its ratio bucket."""
        patches, masked = self.side * self.side, int(crops * self.probability)
        return sum(int(patches * hi) for hi in torch.linspace(*self.ratio, masked + 1).tolist()[1:])

    def draw(self, samples: int) -> MaskDraw:
        """collate_data_and_cast's masks for `samples` samples: the i-th of the masked crops takes a ratio in the
        i-th of equal buckets over the range, the rest none, shuffled; DINOv2's generator caps a rectangle at half
        the grid."""
        patches, crops = self.side * self.side, self.crops * samples
        generator = MaskingGenerator(self.side, 0.5 * patches)
        masked = int(crops * self.probability)
        probs = torch.linspace(*self.ratio, masked + 1).tolist()
        rows = [generator(int(patches * random.uniform(probs[i], probs[i + 1]))) for i in range(masked)]
        rows += [generator(0) for _ in range(masked, crops)]
        random.shuffle(rows)
        full = torch.from_numpy(np.stack(rows)).flatten(1)
        first = full.view(self.crops, samples, patches)[:, : samples // 2].flatten(0, 1)
        half = MaskDraw.of(first, self.upperbound(first.shape[0]), self.crops)
        return MaskDraw.of(full, self.upperbound(crops), self.crops, half)


@dataclass
class MaskCollate:
    """The loader's own collate (None: torch's default), then the batch's masks drawn in the label's place."""

    masking: Masking
    base: Callable[[list], Any] | None = None

    def __call__(self, samples: list) -> tuple[Any, MaskDraw]:
        views, labels = (self.base or default_collate)(samples)
        return views, self.masking.draw(len(labels))

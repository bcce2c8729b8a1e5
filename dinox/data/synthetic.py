"""Synthetic images generated on the host, per sample, inside the DataLoader workers.

Generating each sample costs CPU time proportional to its pixels, so the loader knobs (workers,
prefetch, pinned memory) act on it as they do on a real pipeline; the content is noise, so it measures
the model's compute, not a decoder's.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class SyntheticImages(Dataset):
    def __init__(self, length: int, channels: int, img_size: int, num_classes: int, seed: int):
        self.length = length
        self.shape = (channels, img_size, img_size)
        self.num_classes = num_classes
        self.seed = seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.length:
            raise IndexError(index)
        # Seeded per index: the same sample whichever worker draws it, so runs are repeatable.
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        image = torch.randn(self.shape, generator=g)
        label = int(torch.randint(self.num_classes, (1,), generator=g))
        return image, label

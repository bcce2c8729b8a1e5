"""Synthetic images generated on the host, per sample, inside the DataLoader workers.

Generating each sample costs CPU time proportional to its pixels, so the loader knobs (workers,
prefetch, pinned memory) act on it as they do on a real pipeline; the content is noise, so it measures
the model's compute, not a decoder's. With a multi-crop plan each sample is DINO's list of views.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from dinox.data.views import ViewPlan


class SyntheticImages(Dataset):
    def __init__(self, length: int, channels: int, plan: ViewPlan, num_classes: int, seed: int):
        self.length = length
        self.channels = channels
        self.plan = plan
        self.num_classes = num_classes
        self.seed = seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if not 0 <= index < self.length:
            raise IndexError(index)
        # Seeded per index: the same sample whichever worker draws it, so runs are repeatable.
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        views = [torch.randn((self.channels, s, s), generator=g) for s in self.plan.sizes]
        label = int(torch.randint(self.num_classes, (1,), generator=g))
        return (views[0] if self.plan.full_size is not None else views), label

"""Synthetic images generated on the host, per sample, inside the DataLoader workers.

Generating each sample costs CPU time proportional to its pixels, so the loader knobs (workers,
prefetch, pinned memory) act on it as they do on a real pipeline; the content is noise, so it measures
the model's compute, not a decoder's. With a multi-crop plan each sample is DINO's list of views. Pixels are
uint8 by default, as a decoder yields them, made float and normalised on the device (dinox.data.device_prep)
as timm's prefetching loader does: float32 samples would move four times the bytes a real pipeline moves
through the workers' queues and the host-to-device copies (``data.pixels: float32`` keeps them, as a what-if).
``delay_s`` adds a fixed wait to every sample (a slow disk or network file system, or a decoder's cost),
to ask "what if the input pipeline took this long?" and to build a loader-bound trial on purpose.
"""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset

from dinox.data.views import ViewPlan, one_thread


class SyntheticImages(Dataset):
    def __init__(
        self,
        length: int,
        channels: int,
        plan: ViewPlan,
        num_classes: int,
        seed: int,
        delay_s: float = 0.0,
        pixels: str = "uint8",
    ):
        self.length, self.pixels = length, pixels
        self.delay_s = delay_s
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
        with one_thread():
            if self.pixels == "uint8":
                views = [
                    torch.randint(256, (self.channels, s, s), generator=g, dtype=torch.uint8) for s in self.plan.sizes
                ]
            else:
                views = [torch.randn((self.channels, s, s), generator=g) for s in self.plan.sizes]
            label = int(torch.randint(self.num_classes, (1,), generator=g))
        if self.delay_s:
            time.sleep(self.delay_s)
        return (views[0] if self.plan.full_size is not None else views), label

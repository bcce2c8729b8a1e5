"""What one sample becomes for the objective: a whole image (classification) or DINO's multi-crop views,
and the random HU window applied to each. Runs in the DataLoader workers, so its cost is the loader's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torchvision.transforms.v2 import RandomResizedCrop
from torchvision.transforms.v2 import functional as F

from dinox.spec.objectives import DinoObjective
from dinox.spec.sections import TrialSpec


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Sample preparation on one intra-op thread. In a DataLoader worker torch already runs one; in the main
    process (0 workers) a sample's small ops would otherwise take the trial's threads, which thrash when a core
    is busy: ct_png at 0 workers with one core busy, 2 threads 64 img/s, 1 thread 156 (224 px, this box).
    Switching costs half a microsecond."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class ViewPlan:
    full_size: int | None  # classification: the whole image resized to this; None for multi-crop
    global_count: int = 0
    global_size: int = 0
    global_scale: tuple[float, float] = (0.32, 1.0)
    local_count: int = 0
    local_size: int = 0
    local_scale: tuple[float, float] = (0.05, 0.32)

    @property
    def sizes(self) -> list[int]:
        if self.full_size is not None:
            return [self.full_size]
        return [self.global_size] * self.global_count + [self.local_size] * self.local_count


def view_plan(spec: TrialSpec) -> ViewPlan:
    o = spec.objective
    if isinstance(o, DinoObjective):
        return ViewPlan(
            full_size=None,
            global_count=o.global_crops,
            global_size=o.global_crop_size or spec.model.img_size,
            global_scale=(o.global_crop_min_scale, 1.0),
            local_count=o.local_crops,
            local_size=o.local_crop_size,
            local_scale=(0.05, o.local_crop_max_scale),
        )
    return ViewPlan(full_size=spec.model.img_size)


@dataclass(frozen=True)
class HuWindow:
    level: tuple[float, float] = (-700.0, 100.0)
    width: tuple[float, float] = (300.0, 2000.0)

    def apply(self, hu: torch.Tensor) -> torch.Tensor:
        """Map HU to [0, 1] through a window with level and width drawn uniformly (torch's RNG, which the
        DataLoader seeds per worker)."""
        u = torch.rand(2)
        level = self.level[0] + float(u[0]) * (self.level[1] - self.level[0])
        width = self.width[0] + float(u[1]) * (self.width[1] - self.width[0])
        return ((hu - (level - width / 2)) / width).clamp_(0.0, 1.0)


def make_views(hu: torch.Tensor, plan: ViewPlan, window: HuWindow | None) -> torch.Tensor | list[torch.Tensor]:
    """hu: float32 [C, H, W] in Hounsfield units (or an image in [0, 1], with no window). Returns one windowed
    image, or the list of crops."""
    apply = window.apply if window is not None else (lambda x: x)
    if plan.full_size is not None:
        return apply(F.resize(hu, [plan.full_size, plan.full_size], antialias=True))
    views = []
    for count, size, scale in (
        (plan.global_count, plan.global_size, plan.global_scale),
        (plan.local_count, plan.local_size, plan.local_scale),
    ):
        for _ in range(count):
            top, left, h, w = RandomResizedCrop.get_params(hu, scale=list(scale), ratio=[3 / 4, 4 / 3])
            view = F.resized_crop(hu, top, left, h, w, [size, size], antialias=True)
            if torch.rand(1).item() < 0.5:
                view = F.horizontal_flip(view)
            views.append(apply(view))
    return views

"""The trial's input, built from its spec: the dataset pipeline, the device-side preparation of its batches
(normalisation, Mixup) and the DataLoader with the spec's knobs, as a training run builds them. Nothing is
timed or fetched here: the loop does that, and the workers start inside its first warm-up step."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils.data import DataLoader, IterableDataset

from dinox import record as rec
from dinox.data import build_dataset
from dinox.data.device_prep import DevicePrep
from dinox.data.views import ViewPlan
from dinox.isolate import lifeline
from dinox.measure import models
from dinox.spec.sections import TrialSpec


@dataclass
class Input:
    """What the trial feeds its step from, and what building it recorded."""

    loader: DataLoader
    prep: DevicePrep | None  # the device-side preparation of image batches (None: the data is ready as it is)
    pin: bool  # pinned host memory, applied (only where the device is CUDA)
    non_blocking: bool  # the copies to the device
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


def build(
    spec: TrialSpec,
    dev: torch.device,
    num_classes: int,
    plan: ViewPlan,
    samples: int,
    distributed: tuple[int, int, int] | None,
) -> Input:
    """The loader of `spec` for `dev`; `samples`: what the loop may draw (a synthetic or repeated set is made
    that long), `plan`: the views (dinox.data.views), `distributed`: (rank, local rank, world) under torchrun."""
    lo, channels = spec.loader, models.in_chans(spec.model)
    pipeline = build_dataset(spec, channels, max(num_classes, 1), samples, plan)
    dataset = pipeline.dataset
    metrics: dict[str, float] = {}
    tags: dict[str, str] = {}
    if pipeline.repeats > 1:
        tags[rec.DATA_REPEATS] = str(pipeline.repeats)
        metrics[rec.DATA_SAMPLES] = float(pipeline.samples or 0)
    if getattr(dataset, "urls", None):
        from dinox.data.files import shard_layout

        tags[rec.SHARD_LAYOUT] = shard_layout(dataset.urls[0]) or "unknown"
    prep = DevicePrep(spec.data, dev, spec.model.img_size, num_classes, channels) if pipeline.images else None
    pin = lo.pin_memory and dev.type == "cuda"
    tags[rec.PIN_MEMORY_APPLIED] = str(pin)
    # Asynchronous copies only from pinned memory (otherwise they are synchronous anyway), unless asked.
    non_blocking = pin if lo.non_blocking is None else lo.non_blocking
    iterable = isinstance(dataset, IterableDataset)  # webdataset shuffles in its own buffer
    seed = getattr(spec.data, "seed", 0)
    sampler = None
    if distributed is not None and not iterable:
        from torch.utils.data.distributed import DistributedSampler

        # Each rank its own shard of the data (webdataset splits its shards by rank itself).
        rank, _, world = distributed
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
    loader = DataLoader(
        dataset,
        batch_size=spec.size,
        shuffle=not iterable and sampler is None,
        sampler=sampler,
        generator=None if iterable or sampler is not None else torch.Generator().manual_seed(seed),
        num_workers=lo.num_workers,
        pin_memory=pin,
        prefetch_factor=lo.prefetch_factor,
        persistent_workers=lo.persistent_workers,
        collate_fn=pipeline.collate_fn,
        drop_last=True,  # every step sees the same shapes: no recompilation, no ragged last batch
        worker_init_fn=lifeline.worker_init,  # a worker dies with its trial, even a hung one
    )
    return Input(loader, prep, pin, non_blocking, metrics, tags)

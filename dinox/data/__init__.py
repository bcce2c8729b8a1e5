"""Data sources behind one factory, selected by ``data.source`` in the spec."""

from __future__ import annotations

from torch.utils.data import Dataset

from dinox.data.synthetic import SyntheticImages
from dinox.spec import TrialSpec


def build_dataset(spec: TrialSpec, channels: int, num_classes: int, samples_needed: int) -> Dataset:
    data = spec.data
    if data.source == "synthetic":
        length = data.num_samples or samples_needed
        return SyntheticImages(length, channels, spec.model.img_size, num_classes, data.seed)
    raise ValueError(f"data.source: {data.source!r} is not supported")

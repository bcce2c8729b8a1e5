"""Data sources behind one factory, selected by ``data.source`` in the spec.

The package itself imports nothing heavy: ``dinox.data.dicom_preprocess`` runs on a data box without torch,
so the factory imports torch and the sources only when it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from dinox.data.views import ViewPlan
    from dinox.spec import TrialSpec


def build_dataset(spec: TrialSpec, channels: int, num_classes: int, samples_needed: int, plan: ViewPlan) -> Dataset:
    from dinox.data.views import HuWindow
    from dinox.spec import CtPngData, SyntheticData, WebDatasetData

    data = spec.data
    if isinstance(data, SyntheticData):
        from dinox.data.synthetic import SyntheticImages

        return SyntheticImages(
            data.num_samples or samples_needed, channels, plan, num_classes, data.seed, data.sample_delay_ms / 1000.0
        )
    window = HuWindow((data.window_level_min, data.window_level_max), (data.window_width_min, data.window_width_max))
    if isinstance(data, CtPngData):
        from dinox.data.ct_png import CtPngSlices

        return CtPngSlices(
            data.index_csv,
            data.root,
            plan,
            window,
            decoder=data.decoder,
            subset_size=data.subset_size,
            seed=data.seed,
            inflation=data.inflation,
            num_classes=num_classes,
        )
    if isinstance(data, WebDatasetData):
        from dinox.data.webdataset_source import CtShards

        return CtShards(
            data.shards,
            plan,
            window,
            decoder=data.decoder,
            shuffle_buffer=data.shuffle_buffer,
            seed=data.seed,
            num_classes=num_classes,
        )
    raise ValueError(f"data.source: {data.source!r} is not supported")

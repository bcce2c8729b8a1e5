"""Data sources behind one factory, selected by ``data.source`` in the spec.

The package itself imports nothing heavy: ``dinox.data.dicom_preprocess`` runs on a data box without torch,
so the factory imports torch and the sources only when it is called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from dinox.data.views import ViewPlan
    from dinox.spec.sections import TrialSpec


@dataclass
class Pipeline:
    """What the trial's DataLoader reads, how it batches it, and whether the batch is an image source's (then
    ``dinox.data.device_prep`` finishes it on the device, as timm's loader does)."""

    dataset: Dataset
    collate_fn: Callable[[list], Any] | None = None
    images: bool = False
    repeats: int = 1  # the set seen this many times over in one epoch (see `repeat_to`)
    samples: int | None = None  # the set's own length (None: a stream, webdataset's)


def build_dataset(spec: TrialSpec, channels: int, num_classes: int, samples_needed: int, plan: ViewPlan) -> Pipeline:
    """The trial's data, at least `samples_needed` long (see `repeat_to`)."""
    pipeline = _build(spec, channels, num_classes, samples_needed, plan)
    return repeat_to(pipeline, samples_needed)


def repeat_to(pipeline: Pipeline, samples_needed: int) -> Pipeline:
    """A map-style set smaller than what the measurement draws is seen several times over in one epoch (a new
    shuffle of the whole each epoch), as the loader study repeated its subset: an epoch of a small demo set
    would otherwise end every few steps, and a worker restarting inside a timed window is not what a run over
    the real set (an epoch every few thousand steps) meets. What an epoch boundary costs is measured apart
    (epoch_start_s). A stream (webdataset) repeats its shards itself."""
    from torch.utils.data import IterableDataset

    dataset = pipeline.dataset
    if isinstance(dataset, IterableDataset):
        return pipeline
    n = len(dataset)  # type: ignore[arg-type]
    pipeline.samples = n
    if 0 < n < samples_needed:
        pipeline.repeats = -(-samples_needed // n)
        pipeline.dataset = Repeated(dataset, pipeline.repeats)
    return pipeline


class Repeated:
    """A map-style dataset `times` over, by index modulo its length."""

    def __init__(self, dataset: Any, times: int):
        self.dataset, self.times, self.n = dataset, times, len(dataset)

    def __len__(self) -> int:
        return self.n * self.times

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self.dataset[index % self.n]


def _build(spec: TrialSpec, channels: int, num_classes: int, samples_needed: int, plan: ViewPlan) -> Pipeline:
    from dinox.data.views import HuWindow
    from dinox.spec.data_sources import CtPngData, ImageFolderData, PythonData, SyntheticData

    data = spec.data
    if isinstance(data, PythonData):  # the team's own dataset: its samples as it makes them
        from dinox.data.user_data import DataContext, build

        context = DataContext(spec.model.img_size, channels, num_classes, plan, samples_needed, data.options)
        return Pipeline(build(data, context), images=data.normalize)
    if isinstance(data, SyntheticData):
        from dinox.data.synthetic import SyntheticImages

        delay = data.sample_delay_ms / 1000.0
        images = SyntheticImages(
            data.num_samples or samples_needed, channels, plan, num_classes, data.seed, delay, data.pixels
        )
        return Pipeline(images, images=data.pixels == "uint8")  # uint8: normalised on the device
    if isinstance(data, ImageFolderData):
        return _image_folder(data, plan)
    window = HuWindow((data.window_level_min, data.window_level_max), (data.window_width_min, data.window_width_max))
    if isinstance(data, CtPngData):
        from dinox.data.ct_png import CtPngSlices

        slices = CtPngSlices(
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
        return Pipeline(slices)
    from dinox.data.webdataset_source import Shards

    shards = Shards(
        data.shards,
        plan,
        window,
        decoder=data.decoder,
        shuffle_buffer=data.shuffle_buffer,
        seed=data.seed,
        num_classes=num_classes,
        augment=data.augment,
        repeat=True,
    )
    # A CT shard's views are finished in the worker; an image shard's on the device (DevicePrep tells them apart).
    return Pipeline(shards, images=True)


def _image_folder(data: Any, plan: ViewPlan) -> Pipeline:
    from dinox.data.files import list_image_folder
    from dinox.data.images import ImageSamples, collate_encoded

    _classes, items = list_image_folder(data.root)
    encoded = data.decode_device == "cuda"
    samples = ImageSamples(items, plan, data.decoder, data.augment, encoded=encoded)
    return Pipeline(samples, collate_encoded if encoded else None, images=True)

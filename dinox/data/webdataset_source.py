"""webdataset tar shards, streamed and split across DataLoader workers and hosts, in either layout:

- CT: ``dinox shards --index-csv`` keeps a slice's three slices (z-1, z, z+1, clamped) as the lossless 16-bit
  PNG bytes ``preprocess`` wrote, under keys ``prev.png``, ``cur.png``, ``next.png``, plus ``json`` metadata.
  Sample keys avoid dots, which webdataset reads as the start of a file extension (series UIDs have many).
- images: ``jpg`` / ``png`` (or ``jpeg``, ``webp``) with ``cls``, as ``dinox shards --image-folder`` and other
  tools write them; decoded and transformed as an image folder's files are (``dinox.data.images``).
"""

from __future__ import annotations

import io
import json

import numpy as np
from torch.utils.data import IterableDataset

from dinox.data.ct_png import decode_png16_bytes, to_hu
from dinox.data.files import IMAGE_KEYS, PARTS, RAW_KEY, DataError, shard_urls
from dinox.data.images import ImageSamples
from dinox.data.views import HuWindow, ViewPlan, make_views, one_thread
from dinox.spec.data_sources import AugmentSpec


class Shards(IterableDataset):
    def __init__(
        self,
        shards: str,
        plan: ViewPlan,
        window: HuWindow,
        *,
        decoder: str,
        shuffle_buffer: int,
        seed: int,
        num_classes: int,
        augment: AugmentSpec | None = None,
        repeat: bool = False,
    ):
        self.urls = shard_urls(shards)
        self.repeat = repeat
        self.images = ImageSamples([], plan, decoder, augment)
        self.plan, self.window, self.decoder = plan, window, decoder
        self.shuffle_buffer, self.seed, self.num_classes = shuffle_buffer, seed, num_classes

    def _pipeline(self):
        import webdataset as wds

        from dinox.spec.shard_urls import install_openers

        install_openers()  # http(s) through urllib; no scheme that starts a shell or a program
        ds = wds.WebDataset(
            self.urls,
            shardshuffle=len(self.urls) if self.shuffle_buffer else False,
            nodesplitter=wds.split_by_node,  # hosts: by torch.distributed rank when initialised
            workersplitter=wds.split_by_worker,  # DataLoader workers: disjoint shards each
            empty_check=False,  # more workers than shards: the extra ones simply yield nothing
            seed=self.seed,
        )
        if self.shuffle_buffer:
            ds = ds.shuffle(self.shuffle_buffer)
        return ds.map(self._prepared)

    def _prepared(self, sample: dict):
        with one_thread():
            return self._sample(sample)

    def _sample(self, sample: dict):
        if RAW_KEY in sample:
            stored = _raw16(sample[RAW_KEY], f"{sample['__key__']}.{RAW_KEY} in {sample.get('__url__')}")
        elif "cur.png" in sample:
            where = f"{sample['__key__']}.{{}} in {sample.get('__url__')}"
            stored = np.stack([decode_png16_bytes(sample[p], self.decoder, where.format(p)) for p in PARTS])
        else:
            return self._image(sample)
        hu = to_hu(stored, self.plan.full_size)
        meta = json.load(io.BytesIO(sample["json"]))
        label = (int(meta["series"]) * 7919 + int(meta["slice"])) % self.num_classes
        return make_views(hu, self.plan, self.window), label

    def _image(self, sample: dict):
        where = f"{sample['__key__']} in {sample.get('__url__')}"
        key = next((k for k in IMAGE_KEYS if k in sample), None)
        if key is None or "cls" not in sample:
            raise DataError(f"{where}: neither a CT sample (cur.png, slices.npy) nor an image one (jpg/png with cls)")
        return self.images.prepare(sample[key], f"{where}.{key}"), int(sample["cls"]) % self.num_classes

    def __iter__(self):
        """One pass over this worker's shards; with `repeat`, pass after pass (until a pass yields nothing: a
        worker without shards), so a small shard set never ends an epoch inside a trial's measurement.
        webdataset's own repeat() would spin forever on a worker that has no shard."""
        while True:
            yielded = False
            for sample in self._pipeline():
                yielded = True
                yield sample
            if not yielded or not self.repeat:
                return


def _raw16(data: bytes, name: str) -> np.ndarray:
    """A raw16 sample's stored values, uint16 [3, H, W]."""
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataError(f"cannot decode {name}: {type(e).__name__}: {e}") from e
    if array.dtype != np.uint16 or array.ndim != 3 or array.shape[0] != 3:
        raise DataError(f"{name}: a {array.dtype} array of shape {array.shape}, not uint16 [3, H, W]")
    return array

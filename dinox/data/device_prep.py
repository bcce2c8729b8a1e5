"""What a timm training loop does to an image batch on the device, before the forward pass.

timm's prefetching loader makes the uint8 batch float, normalises it and applies random erasing on the
device; timm's train.py then applies Mixup / CutMix to the device batch and trains on soft targets. dinox does
the same, with timm's own ``RandomErasing`` and ``Mixup``, so their cost lands where a real run pays it: the
preparation in the host-to-device part of the step, Mixup inside the step. With ``decode_device: cuda`` the
batch arrives as encoded JPEG bytes and is decoded here (``torchvision.io.decode_jpeg`` on the device, nvJPEG
on CUDA), then cropped and flipped by torchvision on the device: timm's transforms work on PIL images.
"""

from __future__ import annotations

from typing import Any

import torch
from torchvision.transforms.v2 import functional as F

from dinox.spec.data_sources import AugmentSpec, ImageFolderData, MixupSpec, SyntheticData, WebDatasetData

MEAN = (0.485, 0.456, 0.406)  # timm's IMAGENET_DEFAULT_MEAN / STD, what create_transform normalises with
STD = (0.229, 0.224, 0.225)


class DevicePrep:
    """The batch's device-side preparation for one trial's image source."""

    def __init__(
        self,
        data: ImageFolderData | WebDatasetData | SyntheticData,
        dev: torch.device,
        img_size: int,
        num_classes: int,
        channels: int = 3,
    ):
        self.dev, self.img_size = dev, img_size
        self.augment: AugmentSpec | None = getattr(data, "augment", None)  # synthetic noise: none
        self.decode_on_device = getattr(data, "decode_device", "cpu") == "cuda"
        # ImageNet's statistics for RGB; another channel count (a CT model's in_chans: 1) their mean.
        mean, std = (MEAN, STD) if channels == 3 else ((sum(MEAN) / 3,) * channels, (sum(STD) / 3,) * channels)
        self.mean = torch.tensor(mean, device=dev).view(1, channels, 1, 1)
        self.std = torch.tensor(std, device=dev).view(1, channels, 1, 1)
        self.erase = _random_erasing(self.augment, dev)
        self.mixup = _mixup(getattr(data, "mixup", None), num_classes)

    def images(self, images: Any) -> Any:
        """The moved batch (a tensor, DINO's list of views, or encoded bytes) made ready for the model."""
        if self.decode_on_device:
            images = self.decode(images)
        if isinstance(images, list):
            return [self._normalise(v) for v in images]
        x = self._normalise(images)
        return self.erase(x) if self.erase is not None and images.dtype == torch.uint8 else x

    def decode(self, encoded: list[torch.Tensor]) -> torch.Tensor:
        """JPEG bytes (one uint8 tensor each, on the host) to a uint8 [N, 3, S, S] batch on the device."""
        from torchvision.io import ImageReadMode, decode_jpeg

        decoded = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.dev)
        return torch.stack([self._crop(im) for im in decoded])

    def _crop(self, image: torch.Tensor) -> torch.Tensor:
        size = [self.img_size, self.img_size]
        a = self.augment
        if a is None:
            return F.center_crop(F.resize(image, [self.img_size], antialias=True), size)
        from torchvision.transforms.v2 import RandomResizedCrop

        top, left, h, w = RandomResizedCrop.get_params(image, scale=list(a.scale), ratio=list(a.ratio))
        image = F.resized_crop(image, top, left, h, w, size, antialias=True)
        if torch.rand(1).item() < a.hflip:
            image = F.horizontal_flip(image)
        if torch.rand(1).item() < a.vflip:
            image = F.vertical_flip(image)
        return image

    def _normalise(self, x: torch.Tensor) -> torch.Tensor:
        # Images arrive as uint8; a float batch (CT views from shards, windowed in the worker) is already done.
        if x.dtype != torch.uint8:
            return x
        return x.float().div_(255.0).sub_(self.mean).div_(self.std)


def _random_erasing(augment: AugmentSpec | None, dev: torch.device):
    if augment is None or augment.re_prob == 0:
        return None
    from timm.data.random_erasing import RandomErasing

    return RandomErasing(augment.re_prob, mode=augment.re_mode, max_count=augment.re_count, device=str(dev))


def _mixup(spec: MixupSpec | None, num_classes: int):
    if spec is None:
        return None
    from timm.data import Mixup

    return Mixup(
        mixup_alpha=spec.mixup_alpha,
        cutmix_alpha=spec.cutmix_alpha,
        prob=spec.prob,
        switch_prob=spec.switch_prob,
        mode=spec.mode,
        label_smoothing=spec.label_smoothing,
        num_classes=num_classes,
    )

"""Images from an ImageNet-style folder (root/<class>/<image>): read, decoded (PIL or torchvision.io), and
transformed by timm's own transform, in the DataLoader workers.

The transform is ``timm.data.create_transform`` with ``use_prefetcher=True``, as timm's training script runs
it: the workers hand over uint8 images, and the device batch is made float, normalised and randomly erased on
the device (``dinox.data.device_prep``). With ``decode_device: cuda`` a worker only reads the file: the step
decodes the batch with nvJPEG. A file that cannot be read or decoded fails the trial with its path.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch
from torch.utils.data import Dataset

from dinox.data.files import DataError, check_pixels
from dinox.data.views import ViewPlan, make_views, one_thread
from dinox.spec.data_sources import AugmentSpec


def decode(data: bytes, decoder: str, name: str) -> object:
    """An RGB image: a PIL image, or a uint8 [3, H, W] tensor from torchvision.io."""
    check_pixels(data, name)
    try:
        if decoder == "torchvision":
            from torchvision.io import ImageReadMode, decode_image

            return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            return im.convert("RGB")
    except Exception as e:  # noqa: BLE001 - each decoder raises its own types for a bad file
        raise DataError(f"cannot decode {name}: {type(e).__name__}: {e}") from e


def build_transform(img_size: int, augment: AugmentSpec | None):
    """timm's training transform with the spec's knobs (or its eval transform: resize and center crop),
    ending in uint8 tensors; normalisation and random erasing happen on the device."""
    from timm.data import create_transform

    if augment is None:
        return create_transform(img_size, is_training=False, use_prefetcher=True)
    return create_transform(
        img_size,
        is_training=True,
        use_prefetcher=True,
        scale=augment.scale,
        ratio=augment.ratio,
        hflip=augment.hflip,
        vflip=augment.vflip,
        color_jitter=augment.color_jitter,
        auto_augment=augment.auto_augment,
        interpolation=augment.interpolation,
    )


def needs_pil(augment: AugmentSpec | None) -> bool:
    """timm's auto-augment policies work on PIL images only: a torchvision-decoded image is handed to them as
    one (the conversion is part of such a pipeline's cost, and measured with it)."""
    return augment is not None and augment.auto_augment is not None


class ImageSamples(Dataset):
    """(image file, class) pairs as training samples: one transformed image for classification, DINO's
    multi-crop views otherwise, or the encoded bytes when the device decodes."""

    def __init__(
        self,
        items: list[tuple[str, int]],
        plan: ViewPlan,
        decoder: str,
        augment: AugmentSpec | None,
        encoded: bool = False,
    ):
        self.items, self.plan, self.decoder, self.augment, self.encoded = items, plan, decoder, augment, encoded
        self.to_pil = needs_pil(augment)
        # Classification: timm's transform; DINO keeps its own multi-crop views (dinox.data.views).
        full = plan.full_size
        self.transform = build_transform(full, augment) if full is not None and not encoded else None

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        path, label = self.items[index]
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise DataError(f"cannot read {path}: {e.strerror or e}") from e
        with one_thread():
            return self.prepare(data, path), label

    def prepare(self, data: bytes, name: str):
        """One encoded image as a sample: what the DataLoader batches."""
        if self.encoded:
            check_pixels(data, name)  # the device's decoder allocates what the header says
            return torch.frombuffer(bytearray(data), dtype=torch.uint8)
        image = decode(data, self.decoder, name)
        if self.transform is not None:
            if self.to_pil and isinstance(image, torch.Tensor):
                from torchvision.transforms.functional import to_pil_image

                image = to_pil_image(image)
            return self.transform(image)
        return make_views(_as_uint8(image), self.plan, None)


def _as_uint8(image: object) -> torch.Tensor:
    """[3, H, W] uint8, for DINO's own multi-crop views (made float and normalised on the device)."""
    if isinstance(image, torch.Tensor):
        return image
    from torchvision.transforms.functional import pil_to_tensor

    return pil_to_tensor(image)


def collate_encoded(samples: list[tuple[torch.Tensor, int]]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A batch of encoded images stays a list (their lengths differ); the labels a tensor."""
    return [s[0] for s in samples], torch.tensor([s[1] for s in samples])

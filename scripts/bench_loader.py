"""The image loader alone: images/s per DataLoader worker count, PIL against torchvision decoding, with and
without RandAugment (timm's rand-m9-mstd0.5), and GPU decoding (nvJPEG) when CUDA is there.

Reads the demo tree (`python scripts/make_demo_images.py data/demo_images`, written here if missing) through
dinox's own ImageSamples and timm's transform, as a trial's loader does, with no model. Each configuration
runs in alternating rounds and reports the median, since this is a shared, noisy machine.

    python scripts/bench_loader.py                       # 224 px, workers 0 1 2, 3 rounds
    python scripts/bench_loader.py --workers 0 4 8 --rounds 5
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, RandomSampler

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dinox.data.device_prep import DevicePrep  # noqa: E402
from dinox.data.files import list_image_folder  # noqa: E402
from dinox.data.images import ImageSamples, collate_encoded  # noqa: E402
from dinox.data.views import ViewPlan  # noqa: E402
from dinox.spec.data_sources import AugmentSpec, ImageFolderData  # noqa: E402

RANDAUGMENT = AugmentSpec(auto_augment="rand-m9-mstd0.5")  # -inc1 crashes with Pillow 13: see dinox.plan.preflight


def _demo_tree(root: Path) -> None:
    if root.is_dir():
        return
    spec = importlib.util.spec_from_file_location("make_demo_images", ROOT / "scripts" / "make_demo_images.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)  # type: ignore[union-attr]
    demo.write_tree(root)


def images_per_s(items, size: int, decoder: str, augment, workers: int, batch: int, batches: int) -> float:
    """The loader's rate over `batches` batches after one warm-up batch (workers started)."""
    encoded = decoder == "gpu"
    samples = ImageSamples(items, ViewPlan(full_size=size), "pil" if encoded else decoder, augment, encoded=encoded)
    loader = DataLoader(
        samples,
        batch_size=batch,
        # Drawn with replacement: as many batches as asked for, whatever the size of the tree.
        sampler=RandomSampler(samples, replacement=True, num_samples=(batches + 1) * batch),
        num_workers=workers,
        collate_fn=collate_encoded if encoded else None,
        drop_last=True,
    )
    prep = None
    if encoded:
        prep = DevicePrep(ImageFolderData(root="-", decode_device="cuda"), torch.device("cuda"), size, 1000)
    it = iter(loader)
    next(it)
    t = time.perf_counter()
    for _ in range(batches):
        images, _labels = next(it)
        if prep is not None:
            prep.images(images)
            torch.cuda.synchronize()
    return batches * batch / (time.perf_counter() - t)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(ROOT / "data" / "demo_images"))
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    _demo_tree(Path(args.root))
    _classes, items = list_image_folder(args.root)
    configs = [(d, a) for d in ("pil", "torchvision") for a in (None, RANDAUGMENT)]
    if torch.cuda.is_available():
        configs.append(("gpu", None))
    rates: dict[tuple, list[float]] = {}
    for _round in range(args.rounds):
        for workers in args.workers:
            for decoder, augment in configs:  # alternating: every configuration sees the same noise
                rate = images_per_s(items, args.size, decoder, augment, workers, args.batch, args.batches)
                rates.setdefault((decoder, augment is not None, workers), []).append(rate)
    print(f"{len(items)} demo images, {args.size} px, batch {args.batch}; images/s (median of {args.rounds} rounds)")
    print(f"{'decoder':<12} {'RandAugment':<12} " + " ".join(f"{f'{w} workers':>10}" for w in args.workers))
    for decoder, augment in configs:
        cells = [statistics.median(rates[(decoder, augment is not None, w)]) for w in args.workers]
        print(f"{decoder:<12} {'yes' if augment else 'no':<12} " + " ".join(f"{c:>10.1f}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())

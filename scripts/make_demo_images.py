"""Write a small ImageNet-like tree of real JPEGs (root/<class>/<name>.JPEG), nothing downloaded.

Each image is 500x375 by default (ImageNet's commonest size) with ImageNet's typical JPEG quality, and content
that costs a decoder what a photograph costs: smooth shapes and texture, about 60-120 KB a file, not flat
colour (a few KB, decoded much faster) nor pure noise (larger than any photograph).

    python scripts/make_demo_images.py data/demo_images            # 4 classes x 100 images: more than the
                                                                   # largest batch of resnet50_imagenet.yaml
    python scripts/make_demo_images.py data/demo_images --classes 10 --per-class 100
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image


def image(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """Low-frequency colour fields (the scene) plus fine texture (the detail a decoder has to restore)."""
    coarse = rng.integers(0, 256, (height // 25 + 2, width // 25 + 2, 3), dtype=np.uint8)
    scene = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), dtype=np.int16)
    texture = rng.normal(0, 18, (height, width, 3)).astype(np.int16)
    return Image.fromarray(np.clip(scene + texture, 0, 255).astype(np.uint8))


def write_tree(
    root: str | Path, classes: int = 4, per_class: int = 100, size: tuple[int, int] = (500, 375), seed: int = 0
) -> list[Path]:
    rng = np.random.default_rng(seed)
    paths = []
    for c in range(classes):
        folder = Path(root) / f"n{c:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            path = folder / f"n{c:08d}_{i}.JPEG"
            image(rng, *size).save(path, quality=90)
            paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--width", type=int, default=500)
    parser.add_argument("--height", type=int, default=375)
    args = parser.parse_args()
    paths = write_tree(args.root, args.classes, args.per_class, (args.width, args.height))
    kb = sum(p.stat().st_size for p in paths) / len(paths) / 1024
    print(f"wrote {len(paths)} JPEGs ({args.width}x{args.height}, {kb:.0f} KB on average) under {args.root}")


if __name__ == "__main__":
    main()

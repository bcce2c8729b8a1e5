#!/usr/bin/env python3
"""ct_png loader throughput per worker count: torchvision.io against PIL + numpy decoding, in one run; then
CT shards per worker count, png16 (the PNG bytes) against raw16 (uncompressed, nothing to inflate).

Writes a demo CT study at 512 x 512 (the usual CT matrix), preprocesses it to 16-bit PNGs, then iterates
a real DataLoader over the ct_png dataset (three slices per sample, random HU window, resize to 224) for
each worker count, alternating the two decoders so both see the same machine state. Prints images/s.

    python scripts/bench_decode.py                  # workers 0, 1, 2; 3 rounds
    python scripts/bench_decode.py --workers 0 4 8 16 --batches 40
    python scripts/bench_decode.py --matrix 256 --size 64 --busy   # small slices, small model, a core busy
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from dinox.data.ct_png import CtPngSlices, decode_png16, to_hu
from dinox.data.dicom_preprocess import preprocess
from dinox.data.files import write_shards
from dinox.data.views import HuWindow, ViewPlan, one_thread
from dinox.data.webdataset_source import Shards

_spec = importlib.util.spec_from_file_location("make_demo_ct", Path(__file__).with_name("make_demo_ct.py"))
demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo)  # type: ignore[union-attr]


def loader_ips(index: Path, decoder: str, workers: int, args: argparse.Namespace) -> float:
    ds = CtPngSlices(
        str(index),
        None,
        ViewPlan(full_size=args.size),
        HuWindow(),
        decoder=decoder,
        subset_size=None,
        seed=0,
        inflation=100,
        num_classes=1000,
    )
    loader = DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=workers, drop_last=True)
    it = iter(loader)
    next(it)  # worker start-up is not decoding
    t = time.perf_counter()
    for _ in range(args.batches):
        next(it)
    return args.batches * args.batch / (time.perf_counter() - t)


def shards_ips(folder: Path, workers: int, batch: int, size: int) -> float:
    """One warm pass over the shards (workers started, files cached), then a timed one."""
    ds = Shards(
        str(folder), ViewPlan(full_size=size), HuWindow(), decoder="pil", shuffle_buffer=0, seed=0, num_classes=10
    )
    loader = DataLoader(ds, batch_size=batch, num_workers=workers, persistent_workers=workers > 0)
    for _ in loader:
        pass
    t, n = time.perf_counter(), 0
    for images, _labels in loader:
        n += images.shape[0]
    return n / (time.perf_counter() - t)


@contextlib.contextmanager
def busy_core(on: bool) -> Iterator[None]:
    """Another process spinning on one core, as a second job or the trial's own step would."""
    if not on:
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def decode_ms(pngs: list[Path], decoder: str) -> float:
    t = time.perf_counter()
    for p in pngs:
        decode_png16(p, decoder)
    return (time.perf_counter() - t) / len(pngs) * 1000


def to_hu_ms(pngs: list[Path], size: int) -> float:
    """The rest of a classification sample after decoding: three stored slices to float HU at the model's size."""
    stacks = [np.stack([decode_png16(p, "pil") for p in pngs[i : i + 3]]) for i in range(len(pngs) - 2)]
    with one_thread():
        t = time.perf_counter()
        for stored in stacks:
            to_hu(stored, size)
    return (time.perf_counter() - t) / len(stacks) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slices", type=int, default=40)
    parser.add_argument("--matrix", type=int, default=512, help="slice size in pixels (CT: 512)")
    parser.add_argument("--size", type=int, default=224, help="the model's input size")
    parser.add_argument("--busy", action="store_true", help="keep one core busy with another process")
    parser.add_argument("--threads", type=int, default=None, help="torch threads in the main process")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # the trial's threads; the loader goes to one for each sample
    with tempfile.TemporaryDirectory() as tmp, busy_core(args.busy):
        demo.make_demo(Path(tmp) / "dicom", patients=2, slices=args.slices, size=args.matrix)
        preprocess(Path(tmp) / "dicom", Path(tmp) / "png", progress=False)
        index = Path(tmp) / "png" / "_index" / "index.csv"
        pngs = sorted((Path(tmp) / "png").rglob("*.png"))
        decoders = ("torchvision", "pil")
        single = {d: [] for d in decoders}
        for _ in range(args.rounds):
            for d in decoders:
                single[d].append(decode_ms(pngs, d))
        shape = f"{args.matrix}x{args.matrix}"
        print(f"decode one {shape} 16-bit PNG (median of {args.rounds} rounds over {len(pngs)} files):")
        for d in decoders:
            print(f"  {d:<12} {statistics.median(single[d]):6.2f} ms")
        hu_ms = statistics.median(to_hu_ms(pngs, args.size) for _ in range(args.rounds))
        print(f"  then 3 slices to HU at {args.size} px: {hu_ms:.2f} ms a sample")
        print(
            f"loader images/s (3 slices + HU window + resize to {args.size} per image; batch {args.batch}, "
            f"median of {args.rounds} rounds{', one core busy' if args.busy else ''}):"
        )
        print(f"  {'workers':>7} {'torchvision':>12} {'pil':>8} {'tv/pil':>7}")
        for w in args.workers:
            ips = {d: [] for d in decoders}
            for _ in range(args.rounds):
                for d in decoders:
                    ips[d].append(loader_ips(index, d, w, args))
            tv, pil = statistics.median(ips["torchvision"]), statistics.median(ips["pil"])
            print(f"  {w:>7} {tv:>12.1f} {pil:>8.1f} {tv / pil:>7.2f}")
        _shard_table(Path(tmp), index, args)


def _shard_table(tmp: Path, index: Path, args: argparse.Namespace) -> None:
    encodings = ("png16", "raw16")
    for encoding in encodings:
        write_shards(index, tmp / encoding, shard_size=8, encoding=encoding)
    print(f"CT shards, loader images/s (PIL for png16; batch {args.batch}, median of {args.rounds} rounds):")
    print(f"  {'workers':>7} {'png16':>8} {'raw16':>8} {'raw/png':>8}")
    for w in args.workers:
        ips = {e: [] for e in encodings}
        for _ in range(args.rounds):
            for e in encodings:
                ips[e].append(shards_ips(tmp / e, w, args.batch, args.size))
        png, raw = statistics.median(ips["png16"]), statistics.median(ips["raw16"])
        print(f"  {w:>7} {png:>8.1f} {raw:>8.1f} {raw / png:>8.2f}")


if __name__ == "__main__":
    main()

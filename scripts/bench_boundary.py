#!/usr/bin/env python3
"""What an epoch boundary costs a plain PyTorch loop with loader workers: the quickstart's step (a ViT-Tiny at
64 px, batch 32 x 2 micro-batches, AdamW, fp32, on the CPU) over a synthetic set of `--steps` steps an epoch,
with `--workers` workers, non-persistent and then persistent; no dinox. For each epoch after the first: the
restarted iterator's first batch, the step that trains on it, the median step, and the minor page faults of
that step beside a median step's.

A trial charges each boundary the restart's first batch and the step on it, less a typical step
(`epoch_boundary_s`, docs/measuring.md "Epochs"), because on this project's 2-core box the first batch came in
0.02-0.08 s and the step after it ran 0.39-0.61 s over a typical one, with 52,000-56,000 page faults: the
restart forked new workers, and each page the training process writes next is copied first. Persistent workers
fork nothing.

    python scripts/bench_boundary.py                    # 2 workers, 3 boundaries each way
    python scripts/bench_boundary.py --workers 4 --epochs 5
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def run(persistent: bool, workers: int, epochs: int, steps: int, img: int, batch: int) -> list[str]:
    import timm
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Synthetic(Dataset):
        def __len__(self) -> int:
            return steps * 2 * batch

        def __getitem__(self, i: int):
            return torch.randn(3, img, img, generator=torch.Generator().manual_seed(i)), i % 100

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=img, num_classes=100, pretrained=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    loader = DataLoader(Synthetic(), batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=persistent)
    lines = []
    for epoch in range(epochs + 1):
        t = time.perf_counter()
        it = iter(loader)
        held = next(it)
        first_batch = time.perf_counter() - t
        taken: list[tuple[float, int]] = []
        for _ in range(steps):
            t, f = time.perf_counter(), faults()
            for micro in range(2):
                x, y = held if not taken and micro == 0 else next(it)
                (torch.nn.functional.cross_entropy(model(x), y) / 2).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            taken.append((time.perf_counter() - t, faults() - f))
        if epoch:  # the first epoch's start is the workers' first start, not a boundary
            median = statistics.median(s for s, _ in taken[1:])
            lines.append(
                f"  epoch {epoch}: first batch {first_batch:.3f} s, its step {taken[0][0]:.3f} s "
                f"({taken[0][0] - median:+.3f} over the median {median:.3f}), page faults {taken[0][1]} "
                f"against a median {statistics.median(n for _, n in taken[1:]):.0f}"
            )
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3, help="boundaries timed, each way")
    p.add_argument("--steps", type=int, default=20, help="steps an epoch")
    p.add_argument("--img", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    a = p.parse_args()
    if a.workers < 1 or a.epochs < 1 or a.steps < 2 or a.img % 16 or a.batch < 1:
        p.error("--workers, --epochs and --batch at least 1, --steps at least 2, --img a multiple of 16")
    for persistent in (False, True):
        workers = f"{a.workers} worker{'s' if a.workers > 1 else ''}"
        print(f"{workers}, {'persistent' if persistent else 'forked again each epoch'}:", flush=True)
        print("\n".join(run(persistent, a.workers, a.epochs, a.steps, a.img, a.batch)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

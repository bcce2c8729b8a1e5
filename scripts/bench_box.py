#!/usr/bin/env python3
"""Does this box hold one pace? A plain PyTorch loop of the quickstart's step (a ViT-Tiny at 64 px, batch 32 x 2
micro-batches, AdamW, fp32, on the CPU; one batch reused, no loader, no dinox), its images/s over every
`--every` seconds for `--seconds`, in one process, once per thread count; beside each line the CPU time the
hypervisor took (steal) and the share of the cores other processes used over the run.

A forecast from a sweep's short windows holds against a minute of training only where the box keeps one pace
between them. On this project's 2-core VM, quiet, two threads ran 180-189 img/s, then 211-240, then back, for tens
of seconds at a time, with no steal and nothing else running, while one thread held 126-134: the box, not
dinox, moves the figure (dinox verify's quarters, docs/deciding.md; docs/evidence.md).

    python scripts/bench_box.py                         # 120 s each at 1 and 2 threads, a figure every 5 s
    python scripts/bench_box.py --threads 2 --seconds 300
"""

from __future__ import annotations

import argparse
import sys
import time

import psutil


def cpu_seconds() -> tuple[float, float, float]:
    """(all, idle, steal) CPU seconds of the box since boot, its cores together (psutil's /proc/stat; steal 0
    where the platform has none)."""
    t = psutil.cpu_times()
    guest = getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)  # Linux counts these in user and nice too
    return sum(t) - guest, t.idle + getattr(t, "iowait", 0.0), getattr(t, "steal", 0.0)


def own_seconds() -> float:
    """This process's CPU seconds, its threads together."""
    t = psutil.Process().cpu_times()
    return t.user + t.system


def run(threads: int, seconds: float, every: float, img: int, batch: int) -> str:
    import timm
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=img, num_classes=100, pretrained=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    x, y = torch.randn(batch, 3, img, img), torch.randint(0, 100, (batch,))

    def step() -> None:
        for _ in range(2):
            (torch.nn.functional.cross_entropy(model(x), y) / 2).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    box0, mine0, start = cpu_seconds(), own_seconds(), time.perf_counter()
    rates, edge, images = [], start, 0
    while time.perf_counter() - start < seconds:
        step()
        images += 2 * batch
        now = time.perf_counter()
        if now - edge >= every:
            rates.append(images / (now - edge))
            edge, images = now, 0
    (all1, idle1, steal1), mine = cpu_seconds(), own_seconds() - mine0
    total, idle, steal = all1 - box0[0], idle1 - box0[1], steal1 - box0[2]
    others = (total - idle - steal - mine) / total if total > 0 else float("nan")
    return (
        f"{threads} thread{'s' * (threads != 1)}: {' '.join(f'{r:.0f}' for r in rates)} img/s "
        f"(min {min(rates, default=0):.0f}, max {max(rates, default=0):.0f}); steal {steal:.2f} s, "
        f"other processes {max(others, 0.0):.0%} of the cores, idle {idle / total if total > 0 else 0:.0%}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--every", type=float, default=5.0)
    p.add_argument("--img", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    a = p.parse_args()
    if a.seconds <= 0 or a.every <= 0 or a.img % 16 or a.batch < 1 or min(a.threads) < 1:
        p.error("--seconds and --every above 0, --img a multiple of 16, --batch and --threads at least 1")
    for threads in a.threads:
        print(run(threads, a.seconds, a.every, a.img, a.batch), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

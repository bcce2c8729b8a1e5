"""The timed loop, in-process on the CPU: accounting against an independent clock, and the time split."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from dinox import bench


class Images(Dataset):
    def __init__(self, n: int, delay_s: float = 0.0):
        self.n, self.delay_s = n, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.delay_s:
            time.sleep(self.delay_s)
        return torch.zeros(3, 8, 8), 0


def loop(loader, micro_step, optimizer_step=lambda: None, accumulation=2, batch_size=4, warmup=2, steps=6):
    return bench.run(
        loader,
        to_device=lambda b: b,
        micro_step=micro_step,
        optimizer_step=optimizer_step,
        device=torch.device("cpu"),
        accumulation=accumulation,
        batch_size=batch_size,
        warmup_steps=warmup,
        bench_steps=steps,
    )


def test_images_per_s_matches_an_independent_clock():
    model = torch.nn.Linear(3 * 8 * 8, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ends: list[float] = []  # the test's own clock, read at the end of every optimizer step

    def micro(batch):
        x, _ = batch
        model(x.flatten(1)).sum().backward()
        time.sleep(0.01)  # a step long enough that timer granularity does not matter

    def step():
        opt.step()
        opt.zero_grad(set_to_none=True)
        ends.append(time.perf_counter())

    stats = loop(DataLoader(Images(400), batch_size=4), micro, step, warmup=2, steps=8)
    assert len(ends) == 10 and len(stats.steps) == 8
    independent = stats.images / (ends[-1] - ends[1])  # from the end of warm-up to the last step
    assert stats.images == 8 * 2 * 4
    assert stats.images_per_s == pytest.approx(independent, rel=0.05)
    assert stats.window_s == pytest.approx(sum(s.step_s for s in stats.steps), rel=0.05)


def test_compute_heavy_loop_is_compute_bound():
    stats = loop(DataLoader(Images(200), batch_size=4), lambda b: time.sleep(0.02))
    assert stats.mean("step_s") == pytest.approx(0.04, rel=0.5)
    assert stats.mean("compute_s") > 0.8 * stats.mean("step_s")
    assert bench.classify(stats.mean("data_s"), stats.mean("h2d_s"), stats.mean("step_s"), 0.1) == "compute_bound"


def test_slow_loader_is_io_bound():
    # 4 samples x 10 ms per micro-batch in the main process: the step waits on data.
    stats = loop(DataLoader(Images(200, delay_s=0.01), batch_size=4), lambda b: None)
    assert stats.mean("data_s") > 0.8 * stats.mean("step_s")
    assert bench.classify(stats.mean("data_s"), stats.mean("h2d_s"), stats.mean("step_s"), 0.1) == "io_bound"


def test_an_exhausted_loader_starts_a_new_epoch():
    stats = loop(DataLoader(Images(8), batch_size=4), lambda b: None, warmup=1, steps=5)  # 1 epoch = 2 micro
    assert len(stats.steps) == 5


def test_classify_prefers_the_larger_wait():
    assert bench.classify(0.05, 0.3, 1.0, 0.1) == "transfer_bound"
    assert bench.classify(0.3, 0.2, 1.0, 0.1) == "io_bound"
    assert bench.classify(0.05, 0.05, 1.0, 0.1) == "compute_bound"


def test_quantile_interpolates_like_numpy():
    values = [4.0, 1.0, 3.0, 2.0]
    assert bench.quantile(values, 0.5) == 2.5
    assert bench.quantile(values, 0.9) == pytest.approx(3.7)
    assert bench.quantile([7.0], 0.9) == 7.0


def test_repeated_windows_report_their_spread():
    calls = [0]

    def micro(batch):
        calls[0] += 1
        # Warm-up (1 step x 2 micro) and the first window (3 x 2) at 5 ms, the second and third at 10 ms.
        time.sleep(0.005 if calls[0] <= 8 else 0.010)

    stats = bench.run(DataLoader(Images(400), batch_size=4), to_device=lambda b: b, micro_step=micro,
                      optimizer_step=lambda: None, device=torch.device("cpu"), accumulation=2, batch_size=4,
                      warmup_steps=1, bench_steps=3, repeats=3)  # fmt: skip
    assert len(stats.windows_s) == 3 and len(stats.steps) == 9
    assert stats.images == 3 * 3 * 2 * 4 and stats.window_s == sum(stats.windows_s)
    fast, slow1, slow2 = stats.window_images_per_s
    assert fast > 1.5 * slow1 and slow1 == pytest.approx(slow2, rel=0.3)
    assert stats.spread == pytest.approx((fast - min(slow1, slow2)) / sorted([fast, slow1, slow2])[1])
    assert stats.spread > 0.5
    assert stats.loader_start_s >= 0

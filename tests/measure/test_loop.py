"""The timed loop, in-process on the CPU: accounting against an independent clock, the windows and their
steps, the ablation windows and the loader-only window."""

from __future__ import annotations

import functools
import json
import statistics
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from dinox.measure import loop as bench
from dinox.measure.batches import Batches
from dinox.measure.step_metrics import copies_known, decided, summarize
from dinox.measure.timeline import StepTimes
from dinox.measure.windows import Repeats, Window, boundary_cost, pooled, quantile
from dinox.spec.sections import MeasureSpec


class Images(Dataset):
    def __init__(self, n: int, delay_s: float = 0.0):
        self.n, self.delay_s = n, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.delay_s:
            time.sleep(self.delay_s)
        return torch.zeros(3, 8, 8), 0


class FakeClock:
    """A clock that moves only when a step or a sample "takes" time: the loop's arithmetic checked exactly,
    whatever else the machine is doing (a 10 ms sleep beside a parallel suite can take 40)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def take(self, seconds: float) -> None:
        self.t += seconds

    def timeline(self) -> bench.Timeline:
        clock = self

        class Event:
            def record(self) -> None:
                self.t = clock.t

            def query(self) -> bool:
                return True

            def elapsed_time(self, end: Event) -> float:
                return (end.t - self.t) * 1000.0

        return bench.Timeline(Event, lambda: None, host_clock=clock, device_clock=False)


def loop(loader, micro_step, optimizer_step=lambda: None, accumulation=2, batch_size=4, warmup=2, steps=6, **kw):
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
        **kw,
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
    assert len(ends) == 10 and len(stats.steps) == 7  # the intervals between 8 consecutive step ends
    assert stats.clock == "host" and stats.images == 8 * 2 * 4
    independent = stats.images / (ends[-1] - ends[1])  # from the end of warm-up to the last step
    assert stats.images_per_s == pytest.approx(independent, rel=0.05)
    # Each period is the interval between two step ends, as the test's clock saw them.
    assert stats.periods == pytest.approx([b - a for a, b in zip(ends[2:], ends[3:], strict=False)], abs=2e-3)


def test_a_step_splits_into_data_copy_compute_and_idle():
    clock = FakeClock()  # exact: the split's arithmetic, not this machine's sleep

    class Slow(Images):
        def __getitem__(self, i):
            clock.take(0.005)
            return super().__getitem__(i)

    stats = loop(
        DataLoader(Slow(200), batch_size=2),
        lambda b: clock.take(0.02),
        batch_size=2,
        warmup=1,
        steps=4,
        timeline=clock.timeline(),
    )
    for s in stats.steps:
        assert s.busy + s.idle == pytest.approx(s.period, abs=1e-9)
        # 2 micro-batches x 2 samples x 5 ms of loading; 2 x 20 ms of compute.
        assert s.data == pytest.approx(0.02) and s.compute == pytest.approx(0.04)
        assert s.idle_loading == pytest.approx(s.data) and s.lag == 0.0


def test_an_exhausted_loader_starts_a_new_epoch():
    stats = loop(DataLoader(Images(8), batch_size=4), lambda b: None, warmup=1, steps=5)  # 1 epoch = 2 micro
    assert len(stats.windows[0].steps) == 4


def test_quantile_interpolates_like_numpy():
    values = [4.0, 1.0, 3.0, 2.0]
    assert quantile(values, 0.5) == 2.5
    assert quantile(values, 0.9) == pytest.approx(3.7)
    assert quantile([7.0], 0.9) == 7.0


def test_repeated_windows_report_their_spread():
    calls = [0]

    def micro(batch):
        calls[0] += 1
        # Warm-up (1 step x 2 micro) and the first window (3 x 2) at 10 ms, the second and third at 30 ms.
        clock.take(0.010 if calls[0] <= 8 else 0.030)

    clock = FakeClock()
    stats = loop(DataLoader(Images(400), batch_size=4), micro, warmup=1, steps=3, repeats=3, timeline=clock.timeline())
    assert len(stats.windows) == 3 and len(stats.steps) == 6
    assert stats.images == 3 * 3 * 2 * 4 and stats.window_s == sum(w.wall_s for w in stats.windows)
    fast, slow1, slow2 = stats.window_images_per_s
    assert fast > 1.5 * slow1 and slow1 == pytest.approx(slow2, rel=0.3)
    assert stats.spread == pytest.approx((fast - min(slow1, slow2)) / sorted([fast, slow1, slow2])[1])
    assert stats.spread > 0.5
    assert stats.loader_start_s >= 0


def test_windows_settle_when_they_agree_and_run_to_the_cap_when_they_do_not():
    """A steady step stops at the least windows; a step slowed in every other window (10 ms, then 30 ms) goes
    on to the most and keeps its spread. On a fake clock: the rule is checked, not the machine's load."""
    windows = Repeats(2, 5, threshold=0.10)
    clock = FakeClock()
    steady = loop(
        DataLoader(Images(400), batch_size=4),
        lambda b: clock.take(0.010),
        warmup=1,
        steps=3,
        repeats=windows,
        timeline=clock.timeline(),
    )
    assert len(steady.windows) == 2 and steady.spread == pytest.approx(0.0, abs=1e-9)

    micro_calls = [0]

    def noisy(batch):
        micro_calls[0] += 1
        window = (micro_calls[0] - 1 - 2) // 6  # 2 warm-up micro-steps, then 3 steps x 2 per window
        clock.take(0.030 if window % 2 else 0.010)

    wobbly = loop(
        DataLoader(Images(400), batch_size=4), noisy, warmup=1, steps=3, repeats=windows, timeline=clock.timeline()
    )
    assert len(wobbly.windows) == 5 and wobbly.spread > 0.5
    summary = summarize(wobbly, MeasureSpec(), compiled=False)
    assert summary.metrics["windows"] == 5 and summary.tags["dinox.unstable"] == "true"


def test_repeats_rules():
    r = Repeats(2, 4, threshold=0.1)
    assert not r.settled([100.0])  # one window cannot settle when two are asked
    assert r.settled([100.0, 105.0]) and not r.settled([100.0, 120.0])
    assert not r.settled([100.0, 120.0, 100.0]) and r.settled([100.0, 120.0, 100.0, 130.0])  # the cap
    assert Repeats.fixed(1).settled([5.0]) and not Repeats.fixed(3).settled([5.0, 5.0])
    said = []
    ranks = Repeats(1, 3, 0.1, agree=lambda mine: said.append(mine) or False)  # another rank is not done
    assert not ranks.settled([100.0]) and said == [True]
    assert ranks.settled([100.0, 100.0, 100.0]) and said == [True]  # the cap needs no vote: every rank is there


def counted(clock: FakeClock, fetched: list[int]) -> Images:
    """400 images, each taking 5 ms of the fake clock to load and counted in fetched[0]."""

    class Counting(Images):
        def __getitem__(self, i):
            fetched[0] += 1
            clock.take(0.005)
            return super().__getitem__(i)

    return Counting(400)


def test_ablation_and_loader_windows_stand_apart_from_the_timed_ones():
    """A loader that costs 5 ms per sample (10 ms a batch), a step that computes 10 ms per micro-batch: without
    the loader a step is twice as fast, and the loader alone delivers its own rate. On a fake clock."""
    fetched = [0]
    clock = FakeClock()

    stats = loop(
        DataLoader(counted(clock, fetched), batch_size=2),
        lambda b: clock.take(0.01),
        batch_size=2,
        warmup=1,
        steps=4,
        repeats=2,
        ablation_steps=4,
        loader_batches=6,
        timeline=clock.timeline(),
    )
    # Warm-up, the timed windows and the epoch boundary's first batch fetch; the ablation windows never do, and
    # a loader without workers gets no window of its own: the timed steps' fetches were it.
    assert fetched[0] == (1 + 2 * 4) * 2 * 2 + 2
    assert stats.epoch_start_s == pytest.approx(0.010)  # a new epoch's first batch: 2 samples x 5 ms
    # ... which every fetch without workers waits out anyway: a boundary adds only the restart, free here.
    assert stats.epoch_boundary_s == pytest.approx(0.0)
    timed = stats.images_per_s
    assert timed == pytest.approx(2 * 2 / 0.040)  # a step: two micro-batches of 10 ms fetch + 10 ms compute
    assert stats.images == 2 * 4 * 2 * 2  # only the timed windows count
    # One round after each timed window: compute only and no loader, 2 steps each (half the ablation steps).
    assert [len(ws) for ws in (stats.compute_only, stats.no_loader)] == [2, 2]
    assert all(w.images == 2 * 2 * 2 for w in stats.compute_only + stats.no_loader)
    assert pooled(stats.compute_only) == pytest.approx(2 * timed)
    assert pooled(stats.no_loader) == pytest.approx(pooled(stats.compute_only))
    assert stats.copies_alone is not None and stats.copies_alone.images == 2 * 2 * 2
    assert stats.compute_half is None  # the half-batch pair: a device with a timeline of its own only
    assert stats.loader_images_per_s == pytest.approx(200)  # 2 samples per 10 ms, read off the timed fetches
    assert stats.ablation_s > 0


def test_without_workers_the_epoch_start_is_a_warm_up_fetch_the_step_trains_on():
    """No loader workers and a warm-up of two steps: the epoch start is timed at the last warm-up step's first
    fetch, from a restarted iterator, and that batch is trained on: the trial loads no batch to throw it away.
    The restart's fetch is a warm-up step's, in its time (as the first step's fetch is). On a fake clock."""
    fetched, batches = [0], []
    clock = FakeClock()

    def micro_step(b):
        batches.append(b)
        clock.take(0.01)

    stats = loop(
        DataLoader(counted(clock, fetched), batch_size=2),
        micro_step,
        batch_size=2,
        warmup=2,
        steps=4,
        repeats=1,
        loader_batches=6,
        timeline=clock.timeline(),
    )
    # No phase is left out: the named ones are all of the loop's time.
    assert clock.t == pytest.approx(stats.loader_start_s + stats.warmup_s + stats.settle_s + stats.window_s)
    micro_batches = (2 + 4) * 2  # warm-up and one window, two micro-batches a step
    assert fetched[0] == micro_batches * 2 and len(batches) == micro_batches  # every batch loaded is trained on
    assert stats.epoch_start_s == pytest.approx(0.010) and stats.epoch_boundary_s == pytest.approx(0.0)
    assert stats.warmup_s == pytest.approx(2 * 2 * (0.010 + 0.010))  # two steps of two 10 ms fetches and computes
    assert stats.ablation_s == 0.0  # nothing measured after the window: no rounds, no loader window


def test_rounds_stop_once_decided_and_every_timed_window_still_counts():
    """`decided` says yes after two rounds: the third and fourth timed windows run without theirs, and the
    rounds that ran are the first two windows'."""
    asked: list[int] = []

    def decided(timed, no_loader, compute, copies):
        # Asked after timed window i, with the rounds of the windows before it (round i follows window i) and
        # the copies alone, measured once after the first window, before any round.
        assert len(timed) == len(no_loader) + 1 == len(compute) + 1 and copies is not None
        asked.append(len(no_loader))
        return len(no_loader) >= 2

    loop_ = bench.Loop(
        DataLoader(Images(400), batch_size=2), lambda b: b, lambda b: None, lambda: None, torch.device("cpu"), 1, 2
    )
    loop_.decided = decided
    events: list[str] = []
    loop_.on_phase = events.append
    loop_.steady = lambda: events.append("steadied")  # type: ignore[method-assign]
    stats = loop_.run(1, 2, repeats=4, ablation_steps=2)
    assert len(stats.windows) == 4
    assert [len(stats.compute_only), len(stats.no_loader)] == [2, 2]
    assert asked == [0, 1, 2]  # asked before each of the first three windows' rounds; never again once decided
    # The pipeline is steadied after the warm-up and after each round (the workers filled their queues while
    # nothing took from them); the fourth window follows the third with nothing between: one stretch of steps.
    assert [e for e in events if e.startswith(("window", "steadied"))] == [
        *("window 1/4", "steadied", "window 2/4", "steadied", "window 3/4", "steadied", "window 4/4")
    ]


def test_the_gpu_s_clock_is_read_after_each_timed_window_outside_it_and_kept_beside_its_rate():
    """On a GPU NVML reads, the SM clock after each timed window (never inside one, nor after an ablation or
    loader window): the trial's tag pairs each window's rate with it, so windows that fell as the GPU throttled
    (or rose as it ramped up) say so. Where any reading failed, or on a CPU, no tag: the record as before."""
    clock = FakeClock()
    readings = iter([1980.0, 1755.0, 1410.0, 1395.0])
    phases: list[str] = []

    def read() -> float | None:
        phases.append("clock")
        return next(readings)

    def micro(batch):
        clock.take(0.010)

    def copy(batch):
        clock.take(0.001)
        return batch

    loop_ = bench.Loop(
        DataLoader(Images(400), batch_size=2), copy, micro, lambda: None, torch.device("cpu"), 1, 2,
        timeline=clock.timeline(), on_phase=phases.append, read_clock=read,
    )  # fmt: skip
    stats = loop_.run(1, 3, repeats=3, ablation_steps=2)
    assert stats.window_clocks == [1980.0, 1755.0, 1410.0] and len(stats.windows) == 3
    assert [p for p in phases if p.startswith("window") or p == "clock"] == [
        *("window 1/3", "clock", "window 2/3", "clock", "window 3/3", "clock")
    ]
    tags = summarize(stats, MeasureSpec(), compiled=False).tags
    said = json.loads(tags["dinox.window_clocks"])
    rates = [round(r, 3) for r in stats.window_images_per_s]
    assert said == {"images_per_s": rates, "sm_clock_mhz": [1980, 1755, 1410]}
    # One reading that failed (NVML refusing midway): the windows' clocks are not known, and not half-said.
    readings = iter([1980.0, None, 1410.0])
    loop_ = bench.Loop(
        DataLoader(Images(400), batch_size=2), lambda b: b, micro, lambda: None, torch.device("cpu"), 1, 2,
        timeline=clock.timeline(), read_clock=lambda: next(readings),
    )  # fmt: skip
    stats = loop_.run(1, 3, repeats=3)
    assert stats.window_clocks == [] and "dinox.window_clocks" not in summarize(stats, MeasureSpec(), False).tags
    stats = loop(DataLoader(Images(400), batch_size=4), micro, warmup=1, steps=3, repeats=2, timeline=clock.timeline())
    assert stats.window_clocks == [] and "dinox.window_clocks" not in summarize(stats, MeasureSpec(), False).tags


@pytest.mark.parametrize(
    ("sample_s", "serial", "rounds"),
    [
        (0.0002, True, 0),  # no workers, a loader of 4 % a step: in series, it caps itself; no round at all
        (0.0002, False, 2),  # the same step read as a worker loader's: the rounds must show it, two at least
        (0.005, False, 1),  # a worker loader that holds each step up 50 %: io_bound after one round (its copies)
        (0.005, True, 0),  # ... in the step's own process: its fetches cap what the step runs without it: none
    ],
)
def test_rounds_stop_once_the_timed_steps_own_evidence_has_decided(sample_s, serial, rounds):
    """The trial's `decided` (step_metrics.decided) on a fake clock: a step computes 10 ms a micro-batch, a
    sample takes `sample_s` to load; four timed windows, and only as many rounds as the label needed."""
    clock = FakeClock()

    class Slow(Images):
        def __getitem__(self, i):
            clock.take(sample_s)
            return super().__getitem__(i)

    loop_ = bench.Loop(
        DataLoader(Slow(4000), batch_size=2),
        lambda b: clock.take(0.0001) or b,  # a copy: 0.1 ms
        lambda b: clock.take(0.01),
        lambda: None,
        torch.device("cpu"),
        2,
        2,
        timeline=clock.timeline(),
    )
    loop_.decided = functools.partial(decided, threshold=0.1, serial=serial)
    loop_.copies_decided = functools.partial(copies_known, threshold=0.1)  # the host's clock, as the trial sets it
    stats = loop_.run(1, 4, repeats=4, ablation_steps=4, loader_batches=8)  # as the trial runs it
    assert len(stats.windows) == 4 and len(stats.no_loader) == rounds
    # The copies alone (20,000 img/s) cap the copies at 1 % of a step without the loader: no compute-only window.
    assert stats.compute_only == [] and stats.copies_alone is not None
    summary = summarize(stats, MeasureSpec(bound_threshold=0.1), compiled=False)
    assert summary.bound == ("io_bound" if sample_s > 0.001 else "compute_bound")


def test_the_loop_tells_its_phases_in_order_outside_the_windows():
    """What the live progress line shows; told between windows, never inside one."""
    phases: list[str] = []
    loop_ = bench.Loop(
        DataLoader(Images(400), batch_size=2),
        lambda b: b,
        lambda b: None,
        lambda: None,
        torch.device("cpu"),
        1,
        2,
        on_phase=phases.append,
    )
    loop_.run(1, 2, repeats=3, ablation_steps=2, loader_batches=2, loader_buffered=1)
    assert phases == [
        *("warm-up", "window 1/3", "window 2/3", "window 3/3"),
        *("ablation windows", "epoch start", "loader alone"),
    ]


def test_the_timed_windows_do_not_eat_the_batches_ready_after_a_long_first_step():
    """Two workers make 2-sample batches at 10 ms a sample (200 img/s together); a step computes in 2 ms.
    During a 1.5 s first step (compilation, autotuning) the workers fill their queues: eight batches at once.
    Eaten at the step's pace they would make the first timed window look several times the loader's rate;
    the windows start from a steady pipeline instead, and agree with each other and with the loader alone."""
    calls = [0]

    def micro(batch):
        calls[0] += 1
        time.sleep(1.5 if calls[0] == 1 else 0.002)

    loader = DataLoader(
        Images(10_000, delay_s=0.010), batch_size=2, num_workers=2, prefetch_factor=4, persistent_workers=True
    )
    stats = loop(
        loader,
        micro,
        accumulation=1,
        batch_size=2,
        warmup=2,
        steps=8,
        repeats=3,
        loader_batches=8,
        loader_buffered=2 * 4,
    )
    # The promise, not a timing threshold: eating the eight ready batches, the first window ran at 600+ img/s,
    # several times the others and the loader alone. One batch caught ready at a window's edge is an eighth of
    # a window (CI on a loaded box once read the first 215 img/s against the others' 178): well under 1.5x.
    first, *rest = stats.window_images_per_s
    assert first < 1.5 * statistics.median(rest), stats.window_images_per_s
    # Neither the windows nor the loader alone outrun the two workers (200 img/s, and an edge batch): a load can
    # slow either, never speed it (beside two busy processes the loader alone once read 61 img/s against the
    # windows' 173; the trial's record then says that window was slowed, dinox.bound_note, and decide's findings
    # leave it out: tests/decide/test_verdict.py).
    assert stats.images_per_s < 220 and stats.loader_images_per_s < 220, stats


class _SlowAt(Images):
    """50 ms a sample, and one sample (`slow`) that takes a second: with batches of two and no shuffling, sample
    0 is the first worker's first batch of every epoch, sample 2 the second worker's."""

    def __init__(self, n: int, slow: int):
        super().__init__(n, delay_s=0.050)
        self.slow = slow

    def __getitem__(self, i: int):
        if i == self.slow:
            time.sleep(1.0)
        return super().__getitem__(i)


@pytest.mark.parametrize("slow", [0, 2])
def test_the_epoch_start_is_a_step_on_the_restarts_first_batch_and_the_loader_alone_starts_steady(monkeypatch, slow):
    """With workers the epoch start is the restarted iterator's first batch and a step trained on it, as an
    epoch begins in training: the step is taken on that very batch, not on a copy issued before. The loader
    alone then starts from a steady pipeline: whichever worker's first batch was the slow one (the first's, or
    the other's, still lagging after the step), its lag is not in the window, and the rate never outruns the
    two workers: 2 images in 100 ms each, 40 img/s (a load can slow it, never speed it)."""
    restart: list[object] = []
    trained: list[object] = []

    class Marked(Batches):
        def epoch_start(self, keep: bool = False) -> float:
            seconds = super().epoch_start(keep)
            restart.append(self._held)
            return seconds

    monkeypatch.setattr(bench, "Batches", Marked)
    loader = DataLoader(_SlowAt(10_000, slow), batch_size=2, num_workers=2, prefetch_factor=2)
    stats = loop(
        loader,
        trained.append,
        accumulation=1,
        batch_size=2,
        warmup=2,
        steps=4,
        loader_batches=6,
        loader_buffered=4,
    )
    assert len(restart) == 1 and restart[0] is not None and trained[-1] is restart[0]
    assert stats.epoch_start_s > 1.0 if slow == 0 else stats.epoch_start_s < 1.0
    assert stats.restart_step_s is not None and stats.restart_step_s >= 0
    assert stats.loader_images_per_s < 44, stats


def test_the_step_after_a_restart_with_workers_is_charged_to_the_boundary(monkeypatch):
    """A restart forks new workers, and the step that trains on its first batch pays for it (copy-on-write
    pages, the new workers filling their prefetch on the same cores): 0.39-0.61 s over a 0.26-0.38 s step on
    this project's 2-core box, while the first batch came in 0.02-0.08 s. On a fake clock: steps of 10 ms, and 500 ms
    for the one that follows the restart; the boundary is charged that step less a typical one."""
    clock = FakeClock()
    restarted = [False]

    class Marked(Batches):
        def epoch_start(self, keep: bool = False) -> float:
            restarted[0] = True
            return super().epoch_start(keep)

    def micro(batch) -> None:
        clock.take(0.5 if restarted[0] else 0.01)
        restarted[0] = False

    monkeypatch.setattr(bench, "Batches", Marked)
    loader = DataLoader(Images(400), batch_size=2, num_workers=1, persistent_workers=True)
    stats = loop(loader, micro, accumulation=1, batch_size=2, steps=4, loader_buffered=2, timeline=clock.timeline())
    assert stats.epoch_start_s == 0.0  # the fake clock does not see the worker's loading
    assert stats.restart_step_s == pytest.approx(0.5)
    assert stats.epoch_boundary_s == pytest.approx(0.49)


@pytest.mark.parametrize("warmup", [1, 3])
def test_the_warm_ups_last_step_steadies_the_first_window_and_costs_no_step_of_its_own(warmup):
    """From two warm-up steps on, the last is taken from a steady pipeline, as `steady` takes its step before a
    window: the trial pays the spec's steps and the epoch start's (a step on the restart's first batch), no
    more. One warm-up step is the first step (its waits are the workers' start): the window then gets its own
    steadying step, untimed."""
    steps = [0]

    def micro(batch):
        steps[0] += 1

    loader = DataLoader(Images(1_000), batch_size=2, num_workers=2, prefetch_factor=2, persistent_workers=True)
    stats = loop(loader, micro, accumulation=1, batch_size=2, warmup=warmup, steps=4, repeats=1, loader_buffered=4)
    own_step = warmup == 1
    assert steps[0] == warmup + 4 + own_step + 1
    assert (stats.settle_s > 0) == own_step


def test_settle_takes_the_ready_batches_and_keeps_the_one_it_waited_for():
    """A fake loader with three batches ready, then batches that take 50 ms each to arrive."""
    now = [0.0]

    def loader():
        for i in range(100):
            now[0] += 0.0001 if i < 3 else 0.050
            yield i

    batches = Batches(_Restartable(loader), lambda: now[0], ready=4)
    batches.settle()
    assert batches.next() == 3  # 0, 1 and 2 were taken untimed; 3 had to be waited for and is next
    assert batches.next() == 4
    quick = Batches(_Restartable(lambda: iter(range(100))), lambda: now[0], ready=4)
    quick.settle()  # nothing is ever waited for: it takes twice the queue and stops
    assert quick.next() == 8
    assert Batches(_Restartable(loader), lambda: now[0], ready=0).next() == 0  # nothing held, nothing to settle


class Indexed(Images):
    def __getitem__(self, i: int):
        return super().__getitem__(i)[0], i


def test_settle_counts_the_workers_ready_batches_so_a_slowed_fetch_cannot_fool_it():
    """Real workers, their queues full (2 workers x prefetch 2 = 4 batches ready), and a clock on which every
    fetch looks slow, as the scheduler of a loaded box can make a ready batch's fetch: settle counts what the
    workers hold instead, takes the four, and keeps the fifth (the one it waited for). (The pin-memory
    thread's queue is counted too; without an accelerator torch runs no such thread, so it is not tried here.)"""
    loader = DataLoader(Indexed(400, delay_s=0.05), batch_size=2, num_workers=2, prefetch_factor=2)
    seconds = iter(range(10**6))  # each reading 1 s after the last: every fetch "took" a second
    batches = Batches(loader, lambda: float(next(seconds)), ready=4)
    deadline = time.time() + 30
    while batches.batches_waiting() != 4 and time.time() < deadline:
        time.sleep(0.05)
    assert batches.batches_waiting() == 4
    batches.settle()
    assert batches.batches_waiting() is None  # one batch held: the next fetch is that one
    assert batches.next()[1].tolist() == [8, 9] and batches.batches_waiting() is not None  # the fifth batch
    fake = Batches(_Restartable(lambda: iter(range(9))), time.perf_counter, ready=4)
    assert fake.batches_waiting() is None  # not a DataLoader's iterator: settle times its fetches instead


class _Restartable:
    def __init__(self, make):
        self.make = make

    def __iter__(self):
        return iter(self.make())


def test_epochs_that_end_inside_the_timed_windows_are_counted():
    stats = loop(DataLoader(Images(8), batch_size=4), lambda b: None, warmup=1, steps=5)  # 1 epoch = 2 micro
    assert stats.epoch_boundaries == 5  # 10 micro-batches from the epoch's second: 5 more epochs ended
    assert loop(DataLoader(Images(400), batch_size=4), lambda b: None, warmup=1, steps=5).epoch_boundaries == 0


def _window(data_s: float, period_s: float, steps: int = 4) -> Window:
    step = StepTimes(period_s, 0.0, period_s - data_s, 0.0, data_s, data_s, data_s, 0.0)
    return Window(period_s * steps, steps * 8, [step] * steps)


def test_a_boundary_adds_the_first_batch_less_the_wait_a_steady_fetch_already_pays():
    """What an epoch boundary adds to a run (epoch_start_s: the restarted loader's first batch, 0.2 s here) is
    charged on top of a rate that already holds each steady fetch's wait for the loader. No wait (workers ahead
    of a 0.3 s step): the whole first batch. A 0.05 s wait a fetch (one worker at 0.2 s a batch, the step's
    compute 0.15 s): the step's compute is what the boundary adds. Loading in the step's process (its whole
    0.2 s every fetch): nothing but the restart. Two fetches a step (accumulation 2) wait half the step's each."""
    assert boundary_cost(0.2, [_window(0.0, 0.3)], 1) == pytest.approx(0.2)
    assert boundary_cost(0.2, [_window(0.05, 0.2)], 1) == pytest.approx(0.15)
    assert boundary_cost(0.2, [_window(0.2, 0.25)], 1) == pytest.approx(0.0)
    assert boundary_cost(0.2, [_window(0.1, 0.4)], 2) == pytest.approx(0.15)
    assert boundary_cost(0.2, [_window(0.3, 0.35)], 1) == 0.0  # a slow restart never earns time back
    assert boundary_cost(0.2, [], 1) == pytest.approx(0.2)  # no timed step: the restart whole
    # With workers the step that trains on the first batch is timed too (the fork's cost lands there): both, less
    # a typical step (its waits included). Persistent workers that keep ahead: the first batch and a step on it.
    assert boundary_cost(0.05, [_window(0.0, 0.3)], 2, restart_step_s=0.85) == pytest.approx(0.6)
    assert boundary_cost(0.2, [_window(0.0, 0.3)], 1, restart_step_s=0.3) == pytest.approx(0.2)
    assert boundary_cost(0.0, [_window(0.1, 0.3)], 1, restart_step_s=0.2) == 0.0  # never earns time back


class _Counted(Dataset):
    """Each sample takes 0.2 s in the worker; `done` counts the samples finished, across the worker process."""

    def __init__(self) -> None:
        import multiprocessing

        self.done = multiprocessing.get_context("fork").Value("i", 0)

    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int):
        time.sleep(0.2)
        with self.done.get_lock():
            self.done.value += 1
        return torch.zeros(2)


def test_an_epoch_start_is_timed_from_idle_workers_as_a_real_epoch_end_leaves_them():
    """Mid-epoch, a persistent worker still owes its prefetched batches, and a restarted iterator waits for them
    before its first batch: a cost no real boundary pays (there the sampler is spent and the worker idle). The
    restart is timed only once the worker owes nothing: between the clock's two readings the worker finishes
    the new epoch's first sample, not the two it owed (counted, not timed: a loaded box cannot move it)."""
    data = _Counted()
    seen: list[int] = []

    def clock() -> float:
        seen.append(data.done.value)
        return time.perf_counter()

    loader = DataLoader(data, batch_size=1, num_workers=1, persistent_workers=True, prefetch_factor=2)
    batches = Batches(loader, clock, ready=2)
    batches.next()  # the worker now owes the two batches it prefetches after it
    seen.clear()
    assert batches.epoch_start() > 0
    before, after = seen
    assert before == 3, seen  # the owed two finished before the clock started
    assert after - before in (1, 2), seen  # the new epoch's first sample (its second may have finished too)
    del batches, loader

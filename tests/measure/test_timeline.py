"""The device timeline's bookkeeping, on a fake asynchronous device with a fake clock: no GPU needed.

The fake device runs one stream: work enqueued at host time h starts when the stream is free and the host has
enqueued it; an event completes when the stream reaches it. The host runs ahead until it synchronises. This
is how CUDA behaves, minus the launch queue's depth; the loop under test is dinox.measure.loop's own."""

from __future__ import annotations

import pytest
import torch

from dinox.measure import loop as bench
from dinox.measure.bound import Evidence, classify
from dinox.measure.step_metrics import summarize
from dinox.measure.timeline import Timeline
from dinox.spec.sections import MeasureSpec


class FakeDevice:
    def __init__(self) -> None:
        self.host = 0.0  # the host's clock, seconds
        self.free = 0.0  # when the stream has done everything enqueued so far
        self.syncs = 0

    def clock(self) -> float:
        return self.host

    def host_work(self, seconds: float) -> None:
        self.host += seconds

    def launch(self, host_cost: float, device_seconds: float) -> None:
        """A kernel: the host spends host_cost launching it, the stream runs it after what is queued."""
        self.host += host_cost
        self.free = max(self.free, self.host) + device_seconds

    def synchronize(self) -> None:
        self.syncs += 1
        self.host = max(self.host, self.free)

    def event(self):
        device = self

        class Event:
            t = 0.0

            def record(self) -> None:
                self.t = max(device.host, device.free)  # the stream reaches it after what is queued

            def query(self) -> bool:
                return device.host >= self.t

            def elapsed_time(self, end) -> float:
                return (end.t - self.t) * 1000.0

        return Event()


def run(
    dev: FakeDevice,
    *,
    fetch_s: float,
    launch_s: float,
    compute_s_per_image: float,
    batch: int = 8,
    accumulation: int = 2,
    update_s: float = 0.002,
    copy_s: float = 0.001,
    steps: int = 10,
    ablation: int = 0,
    halve=None,
    kernel_s: float = 0.0,
    repeats: int = 1,
) -> bench.LoopStats:
    """One trial on the fake device: fetching a micro-batch costs the host fetch_s, its forward/backward costs
    the host launch_s of launching and the device kernel_s + compute_s_per_image x its images."""

    class Loader:
        def __iter__(self):
            while True:
                dev.host_work(fetch_s)
                yield torch.zeros(batch)

    def to_device(x):
        dev.launch(0.0001, copy_s)
        return x

    def micro_step(x):
        dev.launch(launch_s, kernel_s + compute_s_per_image * x.shape[0])

    timeline = Timeline(dev.event, dev.synchronize, dev.clock, device_clock=True)
    return bench.run(
        Loader(),
        to_device=to_device,
        micro_step=micro_step,
        optimizer_step=lambda: dev.launch(0.0005, update_s),
        device=torch.device("cpu"),
        accumulation=accumulation,
        batch_size=batch,
        warmup_steps=2,
        bench_steps=steps,
        repeats=repeats,
        ablation_steps=ablation,
        timeline=timeline,
        halve=halve,
    )


def test_a_device_bound_step_is_the_device_period_with_no_sync_inside_the_window():
    dev = FakeDevice()
    stats = run(dev, fetch_s=0.001, launch_s=0.001, compute_s_per_image=0.005)  # 40 ms per micro-batch
    # warm-up: 3 syncs (before, after the first step, after the last); the window: its two edges.
    assert dev.syncs == 3 + 2
    period = 2 * (0.001 + 0.040) + 0.002
    assert stats.periods == pytest.approx([period] * 9)
    s = stats.steps[3]
    assert s.idle == pytest.approx(0.0, abs=1e-9) and s.busy == pytest.approx(period)
    assert s.copy == pytest.approx(0.002) and s.forward_backward == pytest.approx(0.080)
    assert s.update == pytest.approx(0.002) and s.lag > 0.5 * period  # the host runs ahead of the device
    # images/s from the window's wall between its two edge syncs: the device's pace, not the host's.
    assert stats.images_per_s == pytest.approx(10 * 2 * 8 / stats.window_s)
    assert stats.window_s == pytest.approx(10 * period, rel=0.02)
    assert classify(Evidence(period, s.data, s.copy, s.idle, s.idle_loading), 0.1) == ("compute_bound", "device_events")


def test_a_loader_bound_step_idles_the_device_while_the_host_waits_on_the_loader():
    """With accumulation the host blocks on micro-batch 2 while the device still computes micro-batch 1: the
    host's own data wait overstates the loader's share; the device's idle time does not."""
    dev = FakeDevice()
    stats = run(dev, fetch_s=0.030, launch_s=0.001, compute_s_per_image=0.0025)  # 30 ms fetch, 20 ms compute
    s = stats.steps[3]
    assert s.data == pytest.approx(0.060, rel=0.01)  # the host waited 60 ms per step on the loader ...
    assert s.idle == pytest.approx(s.period - s.busy) and s.idle < s.data  # ... the device idled less of it
    assert s.idle_loading == pytest.approx(s.idle, rel=0.05)  # and every idle moment was the loader's
    e = Evidence(s.period, s.data, s.copy, s.idle, s.idle_loading)
    assert classify(e, 0.1) == ("io_bound", "device_events")


def test_host_timers_overstate_the_loader_where_the_device_timeline_does_not():
    """The DINOv2 case: 12 ms per micro-batch of loading, hidden behind 40 ms of compute except on the first
    micro-batch of each step; the host's timers call it io_bound, the device's idle share does not."""
    dev = FakeDevice()
    stats = run(dev, fetch_s=0.012, launch_s=0.0005, compute_s_per_image=0.005, accumulation=4)
    s = stats.steps[3]
    host_share, device_share = s.data / s.period, s.idle / s.period
    assert host_share > 0.25 and device_share < 0.1
    assert classify(Evidence(s.period, s.data, s.copy), 0.1)[0] == "io_bound"  # what host timers said
    assert classify(Evidence(s.period, s.data, s.copy, s.idle, s.idle_loading), 0.1)[0] == "compute_bound"


def test_a_launch_bound_step_is_host_bound_by_the_half_batch_window():
    """Python launches each forward in 30 ms; the device needs 4 ms for it. No marker sees the device idle
    (it idles inside the forward's span), but half the batch takes nearly as long: the host sets the pace."""
    dev = FakeDevice()
    stats = run(
        dev,
        fetch_s=0.0005,
        launch_s=0.030,
        compute_s_per_image=0.0005,
        ablation=6,
        halve=lambda x: (x[: x.shape[0] // 2], x.shape[0] // 2),
        repeats=2,  # two windows, two rounds: one round alone bounds nothing
    )
    summary = summarize(stats, MeasureSpec(ablation_steps=6), compiled=False)
    assert summary.metrics["device_idle_share"] < 0.1
    assert summary.metrics["fixed_share"] > 0.8
    assert (summary.bound, summary.tags["dinox.bound_rule"]) == ("host_bound", "ablation")
    assert summary.metrics["images_per_s_compute_half"] < 0.6 * summary.metrics["images_per_s_compute_only"]


def test_an_under_occupied_device_is_not_called_host_bound():
    """A batch too small to fill the device: each forward takes the device 30 ms whatever the batch, and the
    host launches it in 1 ms. Half the batch takes as long (fixed share ~1), but the host is steps ahead of
    the device, not behind it: the device sets the pace (a larger batch would be nearly free)."""
    dev = FakeDevice()
    stats = run(
        dev,
        fetch_s=0.0005,
        launch_s=0.001,
        compute_s_per_image=0.0001,
        kernel_s=0.030,
        ablation=6,
        halve=lambda x: (x[: x.shape[0] // 2], x.shape[0] // 2),
        repeats=2,  # two windows, two rounds: one round alone bounds nothing
    )
    summary = summarize(stats, MeasureSpec(ablation_steps=6), compiled=False)
    assert summary.metrics["fixed_share"] > 0.9
    assert summary.bound == "compute_bound"


def test_a_compute_bound_step_stays_compute_bound_with_ablation():
    dev = FakeDevice()
    stats = run(
        dev,
        fetch_s=0.001,
        launch_s=0.001,
        compute_s_per_image=0.005,
        ablation=6,
        halve=lambda x: (x[: x.shape[0] // 2], x.shape[0] // 2),
        repeats=2,  # two windows, two rounds: one round alone bounds nothing
    )
    summary = summarize(stats, MeasureSpec(ablation_steps=6), compiled=False)
    m = summary.metrics
    assert m["fixed_share"] < 0.1 and abs(m["loader_cost"]) < 0.05 and abs(m["transfer_cost"]) < 0.05
    assert summary.bound == "compute_bound" and summary.tags["dinox.step_clock"] == "events"
    assert m["step_s_p50"] == pytest.approx(2 * (0.001 + 0.040) + 0.002)


def test_events_are_read_lazily_and_reused():
    """A step's events are read once the device has passed its end, and go back to a pool: a long window
    holds a bounded number of events, and nothing synchronises to read them."""
    dev = FakeDevice()
    made = []

    def event():
        made.append(dev.event())
        return made[-1]

    timeline = Timeline(event, dev.synchronize, dev.clock, device_clock=True)
    rec = timeline.window()
    for _ in range(200):
        for _m in range(2):
            rec.before_copy()
            rec.before_forward()
            dev.launch(0.001, 0.0005)  # the device keeps up: each step is done before the next is enqueued
            rec.after_backward()
        rec.step_end()
    rec.close()
    assert len(rec.steps) == 199 and dev.syncs == 2
    assert len(made) < 30  # 200 steps x 7 markers, from a pool of a few dozen events


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_window_synchronises_only_at_its_edges(monkeypatch):
    dev = torch.device("cuda")
    x = torch.randn(4096, 4096, device=dev)
    syncs = []
    real = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: (syncs.append(1), real(*a)))

    class Loader:
        def __iter__(self):
            while True:
                yield torch.zeros(8)

    stats = bench.run(
        Loader(),
        to_device=lambda b: b.to(dev),
        micro_step=lambda b: x @ x,
        optimizer_step=lambda: None,
        device=dev,
        accumulation=2,
        batch_size=8,
        warmup_steps=2,
        bench_steps=20,
    )
    assert stats.clock == "cuda_events" and len(syncs) == 3 + 2
    assert sum(stats.periods) == pytest.approx(stats.window_s, rel=0.1)
    assert statistics_idle(stats) < 0.1  # a 4096^3 matmul per micro-batch keeps the device busy


def statistics_idle(stats) -> float:
    return sum(s.idle for s in stats.steps) / sum(s.period for s in stats.steps)


class TwoStreams(FakeDevice):
    """The fake device with a side stream: work launched inside `side()` queues there; an event records the
    stream it is made on; the compute stream can wait for one."""

    def __init__(self) -> None:
        super().__init__()
        self.side_free = 0.0
        self.on_side = False

    def launch(self, host_cost: float, device_seconds: float) -> None:
        if not self.on_side:
            return super().launch(host_cost, device_seconds)
        self.host += host_cost
        self.side_free = max(self.side_free, self.host) + device_seconds

    def synchronize(self) -> None:
        self.free = max(self.free, self.side_free)
        super().synchronize()

    def streams(self):
        import contextlib

        from dinox.measure.ahead import Streams

        device = self

        @contextlib.contextmanager
        def side():
            device.on_side = True
            try:
                yield
            finally:
                device.on_side = False

        def mark():
            return max(device.host, device.side_free)  # when the side stream reaches it

        def wait(event, batch):
            device.free = max(device.free, event)  # the compute stream waits for the copy

        return Streams(side, mark, wait)


def test_copies_ahead_on_a_side_stream_hide_behind_the_compute():
    """20 ms to copy a micro-batch, 30 ms to compute it. In series on the compute stream a step is 2 x 50 ms;
    copied a micro-batch ahead on a side stream (loader.device_prefetch, timm's PrefetchLoader), the copies
    run while the previous micro-batch computes: 2 x 30 ms, and the copy span (h2d_s) all but vanishes."""
    from dinox.measure.ahead import CopyAhead

    def measured(ahead: bool):
        dev = TwoStreams()

        class Loader:
            def __iter__(self):
                while True:
                    dev.host_work(0.001)
                    yield torch.zeros(8)

        def to_device(x):
            dev.launch(0.0001, 0.020)
            return x

        timeline = Timeline(dev.event, dev.synchronize, dev.clock, device_clock=True)
        stats = bench.run(
            Loader(),
            to_device=to_device,
            micro_step=lambda x: dev.launch(0.001, 0.030),
            optimizer_step=lambda: dev.launch(0.0005, 0.002),
            device=torch.device("cpu"),
            accumulation=2,
            batch_size=8,
            warmup_steps=2,
            bench_steps=10,
            timeline=timeline,
            ahead=CopyAhead(to_device, dev.streams()) if ahead else None,
        )
        return summarize(stats, MeasureSpec(ablation=False), compiled=False).metrics

    serial, overlapped = measured(False), measured(True)
    assert serial["step_s_p50"] == pytest.approx(2 * 0.050 + 0.002, rel=0.02)
    assert serial["h2d_s"] == pytest.approx(2 * 0.020, rel=0.02)
    assert overlapped["step_s_p50"] == pytest.approx(2 * 0.030 + 0.002, rel=0.05)
    assert overlapped["h2d_s"] < 0.1 * serial["h2d_s"]
    assert overlapped["images_per_s"] > 1.5 * serial["images_per_s"]


def test_the_half_batch_pair_runs_inside_the_ranks_local_context_and_nothing_else_does():
    """Under DDP the pair runs in no_sync: an all-reduce at the end of every backward is batch-independent and
    would read as the host's fixed share. The timed and ablation windows keep their all-reduce."""
    import contextlib

    dev, inside, steps = FakeDevice(), [False], []

    @contextlib.contextmanager
    def local():
        inside[0] = True
        yield
        inside[0] = False

    class Loader:
        def __iter__(self):
            while True:
                yield torch.zeros(8)

    def micro_step(x):
        steps.append((inside[0], x.shape[0]))
        dev.launch(0.001, 0.005 * x.shape[0])

    loop = bench.Loop(
        Loader(),
        lambda x: x,
        micro_step,
        lambda: dev.launch(0.0005, 0.002),
        torch.device("cpu"),
        1,
        8,
        Timeline(dev.event, dev.synchronize, dev.clock, device_clock=True),
        halve=lambda x: (x[:4], 4),
        local=local,
    )
    stats = loop.run(1, 3, ablation_steps=2)
    local_steps = [n for is_local, n in steps if is_local]
    assert local_steps == [4] + [8] * 2 + [4] * 2  # the untimed half step, then the full and the half windows
    assert all(not is_local for is_local, _n in steps[: -len(local_steps)])
    assert stats.compute_full is not None and stats.compute_half is not None

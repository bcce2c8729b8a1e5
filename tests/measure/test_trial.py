"""The child's own step helpers, in-process: the half batch the fixed-share pair computes on."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from dinox.measure.step import TrainStep


def run_like(mixup: bool, compile_: bool) -> SimpleNamespace:
    prep = SimpleNamespace(mixup=object()) if mixup else None
    return SimpleNamespace(prep=prep, spec=SimpleNamespace(model=SimpleNamespace(compile=compile_)))


def test_the_half_batch_is_even_under_mixup_and_static_under_compile():
    batch = (torch.zeros(62, 3, 8, 8), torch.zeros(62, dtype=torch.long))  # 62: a batch of 2 mod 4
    (images, labels), n = TrainStep.halve(run_like(mixup=False, compile_=False), batch)
    assert n == 31 and images.shape[0] == labels.shape[0] == 31
    (images, labels), n = TrainStep.halve(run_like(mixup=True, compile_=False), batch)
    assert n == 30 and images.shape[0] == labels.shape[0] == 30  # timm's Mixup refuses an odd batch
    views = [torch.zeros(62, 3, 8, 8), torch.zeros(62, 3, 4, 4)]  # DINO's views: each cut, each static
    (cut, labels), n = TrainStep.halve(run_like(mixup=False, compile_=True), (views, batch[1]))
    assert n == 31 and [v.shape[0] for v in cut] == [31, 31]
    assert all(0 in getattr(v, "_dynamo_static_indices", set()) for v in cut)  # torch._dynamo.mark_static


def test_the_loader_alone_times_whole_turns_of_the_workers():
    """Half the ablation steps' batches (one ablation window's), rounded up to whole turns of the workers, two
    at least: in-order delivery makes the k-th turn end k batch times after the waited-for batch it starts at."""
    from dinox.measure.trial import TrialRun

    def batches(ablation: int, accumulation: int, workers: int) -> int:
        run = SimpleNamespace(
            _ablation_steps=lambda: ablation,
            accumulation=accumulation,
            spec=SimpleNamespace(loader=SimpleNamespace(num_workers=workers)),
        )
        return TrialRun._loader_alone_batches(run)  # type: ignore[arg-type]

    assert batches(10, 1, 2) == 6  # 5 batches -> 3 turns of 2
    assert batches(10, 1, 8) == 16  # 5 batches -> 2 turns of 8, where 10 would end mid-turn
    assert batches(10, 2, 4) == 12  # 10 micro-batches -> 3 turns of 4
    assert batches(10, 1, 0) == 5  # no workers: the timed fetches are the rate; the count only says "read it"
    assert batches(0, 1, 2) == 0  # measure.ablation: false


def test_a_trials_own_process_keeps_its_loader_to_its_end_then_kills_and_reaps_the_workers(monkeypatch):
    """In a trial's own process (run_child) the loader is kept once measured, not shut down in order (each
    worker would first finish the batch it is making); once the result is written its workers are killed and
    reaped by that process, not orphaned to the parent's kill (their zombies would wait for init), and torch's
    SIGCHLD handler does not call the kill a worker failure."""
    import multiprocessing
    import signal

    from torch.utils.data import DataLoader, TensorDataset

    from dinox.measure import trial

    before = set(multiprocessing.active_children())
    loader = DataLoader(TensorDataset(torch.zeros(64, 3)), batch_size=4, num_workers=2, prefetch_factor=4)
    it = iter(loader)
    next(it)
    workers = set(multiprocessing.active_children()) - before
    assert len(workers) == 2
    left: list = []
    monkeypatch.setattr(trial, "_LEFT_TO_EXIT", left)
    run = SimpleNamespace(loop=SimpleNamespace(iterator=it), loader=loader)
    previous = signal.getsignal(signal.SIGCHLD)
    try:
        trial.TrialRun.let_go_of_loader(run)  # type: ignore[arg-type]
        del it
        assert left == [SimpleNamespace(iterator=left[0].iterator), loader] and not hasattr(run, "loader")
        assert all(w.is_alive() for w in workers)  # kept: nothing waits for them before the result is out
        trial.kill_workers()
        assert not workers & set(multiprocessing.active_children())  # killed and reaped: no zombie left to anyone
        assert all(w.exitcode == -signal.SIGKILL for w in workers)
    finally:
        signal.signal(signal.SIGCHLD, previous)

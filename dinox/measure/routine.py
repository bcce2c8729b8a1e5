"""What a real run does besides its steps (``routine:`` in the spec): saving a checkpoint and an evaluation
pass, done as a training run does them, and timed. The trial measures one of each for decide's forecast;
``dinox verify`` runs them at the spec's cadence inside its slice.

A checkpoint is the objective's state (the model; DINO's student, teacher and centre), the optimizer's and
the gradient scaler's, written with ``torch.save`` to a new file in ``routine.checkpoint_dir`` (made with
O_EXCL: a link planted under that name is never followed) and fsynced, so the time is the disk's, not the
page cache's; the file is removed after. An evaluation pass is forward only, under ``no_grad`` and the
trial's autocast, the modules in eval mode, through a validation loader over the trial's own data and
loader settings (its workers start with each pass, as a validation loader's do; a validation set's lighter
transforms would load faster: the figure errs slow).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from dinox import record as rec
from dinox.contract import GIB

# A trial's run (dinox.measure.trial.TrialRun, or verify's subclass): this module sits below it, so it names
# what it reads from one (spec, loop, loader, its step: dinox.measure.step.TrainStep) instead of importing it.
TrialRun = Any


def checkpoint_state(objective: Any, optimizer: torch.optim.Optimizer, scaler: Any) -> dict[str, Any]:
    state = {"objective": objective.state(), "optimizer": optimizer.state_dict()}
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    return state


def save_checkpoint(state: dict[str, Any], folder: Path, sync: Callable[[], None]) -> tuple[float, int]:
    """Seconds to write `state` to a new file in `folder` and fsync it, and its bytes; the file is removed."""
    sync()  # the step's queued work is not the save's
    t = time.perf_counter()
    fd, name = tempfile.mkstemp(prefix=".dinox-checkpoint-", suffix=".pt", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        took = time.perf_counter() - t
        return took, os.path.getsize(name)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)


def modules(objective: Any) -> list[nn.Module]:
    """The objective's modules (the model; DINO's student and teacher; a user's step's own)."""
    return objective.modules()


def evaluate(
    objective: Any,
    loader: Iterable,
    to_device: Callable[[Any], Any],
    count: int,
    autocast: Callable[[], contextlib.AbstractContextManager],
    sync: Callable[[], None],
) -> tuple[float, float]:
    """An evaluation pass of `count` batches over a new iterator of `loader` (its workers start, as a
    validation loader's do each pass; a set shorter than the pass starts over): (seconds to its first batch,
    seconds for the whole pass). The modules go back to train mode after."""
    mods = modules(objective)
    modes = [m.training for m in mods]
    for m in mods:
        m.eval()
    try:
        sync()
        t = time.perf_counter()
        it = iter(loader)
        batch = next(it)
        start_s = time.perf_counter() - t
        with torch.no_grad(), autocast():
            for i in range(count):
                if i:
                    try:
                        batch = next(it)
                    except StopIteration:
                        it = iter(loader)
                        batch = next(it)
                objective.evaluate(to_device(batch))
        sync()
        del it  # its workers shut down before the training steps resume
        return start_s, time.perf_counter() - t
    finally:
        for m, mode in zip(mods, modes, strict=True):
            m.train(mode)


def eval_loader(loader: DataLoader) -> DataLoader:
    """A validation loader as a run builds one beside its training loader: the same data and settings, workers
    of its own, started with each pass. A new iterator of the training loader itself would be the training
    iterator reset where its workers persist (DataLoader keeps one), cutting the training epoch short."""
    workers = loader.num_workers
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        num_workers=workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        worker_init_fn=loader.worker_init_fn,
        prefetch_factor=loader.prefetch_factor if workers else None,
        multiprocessing_context=loader.multiprocessing_context if workers else None,
        drop_last=loader.drop_last,  # the training batch's shapes: a compiled model's graphs serve them
    )


def measure(run: TrialRun) -> dict[str, float]:
    """routine: one checkpoint save (rank 0, as a run saves) and an evaluation window of a timed window's
    batches: the metrics decide charges at the spec's cadence."""
    r = run.spec.routine
    m: dict[str, float] = {}
    if r is None:
        return m
    if r.checkpoint_every_steps and (run.distributed is None or run.distributed[0] == 0):
        if run.on_phase is not None:
            run.on_phase("checkpoint")
        took, size = save(run)
        m[rec.CHECKPOINT_S], m[rec.CHECKPOINT_GB] = took, size / GIB
    if r.eval_every_epochs:
        if run.on_phase is not None:
            run.on_phase("evaluation")
        batches = run.spec.measure.bench_steps * run.accumulation
        eval_pass(run, 1)  # untimed: eval mode's first graphs compile (and cuDNN tunes) once a run, not each pass
        start_s, pass_s = eval_pass(run, batches)
        m[rec.EVAL_START_S] = start_s
        m[rec.EVAL_IMAGES_PER_S] = batches * run.spec.size / max(pass_s - start_s, 1e-9)
    return m


def save(run: TrialRun) -> tuple[float, int]:
    """Seconds and bytes of one checkpoint of the trial written to routine.checkpoint_dir (else its folder)."""
    r = run.spec.routine
    folder = Path(r.checkpoint_dir) if r is not None and r.checkpoint_dir else run.out_dir
    step = run.step
    state = checkpoint_state(step.objective, step.optimizer, step.scaler)
    try:
        return save_checkpoint(state, folder, run.loop.timeline.synchronize)  # type: ignore[union-attr]
    except OSError as e:
        why = e.strerror or e
        raise RuntimeError(f"routine.checkpoint_dir: cannot write a checkpoint in {folder}: {why}") from None


def eval_pass(run: TrialRun, batches: int) -> tuple[float, float]:
    """An evaluation pass of `batches` batches over the trial's own data: (its start, the whole pass), s."""
    step, sync = run.step, run.loop.timeline.synchronize  # type: ignore[union-attr]
    return evaluate(step.objective, eval_loader(run.loader), step.to_device, batches, step.autocast, sync)

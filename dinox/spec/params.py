"""The params the parent reads back from a trial's run (decide, store, report), named once, as tags and
metrics are in dinox.record: each is a dotted path of the spec's own fields, checked against their
declarations when this module is imported, so a renamed field fails at import, not as an empty column of
decide's tables. A param a trial logs is its field path (TrialSpec.flat_params)."""

from __future__ import annotations

from dinox.spec.fields import path_problem
from dinox.spec.sections import TrialSpec


def _param(path: str) -> str:
    if problem := path_problem(TrialSpec, path):
        raise AssertionError(f"param {path!r} is not a field of the spec: {problem}")
    return path


PRECISION = _param("precision")
MODEL_NAME = _param("model.name")
MODEL_KWARGS = _param("model.kwargs")  # a mapping: its keys are params of their own (model.kwargs.depth)
MODEL_GRAD_CHECKPOINTING = _param("model.grad_checkpointing")
BATCH_SIZE = _param("batch.size")
BATCH_ACCUMULATION = _param("batch.accumulation")
BATCH_EFFECTIVE = _param("batch.effective")
LOADER_NUM_WORKERS = _param("loader.num_workers")
LOADER_PIN_MEMORY = _param("loader.pin_memory")
DATA_SHARDS = _param("data.shards")
HARDWARE_GPUS = _param("hardware.gpus")
MEASURE_REPEATS = _param("measure.repeats")
MEASURE_BENCH_STEPS = _param("measure.bench_steps")
MEASURE_MAX_REPEATS = _param("measure.max_repeats")
ROUTINE_CHECKPOINT_EVERY_STEPS = _param("routine.checkpoint_every_steps")
ROUTINE_EVAL_EVERY_EPOCHS = _param("routine.eval_every_epochs")
ROUTINE_EVAL_IMAGES = _param("routine.eval_images")
SHRUNK = _param("shrunk")

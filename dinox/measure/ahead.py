"""The next micro-batch copied ahead (``loader.device_prefetch``): its copy to the device and its finishing there
(normalisation, erasing) run on a side stream while the current micro-batch computes, as timm's
PrefetchLoader runs them in train.py. The compute stream waits for the copy only where it uses the batch: a
copy that is hidden costs the step nothing, one that is not shows as the copy span on the compute stream.

The streams are injected (``Streams``): CUDA's here, a fake device's in the tests (tests/measure/test_timeline.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Streams:
    """`side()`: work inside runs on the side stream; `mark()`: an event on the side stream, recorded now;
    `wait(event, batch)`: the compute stream waits for it, and the batch is kept from the allocator until the
    compute stream is done with it (record_stream: timm's loader leaves that out)."""

    side: Callable[[], AbstractContextManager]
    mark: Callable[[], Any]
    wait: Callable[[Any, Any], None]


def cuda_streams(device: torch.device) -> Streams:
    stream = torch.cuda.Stream(device)

    def mark() -> Any:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait(event: Any, batch: Any) -> None:
        current = torch.cuda.current_stream(device)
        current.wait_event(event)
        for t in _tensors(batch):
            t.record_stream(current)

    return Streams(lambda: torch.cuda.stream(stream), mark, wait)


def in_series() -> Streams:
    """No side stream (the CPU): the copy happens when it is issued."""
    return Streams(contextlib.nullcontext, lambda: None, lambda event, batch: None)


@dataclass
class CopyAhead:
    """Issues a host batch's copy on the side stream; takes the device batch when the step uses it."""

    to_device: Callable[[Any], Any]
    streams: Streams

    def issue(self, host: Any) -> tuple[Any, Any]:
        with self.streams.side():
            batch = self.to_device(host)
            return batch, self.streams.mark()

    def take(self, pending: tuple[Any, Any]) -> Any:
        batch, event = pending
        self.streams.wait(event, batch)
        return batch


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, (list, tuple)):
        for item in batch:
            yield from _tensors(item)

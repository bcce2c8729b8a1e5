"""The device's own rules, on the CPU: what counts as running out of memory, and a memory cap that leaves room
for what a process holds outside torch's allocator."""

from __future__ import annotations

import pytest

from dinox.measure.device import allocator_cap, over_limit
from dinox.measure.result import is_oom
from dinox.plan.footprint import GIB


def test_out_of_memory_through_cudnn_or_cublas_is_an_oom():
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"))
    assert is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    # pytorch#108645: no engine fits its workspace near the cap; elsewhere a configuration no engine supports.
    no_engine = RuntimeError("GET was unable to find an engine to execute this computation")
    assert is_oom(no_engine, memory_share=0.97) and not is_oom(no_engine, memory_share=0.4)
    assert not is_oom(no_engine)  # memory unknown: an error, with its message


def test_an_emulated_card_leaves_room_for_what_lives_outside_the_allocator():
    total, limit, outside = 80 * GIB, 24 * GIB, int(0.6 * GIB)  # an H100 emulating a 24 GiB card
    assert allocator_cap(limit, outside, total) == pytest.approx(23.4 / 80)
    assert allocator_cap(limit, 0, total) == pytest.approx(24 / 80)
    assert allocator_cap(100 * GIB, 0, total) == 1.0 and allocator_cap(limit, 30 * GIB, total) == 0.0
    assert over_limit(int(23.3 * GIB), outside, limit) == ""
    why = over_limit(int(23.3 * GIB), int(0.9 * GIB), limit)  # cuDNN and NCCL grew it after the start
    assert why.startswith("out of memory on a 24.0 GiB card") and "24.20 GiB" in why

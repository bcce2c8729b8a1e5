"""How the child reads a failure: an exception that is running out of memory, and one line that says what
went wrong. (What a trial produces, TrialResult, is the parent/child contract: dinox.contract.)"""

from __future__ import annotations

from dinox.contract import one_line

_OOM_MARKERS = (
    "out of memory",  # CUDA / HIP / MPS allocators
    "can't allocate memory",  # CPU allocator under a data-segment limit
    "cannot allocate memory",
    "unable to allocate",  # numpy
    "cudnn_status_alloc_failed",  # cuDNN's own workspace or handle, near the cap
    "cublas_status_alloc_failed",  # cuBLAS's handle or workspace, near the cap
)
# cuDNN's frontend says the first when no engine's workspace fits (pytorch#108645) as well as for a configuration
# no engine supports, and the second for a handle created with no memory left as well as for a broken install:
# an OOM only when the trial's memory is near what it may use.
NEAR_FULL_MARKERS = ("unable to find an engine", "cudnn_status_not_initialized")
NEAR_FULL = 0.9


def is_oom(exc: BaseException, memory_share: float | None = None) -> bool:
    """Whether an exception is the device (or host) running out of memory; `memory_share`: the trial's peak
    reserved memory over what it may use, where known."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    if any(marker in text for marker in NEAR_FULL_MARKERS):
        return memory_share is not None and memory_share >= NEAR_FULL
    return any(marker in text for marker in _OOM_MARKERS)


def describe_exception(exc: BaseException) -> str:
    """One line for dinox.error. An exception re-raised from a DataLoader worker carries the worker's whole
    traceback in its message; its last line (the original exception) is what says what went wrong."""
    text = str(exc)
    if "Original Traceback" in text:
        head = text.splitlines()[0].removesuffix(".")  # "Caught DataError in DataLoader worker process 0"
        last = [ln for ln in text.splitlines() if ln.strip()][-1].strip()
        return one_line(f"{last} ({head.removeprefix('Caught ')})")
    return one_line(f"{type(exc).__name__}: {text}")

"""measure.profile: a trace of the step, on request. One extra short window under torch.profiler after the
measured ones (never inside them: the profiler's own cost would fall on the figures decide reads), kept as the
trial's artifact (Chrome/Perfetto trace JSON, gzipped) plus a summary: the top ops by self device time and by
self host time, each as a share of the profiled steps' wall time, and on CUDA the device's idle time split as
Holistic Trace Analysis does (waiting on the host, on the kernel before, other).

The summary is a plain dict (rows of lists), so the parent renders it without torch (store.descriptions).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from dinox.measure.loop import Loop

TRACE_FILE = "trace.json.gz"
TOP_OPS = 8
MAX_TRACE_BYTES = 1 << 30  # the uncompressed trace a profile keeps at most
NAME_CHARS = 80  # an op's name, cut: compiled graphs' names run to hundreds of characters
# HTA's consecutive_kernel_delay: a gap shorter than this between two kernels is the launch overhead itself.
KERNEL_WAIT_US = 0.03
_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# Where a kernel's launch shows on the host: the runtime API (cudaLaunchKernel, cudaMemcpyAsync), and the
# driver API (cuLaunchKernel), which Triton's (inductor's) and cuDNN's runtime-compiled kernels launch through.
_LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
OUTSIDE_OPS = "(in no op: Python, waiting for batches)"


def profile_steps(loop: Loop, steps: int, device: torch.device, out_dir: Path, world: int = 1) -> dict[str, Any]:
    """Run 1 + `steps` steps of `loop` under the profiler (the first is the profiler's warm-up, not recorded),
    write the trace to out_dir/TRACE_FILE and return the summary, with the profiled steps' images/s over the
    `world` ranks, as images_per_s counts them (the profiler's own cost shows as the gap to that figure)."""
    sync = loop.timeline.synchronize  # type: ignore[union-attr]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps, repeat=1)) as prof:
        loop.untimed_step()
        sync()
        prof.step()  # the warm-up ends: recording starts with the next step
        t = time.perf_counter()
        for i in range(steps):
            loop.untimed_step()
            if i == steps - 1:
                sync()  # the span ends when the device is done, before the profiler stops
                span_s = time.perf_counter() - t
            prof.step()
    trace = write_trace(prof, out_dir)
    summary = summarize_ops(prof.key_averages(), span_s, steps)
    summary["images_per_s"] = round(steps * loop.accumulation * loop.batch_size * world / span_s, 2)
    if device.type == "cuda":
        with gzip.open(trace, "rt") as f:
            summary["idle"] = idle_split(json.load(f).get("traceEvents", []))
    return summary


class TraceTooLarge(Exception):
    """The exported trace is over MAX_TRACE_BYTES: not kept (the summary stands without it)."""


def write_trace(prof: Any, out_dir: Path) -> Path:
    """The Chrome trace, gzipped (Perfetto and chrome://tracing open .json.gz as it is), whole or not at all:
    a disk that fills while it is written leaves no partial file, and a trace over MAX_TRACE_BYTES (a few
    steps of a model with tens of thousands of kernels) is not kept."""
    plain = out_dir / f".trace-{os.getpid()}.json"
    packed = out_dir / f".{TRACE_FILE}-{os.getpid()}.tmp"
    try:
        prof.export_chrome_trace(str(plain))
        if (size := plain.stat().st_size) > MAX_TRACE_BYTES:
            raise TraceTooLarge(f"trace of {size / 2**20:.0f} MiB, over the {MAX_TRACE_BYTES // 2**20} MiB kept")
        with open(plain, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        path = out_dir / TRACE_FILE
        os.replace(packed, path)
        return path
    finally:
        for leftover in (plain, packed):
            leftover.unlink(missing_ok=True)


def summarize_ops(averages: Any, span_s: float, steps: int) -> dict[str, Any]:
    """The top ops by self host and self device time: [name, calls per step, ms per step, share of the span]."""
    span_us = span_s * 1e6

    def top(attr: str) -> list[list[Any]]:
        events = sorted((e for e in averages if getattr(e, attr, 0) > 0), key=lambda e: -getattr(e, attr))
        return [
            [_name(e.key), round(e.count / steps, 2), round(getattr(e, attr) / steps / 1e3, 3),
             round(getattr(e, attr) / span_us, 4)]
            for e in events[:TOP_OPS]
        ]  # fmt: skip

    return {"steps": steps, "span_s": round(span_s, 4), "host": top("self_cpu_time_total"),
            "device": top("self_device_time_total")}  # fmt: skip


def _name(key: str) -> str:
    # The profiler's step annotation: its self time is the step's time in no op at all.
    return OUTSIDE_OPS if key.startswith("ProfilerStep") else key[:NAME_CHARS]


def idle_split(events: list[dict[str, Any]]) -> dict[str, float] | None:
    """The device's idle time between its first and last activity, as shares of that stretch, split as HTA
    does: host_wait where the next kernel's launch began only after the device had run dry (the host was
    late), kernel_wait where the gap is the launch overhead itself (< KERNEL_WAIT_US), other for the rest (a
    launch queued in time that still waited: stream syncs, events). All streams together: the device is idle
    only when none runs. None without device activity (the CPU)."""
    launches = {
        e["args"]["correlation"]: float(e["ts"])
        for e in events
        if e.get("cat") in _LAUNCH_CATS and "correlation" in e.get("args", {})
    }
    acts = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e.get("args", {}).get("correlation"))
        for e in events
        if e.get("cat") in _DEVICE_CATS and e.get("ph") == "X"
    )
    if not acts:
        return None
    busy_until, first, split = acts[0][1], acts[0][0], {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
    for start, end, corr in acts[1:]:
        gap = start - busy_until
        if gap > 0:
            launched = launches.get(corr)
            kind = (
                "kernel_wait"
                if gap < KERNEL_WAIT_US
                else "host_wait"
                if launched is not None and launched >= busy_until
                else "other"
            )
            split[kind] += gap
        busy_until = max(busy_until, end)
    stretch = busy_until - first
    out = {k: round(v / stretch, 4) for k, v in split.items()}
    out["busy"] = round(1 - sum(split.values()) / stretch, 4)
    return out

"""System metrics of each trial, through MLflow's own monitor, so a trial run's System metrics tab shows them.

MLflow's `SystemMetricsMonitor` samples in a thread of this (parent) process: CPU utilisation and host memory
always, GPU utilisation, memory and power through NVML (`nvidia-ml-py`) when a GPU is there; dinox adds the
SM clock (a throttling GPU shows it first). Sampled every 2 s, logged under MLflow's `system/` names, one
monitor per trial run from its opening to its result. What MLflow's monitor misses for us: a trial
shorter than one sampling interval would log nothing (its loop drops the last partial interval), so a last
sample is taken when the trial ends.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from mlflow.system_metrics.metrics.base_metrics_monitor import BaseMetricsMonitor
from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

INTERVAL_S = 2.0  # 16 ms of CPU a sample here (MLflow also reads the run back each time): 0.8 % of a core


class _SmClockMonitor(BaseMetricsMonitor):
    def __init__(self, handles: list) -> None:
        super().__init__()
        self.handles = handles

    def collect_metrics(self) -> None:
        import pynvml

        for i, handle in enumerate(self.handles):
            with contextlib.suppress(pynvml.NVMLError):
                self._metrics[f"gpu_{i}_sm_clock_mhz"].append(
                    pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
                )

    def aggregate_metrics(self) -> dict[str, float]:
        return {k: round(sum(v) / len(v), 1) for k, v in self._metrics.items() if v}


def own_handles(handles: list, uuid_of: Callable[[Any], str], gpus: Sequence[str]) -> list:
    """The NVML handles of the trial's own GPUs, in the trial's order (its first is gpu_0). MLflow's monitor
    samples every GPU of the node (MLflow #13398), by NVML's index, which is not the CUDA ordinal: beside
    other trials (`dinox run --devices`) each trial would show them all, under the wrong numbers."""
    by_uuid = {}
    for handle in handles:
        with contextlib.suppress(Exception):
            uuid = uuid_of(handle)
            by_uuid[uuid.decode() if isinstance(uuid, bytes) else str(uuid)] = handle
    return [by_uuid[g] for g in gpus if g in by_uuid]


class TrialMonitor:
    """Samples while a trial runs; `finish()` before the run is closed. `gpus`: the UUIDs of the GPUs the trial
    runs on (None: every GPU NVML sees, as MLflow's monitor does)."""

    def __init__(self, run_id: str, tracking_uri: str, gpus: Sequence[str] | None = None):
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no INFO line per trial
        self.monitor = SystemMetricsMonitor(run_id, sampling_interval=INTERVAL_S, tracking_uri=tracking_uri)
        # The root filesystem's space used and free says nothing about a trial, and took 3 of the 8 rows atop
        # every trial's metrics: dropped. Network stays (webdataset shards over http).
        self.monitor.monitors = [m for m in self.monitor.monitors if type(m).__name__ != "DiskMonitor"]
        gpu = next((m for m in self.monitor.monitors if hasattr(m, "gpu_handles")), None)
        if gpu is not None and gpus is not None:
            import pynvml

            gpu.gpu_handles = own_handles(gpu.gpu_handles, pynvml.nvmlDeviceGetUUID, gpus)
        if gpu is not None:
            self.monitor.monitors.append(_SmClockMonitor(gpu.gpu_handles))
        self.monitor.start()

    def finish(self) -> None:
        m = self.monitor
        m.finish()
        if m._logging_step == 0:  # shorter than one interval: one sample of the whole trial
            for monitor in m.monitors:
                monitor.clear_metrics()
            m.collect_metrics()
            m.publish_metrics(m.aggregate_metrics())
            m.mlflow_logger.flush()

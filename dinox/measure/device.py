"""The device a trial runs on: choosing it, capping its memory, precision flags, what it is called, its
memory peaks, and joining torchrun's process group. Shared by the trial and the estimate children."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import resource
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import timm
import torch

import dinox
from dinox import record as rec
from dinox.contract import GIB
from dinox.spec.sections import TrialSpec


def resolve_device(kind: str) -> torch.device:
    if kind == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("hardware.device: cuda was asked for but torch.cuda.is_available() is False")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise RuntimeError("hardware.device: mps was asked for but torch.backends.mps.is_available() is False")
    return torch.device(kind, torch.cuda.current_device()) if kind == "cuda" else torch.device(kind)


def available_kinds() -> tuple[tuple[str, ...], str]:
    """The device kinds torch can use here, and the same in words."""
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        return ("cpu", "cuda"), f"{n} CUDA device{'s' if n > 1 else ''} ({torch.cuda.get_device_name(0)})"
    if torch.backends.mps.is_available():
        return ("cpu", "mps"), "an Apple GPU (MPS) and no CUDA device"
    return ("cpu",), "only a CPU (torch.cuda.is_available() and torch.backends.mps.is_available() are False)"


def cuda_uuids() -> tuple[str, ...]:
    """Each visible CUDA device's UUID as NVML and CUDA_VISIBLE_DEVICES write it (GPU-..., MIG-...): the one
    name of a device that means the same to every process, whatever CUDA_DEVICE_ORDER says."""
    out = []
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        uuid = str(torch.cuda.get_device_properties(i).uuid)
        out.append(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    return tuple(out)


def cuda_numa_nodes(sysfs: Path = Path("/sys/bus/pci/devices")) -> tuple[int, ...]:
    """Each CUDA device's NUMA node from its PCI address in sysfs; -1 where the kernel does not say."""
    nodes = []
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        p = torch.cuda.get_device_properties(i)
        address = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
        try:
            nodes.append(int((sysfs / address / "numa_node").read_text()))
        except (OSError, ValueError):
            nodes.append(-1)
    return tuple(nodes)


def device_total_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "mps":
        return int(torch.mps.recommended_max_memory())
    import psutil

    return psutil.virtual_memory().total


def allocator_cap(limit: int, outside: int, total: int) -> float:
    """The share of the device the caching allocator may reserve so that it and what this process holds outside
    it (`outside`) stay within `limit` bytes."""
    return max(0.0, min(1.0, (limit - outside) / total))


def over_limit(peak_reserved: int, outside: int, limit: int) -> str:
    """Why a trial that fitted the allocator's cap would not fit a card of `limit` bytes; "" when it would."""
    if peak_reserved + outside <= limit:
        return ""
    return (
        f"out of memory on a {limit / GIB:.1f} GiB card (hardware.memory_limit_gb): the allocator's peak "
        f"{peak_reserved / GIB:.2f} GiB and {outside / GIB:.2f} GiB outside it (the CUDA context, loaded kernels, "
        f"cuDNN and NCCL buffers) make {(peak_reserved + outside) / GIB:.2f} GiB"
    )


def outside_from(
    pid: int, processes: list[tuple[int, int]] | None, free: int, total: int, reserved: int
) -> tuple[int | None, str]:
    """(bytes this process holds on the device outside the caching allocator, how that was read). NVML's
    account of this process (`processes`: NVML's (pid, used bytes) on the device, None without NVML); in a
    container whose pids NVML reports from the host's namespace, the one process it lists is this one; without
    NVML, the device's used memory less the allocator's (the GPU taken as this trial's alone: a neighbour's
    memory would count as this trial's). None where none of these can say (several processes, none ours)."""
    if processes is not None:
        mine = [used for p, used in processes if p == pid]
        if mine:
            return max(0, mine[0] - reserved), "nvml"
        if len(processes) == 1:
            return max(0, processes[0][1] - reserved), "nvml (its one process: pids from another namespace)"
        return None, "outside unknown: NVML lists several processes, none with this pid"
    return max(0, total - free - reserved), "mem_get_info (the GPU taken as this trial's alone)"


def outside_allocator_bytes(device: torch.device) -> tuple[int | None, str]:
    """This process's device memory that the caching allocator does not hold (the CUDA context, loaded kernels,
    cuDNN and NCCL buffers), and where the figure came from (outside_from). The context is created first:
    NVML lists a process only once it has one."""
    free, total = torch.cuda.mem_get_info(device)  # creates this process's context on the device
    processes: list[tuple[int, int]] | None
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(cuda_uuids()[device.index or 0])
        processes = [(p.pid, int(p.usedGpuMemory or 0)) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    except Exception:  # noqa: BLE001 - NVML missing, a MIG slice, no permission: the device's own account
        processes = None
    return outside_from(os.getpid(), processes, free, total, torch.cuda.memory_reserved(device))


def apply_memory_limit(device: torch.device, limit_gb: float | None) -> tuple[int, dict[str, str]]:
    """Cap what this trial may use; return the device memory it has (bytes) and the tag saying how it was
    capped. On CUDA the allocator's cap leaves room for what this process holds outside it, so an emulated card
    admits what a real one of that size would."""
    total = device_total_bytes(device)
    if limit_gb is None:
        return total, {}
    tags: dict[str, str] = {}
    limit = int(limit_gb * GIB)
    if device.type == "cuda":
        outside, source = outside_allocator_bytes(device)
        torch.cuda.set_per_process_memory_fraction(allocator_cap(limit, outside or 0, total), device)
        tags[rec.MEMORY_LIMIT] = f"cuda_memory_fraction (outside the allocator: {source})"
    elif device.type == "mps":
        torch.mps.set_per_process_memory_fraction(min(2.0, limit / total))
        tags[rec.MEMORY_LIMIT] = "mps_memory_fraction"
    else:
        # RLIMIT_DATA bounds this process's heap and anonymous mappings (where tensors live), while the
        # shared libraries of torch's CUDA build (GBs of address space) do not count against it as they
        # would with RLIMIT_AS. Loader workers inherit it, each with the same cap.
        _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
        tags[rec.MEMORY_LIMIT] = "rlimit_data"
    return min(limit, total), tags


class Precision(NamedTuple):
    autocast_dtype: torch.dtype | None
    scaler: Any  # torch.amp.GradScaler for fp16-mixed, else None
    tags: dict[str, str]  # a note where the precision changes nothing on this device


def apply_precision(device: torch.device, precision: str) -> Precision:
    """Set the backend flags for `precision`; return what the step needs for it."""
    tags: dict[str, str] = {}
    if device.type == "cuda":
        # torch's own defaults, as a user's loop gets them: cuDNN's TF32 on, float32 matmuls in full fp32.
        # tf32 turns the matmuls' on too; fp32-strict turns cuDNN's off (IEEE fp32 everywhere).
        torch.backends.cudnn.allow_tf32 = precision != "fp32-strict"
        torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")  # matmul.allow_tf32
        # Input shapes never change within a trial, so cuDNN's autotuning pays for itself.
        torch.backends.cudnn.benchmark = True
    elif precision in ("tf32", "fp32-strict"):
        tags[rec.NOTE] = f"{precision} has no effect on {device.type}; measured as fp32"
    if precision == "bf16-mixed":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise RuntimeError("precision: bf16-mixed is not supported by this GPU")
        return Precision(torch.bfloat16, None, tags)
    if precision == "fp16-mixed":
        return Precision(torch.float16, torch.amp.GradScaler(device.type), tags)
    return Precision(None, None, tags)


def conv_share(modules: list[torch.nn.Module]) -> float:
    """The share of the parameters held by convolutions (the patch embedding is a ViT's only one)."""
    total = conv = 0
    for root in modules:
        for m in root.modules():
            n = sum(p.numel() for p in m.parameters(recurse=False))
            total += n
            conv += n if isinstance(m, torch.nn.modules.conv._ConvNd) else 0
    return conv / total if total else 0.0


def math_class_tag(device: torch.device, precision: str, share: float) -> str:
    """The precision class the trial's math ran in, read back from torch's switches (MFU's peak is this
    class's): "tf32 (matmul_tf32=False cudnn_tf32=True; convolutions hold 96% of the parameters)"."""
    from dinox.plan.peaks import math_class

    cuda = device.type == "cuda"
    matmul, cudnn = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) if cuda else (False, False)
    return (
        f"{math_class(precision, matmul, cudnn, share)} (matmul_tf32={matmul} cudnn_tf32={cudnn}"
        f"{'' if cuda else f', none on {device.type}'}; convolutions hold {share:.0%} of the parameters)"
    )


def sm_clock_mhz(device: torch.device) -> float | None:
    """The device's SM clock now, in MHz (NVML's reading over its last sample period, through torch), or None:
    not CUDA, no NVML, or NVML refusing (a MIG slice, permissions). A GPU whose clocks have not ramped up after
    an idle start, or that throttles as it heats, shows it here before anywhere else."""
    if device.type != "cuda":
        return None
    try:
        return float(torch.cuda.clock_rate(device))
    except Exception:  # noqa: BLE001 - NVML missing or refusing: the clock is not known, the run goes on
        return None


def clock_reader(device: torch.device) -> Callable[[], float | None] | None:
    """What reads a CUDA device's SM clock between timed windows (None off CUDA). NVML's first call initialises it
    (milliseconds), so it is made here, at setup, never between two windows of one stretch of steps."""
    if device.type != "cuda":
        return None
    sm_clock_mhz(device)
    return lambda: sm_clock_mhz(device)


def environment_tags(device: torch.device) -> dict[str, str]:
    from dinox.isolate.contention import recorded as omp_recorded

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "mps":
        name = f"Apple MPS ({platform.machine()})"
    else:
        name = _cpu_name()
    return {
        rec.DEVICE: str(device),
        rec.DEVICE_NAME: name,
        rec.TORCH_VERSION: torch.__version__,
        rec.CUDA_VERSION: str(torch.version.cuda or ""),
        rec.HIP_VERSION: str(getattr(torch.version, "hip", None) or ""),
        rec.TIMM_VERSION: timm.__version__,
        rec.DINOX_VERSION: dinox.__version__,
        rec.PYTHON_VERSION: platform.python_version(),
        rec.HOST: platform.node(),
        rec.TORCH_THREADS: str(torch.get_num_threads()),
        rec.OMP_WAIT_POLICY: omp_recorded(os.environ),
    }


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cpus)"
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cpus)"


# A child forked by the fork server: the file-backed pages (torch's and timm's libraries and modules) the fork
# server held resident when it forked this child, in bytes. See rss_bytes.
_FORKED_FROM_FILE_BYTES = 0


def forked_from(parent: int) -> None:
    """Called first thing in a child forked by the fork server `parent` (idle in its loop, so what it holds is
    what it held at the fork)."""
    global _FORKED_FROM_FILE_BYTES
    _FORKED_FROM_FILE_BYTES = _file_backed(parent)


def rss_bytes(peak: bool = True) -> int:
    """This process's resident set (its peak, or now), as a fresh process's would read: a user's training script
    starts fresh. A forked child's own count misses the library pages its fork server touched while importing
    and the child never touched again (Linux copies no page-table entry of a shared file mapping at a fork): on
    the CPU a tiny ViT's trial read 0.54 GiB forked, 0.82 GiB spawned. Those pages are added back: what the fork
    server held of them, less what this child holds of its own now (0.79 GiB then; low by the pages the child
    touched that the fork server never had, never high)."""
    if peak:
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        own = own if sys.platform == "darwin" else own * 1024  # macOS reports bytes, Linux KiB
    else:
        import psutil

        own = psutil.Process().memory_info().rss
    if not _FORKED_FROM_FILE_BYTES:  # a fresh process (or not Linux, where dinox forks no trial)
        return own
    return own + max(0, _FORKED_FROM_FILE_BYTES - _file_backed(os.getpid()))


def _file_backed(pid: int) -> int:
    """Bytes of process `pid`'s resident pages that map files (psutil's `shared`, Linux's RssFile + RssShmem);
    0 where it is gone."""
    import psutil

    try:
        return psutil.Process(pid).memory_info().shared
    except psutil.Error:
        return 0


def rank_of_world() -> tuple[int, int, int] | None:
    """(rank, local rank, world size) when torchrun started this process as one of several ranks."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), world


def pin_cores() -> dict[str, str]:
    """Run on the cores `dinox run --devices` gave this trial (a rank: its part of them), with at most one
    torch thread per core (torch's own default where that is fewer: physical cores, not hyperthreads).
    Loader workers fork from here and keep the same cores."""
    from dinox.isolate.slots import child_cores, format_cores

    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cores = child_cores(os.environ, int(os.environ.get("LOCAL_RANK", "0")), local_world)
    if not cores:
        return {}
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(min(torch.get_num_threads(), len(cores)))
    return {rec.CORES: format_cores(sorted(os.sched_getaffinity(0)))}  # what the kernel holds it to


def join_world(spec: TrialSpec, device: torch.device) -> tuple[torch.device, dict[str, str]]:
    """Join torchrun's process group: NCCL on CUDA (one GPU per local rank), gloo on the CPU; the rank's device
    and the tags naming its place in the world."""
    import torch.distributed as dist

    rank, local_rank, world = rank_of_world()  # type: ignore[misc]
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    # A rank that dies leaves the others in a collective: torchrun stops them, and this bounds the wait.
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=spec.measure.timeout_s))
    return device, {rec.RANK: str(rank), rec.WORLD_SIZE: str(world), rec.DIST_BACKEND: backend}


def all_agree(device: torch.device) -> Callable[[bool], bool]:
    """True for every rank once every rank says True."""
    least = _all_reduce(device, "MIN")
    return lambda mine: bool(least(int(mine)))


def all_max(device: torch.device) -> Callable[[int], int]:
    """The largest of every rank's integer, on every rank."""
    return _all_reduce(device, "MAX")


def _all_reduce(device: torch.device, op: str) -> Callable[[int], int]:
    """Every rank's integer reduced by `op` (a torch.distributed.ReduceOp name), on every rank: an all-reduce of
    one integer on the trial's device."""
    import torch.distributed as dist

    def reduce(mine: int) -> int:
        value = torch.tensor([mine], device=device, dtype=torch.int64)
        dist.all_reduce(value, op=getattr(dist.ReduceOp, op))
        return int(value.item())

    return reduce


def record_memory(device: torch.device) -> tuple[dict[str, float], dict[str, str]]:
    """The peaks so far (metrics) and where they were read (the tag)."""
    metrics: dict[str, float] = {rec.CHILD_PEAK_RSS_GB: rss_bytes() / GIB}
    tags: dict[str, str] = {}
    if device.type == "cuda":
        metrics[rec.PEAK_MEM_ALLOCATED_GB] = torch.cuda.max_memory_allocated(device) / GIB
        metrics[rec.PEAK_MEM_RESERVED_GB] = torch.cuda.max_memory_reserved(device) / GIB
        tags[rec.MEM_SOURCE] = "cuda_allocator"
        outside, _source = outside_allocator_bytes(device)
        if outside is not None:
            metrics[rec.DEVICE_MEM_OUTSIDE_GB] = outside / GIB
    elif device.type == "mps":
        metrics[rec.PEAK_MEM_ALLOCATED_GB] = torch.mps.current_allocated_memory() / GIB
        metrics[rec.PEAK_MEM_RESERVED_GB] = torch.mps.driver_allocated_memory() / GIB
        tags[rec.MEM_SOURCE] = "mps_allocator_at_end"
    else:
        # On the CPU the "device" is host memory: the trial process's peak resident set.
        metrics[rec.PEAK_MEM_ALLOCATED_GB] = metrics[rec.CHILD_PEAK_RSS_GB]
        metrics[rec.PEAK_MEM_RESERVED_GB] = metrics[rec.CHILD_PEAK_RSS_GB]
        tags[rec.MEM_SOURCE] = "process_peak_rss"
    return metrics, tags

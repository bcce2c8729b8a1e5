"""The child process: build model, data and step from one trial, measure, write a TrialResult.

Run as ``python -m dinox.trial TRIAL_JSON RESULT_JSON``. It logs nowhere but its result file (and its own
stdout/stderr, which the parent keeps as the trial's log); MLflow is never imported here. An exception
becomes a result with status oom or error; a death (signal, abort, hang) leaves no result, and the parent
records it as crashed or timeout.
"""

from __future__ import annotations

import faulthandler
import time

_T_START = time.time()
# A segfault or abort in native code (a kernel, a driver, an import) then leaves a Python stack in the
# trial's log, which the parent records with the crash.
faulthandler.enable()

import contextlib  # noqa: E402  (the marks above must come before the heavy imports)
import os  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from typing import Any  # noqa: E402

import timm  # noqa: E402  (imported here so start-up time, not setup time, carries its ~1 s)
import torch  # noqa: E402
from torch.utils.data import DataLoader, IterableDataset  # noqa: E402

from dinox import bench, lifeline, models, objectives, ranks  # noqa: E402
from dinox.data import build_dataset  # noqa: E402
from dinox.data.views import view_plan  # noqa: E402
from dinox.result import TrialResult, one_line  # noqa: E402
from dinox.spec import TrialSpec  # noqa: E402

GIB = 2**30

_OOM_MARKERS = (
    "out of memory",  # CUDA / HIP / MPS allocators
    "can't allocate memory",  # CPU allocator under a data-segment limit
    "cannot allocate memory",
    "unable to allocate",  # numpy
)


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
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


def device_total_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "mps":
        return int(torch.mps.recommended_max_memory())
    import psutil

    return psutil.virtual_memory().total


def apply_memory_limit(device: torch.device, limit_gb: float | None, tags: dict[str, str]) -> int:
    """Cap what this trial may use; return the device memory it has (bytes)."""
    total = device_total_bytes(device)
    if limit_gb is None:
        return total
    limit = int(limit_gb * GIB)
    if device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), device)
        tags["dinox.memory_limit"] = "cuda_memory_fraction"
    elif device.type == "mps":
        torch.mps.set_per_process_memory_fraction(min(2.0, limit / total))
        tags["dinox.memory_limit"] = "mps_memory_fraction"
    else:
        # RLIMIT_DATA bounds this process's heap and anonymous mappings (where tensors live), while the
        # shared libraries of torch's CUDA build (GBs of address space) do not count against it as they
        # would with RLIMIT_AS. Loader workers inherit it, each with the same cap.
        _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
        tags["dinox.memory_limit"] = "rlimit_data"
    return min(limit, total)


def apply_precision(device: torch.device, precision: str, tags: dict[str, str]) -> tuple[Any, Any]:
    """Set the backend flags for `precision`; return (autocast dtype or None, GradScaler or None)."""
    if device.type == "cuda":
        tf32 = precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        # Input shapes never change within a trial, so cuDNN's autotuning pays for itself.
        torch.backends.cudnn.benchmark = True
    elif precision == "tf32":
        tags["dinox.note"] = f"tf32 has no effect on {device.type}; measured as fp32"
    if precision == "bf16-mixed":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise RuntimeError("precision: bf16-mixed is not supported by this GPU")
        return torch.bfloat16, None
    if precision == "fp16-mixed":
        return torch.float16, torch.amp.GradScaler(device.type)
    return None, None


def environment_tags(device: torch.device) -> dict[str, str]:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "mps":
        name = f"Apple MPS ({platform.machine()})"
    else:
        name = _cpu_name()
    return {
        "dinox.device": str(device),
        "dinox.device_name": name,
        "dinox.torch_version": torch.__version__,
        "dinox.cuda_version": str(torch.version.cuda or ""),
        "dinox.hip_version": str(getattr(torch.version, "hip", None) or ""),
        "dinox.timm_version": timm.__version__,
        "dinox.python_version": platform.python_version(),
        "dinox.host": platform.node(),
        "dinox.torch_threads": str(torch.get_num_threads()),
    }


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cpus)"
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cpus)"


def _own_peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


def _build_optimizer(spec: TrialSpec, params: list, device: torch.device, tags: dict[str, str]):
    o = spec.optimizer
    # Fused kernels by default where they are the norm in real training (CUDA); elsewhere torch's default.
    fused = o.fused if o.fused is not None else device.type == "cuda"
    tags["dinox.optimizer_fused"] = str(fused)
    extra = {"fused": True} if fused else {}
    if o.name == "adamw":
        return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay, **extra)
    return torch.optim.SGD(
        params, lr=o.lr, weight_decay=o.weight_decay, momentum=0.9 if o.momentum is None else o.momentum, **extra
    )


def rank_of_world() -> tuple[int, int, int] | None:
    """(rank, local rank, world size) when torchrun started this process as one of several ranks."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), world


def _join_world(spec: TrialSpec, device: torch.device, tags: dict[str, str]) -> torch.device:
    """Join torchrun's process group: NCCL on CUDA (one GPU per local rank), gloo on the CPU."""
    import datetime

    import torch.distributed as dist

    rank, local_rank, world = rank_of_world()  # type: ignore[misc]
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    # A rank that dies leaves the others in a collective: torchrun stops them, and this bounds the wait.
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=spec.measure.timeout_s))
    tags.update({"dinox.rank": str(rank), "dinox.world_size": str(world), "dinox.dist_backend": backend})
    return device


def measure(spec: TrialSpec, marks: dict[str, float], metrics: dict[str, float], tags: dict[str, str]) -> TrialResult:
    device = resolve_device(spec.hardware.device)
    distributed = rank_of_world()
    if distributed is not None:
        device = _join_world(spec, device, tags)
    tags.update(environment_tags(device))
    total_bytes = apply_memory_limit(device, spec.hardware.memory_limit_gb, tags)
    metrics["device_mem_total_gb"] = total_bytes / GIB
    autocast_dtype, scaler = apply_precision(device, spec.precision, tags)
    accumulation = spec.accumulation
    m = spec.measure

    dino = spec.objective.kind == "dino"
    # DINO trains a headless backbone; classification labels come from the objective's class count.
    num_classes = 0 if dino else spec.objective.num_classes  # type: ignore[union-attr]
    plan = view_plan(spec)
    t = time.time()
    world = distributed[2] if distributed else 1
    samples = (m.warmup_steps + m.bench_steps * m.repeats) * accumulation * spec.size * world
    dataset = build_dataset(spec, models.in_chans(spec.model), max(num_classes, 1), samples, plan)
    pin = spec.loader.pin_memory and device.type == "cuda"
    tags["dinox.pin_memory_applied"] = str(pin)
    iterable = isinstance(dataset, IterableDataset)  # webdataset shuffles in its own buffer
    seed = getattr(spec.data, "seed", 0)
    sampler = None
    if distributed is not None and not iterable:
        from torch.utils.data.distributed import DistributedSampler

        # Each rank its own shard of the data (webdataset splits its shards by rank itself).
        sampler = DistributedSampler(dataset, num_replicas=world, rank=distributed[0], shuffle=True, seed=seed,
                                     drop_last=True)  # fmt: skip
    loader = DataLoader(
        dataset,
        batch_size=spec.size,
        shuffle=not iterable and sampler is None,
        sampler=sampler,
        generator=None if iterable or sampler is not None else torch.Generator().manual_seed(seed),
        num_workers=spec.loader.num_workers,
        pin_memory=pin,
        prefetch_factor=spec.loader.prefetch_factor,
        persistent_workers=spec.loader.persistent_workers,
        drop_last=True,  # every step sees the same shapes: no recompilation, no ragged last batch
        worker_init_fn=lifeline.worker_init,  # a worker dies with its trial, even a hung one
    )
    metrics["data_setup_s"] = time.time() - t  # workers start lazily, inside the first warm-up step

    t = time.time()
    model = models.build(spec.model, num_classes, plan.sizes)
    # The backbone's size is "the model's size" (what decide compares); a DINO head comes on top.
    metrics["params_m"] = models.count_params_m(model)
    memory_format = torch.channels_last if spec.model.channels_last else torch.contiguous_format
    model = model.to(device=device, memory_format=memory_format)
    model.train()
    objective = objectives.build(model, spec.objective)
    metrics["trainable_params_m"] = sum(p.numel() for p in objective.parameters()) / 1e6
    optimizer = _build_optimizer(spec, objective.parameters(), device, tags)
    if spec.model.compile is not False:
        # torch.compile is lazy: the graph is built in the first warm-up step, timed apart as compile_s.
        objective.compile(lambda mod: models.compile_model(mod, spec.model.compile))
    ddp: Any = None
    if distributed is not None:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        ddp = objective.distribute(lambda mod: DistributedDataParallel(mod, device_ids=ids))
    metrics["build_s"] = time.time() - t

    non_blocking = pin  # async copies only from pinned memory; otherwise they are synchronous anyway
    channels_last = spec.model.channels_last

    def move(x: torch.Tensor) -> torch.Tensor:
        x = x.to(device, non_blocking=non_blocking)
        return x.contiguous(memory_format=torch.channels_last) if channels_last and x.dim() == 4 else x

    def to_device(batch: Any) -> Any:
        images, labels = batch
        images = [move(v) for v in images] if isinstance(images, (list, tuple)) else move(images)
        return images, labels.to(device, non_blocking=non_blocking)

    last_loss: list[torch.Tensor] = []

    micro_count = [0]

    def micro_step(batch: Any) -> None:
        micro_count[0] += 1
        # Under DDP, gradients are all-reduced on the last micro-batch of a step only, as Lightning does.
        last = micro_count[0] % accumulation == 0
        sync = ddp.no_sync() if ddp is not None and not last else contextlib.nullcontext()
        with sync:
            with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                                enabled=autocast_dtype is not None):  # fmt: skip
                loss = objective.loss(batch) / accumulation
            (scaler.scale(loss) if scaler is not None else loss).backward()
        last_loss[:] = [loss.detach()]  # no .item(): that would synchronise inside the step

    def optimizer_step() -> None:
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        objective.after_optimizer_step()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    marks["setup_done"] = time.time()
    stats = bench.run(
        loader,
        to_device=to_device,
        micro_step=micro_step,
        optimizer_step=optimizer_step,
        device=device,
        accumulation=accumulation,
        batch_size=spec.size,
        warmup_steps=m.warmup_steps,
        bench_steps=m.bench_steps,
        repeats=m.repeats,
    )
    marks["measured"] = time.time()

    step_p50 = stats.quantile(0.5)
    metrics.update(
        {
            "images_per_s": stats.images_per_s,
            "step_s_p50": step_p50,
            "step_s_p90": stats.quantile(0.9),
            "data_s": stats.mean("data_s"),
            "h2d_s": stats.mean("h2d_s"),
            "compute_s": stats.mean("compute_s"),
            "window_s": stats.window_s,
            "images_per_s_min": min(stats.window_images_per_s),
            "images_per_s_max": max(stats.window_images_per_s),
            "window_spread": stats.spread,
            "warmup_s": stats.warmup_s,
            "loader_start_s": stats.loader_start_s,
            "first_step_s": stats.first_step_s,
            "loss": float(last_loss[0].float() * accumulation) if last_loss else float("nan"),
        }
    )
    # One window cannot disagree with itself: only repeated windows can call a trial unstable.
    tags["dinox.unstable"] = str(m.repeats > 1 and stats.spread > m.unstable_threshold).lower()
    if spec.model.compile is not False:
        metrics["compile_s"] = max(0.0, stats.first_step_s - step_p50)
    _record_memory(device, metrics, tags)
    mean_step = stats.mean("step_s")
    bound = bench.classify(stats.mean("data_s"), stats.mean("h2d_s"), mean_step, m.bound_threshold)
    del loader  # shut the workers down before the process reports
    return TrialResult("ok", bound=bound, metrics=metrics, tags=tags, step_s=[s.step_s for s in stats.steps])


def _record_memory(device: torch.device, metrics: dict[str, float], tags: dict[str, str]) -> None:
    metrics["child_peak_rss_gb"] = _own_peak_rss_bytes() / GIB
    if device.type == "cuda":
        metrics["peak_mem_allocated_gb"] = torch.cuda.max_memory_allocated(device) / GIB
        metrics["peak_mem_reserved_gb"] = torch.cuda.max_memory_reserved(device) / GIB
        tags["dinox.mem_source"] = "cuda_allocator"
    elif device.type == "mps":
        metrics["peak_mem_allocated_gb"] = torch.mps.current_allocated_memory() / GIB
        metrics["peak_mem_reserved_gb"] = torch.mps.driver_allocated_memory() / GIB
        tags["dinox.mem_source"] = "mps_allocator_at_end"
    else:
        # On the CPU the "device" is host memory: the trial process's peak resident set.
        metrics["peak_mem_allocated_gb"] = metrics["child_peak_rss_gb"]
        metrics["peak_mem_reserved_gb"] = metrics["child_peak_rss_gb"]
        tags["dinox.mem_source"] = "process_peak_rss"


def run_child(trial_json: str, result_json: str, forked: bool = False) -> int:
    """Measure, write the result; 0, or under torchrun 1 for a failed rank, so torchrun stops the others."""
    distributed = rank_of_world()
    if distributed is not None:
        result_json = ranks.result_name(result_json, distributed[0])
    # Forked from the fork server, the imports were paid once, before the fork: this trial starts now.
    now = time.time()
    marks = {"start": now if forked else _T_START, "imports_done": now}
    metrics: dict[str, float] = {}
    tags: dict[str, str] = {}
    spec = TrialSpec.model_validate_json(open(trial_json).read())
    device: torch.device | None = None
    try:
        result = measure(spec, marks, metrics, tags)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded status
        traceback.print_exc()
        status = "oom" if is_oom(exc) else "error"
        message = describe_exception(exc)
        with contextlib.suppress(Exception):
            device = torch.device(tags["dinox.device"]) if "dinox.device" in tags else None
            if device is not None:
                _record_memory(device, metrics, tags)
        result = TrialResult(status, error=message, metrics=metrics, tags=tags)
    result.marks = marks
    result.marks["result_written"] = time.time()
    result.write_atomic(result_json)
    sys.stdout.flush()
    sys.stderr.flush()
    return 1 if distributed is not None and result.status != "ok" else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m dinox.trial TRIAL_JSON RESULT_JSON")
    # Dies with the sweep that started it (or, as a rank, with torchrun), even if that one is SIGKILLed.
    lifeline.die_with_parent(lifeline.env_parent())
    code = run_child(sys.argv[1], sys.argv[2])
    # The result is on disk and the output flushed: skip interpreter teardown (~0.8 s of unloading torch
    # here). The parent ends whatever is left of the process group (loader workers) right after.
    os._exit(code)

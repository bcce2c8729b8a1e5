"""The child process: build model, data and step from one trial, measure, write a TrialResult.

Run as ``python -m dinox.measure.trial TRIAL_JSON RESULT_JSON``. It logs nowhere but its result file (and its own
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
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import multiprocessing  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import timm  # noqa: E402, F401  (imported here so start-up time, not setup time, carries its ~1 s)
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from dinox import record as rec  # noqa: E402
from dinox.contract import COST_FILE, GIB, PHASE_FILE, PROFILE_CUT, PROVISIONAL_FILE, TrialResult  # noqa: E402
from dinox.data.device_prep import DevicePrep  # noqa: E402
from dinox.data.views import ViewPlan, view_plan  # noqa: E402
from dinox.isolate import lifeline, ranks  # noqa: E402
from dinox.measure import device, loading, models, objectives, profile, routine, runtime  # noqa: E402
from dinox.measure import loop as bench  # noqa: E402
from dinox.measure.result import describe_exception, is_oom  # noqa: E402
from dinox.measure.step import TrainStep, build_optimizer  # noqa: E402
from dinox.measure.step_metrics import copies_known, decided, summarize  # noqa: E402
from dinox.measure.windows import LoopStats, Repeats  # noqa: E402
from dinox.plan.footprint import compute_metrics  # noqa: E402
from dinox.spec.objectives import DinoObjective, PythonObjective  # noqa: E402
from dinox.spec.sections import TrialSpec  # noqa: E402
from dinox.writes import write_whole  # noqa: E402

# In a trial's own process (run_child), which ends by os._exit once its result is written: the loader, kept to
# that exit, its workers killed and reaped once the result is on disk. Shut down in order, each worker first
# finishes the batch it is making (0.14 and 0.25 s of a 2-worker CT trial at batch 32 and 64 here). Not left to
# the parent's kill of the trial's process group: orphaned, the workers' zombies wait for whatever init reaps
# them (1.7 s here; never, under a container's PID 1 that reaps nothing: the kill's whole 13 s), and the group
# counts as alive till then. None elsewhere (a trial measured in-process, as tests do): the loader goes with its
# TrialRun, in order.
_LEFT_TO_EXIT: list[Any] | None = None
KILLED_WORKER_WAIT_S = 5.0  # a worker stuck in the kernel (a hung file system) is left to the parent's kill


class TrialRun:
    """One trial in the child, as named steps: the device, the loader, the model and optimizer, the step
    functions, the loop, and its summary (dinox.measure.step_metrics).

    Its state, declared here (torchtitan's Trainer): what __init__ sets from the spec, then what each setup
    step adds (the device's, the loader's, the model's), then what the measurement keeps."""

    # from the spec and the launcher (__init__)
    spec: TrialSpec
    marks: dict[str, float]
    metrics: dict[str, float]
    tags: dict[str, str]
    on_phase: Callable[[str], None] | None
    accumulation: int
    distributed: tuple[int, int, int] | None  # (rank, local rank, world) under torchrun
    world: int
    out_dir: Path
    # _setup_device
    dev: torch.device
    autocast_dtype: torch.dtype | None
    scaler: Any  # torch.amp.GradScaler for fp16-mixed, else None
    num_classes: int
    plan: ViewPlan
    # _setup_loader
    prep: DevicePrep | None
    pin: bool
    non_blocking: bool
    loader: DataLoader
    # _setup_model: the objective, its optimizer and the step functions over them
    step: TrainStep
    # the measurement
    loop: bench.Loop
    runtime_seen: dict[str, str]  # what the gc held during the windows
    artifacts: list[str]
    graphs: models.GraphCount | None  # a compiled trial's graph count, phase by phase

    def __init__(
        self,
        spec: TrialSpec,
        marks: dict[str, float],
        metrics: dict[str, float],
        tags: dict[str, str],
        on_phase: Callable[[str], None] | None = None,
        out_dir: Path = Path(),
    ):
        self.spec, self.marks, self.metrics, self.tags = spec, marks, metrics, tags
        self.on_phase = on_phase
        self.accumulation = spec.accumulation
        self.distributed = device.rank_of_world()
        self.world = self.distributed[2] if self.distributed else 1
        self.runtime_seen: dict[str, str] = {}  # what the gc held during the windows
        self.out_dir = out_dir  # where the trial's files go (beside its result): the profile's trace
        self.artifacts: list[str] = []
        self.graphs: models.GraphCount | None = None  # a compiled trial's graph count, phase by phase

    def setup(self) -> None:
        """The device, the loader, the model and its optimizer: what a measurement and a verification share."""
        if self.on_phase is not None:
            self.on_phase("setup")
        self._setup_device()
        self._setup_loader()
        self._setup_model()
        if self.dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.dev)
        self.marks["setup_done"] = time.time()

    def measure(self) -> TrialResult:
        self.setup()
        with runtime.gc_for_windows(self.spec, self.runtime_seen):
            stats = self._loop()
            self.marks["measured"] = time.time()
            self._record_memory()  # the peaks before the profile: the profiler's buffers are not the trial's
            self.metrics.update(routine.measure(self))  # what the real run does besides its steps, timed once
            if self.spec.measure.profile:
                self._provisional(stats)
                self._profile()
        return self._result(stats)

    def _record_memory(self) -> None:
        metrics, tags = device.record_memory(self.dev)
        self.metrics.update(metrics)
        self.tags.update(tags)

    def _provisional(self, stats: Any) -> None:
        """The measurement, recorded before the profile starts (one process: under torchrun the ranks' results
        are merged, and only rank 0 profiles): a profile cut off by the time limit or a crash costs its
        trace, never the result (the parent takes this file then)."""
        if self.distributed is not None:
            return
        before = dict(self.tags)
        self.tags[rec.PROFILE] = json.dumps({"error": PROFILE_CUT}, separators=(",", ":"))
        result = self._result(stats, keep_loop=True)
        self.tags.clear()  # in place: run_child reads the same dict should anything fail after this
        self.tags.update(before)
        result.marks = {**self.marks, "result_written": time.time()}
        with contextlib.suppress(OSError):  # no room for it: the profile's result is still written after
            result.write_atomic(self.out_dir / PROVISIONAL_FILE)

    def _result(self, stats: Any, keep_loop: bool = False) -> TrialResult:
        step = self.step
        self.tags[rec.RUNTIME] = runtime.applied(self.dev, self.non_blocking, step.set_to_none, self.runtime_seen)
        share = device.conv_share(routine.modules(step.objective))
        self.tags[rec.MATH_CLASS] = device.math_class_tag(self.dev, self.spec.precision, share)
        summary = summarize(stats, self.spec.measure, self.spec.model.compile is not False)
        self.metrics.update(summary.metrics)
        self.tags.update(summary.tags)
        self._flops(stats.images_per_s)
        self.metrics[rec.LOSS] = step.loss_value()
        if not keep_loop:
            self.let_go_of_loader()
        if why := self._over_limit():
            return TrialResult("oom", error=why, metrics=dict(self.metrics), tags=dict(self.tags))
        return TrialResult(
            "ok",
            bound=summary.bound,
            metrics=dict(self.metrics),
            tags=dict(self.tags),
            step_s=summary.step_s,
            artifacts=list(self.artifacts),
        )

    def let_go_of_loader(self) -> None:
        """Measured: the loop and its loader let go of. In a trial's own process kept to its end, where its
        workers are killed once the result is written (_LEFT_TO_EXIT); elsewhere shut down in order, now."""
        if _LEFT_TO_EXIT is not None:
            _LEFT_TO_EXIT.extend((self.loop, self.loader))  # the loop's iterator holds the workers
        del self.loop, self.loader

    def _flops(self, images_per_s: float) -> None:
        """TFLOP/s and MFU beside the throughput: the plan's FLOPs per image (COST_FILE, where the parent had
        one) at this rank's rate, against the peak of the math class the child read back. Ranks sum TFLOP/s and
        average MFU (rec.RANKS)."""
        try:
            flops = float(json.loads((self.out_dir / COST_FILE).read_text())["flops_per_image"])
        except (OSError, ValueError, KeyError, TypeError):
            return  # no plan figure: the trial has no MFU, as before
        ran = self.tags[rec.MATH_CLASS].split(" ")[0]
        device_name = self.tags.get(rec.DEVICE_NAME, "")
        metrics, tags = compute_metrics(flops, images_per_s, device_name, ran, self.spec.hardware.peak_tflops)
        self.metrics.update(metrics)
        self.tags.update(tags)

    def _profile(self) -> None:
        """measure.profile on rank 0 (the others take the same steps unprofiled, so DDP's collectives pair up).
        A profiler that fails costs the trace, never the measured result."""
        steps = self.spec.measure.profiled_steps
        if self.distributed is not None and self.distributed[0] != 0:
            for _ in range(steps + 1):
                self.loop.untimed_step()
            return
        if self.on_phase is not None:
            self.on_phase("profile")
        try:
            summary = profile.profile_steps(self.loop, steps, self.dev, self.out_dir, self.world)
        except Exception as exc:  # noqa: BLE001 - the trace is a diagnostic; the result stands without it
            traceback.print_exc()
            summary = {"error": describe_exception(exc)}
        else:
            self.artifacts.append(str(self.out_dir / profile.TRACE_FILE))
        self.tags[rec.PROFILE] = json.dumps(summary, separators=(",", ":"))

    def _over_limit(self) -> str:
        """A trial within the allocator's cap that a real card of hardware.memory_limit_gb would not hold."""
        limit, m = self.spec.hardware.memory_limit_gb, self.metrics
        if limit is None or self.dev.type != "cuda" or rec.DEVICE_MEM_OUTSIDE_GB not in m:
            return ""
        return device.over_limit(
            int(m[rec.PEAK_MEM_RESERVED_GB] * GIB), int(m[rec.DEVICE_MEM_OUTSIDE_GB] * GIB), int(limit * GIB)
        )

    # --- setup --------------------------------------------------------------------------------------

    def _setup_device(self) -> None:
        spec, tags = self.spec, self.tags
        runtime.before_device(spec)
        self.dev = device.resolve_device(spec.hardware.device)
        if self.distributed is not None:
            self.dev, world_tags = device.join_world(spec, self.dev)
            tags.update(world_tags)
        tags.update(device.environment_tags(self.dev))
        total_bytes, limit_tags = device.apply_memory_limit(self.dev, spec.hardware.memory_limit_gb)
        tags.update(limit_tags)
        self.metrics[rec.DEVICE_MEM_TOTAL_GB] = total_bytes / GIB
        self.autocast_dtype, self.scaler, precision_tags = device.apply_precision(self.dev, spec.precision)
        tags.update(precision_tags)
        runtime.after_precision(spec)
        # DINO trains a headless backbone; classification labels come from the objective's class count.
        self.num_classes = 0 if isinstance(spec.objective, DinoObjective) else spec.objective.num_classes  # type: ignore[union-attr]
        self.plan = view_plan(spec)

    def _samples_needed(self) -> int:
        """What the loop can draw from the loader at most: warm-up, the timed windows each after a drain of twice
        the batches the workers hold and an untimed step, and the loader-only window after one more drain; so
        no epoch edge falls inside the measurement (synthetic data is this long, a smaller set repeated)."""
        m, lo = self.spec.measure, self.spec.loader
        windows = m.window_bounds[1]
        steps = m.warmup_steps + (m.bench_steps + 1) * windows
        drained = 2 * lo.num_workers * (lo.prefetch_factor or 2) * (windows + 1)
        profiled = m.profiled_steps + 1 if m.profile else 0
        micro = (steps + profiled) * self.accumulation + self._loader_alone_batches() + drained
        return micro * self.spec.size * self.world

    def _ablation_steps(self) -> int:
        m = self.spec.measure
        return (m.ablation_steps or m.bench_steps) if m.ablation else 0

    def _loader_alone_batches(self) -> int:
        """The loader-alone window's batches: as many as one ablation window's micro-batches, rounded up to whole
        turns of the workers, two at least. A worker loader hands batches over in order, each worker its turn,
        and the window starts just after a batch that had to be waited for: the k-th turn after it ends with
        that worker's k-th batch, k batch times later, where a count that ends mid-turn is up to a batch time
        off (10 batches of 8 workers). Without workers (in the step's process) its rate is the timed steps'
        own fetches (Loop.run): a nonzero count only says to read it."""
        batches = math.ceil(self._ablation_steps() / 2) * self.accumulation
        workers = self.spec.loader.num_workers
        return workers * max(2, math.ceil(batches / workers)) if batches and workers else batches

    def _setup_loader(self) -> None:
        t = time.time()
        feed = loading.build(self.spec, self.dev, self.num_classes, self.plan, self._samples_needed(), self.distributed)
        self.prep, self.pin, self.non_blocking, self.loader = feed.prep, feed.pin, feed.non_blocking, feed.loader
        self.metrics.update(feed.metrics)
        self.tags.update(feed.tags)
        self.metrics[rec.DATA_SETUP_S] = time.time() - t  # workers start lazily, inside the first warm-up step

    def _setup_model(self) -> None:
        spec = self.spec
        t = time.time()
        runtime.before_model(spec)
        if isinstance(spec.objective, PythonObjective):  # the team's own step builds its own modules
            from dinox.measure import user_step

            context = user_step.Context(spec.model, self.dev, spec.precision, self.num_classes, spec.objective.options)
            objective = user_step.build(spec.objective, context)
            owned = {id(p): p for m in objective.modules() for p in m.parameters()}
            self.metrics[rec.PARAMS_M] = sum(p.numel() for p in owned.values()) / 1e6
        else:
            model = models.build(spec.model, self.num_classes, self.plan.sizes)
            # The backbone's size is "the model's size" (what decide compares); a DINO head comes on top.
            self.metrics[rec.PARAMS_M] = models.count_params_m(model)
            memory_format = torch.channels_last if spec.model.channels_last else torch.contiguous_format
            model = model.to(device=self.dev, memory_format=memory_format)
            model.train()
            mixup = self.prep is not None and self.prep.mixup is not None
            objective = objectives.build(model, spec.objective, soft_targets=mixup)
        self.metrics[rec.TRAINABLE_PARAMS_M] = sum(p.numel() for p in objective.parameters()) / 1e6
        if callable(collate := getattr(objective, "collate", None)):  # what the recipe's collate adds (DINOv2's masks)
            self.loader.collate_fn = collate(self.loader.collate_fn)  # the workers start in the first warm-up step
        groups = getattr(objective, "param_groups", None)  # per-group learning rates, where it has them
        params = groups() if callable(groups) else list(objective.parameters())
        optimizer, fused = build_optimizer(spec, params, self.dev)
        self.tags[rec.OPTIMIZER_FUSED] = str(fused)
        ddp = None
        if self.distributed is not None:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.dev.index] if self.dev.type == "cuda" else None
            ddp = objective.distribute(lambda mod: DistributedDataParallel(mod, device_ids=ids))
        if spec.model.compile is not False:
            # torch.compile is lazy: the graph is built in the first warm-up step, timed apart as compile_s.
            # compile(DDP(model)), as torch's DDP docs ask: dynamo then splits the graph at DDP's buckets, so
            # the all-reduce overlaps the backward; DDP(compile(model)) would give that up (pytorch#89096).
            objective.compile(lambda mod: models.compile_model(mod, spec.model.compile))
        self.step = TrainStep(
            spec, self.dev, objective, optimizer, self.autocast_dtype, self.scaler, self.prep, self.non_blocking, ddp
        )
        self.metrics[rec.BUILD_S] = time.time() - t

    def make_loop(self) -> bench.Loop:
        """The trial's steps, as the timed windows take them and as `dinox verify` trains with them."""
        compiled = self.spec.model.compile is not False
        self.graphs = models.GraphCount(self.on_phase) if compiled else None
        step = self.step
        ahead, ahead_tags = step.copy_ahead()
        self.tags.update(ahead_tags)
        self.loop = bench.Loop(
            self.loader,
            step.to_device,
            step.micro_step,
            step.optimizer_step,
            self.dev,
            self.accumulation,
            self.spec.size,
            halve=step.halve,
            on_phase=self.graphs.phase if self.graphs is not None else self.on_phase,
            local=step.local,
            ahead=ahead,
            read_clock=device.clock_reader(self.dev),
        )
        return self.loop

    def _loop(self) -> LoopStats:
        m, lo = self.spec.measure, self.spec.loader
        ablation = self._ablation_steps()
        loop = self.make_loop()
        agree = device.all_agree(self.dev) if self.world > 1 else None
        # No workers on the host's clock: the loader and the copies run in series with the step, timed by it.
        serial = loop.clock == "host" and lo.num_workers == 0
        known = functools.partial(decided, threshold=m.bound_threshold, serial=serial)
        # Ranks run each round's windows together (their steps all-reduce): they stop the rounds together.
        loop.decided = known if agree is None else lambda *seen: agree(known(*seen))
        if loop.clock == "host":  # a compute-only window shows the copies' cost and nothing else there
            copies = functools.partial(copies_known, threshold=m.bound_threshold)
            loop.copies_decided = copies if agree is None else lambda *seen: agree(copies(*seen))
        try:
            stats = loop.run(
                m.warmup_steps,
                m.bench_steps,
                Repeats(*m.window_bounds, m.unstable_threshold, agree),
                ablation_steps=ablation,
                loader_batches=self._loader_alone_batches(),
                loader_buffered=lo.num_workers * (lo.prefetch_factor or 2),
            )
            if self.graphs is not None:
                self.graphs.end()
        finally:  # a trial that fails in its windows still reports the graphs warm-up built
            if self.graphs is not None:
                self.metrics.update(self.graphs.metrics)
        return stats


def kill_workers() -> None:
    """This process's loader workers (multiprocessing's children of it) killed, then reaped: for a process
    that ends now. torch's SIGCHLD handler, which raises for a worker killed by a signal (it catches workers
    that die under a live loader), is let go first."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    workers = multiprocessing.active_children()
    for worker in workers:
        worker.kill()
    deadline = time.time() + KILLED_WORKER_WAIT_S
    for worker in workers:
        worker.join(max(0.0, deadline - time.time()))


def measure(
    spec: TrialSpec,
    marks: dict[str, float],
    metrics: dict[str, float],
    tags: dict[str, str],
    on_phase: Callable[[str], None] | None = None,
    out_dir: Path = Path(),
) -> TrialResult:
    return TrialRun(spec, marks, metrics, tags, on_phase, out_dir).measure()


def phase_writer(path: Path) -> Callable[[str], None]:
    """Tells the parent which phase the trial is in (its live progress line), through a small file replaced
    whole: a few writes per trial, never inside a timed window."""

    def write(text: str) -> None:
        with contextlib.suppress(OSError):
            write_whole(path, text)

    return write


def run_child(trial_json: str, result_json: str, forked: bool = False, measure_with: Callable = measure) -> int:
    """Measure (`measure_with`: `dinox verify` trains instead), write the result; 0, or under torchrun 1 for a
    failed rank, so torchrun stops the others."""
    global _LEFT_TO_EXIT
    _LEFT_TO_EXIT = []  # this process ends once the result is written: see _LEFT_TO_EXIT
    distributed = device.rank_of_world()
    on_phase = phase_writer(Path(result_json).with_name(PHASE_FILE)) if not distributed or distributed[0] == 0 else None
    if distributed is not None:
        result_json = ranks.result_name(result_json, distributed[0])
    # Forked from the fork server, the imports were paid once, before the fork: this trial starts now.
    now = time.time()
    if forked:
        device.forked_from(os.getppid())
    marks = {"start": now if forked else _T_START, "imports_done": now}
    metrics: dict[str, float] = {}
    tags: dict[str, str] = {}
    spec = TrialSpec.model_validate_json(open(trial_json).read())
    try:
        tags.update(device.pin_cores())  # before any torch op starts its thread pool
        result = measure_with(spec, marks, metrics, tags, on_phase, Path(result_json).parent)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded status
        traceback.print_exc()
        message = describe_exception(exc)
        with contextlib.suppress(Exception):
            if rec.DEVICE in tags:
                peaks, source = device.record_memory(torch.device(tags[rec.DEVICE]))
                metrics.update(peaks)
                tags.update(source)
        share = (
            metrics.get(rec.PEAK_MEM_RESERVED_GB, 0.0) / metrics[rec.DEVICE_MEM_TOTAL_GB]
            if metrics.get(rec.DEVICE_MEM_TOTAL_GB)
            else None
        )
        status = "oom" if is_oom(exc, share) else "error"
        result = TrialResult(status, error=message, metrics=metrics, tags=tags)
    result.marks = marks
    result.marks["result_written"] = time.time()
    try:
        result.write_atomic(result_json)
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        kill_workers()  # the result is on disk (or cannot be: a full disk): see _LEFT_TO_EXIT
    return 1 if distributed is not None and result.status != "ok" else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m dinox.measure.trial TRIAL_JSON RESULT_JSON")
    # Dies with the sweep that started it (or, as a rank, with torchrun), even if that one is SIGKILLed.
    lifeline.die_with_parent(lifeline.env_parent())
    code = run_child(sys.argv[1], sys.argv[2])
    # The result is on disk and the output flushed: skip interpreter teardown (~0.8 s of unloading torch
    # here). The parent ends whatever is left of the process group (loader workers) right after.
    os._exit(code)

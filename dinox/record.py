"""The MLflow record: every tag, metric and param name dinox writes or reads, each defined once with its meaning.

This is the contract users' own queries rely on (``tags.`dinox.status` = 'ok'``, ``metrics.images_per_s``):
the child, the recorder, readback, decide and ``docs/record.md`` all take the names from here, and a test runs a
real sweep and decision and checks that every name in the store is in this table. Plain Python: the child
imports it, so no MLflow and no torch.

A trial's params are not listed one by one: they are the trial's spec flattened to dotted field paths
(``model.name``, ``batch.size``); ``docs/spec.md`` is their reference. MLflow's own names (``mlflow.*`` tags,
``system/*`` metrics) are MLflow's.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["tag", "metric", "param"]
Run = Literal["trial", "sweep", "decision", "verify", "head_to_head", "any"]


@dataclass(frozen=True)
class Name:
    name: str
    kind: Kind
    run: Run  # the run that carries it
    meaning: str


NAMES: dict[str, Name] = {}


def _name(kind: Kind, run: Run, name: str, meaning: str) -> str:
    if name in NAMES:
        raise ValueError(f"{name} defined twice in the record")
    NAMES[name] = Name(name, kind, run, meaning)
    return name


def _tag(run: Run, name: str, meaning: str) -> str:
    return _name("tag", run, name, meaning)


def _metric(run: Run, name: str, meaning: str) -> str:
    return _name("metric", run, name, meaning)


# --- tags on every run dinox makes -----------------------------------------------------------------------
ROLE = _tag(
    "any",
    "dinox.role",
    "what the run is: sweep (the parent), trial, probe (batch.size: auto), decision, verify or head_to_head",
)

# --- a trial's result ---------------------------------------------------------------------------------------
STATUS = _tag("trial", "dinox.status", "ok, oom, error, crashed, timeout or skipped; absent on a KILLED run")
ERROR = _tag("any", "dinox.error", "what went wrong, one line (a failed trial, or a sweep that died)")
TRIAL_ID = _tag("trial", "dinox.trial_id", "stable hash of the params that identify the configuration")
PARENT_RUN = _tag("trial", "mlflow.parentRunId", "MLflow's own: the sweep (parent run) that measured the trial")
TRIAL_INDEX = _tag("trial", "dinox.trial_index", "the trial's place in the sweep, from 0")
SWEEP_VALUES = _tag("trial", "dinox.sweep_values", "the values the sweep varies, as in the run's name")
SETS = _tag(
    "trial",
    "dinox.sets",
    "the `--set` overrides `dinox run` measured it with (KEY=VALUE; ...): the trial is the spec's with them",
)
RESULT_ID = _tag("trial", "dinox.result_id", "the result's identity, so `dinox sync` never logs it twice")
BOUND = _tag("trial", "dinox.bound", "compute_bound, io_bound, transfer_bound, host_bound or inconclusive")
BOUND_RULE = _tag(
    "trial", "dinox.bound_rule", "the measurement that decided the bound: ablation, device_events, host_timers"
)
BOUND_EVIDENCE = _tag(
    "trial", "dinox.bound_evidence", "the costs the label read, as printed (`loader 72-80%, copies ≤1%`)"
)
BOUND_NOTE = _tag("trial", "dinox.bound_note", "a loader-alone window the trial outran, so not evidence")
UNSTABLE = _tag(
    "trial", "dinox.unstable", "true when the timed windows did not settle within measure.unstable_threshold"
)
STEP_CLOCK = _tag("trial", "dinox.step_clock", "what timed the steps: cuda_events, mps_events or host")
WINDOW_CLOCKS = _tag(
    "trial",
    "dinox.window_clocks",
    "on a GPU NVML reads: each timed window's images/s and the SM clock (MHz) at its end, as JSON",
)
DRIFT_CHECK = _tag(
    "trial",
    "dinox.drift_check",
    "on a sweep's first ok trial: it measured again after the sweep's last trial (sweep.drift_check), as JSON: "
    "images_per_s, slow_ips, fast_ips, windows, seconds_after",
)
NOTE = _tag("trial", "dinox.note", "what the trial measured instead of what was asked (tf32 off CUDA)")
PREDICTED_OOM = _tag(
    "trial", "dinox.predicted_oom", "the plan predicted this trial would not fit (the figure it predicted)"
)
PEAK_SOURCE = _tag("trial", "dinox.peak_source", "where peak_tflops came from: the spec, or the peak table's entry")
BATCH_AUTO_PROBES = _tag(
    "trial", "dinox.batch_auto_probes", "the batch sizes batch.size: auto tried, and how each ended"
)

# --- where and how the trial ran --------------------------------------------------------------------------
DEVICE = _tag("trial", "dinox.device", "the torch device (cuda:0, mps, cpu)")
DEVICE_NAME = _tag("trial", "dinox.device_name", "the device's own name (NVIDIA H100 80GB HBM3, the CPU's model)")
HOST = _tag("any", "dinox.host", "the host the process ran on")
PID = _tag("sweep", "dinox.pid", "the sweep process, so a later run can tell whether it still lives")
PID_STARTED = _tag("sweep", "dinox.pid_started", "when that process started (a reused pid is not the sweep)")
SWEEP_DIR = _tag("sweep", "dinox.sweep_dir", "the sweep's local folder (journal, results.csv, child logs)")
SPEC_PATH = _tag("sweep", "dinox.spec_path", "the spec file the sweep ran")
SPEC_NAME = _tag("sweep", "dinox.spec_name", "the spec's name (the experiment)")
SHRUNK = _tag(
    "any",
    "dinox.shrunk",
    "true on a sweep, trial, decision or verify run of a spec run with --shrink (made small to try here): not the "
    "study's figures",
)
SHARD = _tag("sweep", "dinox.shard", "the --shard slice this sweep ran (i/n)")
COUNTS = _tag("sweep", "dinox.counts", "how the sweep's trials ended, status=count")
ISOLATION = _tag("trial", "dinox.isolation", "how the child was started: fork (the fork server), spawn or torchrun")
CORES = _tag("trial", "dinox.cores", "the cores the child was held to (--devices)")
SLOT = _tag("trial", "dinox.slot", "the --devices slot(s) the trial ran on")
CONCURRENT_TRIALS = _tag("trial", "dinox.concurrent_trials", "trials running side by side when it ran (--devices)")
TORCH_THREADS = _tag("trial", "dinox.torch_threads", "torch's intra-op threads in the child")
OMP_WAIT_POLICY = _tag(
    "trial",
    "dinox.omp_wait_policy",
    "OpenMP's waiting threads in the child (PASSIVE: they sleep) and who chose it; also on verify runs and rounds",
)
WORLD_SIZE = _tag("trial", "dinox.world_size", "ranks of a multi-GPU trial (hardware.gpus)")
RANK = _tag("trial", "dinox.rank", "the rank whose result this is (multi-GPU trials)")
DIST_BACKEND = _tag("trial", "dinox.dist_backend", "torch.distributed's backend (nccl, gloo)")
MEMORY_LIMIT = _tag("trial", "dinox.memory_limit", "how hardware.memory_limit_gb was applied")
MEM_SOURCE = _tag("trial", "dinox.mem_source", "where the peak memory figures came from")
OPTIMIZER_FUSED = _tag("trial", "dinox.optimizer_fused", "whether the optimizer ran fused kernels")
PIN_MEMORY_APPLIED = _tag("trial", "dinox.pin_memory_applied", "whether pinned memory was in effect (CUDA only)")
MATH_CLASS = _tag(
    "trial", "dinox.math_class", "the precision class the math ran in (fp32, tf32, bf16, fp16), read back: MFU's peak"
)
RUNTIME = _tag(
    "trial", "dinox.runtime", "the process-wide settings the trial ran with, read back (cudnn, matmul, gc, ...)"
)
PROFILE = _tag(
    "trial",
    "dinox.profile",
    "measure.profile's summary, JSON: the top ops by self host/device time (name, calls, ms and share per step), "
    "the profiled steps' images/s and on CUDA the idle split; the trace is the artifact profile/trace.json.gz",
)
PROFILE_DIR = "profile"  # the artifact folder of a profiled trial's trace
DEVICE_PREFETCH = _tag("trial", "dinox.device_prefetch", "side_stream or in_series: how the next batch was copied")
DATA_REPEATS = _tag("trial", "dinox.data_repeats", "a small set seen N times over in one epoch of the window")
SHARD_LAYOUT = _tag("trial", "dinox.shard_layout", "webdataset shards: png16, raw16 or images")
PYTHON_VERSION = _tag("trial", "dinox.python_version", "the child's Python")
TORCH_VERSION = _tag("trial", "dinox.torch_version", "the child's torch")
CUDA_VERSION = _tag("trial", "dinox.cuda_version", "torch's CUDA (empty without)")
HIP_VERSION = _tag("trial", "dinox.hip_version", "torch's HIP (empty without)")
TIMM_VERSION = _tag("trial", "dinox.timm_version", "the child's timm")
DINOX_VERSION = _tag("trial", "dinox.dinox_version", "the dinox that measured the trial")

# --- a decision run ------------------------------------------------------------------------------------------
VERIFIES = _tag("verify", "dinox.verifies", "the trial run a dinox verify run trained for real")
VERIFY_EPOCHS = _tag(
    "verify", "dinox.verify_epochs", "each epoch of the slice as JSON: images, wall_s, partial (sm_clock_mhz on a GPU)"
)
VERIFY_CHECK_WINDOWS = _tag(
    "verify",
    "dinox.verify_check_windows",
    "each check window's images/s as JSON: before and after the slice (sm_clock_mhz: each one's GPU clock)",
)
VERIFY_MOVED = _tag(
    "verify",
    "dinox.verify_moved",
    "true: the box moved: check windows after the slice >5 % outside the trial's, or the forecast's error at "
    "their rate and the trial's, or at the slice's slowest and fastest quarters' pace, on either side of ±5 %",
)
VERIFY_VERDICT = _tag(
    "verify", "dinox.verify_verdict", "HELD, OFF or UNDECIDED (the box moved: a match as open as a miss): exit 0, 1, 3"
)
REMEASURES = _tag("head_to_head", "dinox.remeasures", "the trial run a head-to-head round measured again")
HEAD_TO_HEAD = _tag(
    "head_to_head", "dinox.head_to_head", "the head-to-head a round belongs to (when it started, and where)"
)
ROUND = _metric(
    "head_to_head", "round", "the round's place in its head-to-head, from 1 (a round measures each trial once)"
)
VERDICT = _tag("decision", "dinox.verdict", "GO, NO-GO or UNSETTLED (the measured range straddles the budget)")
SETTLED = _tag(
    "decision", "dinox.settled", "true when the evidence decided (GO or NO-GO), false for UNSETTLED or shrunk trials"
)

# --- a trial's metrics: throughput and step times -----------------------------------------------------------
IMAGES_PER_S = _metric("trial", "images_per_s", "images per second over the timed windows, pooled (all ranks)")
STEP_S_P50 = _metric("trial", "step_s_p50", "median optimizer-step time, seconds")
STEP_S_P90 = _metric("trial", "step_s_p90", "90th-percentile step time: what decide plans with")
STEP_S = _metric("trial", "step_s", "the per-step history (one value per timed step)")
IMAGES_PER_S_MIN = _metric("trial", "images_per_s_min", "the slowest timed window")
IMAGES_PER_S_MAX = _metric("trial", "images_per_s_max", "the fastest timed window")
WINDOW_SPREAD = _metric("trial", "window_spread", "(fastest - slowest) / median of the windows' rates")
WINDOWS = _metric("trial", "windows", "timed windows measured")
WINDOW_S = _metric("trial", "window_s", "seconds of timed windows")
DATA_S = _metric("trial", "data_s", "mean seconds per step waiting for the loader")
H2D_S = _metric("trial", "h2d_s", "mean seconds per step copying to the device")
COMPUTE_S = _metric("trial", "compute_s", "mean seconds per step of forward, backward and optimizer")
DEVICE_BUSY_S = _metric("trial", "device_busy_s", "CUDA: mean seconds per step the device worked")
DEVICE_IDLE_S = _metric("trial", "device_idle_s", "CUDA: mean seconds per step the device waited")
DEVICE_IDLE_SHARE = _metric("trial", "device_idle_share", "CUDA: idle / (busy + idle)")
IDLE_LOADER_SHARE = _metric("trial", "idle_loader_share", "CUDA: the share of idle time spent waiting for the loader")
DEVICE_LAG_S = _metric("trial", "device_lag_s", "CUDA: how far the device trailed the host")
# --- the ablation windows and what they say -------------------------------------------------------------------
IMAGES_PER_S_COMPUTE_ONLY = _metric(
    "trial",
    "images_per_s_compute_only",
    "one batch on the device, reused: no loader, no copies (absent without a round, or where the copies alone decided)",
)
IMAGES_PER_S_NO_LOADER = _metric(
    "trial", "images_per_s_no_loader", "batches in host memory, copied each step: no loader (absent without a round)"
)
IMAGES_PER_S_COMPUTE_HALF = _metric("trial", "images_per_s_compute_half", "CUDA: compute-only at half the batch")
FIXED_SHARE = _metric("trial", "fixed_share", "CUDA: the share of a step that does not shrink with the batch")
HOST_AHEAD_STEPS = _metric(
    "trial", "host_ahead_steps", "CUDA: the device's queued work at a step's end in the compute-only windows, in steps"
)
LOADER_COST = _metric("trial", "loader_cost", "1 - images_per_s / images_per_s_no_loader")
LOADER_COST_LOW = _metric("trial", "loader_cost_low", "the low end of the interval the label read")
LOADER_COST_HIGH = _metric("trial", "loader_cost_high", "the high end of that interval")
TRANSFER_COST = _metric("trial", "transfer_cost", "1 - images_per_s_no_loader / images_per_s_compute_only")
TRANSFER_COST_LOW = _metric("trial", "transfer_cost_low", "the low end of the interval the label read")
TRANSFER_COST_HIGH = _metric("trial", "transfer_cost_high", "the high end of that interval")
LOADER_IMAGES_PER_S = _metric("trial", "loader_images_per_s", "the loader alone, no step")
COPY_IMAGES_PER_S = _metric("trial", "copy_images_per_s", "the copies to the device alone")
ABLATION_S = _metric("trial", "ablation_s", "seconds spent in ablation windows")
ABLATION_ROUNDS = _metric(
    "trial",
    "ablation_rounds",
    "timed windows followed by an ablation round (they stop once the label is decided; 0: the timed steps decided it)",
)
# --- memory ---------------------------------------------------------------------------------------------------
PEAK_MEM_ALLOCATED_GB = _metric("trial", "peak_mem_allocated_gb", "peak device memory allocated, GiB")
PEAK_MEM_RESERVED_GB = _metric("trial", "peak_mem_reserved_gb", "peak device memory reserved by the allocator, GiB")
DEVICE_MEM_TOTAL_GB = _metric("trial", "device_mem_total_gb", "the device's memory, or the cap (memory_limit_gb)")
DEVICE_MEM_OUTSIDE_GB = _metric("trial", "device_mem_outside_gb", "CUDA: this process's memory outside the allocator")
HOST_PEAK_RSS_GB = _metric("trial", "host_peak_rss_gb", "peak host memory of the child's whole process tree (PSS)")
CHILD_PEAK_RSS_GB = _metric("trial", "child_peak_rss_gb", "the child's own peak RSS, as it measured it")
PREDICTED_DEVICE_MEM_GB = _metric("trial", "predicted_device_mem_gb", "what the plan predicted for device memory")
PREDICTED_ACTIVATIONS_GB = _metric("trial", "predicted_activations_gb", "the saved activations in that prediction")
PREDICTED_LOADER_HOST_GB = _metric("trial", "predicted_loader_host_gb", "what the plan predicted for the loader's RAM")
# --- model and work -------------------------------------------------------------------------------------------
PARAMS_M = _metric("trial", "params_m", "the model's parameters, millions")
TRAINABLE_PARAMS_M = _metric("trial", "trainable_params_m", "the parameters the optimizer updates, millions")
LOSS = _metric("trial", "loss", "the last step's loss (a finite number: the step computed something)")
FLOPS_PER_IMAGE = _metric("trial", "flops_per_image", "training FLOPs per image (forward + backward)")
TFLOPS = _metric("trial", "tflops", "achieved TFLOPs (flops_per_image x images_per_s), all ranks")
MFU = _metric("trial", "mfu", "tflops / peak_tflops per device (the ranks' average)")
PEAK_TFLOPS = _metric("trial", "peak_tflops", "the device's dense peak at the trial's precision")
BATCH_AUTO_PROBES_M = _metric("trial", "batch_auto_probes", "how many sizes batch.size: auto tried")
BATCH_AUTO_FIT = _metric("trial", "batch_auto_fit", "the largest batch that fit")
# --- the trial's timeline -------------------------------------------------------------------------------------
WARMUP_S = _metric("trial", "warmup_s", "seconds of warm-up steps")
FIRST_STEP_S = _metric("trial", "first_step_s", "the first step, with cuDNN autotuning, lazy loading, compile")
FIRST_FETCH_S = _metric("trial", "first_fetch_s", "the first batch (worker start-up)")
COMPILE_S = _metric("trial", "compile_s", "torch.compile's share of the first step")
COMPILE_GRAPHS = _metric("trial", "compile_graphs", "graphs torch.compile built by the end of warm-up (static shapes)")
RECOMPILES_IN_WINDOWS = _metric(
    "trial", "recompiles_in_windows", "graphs compiled after warm-up, inside the timed windows and their rounds: 0"
)
SETTLE_S = _metric(
    "trial", "settle_s", "steadying the loader before a timed window the warm-up's last step did not steady"
)
LOADER_START_S = _metric("trial", "loader_start_s", "starting the loader's workers")
EPOCH_START_S = _metric("trial", "epoch_start_s", "an epoch boundary apart: idle workers restarted, a first batch")
EPOCH_RESTART_STEP_S = _metric(
    "trial", "epoch_restart_step_s", "with workers: the step that trains on epoch_start_s's batch (the fork's cost)"
)
EPOCH_BOUNDARY_S = _metric(
    "trial",
    "epoch_boundary_s",
    "what a boundary adds: with workers, epoch_start_s and epoch_restart_step_s less a typical step; without, "
    "epoch_start_s less a steady fetch's wait",
)
CHECKPOINT_S = _metric(
    "trial", "checkpoint_s", "one checkpoint save, written and fsynced (routine.checkpoint_every_steps)"
)
CHECKPOINT_GB = _metric("trial", "checkpoint_gb", "the checkpoint's size on disk, GiB")
EVAL_START_S = _metric("trial", "eval_start_s", "an evaluation pass's start: a new iterator's first batch")
EVAL_IMAGES_PER_S = _metric(
    "trial", "eval_images_per_s", "an evaluation window: forward only, no gradients (routine.eval_every_epochs)"
)
EPOCH_BOUNDARIES = _metric("trial", "epoch_boundaries", "epoch boundaries the timed windows crossed")
DATA_SAMPLES = _metric("trial", "data_samples", "a repeated set's own length")
STARTUP_S = _metric("trial", "startup_s", "process start and imports")
SETUP_S = _metric("trial", "setup_s", "data, model and optimizer built")
DATA_SETUP_S = _metric("trial", "data_setup_s", "the dataset and loader built (workers start later, lazily)")
BUILD_S = _metric("trial", "build_s", "the model, objective and optimizer built")
MEASURE_S = _metric("trial", "measure_s", "warm-up, timed and ablation windows")
TEARDOWN_S = _metric("trial", "teardown_s", "from the result written until the child process was gone")
TRIAL_WALL_S = _metric("trial", "trial_wall_s", "the trial's wall time, start to result")

# --- a sweep's parent run -------------------------------------------------------------------------------------
SPEC_NAME_PARAM = _name("param", "sweep", "spec.name", "the spec's name")
SWEEP_TRIALS = _name("param", "sweep", "sweep.trials", "how many trials the sweep expands to")
BEST_IMAGES_PER_S = _metric(
    "sweep", "best_images_per_s", "the best images_per_s among the ok trials (after a head-to-head: its planned figure)"
)
BEST_PEAK_MEM_GB = _metric("sweep", "best_peak_mem_gb", "the best trial's peak device memory reserved, GiB")
BEST_STEP_S_P50 = _metric("sweep", "best_step_s_p50", "the best trial's median optimizer step, seconds")
UNSETTLED_TRIALS = _metric("sweep", "unsettled_trials", "ok trials whose timed windows disagreed (unstable)")
TRIALS_PREFIX = "trials_"  # trials_<status>: how many trials ended with each status
for _status in ("ok", "oom", "error", "crashed", "timeout", "skipped", "killed"):
    _metric("sweep", TRIALS_PREFIX + _status, f"trials that ended {_status}")

# --- a decision run -------------------------------------------------------------------------------------------
VERIFY_WALL_S = _metric("verify", "verify_wall_s", "the slice's wall time after warm-up, every epoch boundary in it")
VERIFY_WARMUP_S = _metric("verify", "verify_warmup_s", "the warm-up steps before the slice (not forecast)")
VERIFY_STEPS = _metric("verify", "verify_steps", "optimizer steps in the slice")
VERIFY_IMAGES = _metric("verify", "verify_images", "images through the optimizer in the slice")
VERIFY_IMAGES_PER_S = _metric("verify", "verify_images_per_s", "images / wall time over the slice")
VERIFY_CHECK_IMAGES_PER_S = _metric(
    "verify", "verify_check_images_per_s", "check windows timed as the trial's, after the warm-up, before the slice"
)
VERIFY_CHECK_AFTER_IMAGES_PER_S = _metric(
    "verify", "verify_check_after_images_per_s", "the same windows right after the slice, the process as old as it"
)
VERIFY_EPOCHS_ENDED = _metric("verify", "verify_epochs_ended", "epoch boundaries the slice crossed")
VERIFY_EPOCH_BOUNDARY_S = _metric(
    "verify", "verify_epoch_boundary_s", "an epoch's first step over a typical step (host time): a restart's cost"
)
VERIFY_CHECKPOINTS = _metric("verify", "verify_checkpoints", "checkpoints the slice saved (routine)")
VERIFY_CHECKPOINT_S = _metric("verify", "verify_checkpoint_s", "seconds the slice spent saving them, in its wall time")
VERIFY_EVALS = _metric("verify", "verify_evals", "evaluation passes the slice ran (routine)")
VERIFY_EVAL_S = _metric("verify", "verify_eval_s", "seconds the slice spent in them, in its wall time")
VERIFY_STEADY_S = _metric(
    "verify", "verify_steady_s", "the slice's steps at their own pace: its wall less routine and epoch starts' excess"
)
VERIFY_QUARTER_SLOW_IMAGES_PER_S = _metric(
    "verify", "verify_quarter_slow_images_per_s", "the slice's slowest quarter of its time, at its steps' own pace"
)
VERIFY_QUARTER_FAST_IMAGES_PER_S = _metric(
    "verify", "verify_quarter_fast_images_per_s", "the slice's fastest quarter of its time, at its steps' own pace"
)
FORECAST_S = _metric(
    "verify", "forecast_s", "decide's forecast for the same slice: images / forecast rate + boundaries + routine"
)
FORECAST_SLOW_S = _metric("verify", "forecast_slow_s", "the same at the slowest timed window's rate")
FORECAST_FAST_S = _metric("verify", "forecast_fast_s", "the same at the fastest timed window's rate")
FORECAST_ERROR = _metric("verify", "forecast_error", "(forecast_s - verify_wall_s) / verify_wall_s: + pessimistic")
OWN_WINDOWS_ERROR = _metric(
    "verify",
    "own_windows_error",
    "the same against the windows the check windows are held against: the trial's sweep windows, else the "
    "forecast's own (its head-to-head rounds, or a measurement under another OpenMP policy)",
)
CHECK_WINDOWS_ERROR = _metric(
    "verify", "check_windows_error", "the same at the check windows' rate: the forecast's method, the box's move aside"
)
CHECK_AFTER_ERROR = _metric(
    "verify", "check_after_error", "the same at the rate of the check windows after the slice: what verify_moved reads"
)
NEEDED_IMAGES_PER_S = _metric("decision", "needed_images_per_s", "the rate the schedule needs to fit the days")
MODELS = _metric("decision", "models", "models compared")
RECOMMENDED_DAYS = _metric("decision", "recommended_days", "days the recommended configuration needs")
RECOMMENDED_IMAGES_PER_S = _metric(
    "decision", "recommended_images_per_s", "its forecast rate (images over all its timed windows' wall time)"
)
SOURCES = _name("param", "decision", "sources", "the sweeps the decision read")
BUDGET_PREFIX = "budget."  # budget.<field>: the budget the decision was made against
POLICY_PREFIX = "policy."  # policy.<field>: how it chose (safety margin, the rates it trusts)

# Names the test of the record reads against, for names with a free part.
VERIFY_PREFIX = "verify."  # verify.<setting>: the slice a dinox verify trained and the forecast it held
FAMILIES = {TRIALS_PREFIX: "metric", BUDGET_PREFIX: "param", POLICY_PREFIX: "param", VERIFY_PREFIX: "param"}
_WORD = re.compile(r"^[a-z0-9_.]+$")


def known(name: str, kind: Kind) -> bool:
    """Is ``name`` a name of the record (or of one of its families)?"""
    entry = NAMES.get(name)
    if entry is not None:
        return entry.kind == kind
    if kind == "metric" and (m := re.fullmatch(r"rank\d+_(\w+)", name)) and m.group(1) in PER_RANK:
        return True  # a multi-rank trial's per-rank figure (PER_RANK)
    return any(name.startswith(p) and k == kind and _WORD.match(name) for p, k in FAMILIES.items())


# How a trial's metric combines over its ranks (hardware.gpus > 1; isolate.ranks.merge reads this): "pace" is
# images through every rank over the slowest rank's window; "sum" a rate each rank measures of its own part;
# "max" the largest rank's (memory, step times, spread, graphs); "mean" the ranks' average (a utilisation: each
# rank's share of its own device's peak); "slowest" the value of the rank whose window was longest (it sets the
# trial's pace). Every trial metric is listed: one added without a rule fails here.
RankRule = Literal["pace", "sum", "max", "mean", "slowest"]
_SUMS = (IMAGES_PER_S_MIN, IMAGES_PER_S_MAX, IMAGES_PER_S_COMPUTE_ONLY, IMAGES_PER_S_NO_LOADER)
_SUMS += (IMAGES_PER_S_COMPUTE_HALF, LOADER_IMAGES_PER_S, COPY_IMAGES_PER_S, EVAL_IMAGES_PER_S, TFLOPS)
_MEANS = (MFU,)
_MAXES = (STEP_S_P50, STEP_S_P90, WINDOW_SPREAD, PEAK_MEM_ALLOCATED_GB, PEAK_MEM_RESERVED_GB, CHILD_PEAK_RSS_GB)
_MAXES += (DEVICE_MEM_OUTSIDE_GB, COMPILE_GRAPHS, RECOMPILES_IN_WINDOWS)
_SLOWEST = (STEP_S, WINDOWS, WINDOW_S, DATA_S, H2D_S, COMPUTE_S, DEVICE_BUSY_S, DEVICE_IDLE_S, DEVICE_IDLE_SHARE)
_SLOWEST += (IDLE_LOADER_SHARE, DEVICE_LAG_S, FIXED_SHARE, HOST_AHEAD_STEPS, LOADER_COST, LOADER_COST_LOW)
_SLOWEST += (LOADER_COST_HIGH, TRANSFER_COST, TRANSFER_COST_LOW, TRANSFER_COST_HIGH, ABLATION_S, ABLATION_ROUNDS)
_SLOWEST += (DEVICE_MEM_TOTAL_GB, HOST_PEAK_RSS_GB, PREDICTED_DEVICE_MEM_GB, PREDICTED_ACTIVATIONS_GB)
_SLOWEST += (PREDICTED_LOADER_HOST_GB, PARAMS_M, TRAINABLE_PARAMS_M, LOSS, FLOPS_PER_IMAGE)
_SLOWEST += (PEAK_TFLOPS, BATCH_AUTO_PROBES_M, BATCH_AUTO_FIT, WARMUP_S, FIRST_STEP_S, FIRST_FETCH_S, COMPILE_S)
_SLOWEST += (SETTLE_S, LOADER_START_S, EPOCH_START_S, EPOCH_RESTART_STEP_S, EPOCH_BOUNDARY_S, CHECKPOINT_S)
_SLOWEST += (CHECKPOINT_GB, EVAL_START_S)
_SLOWEST += (EPOCH_BOUNDARIES, DATA_SAMPLES, STARTUP_S, SETUP_S, DATA_SETUP_S, BUILD_S, MEASURE_S, TEARDOWN_S)
_SLOWEST += (TRIAL_WALL_S,)
RANKS: dict[str, RankRule] = {
    IMAGES_PER_S: "pace",
    **dict.fromkeys(_SUMS, "sum"),
    **dict.fromkeys(_MAXES, "max"),
    **dict.fromkeys(_MEANS, "mean"),
    **dict.fromkeys(_SLOWEST, "slowest"),
}
_undeclared = [n.name for n in NAMES.values() if n.kind == "metric" and n.run == "trial" and n.name not in RANKS]
if _undeclared or len(RANKS) != len(_SUMS) + len(_MAXES) + len(_MEANS) + len(_SLOWEST) + 1:
    raise ValueError(f"trial metrics without one rank rule (RANKS): {_undeclared or 'one listed twice'}")
# A verification's ranks (dinox verify of a hardware.gpus > 1 trial) trained the same steps in lock step: the
# slowest rank (the longest verify_wall_s) sets the slice, its counts are global already (each rank counts every
# rank's images); the check windows' rates are each rank's own part, summed; memory the largest rank's.
_VERIFY_SUMS = (VERIFY_CHECK_IMAGES_PER_S, VERIFY_CHECK_AFTER_IMAGES_PER_S)
_VERIFY_MAXES = (VERIFY_CHECKPOINT_S, VERIFY_EVAL_S, PEAK_MEM_ALLOCATED_GB, PEAK_MEM_RESERVED_GB)
_VERIFY_SLOWEST = (VERIFY_WALL_S, VERIFY_WARMUP_S, VERIFY_STEPS, VERIFY_IMAGES, VERIFY_IMAGES_PER_S)
_VERIFY_SLOWEST += (VERIFY_EPOCHS_ENDED, VERIFY_EPOCH_BOUNDARY_S, VERIFY_CHECKPOINTS, VERIFY_EVALS, DEVICE_MEM_TOTAL_GB)
_VERIFY_SLOWEST += (VERIFY_STEADY_S, VERIFY_QUARTER_SLOW_IMAGES_PER_S, VERIFY_QUARTER_FAST_IMAGES_PER_S)
VERIFY_RANKS: dict[str, RankRule] = {
    **dict.fromkeys(_VERIFY_SUMS, "sum"),
    **dict.fromkeys(_VERIFY_MAXES, "max"),
    **dict.fromkeys(_VERIFY_SLOWEST, "slowest"),
}
if len(VERIFY_RANKS) != len(_VERIFY_SUMS) + len(_VERIFY_MAXES) + len(_VERIFY_SLOWEST):
    raise ValueError("a verify metric listed under two rank rules (VERIFY_RANKS)")
# Figures also kept per rank beside the global one, as rank{r}_<name>.
PER_RANK = (IMAGES_PER_S, STEP_S_P50, PEAK_MEM_ALLOCATED_GB, CHILD_PEAK_RSS_GB, DATA_S)


def per_rank(rank: int, name: str) -> str:
    """The rank{r}_<name> metric of a multi-rank trial (for the PER_RANK names)."""
    return f"rank{rank}_{name}"


def markdown() -> str:
    """The record's tables for docs/record.md (a test keeps that file equal to this)."""
    out = []
    for kind, title in (("tag", "Tags"), ("metric", "Metrics"), ("param", "Params")):
        out += [f"### {title}", "", "| name | run | meaning |", "|---|---|---|"]
        out += [f"| `{n.name}` | {n.run} | {n.meaning} |" for n in NAMES.values() if n.kind == kind]
        out.append("")
    return "\n".join(out)


# What MLflow accepts as a param (mlflow.utils.validation, which dinox validate does not import: MLflow's
# package costs 2.5 s there): alphanumerics, _ - . space : /, at most 250 characters, a name that stays itself
# as a path; a value of at most 6000 characters. tests/spec/test_spec.py holds the two to the same answers.
_PARAM_NAME = re.compile(r"^[/\w.\- :]*$")
MAX_PARAM_NAME = 250
MAX_PARAM_VALUE = 6000


def param_problem(name: str, value: str) -> str:
    """Why MLflow would refuse this param ("" when it takes it): a refused param fails every write of its
    trial's run, which must never look like a store outage."""
    if len(name) > MAX_PARAM_NAME:
        return f"a name of {len(name)} characters; MLflow takes at most {MAX_PARAM_NAME} in a param's name"
    if not _PARAM_NAME.match(name):
        return "MLflow's param names hold only letters, digits, _ - . : / and spaces"
    norm = posixpath.normpath(name)
    if norm != name or norm == "." or norm.startswith(("..", "/")):
        return f"MLflow refuses a param name that reads as another path ({norm!r})"
    if len(value) > MAX_PARAM_VALUE:
        return f"a value of {len(value)} characters; MLflow takes at most {MAX_PARAM_VALUE} in a param"
    return ""


if __name__ == "__main__":  # python -m dinox.record: the tables docs/record.md holds
    print(markdown())

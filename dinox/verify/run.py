"""`dinox verify` top to bottom: the trial from the store, its spec from the spec file, the slice, the child that
trains it, the forecast for the same slice, the error, the run recorded."""

from __future__ import annotations

import json
import math
import os
import shlex
import time
from pathlib import Path

from dinox import record as rec
from dinox.contract import SLICE_FILE, TrialResult
from dinox.isolate import contention
from dinox.isolate.runner import run_trial
from dinox.isolate.slots import CORES_VAR, affinity, format_cores
from dinox.plan.grid import Trial
from dinox.spec.data_sources import SyntheticData
from dinox.spec.params import SHRUNK
from dinox.store.readback import log_beside
from dinox.store.trial_record import TrialRecord, store_text
from dinox.verify.outcome import Forecast, Reference, VerifyError, VerifyOutcome, check_clocks, slice_forecast
from dinox.verify.step import NO_BATCH, as_measured, held_cores, held_policy, held_threads

SETUP_S = 600.0  # the child's allowance beyond the slice: start-up, data, model, warm-up, compile


def find_trial(record: TrialRecord, trials: list[Trial], spec_path: str, shrink: bool = False) -> Trial:
    """The trial of SPEC (shrunk where `shrink`) the record measured, as it measured it (as_measured);
    VerifyError naming why there is none."""
    trial_id = record.tags.get(rec.TRIAL_ID, "")
    for t in trials:
        if t.trial_id == trial_id:
            if (measured := as_measured(t, record)) is None:
                raise VerifyError(f"{store_text(record.run_name or record.run_id)}: {NO_BATCH}")
            return measured
    given = record.tags.get(rec.SETS, "")
    asked = "; ".join(trials[0].sets) if trials else ""
    shrunk = bool(record.param_bool(SHRUNK))
    if shrunk and not shrink:  # a small stand-in: nothing of it trains as the spec would
        why = (
            "it was measured with `dinox run --shrink`, a small stand-in: take a trial of the spec as written, or "
            "give --shrink to train the stand-in"
        )
    elif shrink and not shrunk:
        why = "it was measured from the spec as written: drop --shrink"
    elif given != asked:  # the same spec with other --sets names other trials
        how = " ".join(f"--set {shlex.quote(s.strip())}" for s in given.split(";") if s.strip())
        why = f"it was measured with {store_text(how)}: give the same here" if how else "it was measured without --set"
    else:
        why = "the spec changed since the trial was measured, or it is another spec"
    raise VerifyError(
        f"{store_text(spec_path)} has no trial with id {trial_id or '(none recorded)'} (run {record.run_id}, "
        f"{record.run_name or 'unnamed'}): {why}"
    )


def epoch_images_for(trial: Trial, asked: int | None, seconds: float, forecast: Forecast) -> tuple[int, str]:
    """A synthetic set's epoch (0: the data's own length), and a line saying where it came from. A synthetic set
    has no epoch of its own: the schedule's (budget.dataset_size) where the slice crosses it, else one that
    makes the slice cross two boundaries, so their cost is measured."""
    data, size = trial.spec.data, trial.spec.size * trial.spec.accumulation * trial.spec.hardware.gpus  # every rank's
    if not isinstance(data, SyntheticData) or data.num_samples is not None:
        if asked:
            raise VerifyError("--epoch-images applies to synthetic data without data.num_samples only")
        return 0, ""
    if asked:
        if asked < size:
            raise VerifyError(
                f"--epoch-images {asked}: fewer than one step's {size} images (batch x accumulation x gpus)"
            )
        return asked, f"synthetic data: an epoch of {asked:,} images (--epoch-images)"
    planned = forecast.ips * seconds
    budget = trial.spec.budget
    schedule = budget.dataset_size if budget is not None else None
    if not seconds:  # --epochs: the schedule's epoch, or the user's
        if not schedule:
            raise VerifyError("--epochs of synthetic data needs --epoch-images (or data.num_samples, or a budget)")
        return schedule, f"synthetic data: an epoch of {schedule:,} images (budget.dataset_size)"
    if schedule and schedule * 1.2 <= planned:
        return schedule, f"synthetic data: an epoch of {schedule:,} images (budget.dataset_size)"
    epoch = max(4 * size, int(planned / 2.5) // size * size)
    return epoch, (
        f"synthetic data: an epoch of {epoch:,} images, so the slice crosses about two boundaries "
        f"(--epoch-images sets it{f'; the schedule epoch, {schedule:,}, is longer than the slice' if schedule else ''})"
    )


def verify(
    uri: str,
    record: TrialRecord,
    trial: Trial,
    forecast: Forecast,
    seconds: float,
    epochs: float | None,
    epoch_images: int,
    workdir: Path,
) -> VerifyOutcome:
    """Train the trial for the slice in its own child, hold the forecast against it, record the run."""
    own, against = reference(record, forecast)
    cores, _said = held_cores(record, forecast, affinity())
    env = held_threads(record, forecast, os.environ)[0]
    if cores:  # the child pins itself, as a trial under --devices
        env[CORES_VAR] = format_cores(cores)
    slice_ = {"seconds": seconds, "epochs": epochs, "epoch_images": epoch_images}
    slice_["device_name"] = record.tags.get(rec.DEVICE_NAME, "")  # the child trains on no other
    result = _train(trial, slice_, workdir, *held_policy(record, forecast), env)
    m = result.metrics
    images, ended = m[rec.VERIFY_IMAGES], int(m[rec.VERIFY_EPOCHS_ENDED])
    routine_done = (m.get(rec.VERIFY_CHECKPOINTS, 0.0), m.get(rec.VERIFY_EVALS, 0.0))
    forecast_s, slow_s, fast_s = slice_forecast(forecast, images, ended, *routine_done)
    done = VerifyOutcome(
        record.run_id, "", m[rec.VERIFY_WALL_S], images, ended, epoch_images, forecast_s, slow_s, fast_s,
        m[rec.VERIFY_IMAGES_PER_S], forecast, check_ips=m.get(rec.VERIFY_CHECK_IMAGES_PER_S), own=own,
        after_ips=m.get(rec.VERIFY_CHECK_AFTER_IMAGES_PER_S), steady_s=m.get(rec.VERIFY_STEADY_S),
        quarters=(m.get(rec.VERIFY_QUARTER_SLOW_IMAGES_PER_S), m.get(rec.VERIFY_QUARTER_FAST_IMAGES_PER_S)),
        clocks=check_clocks(result.tags.get(rec.VERIFY_CHECK_WINDOWS, "")), reference=against,
    )  # fmt: skip
    metrics = {k: v for k, v in m.items() if k in _KEPT}
    metrics.update({rec.FORECAST_S: forecast_s, rec.FORECAST_SLOW_S: slow_s, rec.FORECAST_FAST_S: fast_s})
    metrics[rec.FORECAST_ERROR] = done.error
    done.own_error = metrics[rec.OWN_WINDOWS_ERROR] = done.error_at(own, routine_done)
    done.check_error = done.error_at_rate(done.check_rate, routine_done)
    done.after_error = done.error_at_rate(done.after_ips, routine_done)
    for name, value in ((rec.CHECK_WINDOWS_ERROR, done.check_error), (rec.CHECK_AFTER_ERROR, done.after_error)):
        if value is not None:
            metrics[name] = value
    tags = {rec.VERIFIES: record.run_id, rec.TRIAL_ID: trial.trial_id, rec.VERIFY_MOVED: str(done.moved).lower()}
    tags[rec.VERIFY_VERDICT] = done.word
    if trial.spec.shrunk:
        tags[rec.SHRUNK] = "true"
    tags.update({k: result.tags.get(k, "") for k in (rec.VERIFY_EPOCHS, rec.VERIFY_CHECK_WINDOWS)})
    kept = (rec.DEVICE_NAME, rec.DEVICE, rec.TORCH_VERSION, rec.OMP_WAIT_POLICY, rec.CORES, rec.TORCH_THREADS)
    kept += (rec.WORLD_SIZE,)  # a hardware.gpus > 1 trial trained by as many ranks
    tags.update({k: v for k, v in result.tags.items() if k in kept})
    settings = {
        "seconds": f"{seconds:g}",
        "epochs": str(epochs),
        "epoch_images": str(epoch_images),
        "forecast_source": forecast.source[:250],
        "forecast_images_per_s": f"{forecast.ips:.6g}",
    }
    params = {f"{rec.VERIFY_PREFIX}{k}": v for k, v in settings.items()}
    done.run_id = log_beside(
        uri, record.experiment_id, "verify", f"verify {record.run_name or record.run_id}"[:250], params, metrics, tags,
        f"**{'SHRUNK stand-in: ' if trial.spec.shrunk else ''}{done.word}: {done.verdict()}**",
    )  # fmt: skip
    return done


def reference(record: TrialRecord, forecast: Forecast) -> tuple[Forecast, Reference]:
    """The windows the check windows are held against, and whose they are: the trial's sweep windows, unless
    the forecast pools a head-to-head's rounds (the trial measured again, later: the forecast and its range are
    theirs) or was measured under another OpenMP policy (the sweep's windows timed another step than the
    slice trains); then the forecast's own range."""
    if forecast.rounds:
        return forecast, "rounds"
    if held_policy(record, forecast)[1]:
        return forecast, "forecast"
    return Forecast.of_record(record), "trial"


def _train(
    trial: Trial, slice_: dict[str, object], workdir: Path, omp_policy: str, forecasts: bool, env: dict[str, str]
) -> TrialResult:
    """The child that trains the trial for the slice (its folder under WORKDIR/verify), with the OpenMP policy
    `omp_policy` (dinox.omp_wait_policy's text: the forecast's measurement's where `forecasts`, else the
    trial's; see held_policy) and `env` (its cores and threads: held_cores, held_threads); its result, or
    VerifyError where it could not start, found another device than the trial's, or did not end ok."""
    folder = workdir / "verify" / f"{trial.trial_id}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        folder.mkdir(parents=True, exist_ok=False)
        (folder / SLICE_FILE).write_text(json.dumps(slice_))
    except OSError as e:
        raise VerifyError(f"cannot write {folder}: {e.strerror or e}") from None
    seconds = float(slice_["seconds"])  # type: ignore[arg-type]
    timeout = (seconds if math.isfinite(seconds) else 30 * 86400.0) + SETUP_S + trial.spec.measure.timeout_s
    # The step the forecast measured, its threads waiting as they did there; the child's record says whose.
    contention.hold(omp_policy, "its forecast was measured" if forecasts else "its trial ran")
    outcome = run_trial(trial, folder, module="dinox.measure.verify", timeout_s=timeout, on_phase=None, env=env)
    r = outcome.result
    if r.status == "skipped":  # untrained: this machine's device is not the trial's (the child names both)
        raise VerifyError(store_text(r.error or "another device than the trial's"))
    if r.status != "ok":
        raise VerifyError(f"the training ended {r.status}: {r.error} (its log: {outcome.log_path})")
    return outcome.result


# What the child measured that the verify run keeps: the slice, and the memory it took.
_KEPT = (
    rec.VERIFY_WALL_S,
    rec.VERIFY_WARMUP_S,
    rec.VERIFY_STEPS,
    rec.VERIFY_IMAGES,
    rec.VERIFY_IMAGES_PER_S,
    rec.VERIFY_CHECK_IMAGES_PER_S,
    rec.VERIFY_CHECK_AFTER_IMAGES_PER_S,
    rec.VERIFY_EPOCHS_ENDED,
    rec.VERIFY_EPOCH_BOUNDARY_S,
    rec.VERIFY_CHECKPOINTS,
    rec.VERIFY_CHECKPOINT_S,
    rec.VERIFY_EVALS,
    rec.VERIFY_EVAL_S,
    rec.VERIFY_STEADY_S,
    rec.VERIFY_QUARTER_SLOW_IMAGES_PER_S,
    rec.VERIFY_QUARTER_FAST_IMAGES_PER_S,
    rec.PEAK_MEM_RESERVED_GB,
    rec.PEAK_MEM_ALLOCATED_GB,
    rec.DEVICE_MEM_TOTAL_GB,
)

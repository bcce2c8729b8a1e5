"""From trial records and a budget to GO / NO-GO: pure functions, plus the report's text and JSON.

Never talks to MLflow: ``tracking`` reads the records and logs what this module produces.

The policy in one paragraph: only ``ok`` trials count. A trial whose peak reserved memory is above
``max_memory_share`` of its device is not recommended (a run that close to the edge dies on day three). With
``effective_batch`` set, only trials with that effective batch count. Throughput for the verdict is the
conservative one, images per optimizer step / p90 step time; the median (p50) is shown beside it. Per model,
the best qualifying trial gives days = images needed / (images/s x 86400 x utilization). The recommendation
is the largest model (by ``params_m``) that is GO.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from dinox.records import TrialRecord, record_problem

SECONDS_PER_DAY = 86400.0

# Params shown as "the configuration" of a trial when present; any other param that varies between a
# model's trials is shown too, so whatever a sweep swept is visible.
CONFIG_KEYS = (
    "batch.size", "batch.accumulation", "batch.effective", "precision", "model.img_size",
    "model.grad_checkpointing", "model.compile", "model.channels_last", "loader.num_workers",
    "loader.pin_memory", "loader.prefetch_factor", "loader.persistent_workers", "optimizer.fused",
)  # fmt: skip
# Params that do not describe the workload: never part of a grouping key.
_NOT_CONFIG = {"name", "spec.name", "sweep.trials", "measure.timeout_s", "measure.bound_threshold",
               "hardware.peak_tflops", "measure.warmup_steps", "measure.bench_steps", "measure.repeats",
               "measure.unstable_threshold"}  # fmt: skip
# What can change peak memory: trials that share these share an OOM boundary over batch size.
_MEMORY_KEYS = ("precision", "model.img_size", "model.grad_checkpointing", "model.compile", "model.channels_last",
                "hardware.memory_limit_gb", "objective.kind")  # fmt: skip


class DecisionError(Exception):
    """Nothing to decide on (no trials, no budget): one line for the user."""


@dataclass(frozen=True)
class Budget:
    days: float
    dataset_size: int | None = None
    epochs: float | None = None
    target_images: int | None = None
    utilization: float = 1.0

    def __post_init__(self) -> None:
        if not self.days > 0:
            raise DecisionError(f"budget days must be > 0, got {self.days}")
        if not 0 < self.utilization <= 1:
            raise DecisionError(f"utilization must be in (0, 1], got {self.utilization}")
        if self.target_images is None and (self.dataset_size is None or self.epochs is None):
            raise DecisionError("budget needs --target-images, or --dataset-size with --epochs")
        if self.target_images is not None and (self.dataset_size is not None or self.epochs is not None):
            raise DecisionError("budget takes --target-images or --dataset-size with --epochs, not both")

    @property
    def images_needed(self) -> float:
        if self.target_images is not None:
            return float(self.target_images)
        return float(self.dataset_size) * float(self.epochs)  # type: ignore[arg-type]

    def days_for(self, images_per_s: float) -> float:
        return self.images_needed / (images_per_s * SECONDS_PER_DAY * self.utilization)

    def images_in_budget(self, images_per_s: float) -> float:
        return images_per_s * SECONDS_PER_DAY * self.utilization * self.days

    def describe(self) -> str:
        schedule = (f"{self.target_images:,} images" if self.target_images is not None
                    else f"{self.epochs:g} epochs of {self.dataset_size:,} images")  # fmt: skip
        util = f" at {self.utilization:.0%} utilization" if self.utilization != 1 else ""
        return f"{schedule} in {self.days:g} day{'' if self.days == 1 else 's'}{util}"


def merge_budget(base: dict[str, Any], days: float | None, dataset_size: int | None, epochs: float | None,
                 target_images: int | None, utilization: float) -> Budget:  # fmt: skip
    """The spec's budget (`base`, possibly empty) overridden field by field by the options given; a
    schedule given as images replaces one given as epochs, and the other way round."""
    merged = dict(base)
    if days is not None:
        merged["days"] = days
    if target_images is not None:
        merged.update(target_images=target_images, dataset_size=None, epochs=None)
    if dataset_size is not None or epochs is not None:
        merged["target_images"] = None
        merged.update({k: v for k, v in (("dataset_size", dataset_size), ("epochs", epochs)) if v is not None})
    if merged.get("days") is None:
        raise DecisionError("no budget: give --days with --dataset-size and --epochs (or --target-images), "
                            "or a --spec with one")  # fmt: skip
    _check_budget(merged, utilization)
    return Budget(days=merged["days"], dataset_size=merged.get("dataset_size"), epochs=merged.get("epochs"),
                  target_images=merged.get("target_images"), utilization=utilization)  # fmt: skip


_OPTION = {"days": "--days", "dataset_size": "--dataset-size", "epochs": "--epochs", "target_images": "--target-images"}


def _check_budget(merged: dict[str, Any], utilization: float) -> None:
    """The budget as the spec's own rules see it (finite, positive, bounded), each problem naming its option."""
    from pydantic import ValidationError

    from dinox.spec import BudgetSpec, field_problems

    try:
        BudgetSpec.model_validate({k: v for k, v in merged.items() if v is not None})
    except ValidationError as e:
        problems = [f"{_OPTION.get(p.loc[0], p.loc[0]) if p.loc else 'budget'}: {p.message}"
                    for p in field_problems(e, BudgetSpec)]  # fmt: skip
        raise DecisionError("; ".join(problems)) from None
    if not (math.isfinite(utilization) and 0 < utilization <= 1):
        raise DecisionError(f"--utilization: must be in (0, 1], got {utilization}")


@dataclass(frozen=True)
class Policy:
    max_memory_share: float = 0.90
    effective_batch: int | None = None
    knee_tolerance: float = 0.05
    exclude_unstable: bool = False  # True: a trial whose timed windows disagree is not recommended

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_memory_share) and 0 < self.max_memory_share <= 1):
            raise DecisionError(f"--max-memory-share: must be in (0, 1], got {self.max_memory_share}")
        if not (math.isfinite(self.knee_tolerance) and 0 <= self.knee_tolerance < 1):
            raise DecisionError(f"--knee-tolerance: must be in [0, 1), got {self.knee_tolerance}")
        if self.effective_batch is not None and self.effective_batch <= 0:
            raise DecisionError(f"--effective-batch: must be a positive integer, got {self.effective_batch}")


@dataclass
class Candidate:
    """One ok trial as the policy sees it."""

    run_id: str
    run_name: str
    configuration: dict[str, str]
    effective_batch: int
    conservative_ips: float  # images per optimizer step / p90 step time: drives the verdict
    median_ips: float  # ... / p50 step time
    measured_ips: float  # images_per_s as measured over the timed window
    memory_share: float | None  # peak reserved / device memory
    bound: str
    days: float
    excluded: str = ""  # why the policy does not recommend it; "" when it qualifies
    mfu: float | None = None  # model FLOPs utilisation over the timed windows
    tflops: float | None = None
    spread: float | None = None  # (fastest - slowest) / median window throughput
    unstable: bool = False
    loader_cost: float | None = None  # 1 - images/s / images/s without the loader (the ablation windows)


@dataclass
class OomBoundary:
    """For one memory configuration of a model: the largest batch that fit and the smallest that did not."""

    settings: dict[str, str]
    largest_ok: int | None
    smallest_oom: int | None


@dataclass
class ModelVerdict:
    key: str  # model.name plus its kwargs
    name: str
    kwargs: dict[str, str]
    params_m: float | None
    trials: int
    statuses: dict[str, int]
    candidates: list[Candidate]
    oom: list[OomBoundary]
    best: Candidate | None = None
    go: bool = False
    margin_days: float | None = None
    epochs_in_budget: float | None = None
    images_in_budget: float | None = None

    @property
    def label(self) -> str:
        if not self.kwargs:
            return self.name
        return f"{self.name} ({', '.join(f'{k}={v}' for k, v in sorted(self.kwargs.items()))})"


@dataclass
class KneeRow:
    settings: dict[str, str]  # what the workers were swept under
    points: list[tuple[int, float]]  # (workers, measured images/s), sorted by workers
    knee_workers: int
    best_workers: int
    best_ips: float
    # (workers, loader_images_per_s): what the input pipeline alone delivers at that worker count
    loader_points: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class PinRow:
    settings: dict[str, str]
    pinned_ips: float
    unpinned_ips: float

    @property
    def ratio(self) -> float:
        return self.pinned_ips / self.unpinned_ips


@dataclass
class LoaderFindings:
    knees: list[KneeRow] = field(default_factory=list)
    pin: list[PinRow] = field(default_factory=list)
    # (run name, model, measured ips, loader_cost or None): trials whose input pipeline sets the pace
    io_bound: list[tuple[str, str, float, float | None]] = field(default_factory=list)
    # (run name, model, measured ips): trials whose device waits on the host (Python, kernel launches)
    host_bound: list[tuple[str, str, float]] = field(default_factory=list)

    @property
    def pin_summary(self) -> str:
        if not self.pin:
            return ""
        ratios = [p.ratio for p in self.pin]
        median = statistics.median(ratios)
        faster = sum(r > 1 for r in ratios)
        verdict = "helps" if median > 1.02 else "hurts" if median < 0.98 else "makes no clear difference"
        return (f"pinned memory {verdict}: faster in {faster} of {len(ratios)} otherwise-equal pairs, "
                f"median {median - 1:+.1%}")  # fmt: skip


@dataclass
class ScalingRow:
    """A multi-device trial against the single-device trial of the same configuration."""

    run: str
    model: str
    gpus: int
    images_per_s: float  # global
    single_images_per_s: float

    @property
    def efficiency(self) -> float:
        return self.images_per_s / (self.gpus * self.single_images_per_s)


@dataclass
class MemoryCheck:
    """A trial's predicted device memory (dinox plan) beside what it measured."""

    run: str
    model: str
    batch: int | None
    predicted_gb: float
    measured_gb: float | None  # peak allocated (CUDA) or the process's peak resident set (CPU)
    status: str
    predicted_oom: bool

    @property
    def ratio(self) -> float | None:
        return self.measured_gb / self.predicted_gb if self.measured_gb and self.predicted_gb else None


@dataclass
class Decision:
    verdict: str  # "GO" or "NO-GO"
    budget: Budget
    policy: Policy
    models: list[ModelVerdict]
    recommended: ModelVerdict | None
    loader: LoaderFindings
    reason: str
    needed_ips: float  # the conservative throughput the schedule needs
    sources: list[str] = field(default_factory=list)  # experiments / runs the records came from
    notes: list[str] = field(default_factory=list)
    memory: list[MemoryCheck] = field(default_factory=list)
    scaling: list[ScalingRow] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (run, why): records that cannot be trusted


# --- the policy ------------------------------------------------------------------------------------


def model_key(r: TrialRecord) -> tuple[str, str, dict[str, str]]:
    name = r.params.get("model.name", "?")
    kwargs = {k.removeprefix("model.kwargs."): v for k, v in r.params.items() if k.startswith("model.kwargs.")}
    if r.params.get("model.kwargs") not in (None, "{}"):
        kwargs["kwargs"] = r.params["model.kwargs"]
    key = name + "".join(f" {k}={v}" for k, v in sorted(kwargs.items()))
    return key, name, kwargs


def _configuration(r: TrialRecord, varying: set[str]) -> dict[str, str]:
    keys = [k for k in CONFIG_KEYS if k in r.params]
    keys += sorted(k for k in varying if k not in keys and k in r.params)
    return {k: r.params[k] for k in keys}


def _varying(records: list[TrialRecord]) -> set[str]:
    values: dict[str, set[str]] = defaultdict(set)
    for r in records:
        for k, v in r.params.items():
            values[k].add(v)
    keys = {k for k, vs in values.items() if len(vs) > 1 or any(k not in r.params for r in records)}
    return {k for k in keys if k not in _NOT_CONFIG and not k.startswith("model.kwargs")}


def _candidate(r: TrialRecord, budget: Budget, policy: Policy, varying: set[str]) -> Candidate | None:
    m = r.metrics
    effective = r.effective_batch
    measured = m.get("images_per_s")
    if effective is None or measured is None or measured <= 0:
        return None
    p90, p50 = m.get("step_s_p90"), m.get("step_s_p50")
    conservative = effective / p90 if p90 else measured
    median = effective / p50 if p50 else measured
    total, reserved = m.get("device_mem_total_gb"), m.get("peak_mem_reserved_gb")
    share = reserved / total if total and reserved is not None else None
    excluded = ""
    if policy.effective_batch is not None and effective != policy.effective_batch:
        excluded = f"effective batch {effective} != {policy.effective_batch}"
    elif share is not None and share > policy.max_memory_share:
        excluded = f"peak reserved memory {share:.0%} of the device > {policy.max_memory_share:.0%}"
    unstable = r.tags.get("dinox.unstable") == "true"
    spread = m.get("window_spread")
    if not excluded and unstable and policy.exclude_unstable:
        excluded = f"unstable: its timed windows differ by {spread:.0%}" if spread is not None else "unstable"
    return Candidate(
        run_id=r.run_id,
        run_name=r.run_name,
        configuration=_configuration(r, varying),
        effective_batch=effective,
        conservative_ips=conservative,
        median_ips=median,
        measured_ips=measured,
        memory_share=share,
        bound=r.tags.get("dinox.bound", ""),
        days=budget.days_for(conservative),
        excluded=excluded,
        mfu=m.get("mfu"),
        tflops=m.get("tflops"),
        spread=spread,
        unstable=unstable,
        loader_cost=m.get("loader_cost"),
    )


def _oom_boundaries(records: list[TrialRecord]) -> list[OomBoundary]:
    groups: dict[tuple[tuple[str, str], ...], list[TrialRecord]] = defaultdict(list)
    for r in records:
        if r.status in ("ok", "oom") and r.batch_size is not None:
            groups[tuple((k, r.params[k]) for k in _MEMORY_KEYS if k in r.params)].append(r)
    out = []
    for settings, rs in sorted(groups.items()):
        oks = [r.batch_size for r in rs if r.status == "ok"]
        ooms = [r.batch_size for r in rs if r.status == "oom"]
        if ooms:
            out.append(OomBoundary(dict(settings), max(oks) if oks else None, min(ooms)))  # type: ignore[type-var]
    return out


def _model_verdict(key: str, name: str, kwargs: dict[str, str], records: list[TrialRecord], budget: Budget,
                   policy: Policy) -> ModelVerdict:  # fmt: skip
    statuses: dict[str, int] = defaultdict(int)
    for r in records:
        statuses[r.status or "unknown"] += 1
    params_m = next((r.metrics["params_m"] for r in records if "params_m" in r.metrics), None)
    varying = _varying(records)
    candidates = [c for r in records if r.status == "ok" if (c := _candidate(r, budget, policy, varying))]
    candidates.sort(key=lambda c: -c.conservative_ips)
    mv = ModelVerdict(key, name, kwargs, params_m, len(records), dict(statuses), candidates, _oom_boundaries(records))
    qualifying = [c for c in candidates if not c.excluded]
    if qualifying:
        best = qualifying[0]
        mv.best = best
        mv.go = best.days <= budget.days
        mv.margin_days = budget.days - best.days
        mv.images_in_budget = budget.images_in_budget(best.conservative_ips)
        if budget.dataset_size:
            mv.epochs_in_budget = mv.images_in_budget / budget.dataset_size
    return mv


def _loader_findings(records: list[TrialRecord], tolerance: float) -> LoaderFindings:
    ok = [r for r in records if r.status == "ok" and "images_per_s" in r.metrics]
    findings = LoaderFindings()
    # The worker knee: among trials equal in everything but loader.num_workers.
    knees: list[tuple[tuple, list[tuple[int, float]], list[tuple[int, float]]]] = []
    for key, rs in _groups_without(ok, "loader.num_workers"):
        by_workers: dict[int, float] = {}
        ceiling: dict[int, float] = {}
        for r in rs:
            w = r.param_int("loader.num_workers")
            if w is not None:
                by_workers[w] = max(by_workers.get(w, 0.0), r.metrics["images_per_s"])
                if "loader_images_per_s" in r.metrics:
                    ceiling[w] = max(ceiling.get(w, 0.0), r.metrics["loader_images_per_s"])
        if len(by_workers) >= 2:
            knees.append((key, sorted(by_workers.items()), sorted(ceiling.items())))
    for settings, (_key, points, loader_points) in zip(_telling([k for k, _, _ in knees]), knees, strict=True):
        best_w, best = max(points, key=lambda p: p[1])
        knee = min(w for w, ips in points if ips >= (1 - tolerance) * best)
        findings.knees.append(KneeRow(settings, points, knee, best_w, best, loader_points))
    # Pinned memory: pairs equal in everything but loader.pin_memory.
    pairs: list[tuple[tuple, float, float]] = []
    for key, rs in _groups_without(ok, "loader.pin_memory"):
        pinned = [r.metrics["images_per_s"] for r in rs if r.param_bool("loader.pin_memory")]
        unpinned = [r.metrics["images_per_s"] for r in rs if r.param_bool("loader.pin_memory") is False]
        if pinned and unpinned:
            pairs.append((key, max(pinned), max(unpinned)))
    for settings, (_key, on, off) in zip(_telling([k for k, _, _ in pairs]), pairs, strict=True):
        findings.pin.append(PinRow(settings, on, off))
    findings.io_bound = [
        (r.run_name or r.run_id, r.params.get("model.name", "?"), r.metrics["images_per_s"],
         r.metrics.get("loader_cost"))
        for r in ok
        if r.tags.get("dinox.bound") == "io_bound"
    ]  # fmt: skip
    findings.host_bound = [
        (r.run_name or r.run_id, r.params.get("model.name", "?"), r.metrics["images_per_s"])
        for r in ok
        if r.tags.get("dinox.bound") == "host_bound"
    ]
    return findings


def _groups_without(records: list[TrialRecord], swept: str) -> list[tuple[tuple, list[TrialRecord]]]:
    """Trials equal in every workload param but `swept`, keyed by those params."""
    groups: dict[tuple, list[TrialRecord]] = defaultdict(list)
    for r in records:
        if swept in r.params:
            key = tuple(sorted((k, v) for k, v in r.params.items() if k != swept and k not in _NOT_CONFIG))
            groups[key].append(r)
    return list(groups.items())


def _telling(keys: list[tuple]) -> list[dict[str, str]]:
    """Each key shown by only the params that tell it apart from the other keys of its own list."""
    values: dict[str, set[str]] = defaultdict(set)
    for key in keys:
        for k, v in key:
            values[k].add(v)
    differing = {k for k, vs in values.items() if len(vs) > 1}
    return [{k: v for k, v in key if k in differing} for key in keys]


def _memory_checks(records: list[TrialRecord]) -> list[MemoryCheck]:
    out = []
    for r in records:
        predicted = r.metrics.get("predicted_device_mem_gb")
        if predicted is None or r.status not in ("ok", "oom"):
            continue
        measured = r.metrics.get("peak_mem_allocated_gb") if r.status == "ok" else None
        out.append(MemoryCheck(r.run_name or r.run_id, model_key(r)[0], r.batch_size, predicted, measured, r.status,
                               "dinox.predicted_oom" in r.tags))  # fmt: skip
    return sorted(out, key=lambda c: (c.model, c.batch or 0, c.run))


def _scaling(records: list[TrialRecord]) -> list[ScalingRow]:
    """Scaling efficiency = global images/s / (N x images/s of the same configuration on one device). The
    effective batch grows with the devices, so it is not part of "the same configuration"."""
    free = {"hardware.gpus", "batch.effective"} | _NOT_CONFIG
    single: dict[tuple, float] = {}
    multi: list[tuple[tuple, TrialRecord, int]] = []
    for r in records:
        if r.status != "ok" or "images_per_s" not in r.metrics:
            continue
        key = tuple(sorted((k, v) for k, v in r.params.items() if k not in free))
        gpus = r.param_int("hardware.gpus") or 1
        if gpus == 1:
            single[key] = max(single.get(key, 0.0), r.metrics["images_per_s"])
        else:
            multi.append((key, r, gpus))
    return [ScalingRow(r.run_name or r.run_id, model_key(r)[0], gpus, r.metrics["images_per_s"], single[key])
            for key, r, gpus in multi if key in single]  # fmt: skip


def decide(records: list[TrialRecord], budget: Budget, policy: Policy | None = None) -> Decision:
    policy = policy or Policy()
    if not records:
        raise DecisionError("no trial runs to decide on")
    left_out = [(r.run_name or r.run_id, why) for r in records if (why := record_problem(r))]
    records = [r for r in records if not record_problem(r)]
    if not records:
        raise DecisionError(f"none of the {len(left_out)} trial records can be used: {left_out[0][0]}: "
                            f"{left_out[0][1]}")  # fmt: skip
    by_model: dict[str, list[TrialRecord]] = defaultdict(list)
    names: dict[str, tuple[str, dict[str, str]]] = {}
    for r in records:
        key, name, kwargs = model_key(r)
        by_model[key].append(r)
        names[key] = (name, kwargs)
    models = [_model_verdict(k, *names[k], rs, budget, policy) for k, rs in by_model.items()]
    models.sort(key=lambda mv: (-(mv.params_m or 0.0), mv.key))
    needed = budget.images_needed / (budget.days * SECONDS_PER_DAY * budget.utilization)
    go = [mv for mv in models if mv.go]
    recommended = max(go, key=lambda mv: mv.params_m or 0.0) if go else None
    if recommended is not None:
        b = recommended.best
        assert b is not None
        reason = (f"{recommended.label} is the largest model that finishes {budget.describe()}: "
                  f"{b.conservative_ips:.1f} img/s (p90) -> {fmt_days(b.days)} days, "
                  f"{fmt_days(recommended.margin_days or 0.0)} days to spare")  # fmt: skip
    else:
        measured = [mv for mv in models if mv.best is not None]
        if not measured:
            reason = "no trial qualifies: none is ok within the policy (see each model's statuses and exclusions)"
        else:
            fastest = max(measured, key=lambda mv: mv.best.conservative_ips)  # type: ignore[union-attr]
            fb = fastest.best
            assert fb is not None
            reason = (f"no model finishes {budget.describe()}; it needs {needed:.1f} img/s (p90). The fastest, "
                      f"{fastest.label}, reaches {fb.conservative_ips:.1f} img/s -> {fmt_days(fb.days)} days"
                      + (f", {fastest.epochs_in_budget:.1f} epochs in the budget" if fastest.epochs_in_budget
                         else ""))  # fmt: skip
    return Decision(
        verdict="GO" if recommended is not None else "NO-GO",
        budget=budget,
        policy=policy,
        models=models,
        recommended=recommended,
        loader=_loader_findings(records, policy.knee_tolerance),
        reason=reason,
        needed_ips=needed,
        memory=_memory_checks(records),
        scaling=_scaling(records),
        left_out=left_out,
    )


# --- outputs ---------------------------------------------------------------------------------------


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _candidate_json(c: Candidate | None) -> dict[str, Any] | None:
    return None if c is None else asdict(c)


def to_json(d: Decision) -> dict[str, Any]:
    rec = d.recommended
    recommended = None
    if rec is not None and rec.best is not None:
        recommended = {
            "run_id": rec.best.run_id,
            "model": rec.name,
            "model_kwargs": rec.kwargs,
            "params_m": rec.params_m,
            "configuration": rec.best.configuration,
            "images_per_s_p90": rec.best.conservative_ips,
            "images_per_s_p50": rec.best.median_ips,
            "mfu": rec.best.mfu,
            "days": rec.best.days,
        }
    models = []
    for mv in d.models:
        models.append({
            "model": mv.name, "model_kwargs": mv.kwargs, "key": mv.key, "params_m": mv.params_m,
            "trials": mv.trials, "statuses": mv.statuses, "verdict": "GO" if mv.go else "NO-GO",
            "best": _candidate_json(mv.best), "days": mv.best.days if mv.best else None,
            "margin_days": mv.margin_days, "epochs_in_budget": mv.epochs_in_budget,
            "images_in_budget": mv.images_in_budget,
            "excluded": [{"run_id": c.run_id, "run_name": c.run_name, "why": c.excluded}
                         for c in mv.candidates if c.excluded],
            "oom_boundary": [asdict(b) for b in mv.oom],
        })  # fmt: skip
    budget = {**asdict(d.budget), "images_needed": d.budget.images_needed, "needed_images_per_s_p90": d.needed_ips}
    return _clean(
        {
            "verdict": d.verdict,
            "reason": d.reason,
            "recommended": recommended,
            "models": models,
            "budget": budget,
            "policy": asdict(d.policy),
            "loader": {
                "knees": [asdict(k) for k in d.loader.knees],
                "pin_memory": [asdict(p) | {"ratio": p.ratio} for p in d.loader.pin],
                "pin_memory_summary": d.loader.pin_summary,
                "io_bound": [{"run": n, "model": m, "images_per_s": ips, "loader_cost": cost}
                             for n, m, ips, cost in d.loader.io_bound],
                "host_bound": [{"run": n, "model": m, "images_per_s": ips} for n, m, ips in d.loader.host_bound],
            },
            "sources": d.sources,
            "notes": d.notes,
            "memory_predictions": [asdict(c) | {"ratio": c.ratio} for c in d.memory],
            "scaling": [asdict(row) | {"efficiency": row.efficiency} for row in d.scaling],
            "left_out": [{"run": run, "why": why} for run, why in d.left_out],
        }
    )


def _fmt_config(config: dict[str, str]) -> str:
    short = {
        "batch.size": "batch",
        "batch.accumulation": "accum",
        "batch.effective": "effective",
        "model.grad_checkpointing": "ckpt",
        "loader.num_workers": "workers",
        "loader.pin_memory": "pin",
    }
    return ", ".join(f"{short.get(k, k)}={v}" for k, v in config.items() if v not in ("None",))


def _fmt_settings(settings: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items()) or "all trials"


def render_terminal(d: Decision) -> str:
    lines = [f"{d.verdict}: {d.reason}", ""]
    width = max(5, *(len(mv.label) for mv in d.models))
    header = (f"{'model':<{width}} {'params M':>9} {'img/s p90':>10} {'p50':>8} {'MFU':>6} {'days':>7}  "
              f"{'verdict':<6} trials")  # fmt: skip
    lines.append(header)
    for mv in d.models:
        b = mv.best
        statuses = " ".join(f"{k}={v}" for k, v in sorted(mv.statuses.items()))
        mfu = f"{b.mfu:>6.1%}" if b is not None and b.mfu is not None else f"{'-':>6}"
        lines.append(
            f"{mv.label:<{width}} {_num(mv.params_m, 9, 1)} {_num(b and b.conservative_ips, 10, 1)} "
            f"{_num(b and b.median_ips, 8, 1)} {mfu} {_num(b and b.days, 7, 1)}  {'GO' if mv.go else 'NO-GO':<6} "
            f"{statuses}"
        )
    lines.append(f"budget: {d.budget.describe()}; needs {d.needed_ips:.1f} img/s (p90)")
    if d.left_out:
        lines.append(f"left out {len(d.left_out)} record(s) that cannot be trusted: "
                     + "; ".join(f"{run}: {why}" for run, why in d.left_out[:3])
                     + ("; ..." if len(d.left_out) > 3 else ""))  # fmt: skip
    return "\n".join(lines)


def _num(value: float | None, width: int, digits: int) -> str:
    return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def render_markdown(d: Decision, plots: list[str]) -> str:
    b = d.budget
    out = [f"# Throughput decision: {d.verdict}", ""]
    out += ["## Summary", "", f"**{d.verdict}.** {d.reason}.", ""]
    out += [
        f"- Budget: {b.describe()} = {b.images_needed:,.0f} images, which needs **{d.needed_ips:.1f} img/s** at the "
        f"slow end of the step-time distribution (p90).",
        f"- Policy: only `ok` trials count; peak reserved memory at most {d.policy.max_memory_share:.0%} of the "
        f"device; throughput for the verdict = images per optimizer step / p90 step time"
        + (f"; effective batch {d.policy.effective_batch} only" if d.policy.effective_batch else "")
        + ".",
    ]
    if d.sources:
        out.append(f"- Trials from: {', '.join(d.sources)}.")
    out.append("")
    if d.recommended is not None and d.recommended.best is not None:
        rec = d.recommended
        out += ["## Decision", "", f"Proceed with **{rec.label}** ({_params(rec.params_m)}):", ""]
        out += [f"- {k}: `{v}`" for k, v in rec.best.configuration.items()]
        out += [
            f"- Throughput: {rec.best.conservative_ips:.1f} img/s (p90), {rec.best.median_ips:.1f} img/s (median)"
            + (f"; {rec.best.tflops:.1f} TFLOPs, MFU {rec.best.mfu:.1%}" if rec.best.mfu is not None else ""),
            f"- Schedule: {fmt_days(rec.best.days)} days of the {b.days:g}-day budget "
            f"({fmt_days(rec.margin_days or 0.0)} days to spare); about "
            f"{rec.best.conservative_ips * SECONDS_PER_DAY * b.utilization:,.0f} images a day",
            f"- MLflow run: `{rec.best.run_id}`",
            "",
        ]
    else:
        out += ["## Decision", "", "No model fits the budget. To make it fit, one of:", ""]
        out.append(f"- reach {d.needed_ips:.1f} img/s (p90) for the schedule as it is;")
        fastest = [mv for mv in d.models if mv.best is not None]
        if fastest:
            f = max(fastest, key=lambda mv: mv.best.conservative_ips)  # type: ignore[union-attr]
            out.append(f"- or grant {f.best.days:.1f} days for the fastest model, {f.label};")  # type: ignore[union-attr]
            if f.epochs_in_budget is not None:
                out.append(f"- or shorten the schedule to the {f.epochs_in_budget:.1f} epochs the budget buys it.")
        out.append("")
    out += ["## Models", ""]
    for mv in d.models:
        out += _model_section(mv, b)
    out += _loader_section(d.loader, d.policy.knee_tolerance)
    out += _memory_section(d.memory)
    if d.scaling:
        out += ["## Scaling", "", "Global images/s of each multi-device trial against N x the same configuration on "
                "one device.", "", "| trial | model | devices | img/s | one device | efficiency |",
                "|---|---|---|---|---|---|"]  # fmt: skip
        out += [f"| {row.run} | {row.model} | {row.gpus} | {row.images_per_s:.1f} | {row.single_images_per_s:.1f} | "
                f"{row.efficiency:.0%} |" for row in d.scaling]  # fmt: skip
        out.append("")
    if plots:
        out += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    if d.left_out:
        out += ["## Records left out", "", "These runs carry figures no real trial has (not finite, not positive, "
                "or physically impossible), so the decision does not use them:", ""]  # fmt: skip
        out += [f"- `{run}`: {why}" for run, why in d.left_out] + [""]
    if d.notes:
        out += ["## Notes", ""] + [f"- {n}" for n in d.notes] + [""]
    return "\n".join(out)


def fmt_days(days: float) -> str:
    """Days to a precision that means something: 12.0, 0.54, 0.053."""
    return f"{days:.1f}" if days >= 1 else f"{days:.2g}"


def _params(params_m: float | None) -> str:
    return f"{params_m:.1f} M parameters" if params_m is not None else "parameter count not recorded"


def _model_section(mv: ModelVerdict, b: Budget) -> list[str]:
    statuses = ", ".join(f"{v} {k}" for k, v in sorted(mv.statuses.items()))
    out = [
        f"### {mv.label}: {'GO' if mv.go else 'NO-GO'}",
        "",
        f"{_params(mv.params_m)}; {mv.trials} trials ({statuses}).",
        "",
    ]
    if mv.best is not None:
        best = mv.best
        line = f"Best qualifying trial: {best.conservative_ips:.1f} img/s (p90) -> **{fmt_days(best.days)} days**"
        if mv.go:
            line += f", {fmt_days(mv.margin_days or 0.0)} days within the budget."
        else:
            line += f", {-mv.margin_days:.1f} days over the budget"  # type: ignore[operator]
            line += (f"; the budget buys {mv.epochs_in_budget:.1f} epochs." if mv.epochs_in_budget is not None
                     else f"; the budget buys {mv.images_in_budget:,.0f} images.")  # fmt: skip
        out += [line, ""]
    elif mv.candidates:
        out += ["No trial qualifies under the policy.", ""]
    else:
        out += ["No trial finished ok.", ""]
    if mv.candidates:
        keys = list(dict.fromkeys(k for c in mv.candidates for k in c.configuration))
        # Columns only for what differs between the trials; what they share is said once.
        keys_varying = [k for k in keys if len({c.configuration.get(k) for c in mv.candidates}) > 1]
        common = {k: mv.candidates[0].configuration.get(k) for k in keys if k not in keys_varying}
        if common:
            out += ["Common to these trials: " + ", ".join(f"`{k}={v}`" for k, v in common.items()) + ".", ""]
        out.append("| " + " | ".join([*keys_varying, "img/s p90", "img/s p50", "MFU", "days", "mem", "bound",
                                      "loader cost", "note"]) + " |")  # fmt: skip
        out.append("|" + "---|" * (len(keys_varying) + 8))
        for c in mv.candidates:
            mem = f"{c.memory_share:.0%}" if c.memory_share is not None else "-"
            notes = [c.excluded or ("**best**" if c is mv.best else "")]
            if c.unstable and not c.excluded:
                notes.append(f"unstable (windows differ by {c.spread:.0%})" if c.spread is not None else "unstable")
            mfu = f"{c.mfu:.1%}" if c.mfu is not None else "-"
            cells = [c.configuration.get(k, "") for k in keys_varying]
            loader = f"{c.loader_cost:.0%}" if c.loader_cost is not None else "-"
            cells += [f"{c.conservative_ips:.2f}", f"{c.median_ips:.2f}", mfu, fmt_days(c.days), mem, c.bound, loader,
                      "; ".join(n for n in notes if n)]  # fmt: skip
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    for ob in mv.oom:
        fit = f"largest batch that fit: {ob.largest_ok}" if ob.largest_ok is not None else "no batch fit"
        out.append(f"- OOM boundary ({_fmt_settings(ob.settings)}): {fit}; smallest that did not: {ob.smallest_oom}")
    if mv.oom:
        out.append("")
    return out


def _memory_section(checks: list[MemoryCheck]) -> list[str]:
    if not checks:
        return []
    out = ["## Memory: predicted before the sweep, measured in it", ""]
    out += ["Predicted device memory (`dinox plan`: weights, gradients, optimizer state, saved activations, the "
            "batch; on the CPU the process too) beside the measured peak (CUDA: peak allocated; CPU: the trial "
            "process's peak resident set).", ""]  # fmt: skip
    out += ["| trial | model | batch | predicted GB | measured GB | measured / predicted | status | predicted OOM |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in checks:
        measured = f"{c.measured_gb:.2f}" if c.measured_gb is not None else "-"
        ratio = f"{c.ratio:.2f}" if c.ratio is not None else "-"
        out.append(f"| {c.run} | {c.model} | {c.batch if c.batch is not None else '-'} | {c.predicted_gb:.2f} | "
                   f"{measured} | {ratio} | {c.status} | {'yes' if c.predicted_oom else 'no'} |")  # fmt: skip
    hits = sum(c.predicted_oom == (c.status == "oom") for c in checks)
    out += ["", f"The OOM prediction matched the outcome in {hits} of {len(checks)} trials.", ""]
    return out


def _loader_section(f: LoaderFindings, tolerance: float) -> list[str]:
    if not (f.knees or f.pin or f.io_bound or f.host_bound):
        return []
    out = ["## Input pipeline", ""]
    if f.knees:
        out += [f"Worker knee (fewest workers within {tolerance:.0%} of the best throughput, all else equal). "
                "\"Loader alone\" is what the input pipeline delivers with the model idle (`loader_images_per_s`): "
                "where it is close to the step's rate, the loader sets the pace.", ""]  # fmt: skip
        out += ["| settings | knee | best | best img/s | img/s by workers | loader alone by workers |",
                "|---|---|---|---|---|---|"]  # fmt: skip
        for k in f.knees:
            curve = ", ".join(f"{w}: {ips:.0f}" for w, ips in k.points)
            ceiling = ", ".join(f"{w}: {ips:.0f}" for w, ips in k.loader_points) or "-"
            out.append(f"| {_fmt_settings(k.settings)} | {k.knee_workers} | {k.best_workers} | {k.best_ips:.1f} | "
                       f"{curve} | {ceiling} |")  # fmt: skip
        out.append("")
    if f.pin:
        out += [f"{f.pin_summary[0].upper()}{f.pin_summary[1:]}.", ""]
    if f.io_bound:
        shown = ", ".join(f"{n} ({ips:.0f} img/s" + (f", the loader costs {cost:.0%}" if cost is not None else "") + ")"
                          for n, _m, ips, cost in f.io_bound)  # fmt: skip
        out += [f"io_bound trials ({len(f.io_bound)}): {shown}.", ""]
    if f.host_bound:
        shown = ", ".join(f"{n} ({ips:.0f} img/s)" for n, _m, ips in f.host_bound)
        out += [f"host_bound trials ({len(f.host_bound)}): {shown}. The device waits on Python and kernel launches, "
                "not on data: a larger batch, `model.compile` or CUDA graphs are what move these.", ""]  # fmt: skip
    return out


def log_params(d: Decision) -> dict[str, str]:
    """The decision's inputs, as MLflow params of the decision run."""
    out = {f"budget.{k}": str(v) for k, v in asdict(d.budget).items()}
    out.update({f"policy.{k}": str(v) for k, v in asdict(d.policy).items()})
    out["sources"] = "; ".join(d.sources)[:500]
    return out


def log_metrics(d: Decision) -> dict[str, float]:
    out = {"needed_images_per_s": d.needed_ips, "models": float(len(d.models))}
    if d.recommended is not None and d.recommended.best is not None:
        out["recommended_days"] = d.recommended.best.days
        out["recommended_images_per_s"] = d.recommended.best.conservative_ips
    return out

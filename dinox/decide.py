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
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from dinox.records import IPS_P90, TrialRecord, record_problem
from dinox.result import one_line
from dinox.spec import ROLES

SECONDS_PER_DAY = 86400.0

# Statuses that say "it did not fit": a sweep of only these has an answer (nothing fits), not a failure.
_NO_FIT = ("oom", "skipped")


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
        schedule = (
            f"{self.target_images:,} images"
            if self.target_images is not None
            else f"{self.epochs:g} epochs of {self.dataset_size:,} images"
        )
        util = f" at {self.utilization:.0%} utilization" if self.utilization != 1 else ""
        return f"{schedule} in {self.days:g} day{'' if self.days == 1 else 's'}{util}"


def merge_budget(
    base: dict[str, Any],
    days: float | None,
    dataset_size: int | None,
    epochs: float | None,
    target_images: int | None,
    utilization: float,
) -> Budget:
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
        raise DecisionError(
            "no budget: give --days with --dataset-size and --epochs (or --target-images), or a --spec with one"
        )
    _check_budget(merged, utilization)
    return Budget(
        days=merged["days"],
        dataset_size=merged.get("dataset_size"),
        epochs=merged.get("epochs"),
        target_images=merged.get("target_images"),
        utilization=utilization,
    )


_OPTION = {"days": "--days", "dataset_size": "--dataset-size", "epochs": "--epochs", "target_images": "--target-images"}


def _check_budget(merged: dict[str, Any], utilization: float) -> None:
    """The budget as the spec's own rules see it (finite, positive, bounded), each problem naming its option."""
    from pydantic import ValidationError

    from dinox.spec import BudgetSpec
    from dinox.spec_fields import field_problems

    try:
        BudgetSpec.model_validate({k: v for k, v in merged.items() if v is not None})
    except ValidationError as e:
        problems = [
            f"{_OPTION.get(p.loc[0], p.loc[0]) if p.loc else 'budget'}: {p.message}"
            for p in field_problems(e, BudgetSpec)
        ]
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
    window_min_ips: float | None = None  # the slowest and fastest timed window, images/s
    window_max_ips: float | None = None


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
        return (
            f"pinned memory {verdict}: faster in {faster} of {len(ratios)} otherwise-equal pairs, "
            f"median {median - 1:+.1%}"
        )


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
    unstable: str = ""  # why the recommendation's own figure is uncertain; "" when its windows agree


# --- the policy ------------------------------------------------------------------------------------


def model_key(r: TrialRecord) -> tuple[str, str, dict[str, str]]:
    name = r.params.get("model.name", "?")
    kwargs = {k.removeprefix("model.kwargs."): v for k, v in r.params.items() if k.startswith("model.kwargs.")}
    if r.params.get("model.kwargs") not in (None, "{}"):
        kwargs["kwargs"] = r.params["model.kwargs"]
    key = name + "".join(f" {k}={v}" for k, v in sorted(kwargs.items()))
    return key, name, kwargs


def _configuration(r: TrialRecord, varying: set[str]) -> dict[str, str]:
    keys = [k for k in ROLES.shown_keys() if k in r.params]
    keys += sorted(k for k in varying if k not in keys and k in r.params)
    return {k: r.params[k] for k in keys}


def _varying(records: list[TrialRecord]) -> set[str]:
    values: dict[str, set[str]] = defaultdict(set)
    for r in records:
        for k, v in r.params.items():
            values[k].add(v)
    keys = {k for k, vs in values.items() if len(vs) > 1 or any(k not in r.params for r in records)}
    # The model's kwargs are part of the model's key, shown with its name.
    return {k for k in keys if ROLES.describes(k) and not k.startswith("model.kwargs")}


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
        window_min_ips=m.get("images_per_s_min"),
        window_max_ips=m.get("images_per_s_max"),
    )


def memory_groups(records: list[TrialRecord]) -> dict[tuple[tuple[str, str], ...], list[TrialRecord]]:
    """The ok and oom trials by the params that bound their memory: each group has one OOM boundary over
    the physical batch, the same grouping `dinox.prune` skips larger batches by."""
    groups: dict[tuple[tuple[str, str], ...], list[TrialRecord]] = defaultdict(list)
    for r in records:
        if r.status in ("ok", "oom") and r.batch_size is not None:
            groups[ROLES.memory_key(r.params)].append(r)
    return dict(sorted(groups.items()))


def _oom_boundaries(records: list[TrialRecord]) -> list[OomBoundary]:
    groups = memory_groups(records)
    out = []
    for settings, rs in zip(_telling(list(groups)), groups.values(), strict=True):
        oks = [r.batch_size for r in rs if r.status == "ok"]
        ooms = [r.batch_size for r in rs if r.status == "oom"]
        if ooms:
            out.append(OomBoundary(settings, max(oks) if oks else None, min(ooms)))  # type: ignore[type-var]
    return out


def _model_verdict(
    key: str, name: str, kwargs: dict[str, str], records: list[TrialRecord], budget: Budget, policy: Policy
) -> ModelVerdict:
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
        (
            r.run_name or r.run_id,
            r.params.get("model.name", "?"),
            r.metrics["images_per_s"],
            r.metrics.get("loader_cost"),
        )
        for r in ok
        if r.tags.get("dinox.bound") == "io_bound"
    ]
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
            key = tuple(sorted((k, v) for k, v in r.params.items() if k != swept and ROLES.describes(k)))
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
        out.append(
            MemoryCheck(
                r.run_name or r.run_id,
                model_key(r)[0],
                r.batch_size,
                predicted,
                measured,
                r.status,
                "dinox.predicted_oom" in r.tags,
            )
        )
    return sorted(out, key=lambda c: (c.model, c.batch or 0, c.run))


def _scaling(records: list[TrialRecord]) -> list[ScalingRow]:
    """Scaling efficiency = global images/s / (N x images/s of the same configuration on one device). The
    effective batch grows with the devices, so it is not part of "the same configuration"."""
    free = {"hardware.gpus", "batch.effective"}
    single: dict[tuple, float] = {}
    multi: list[tuple[tuple, TrialRecord, int]] = []
    for r in records:
        if r.status != "ok" or "images_per_s" not in r.metrics:
            continue
        key = tuple(sorted((k, v) for k, v in r.params.items() if k not in free and ROLES.describes(k)))
        gpus = r.param_int("hardware.gpus") or 1
        if gpus == 1:
            single[key] = max(single.get(key, 0.0), r.metrics["images_per_s"])
        else:
            multi.append((key, r, gpus))
    return [
        ScalingRow(r.run_name or r.run_id, model_key(r)[0], gpus, r.metrics["images_per_s"], single[key])
        for key, r, gpus in multi
        if key in single
    ]


def decide(records: list[TrialRecord], budget: Budget, policy: Policy | None = None) -> Decision:
    """Raises DecisionError when nothing can be decided: no records, none usable, or none measured (every
    trial failed for a reason other than memory). Every configuration out of memory is a NO-GO."""
    policy = policy or Policy()
    if not records:
        raise DecisionError("no trial runs to decide on")
    left_out = [(r.run_name or r.run_id, why) for r in records if (why := record_problem(r))]
    records = [r for r in records if not record_problem(r)]
    if not records:
        raise DecisionError(
            f"none of the {len(left_out)} trial records can be used: {left_out[0][0]}: {left_out[0][1]}"
        )
    _check_something_measured(records)
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
    return Decision(
        verdict="GO" if recommended is not None else "NO-GO",
        budget=budget,
        policy=policy,
        models=models,
        recommended=recommended,
        loader=_loader_findings(records, policy.knee_tolerance),
        reason=_reason(records, models, recommended, budget, needed),
        needed_ips=needed,
        memory=_memory_checks(records),
        scaling=_scaling(records),
        left_out=left_out,
        unstable=_unstable_warning(recommended),
    )


def status_summary(records: list[TrialRecord]) -> str:
    """`5 trials: error 4, crashed 1`."""
    counts = Counter(r.status or "unknown" for r in records)
    return f"{len(records)} trial{'s' if len(records) != 1 else ''}: " + ", ".join(
        f"{k} {v}" for k, v in counts.most_common()
    )


def _check_something_measured(records: list[TrialRecord]) -> None:
    if any(r.status == "ok" for r in records) or all(r.status in _NO_FIT for r in records):
        return
    errors = Counter(one_line(r.tags.get("dinox.error", ""), 200) for r in records if r.status not in _NO_FIT)
    error, n = errors.most_common(1)[0]
    commonest = f"; the commonest error ({n}x): {error}" if error else ""
    raise DecisionError(f"nothing was measured ({status_summary(records)}){commonest}")


def _reason(
    records: list[TrialRecord],
    models: list[ModelVerdict],
    recommended: ModelVerdict | None,
    budget: Budget,
    needed: float,
) -> str:
    if recommended is not None:
        b = recommended.best
        assert b is not None
        return (
            f"{recommended.label} is the largest model that finishes {budget.describe()}: "
            f"{b.conservative_ips:.1f} {IPS_P90} -> {fmt_days(b.days)} days, "
            f"{fmt_days(recommended.margin_days or 0.0)} days to spare"
        )
    if not any(r.status == "ok" for r in records):
        tried = sorted({r.batch_size for r in records if r.batch_size is not None})
        smallest = f"; the smallest batch tried was {tried[0]}" if tried else ""
        return (
            f"nothing fits: every configuration ran out of memory ({status_summary(records)}){smallest}. "
            "Try a smaller batch.size (or auto), model.grad_checkpointing, bf16-mixed or a larger device"
        )
    measured = [mv for mv in models if mv.best is not None]
    if not measured:
        return "no trial qualifies: none is ok within the policy (see each model's statuses and exclusions)"
    fastest = max(measured, key=lambda mv: mv.best.conservative_ips)  # type: ignore[union-attr]
    fb = fastest.best
    assert fb is not None
    epochs = f", {fastest.epochs_in_budget:.1f} epochs in the budget" if fastest.epochs_in_budget else ""
    return (
        f"no model finishes {budget.describe()}; it needs {needed:.1f} {IPS_P90}. The fastest, "
        f"{fastest.label}, reaches {fb.conservative_ips:.1f} {IPS_P90} -> {fmt_days(fb.days)} days"
        f"{epochs}"
    )


def _unstable_warning(recommended: ModelVerdict | None) -> str:
    """An unstable best trial: the figure the verdict rests on moved between its own windows."""
    best = recommended.best if recommended is not None else None
    if best is None or not best.unstable:
        return ""
    spread = f"differ by {best.spread:.0%}" if best.spread is not None else "disagree"
    return (
        f"the recommended trial is UNSTABLE: its timed windows {spread}, so its throughput is uncertain; "
        "measure it again with more measure.repeats (or longer measure.bench_steps) on a quiet machine "
        "before committing"
    )


def fmt_days(days: float) -> str:
    """Days to a precision that means something: 12.0, 0.54, 0.053."""
    return f"{days:.1f}" if days >= 1 else f"{days:.2g}"

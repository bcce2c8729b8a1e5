"""From trial records and a budget to GO / NO-GO / UNSETTLED: pure functions, plus the report's text and JSON.

Never talks to MLflow: ``dinox.store`` reads the records and logs what this module produces.

The policy in one paragraph: only ``ok`` trials count. A trial whose peak reserved memory is above
``max_memory_share`` of its device is not recommended (a run that close to the edge dies on day three). With
``effective_batch`` set, only trials with that effective batch count. Each trial gives a forecast (images over
all its timed windows' wall time: the expected rate) and a measured range (its slowest and fastest window).
Per model, the fastest qualifying trial by its forecast leads; trials whose ranges overlap the leader's are
tied with it (the measurement cannot order them) and the plan takes the slowest of them. A model is GO when
the budget holds at the slow end of that range and at least ``SETTLED_WINDOWS`` windows ran; NO-GO when it
fails even at the fast end; UNSETTLED otherwise. The recommendation is the largest model that is GO; with
none, the decision is UNSETTLED when some model is, else NO-GO.
"""

from __future__ import annotations

import math
import shlex
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from dinox import record as rec
from dinox.contract import one_line
from dinox.decide.budget import SECONDS_PER_DAY, Budget, DecisionError, fmt_cost, fmt_days
from dinox.decide.checks import MemoryCheck, ScalingRow, memory_checks, scaling
from dinox.decide.grouping import device_of, memory_groups, model_key, only_device, telling
from dinox.decide.knobs import Combination, KnobEffect, combinations, knob_effects
from dinox.decide.loader_findings import LoaderFindings, loader_findings
from dinox.decide.money import Need, Projection, WhatIf, needs, over_cost, projections, what_if
from dinox.decide.routine import routine_cost
from dinox.decide.types import Candidate, ModelVerdict, OomBoundary, Policy, Span, Verdict, Verification
from dinox.spec import params
from dinox.spec.sections import ROLES
from dinox.store.profile_table import ProfileSummary
from dinox.store.trial_record import IPS_WINDOWS, SETTLED_WINDOWS, TrialRecord, record_problem, store_text

# Statuses that say "it did not fit": a sweep of only these has an answer (nothing fits), not a failure.
_NO_FIT = ("oom", "skipped")


@dataclass
class Decision:
    verdict: Verdict
    budget: Budget
    policy: Policy
    models: list[ModelVerdict]
    recommended: ModelVerdict | None
    loader: LoaderFindings
    reason: str
    needed_ips: float  # the throughput the schedule needs (images over the timed windows' wall time)
    sources: list[str] = field(default_factory=list)  # experiments / runs the records came from
    notes: list[str] = field(default_factory=list)
    memory: list[MemoryCheck] = field(default_factory=list)
    scaling: list[ScalingRow] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (run, why): records that cannot be trusted
    unstable: str = ""  # why the recommendation's forecast is uncertain; "" when its windows agree
    unsettled: list[ModelVerdict] = field(default_factory=list)  # models whose evidence cannot decide
    remeasure: list[str] = field(default_factory=list)  # runs `dinox run --remeasure-unsettled` measures again
    spec_file: str = ""  # the spec the trials came from, where the command line named it
    capped: list[str] = field(default_factory=list)  # of `remeasure`, runs whose spec allows too few windows
    # The cheapest (model, device) that meets the deadline (and max_cost), where prices are known.
    cheapest: ModelVerdict | None = None
    what_if: list[WhatIf] = field(default_factory=list)  # the recommended at 0.5x / 1x / 2x the schedule
    needs: list[Need] = field(default_factory=list)  # what each NO-GO configuration would need
    projections: list[Projection] = field(default_factory=list)  # onto N devices, at a measured efficiency
    knobs: list[KnobEffect] = field(default_factory=list)  # what each varied param bought, measured
    combined: list[Combination] = field(default_factory=list)  # several at once, against the product

    @property
    def spec_arg(self) -> str:
        """The spec as a shell word for the commands the report prints (SPEC where it is not known)."""
        return shlex.quote(store_text(self.spec_file)) if self.spec_file else "SPEC"

    @property
    def settled(self) -> bool:
        return self.verdict != "UNSETTLED"

    @property
    def device_names(self) -> list[str]:
        """The devices the trials came from, in the models' order; one (or none named): decided as one."""
        return list(dict.fromkeys(mv.device for mv in self.models))

    @property
    def per_device(self) -> bool:
        return len(self.device_names) > 1

    def largest_go_on(self, device: str) -> ModelVerdict | None:
        """One device's verdict: its largest GO model."""
        go = [mv for mv in self.models if mv.device == device and mv.go]
        return max(go, key=lambda mv: mv.params_m or 0.0, default=None)

    def where(self, mv: ModelVerdict) -> str:
        """A model verdict in words: with its device when the trials came from several."""
        return f"{mv.label} on {mv.device}" if self.per_device else mv.label


# --- the policy ------------------------------------------------------------------------------------


def _configuration(r: TrialRecord, varying: set[str]) -> dict[str, str]:
    # The batch leads (what a recipe is read by), then the other shown fields in the spec's order.
    keys = sorted((k for k in ROLES.shown_keys() if k in r.params), key=lambda k: not k.startswith("batch."))
    keys += sorted(k for k in varying if k not in keys and k in r.params)
    return {k: r.params[k] for k in keys}


def _varying(records: list[TrialRecord]) -> set[str]:
    values: dict[str, set[str]] = defaultdict(set)
    for r in records:
        for k, v in r.params.items():
            values[k].add(v)
    keys = {k for k, vs in values.items() if len(vs) > 1 or any(k not in r.params for r in records)}
    # The model's kwargs are part of the model's key, shown with its name.
    return {k for k in keys if ROLES.describes(k) and not k.startswith(params.MODEL_KWARGS)}


def _candidate(
    r: TrialRecord, budget: Budget, policy: Policy, varying: set[str], verify: TrialRecord | None = None
) -> Candidate | None:
    m = r.metrics
    effective = r.effective_batch
    measured = m.get(rec.IMAGES_PER_S)
    if effective is None or measured is None or measured <= 0:
        return None
    p90, p50 = m.get(rec.STEP_S_P90), m.get(rec.STEP_S_P50)
    total, reserved = m.get(rec.DEVICE_MEM_TOTAL_GB), m.get(rec.PEAK_MEM_RESERVED_GB)
    share = reserved / total if total and reserved is not None else None
    excluded = ""
    if policy.effective_batch is not None and effective != policy.effective_batch:
        excluded = f"effective batch {effective} != {policy.effective_batch}"
    elif share is not None and share > policy.max_memory_share:
        excluded = f"peak reserved memory {share:.0%} of the device > {policy.max_memory_share:.0%}"
    unstable = r.tags.get(rec.UNSTABLE) == "true"
    spread = m.get(rec.WINDOW_SPREAD)
    if not excluded and unstable and policy.exclude_unstable:
        excluded = f"unstable: its timed windows differ by {spread:.0%}" if spread is not None else "unstable"
    windows = m.get(rec.WINDOWS)
    c = Candidate(
        run_id=r.run_id,
        run_name=r.run_name,
        configuration=_configuration(r, varying),
        effective_batch=effective,
        conservative_ips=effective / p90 if p90 else measured,
        median_ips=effective / p50 if p50 else measured,
        measured_ips=measured,
        memory_share=share,
        bound=r.tags.get(rec.BOUND, ""),
        days=0.0,
        excluded=excluded,
        mfu=m.get(rec.MFU),
        tflops=m.get(rec.TFLOPS),
        spread=spread,
        unstable=unstable,
        loader_cost=m.get(rec.LOADER_COST),
        bound_evidence=r.bound_evidence,
        window_min_ips=_rate(m.get(rec.IMAGES_PER_S_MIN)),
        window_max_ips=_rate(m.get(rec.IMAGES_PER_S_MAX)),
        profile=ProfileSummary.parse(r.tags.get(rec.PROFILE)),
        windows=int(windows) if windows is not None else None,
        epoch_start_s=m.get(rec.EPOCH_START_S, 0.0),
    )
    _apply_verification(c, verify)
    c.routine = routine_cost(r.params, m, budget, effective)
    c.days, c.days_slow, c.days_fast = (budget.days_for(ips, c.epoch_start_s, c.routine.seconds) for ips in c.rates)
    return c


def _apply_verification(c: Candidate, verify: TrialRecord | None) -> None:
    """Real training of the trial (dinox verify): shown beside it, and planned with where its rate falls
    outside the range the windows measured (the windows' spread cannot explain the difference)."""
    m = verify.metrics if verify is not None else {}
    ips, error = m.get(rec.VERIFY_IMAGES_PER_S), m.get(rec.FORECAST_ERROR)
    if verify is None or ips is None or error is None or not (math.isfinite(ips) and ips > 0):
        return
    c.verified = Verification(verify.run_id, ips, error)
    if not c.slow_ips <= ips <= c.fast_ips:
        c.windows_ips, c.measured_ips = c.measured_ips, ips
        c.window_min_ips, c.window_max_ips = min(c.slow_ips, ips), max(c.fast_ips, ips)


def _rate(value: float | None) -> float | None:
    return value if value is not None and value > 0 else None


def _oom_boundaries(records: list[TrialRecord]) -> list[OomBoundary]:
    groups = memory_groups(records)
    out = []
    for settings, rs in zip(telling(list(groups)), groups.values(), strict=True):
        oks = [r.batch_size for r in rs if r.status == "ok"]
        ooms = [r.batch_size for r in rs if r.status == "oom"]
        if ooms:
            out.append(OomBoundary(settings, max(oks) if oks else None, min(ooms)))  # type: ignore[type-var]
    return out


def _model_verdict(
    key: str,
    name: str,
    kwargs: dict[str, str],
    records: list[TrialRecord],
    budget: Budget,
    policy: Policy,
    device: tuple[str, int],
    verified: dict[str, TrialRecord],
) -> ModelVerdict:
    statuses: dict[str, int] = defaultdict(int)
    for r in records:
        statuses[r.status or "unknown"] += 1
    params_m = next((r.metrics[rec.PARAMS_M] for r in records if rec.PARAMS_M in r.metrics), None)
    varying = _varying(records)
    candidates = [
        c for r in records if r.status == "ok" if (c := _candidate(r, budget, policy, varying, verified.get(r.run_id)))
    ]
    candidates.sort(key=lambda c: -c.measured_ips)
    mv = ModelVerdict(key, name, kwargs, params_m, len(records), dict(statuses), candidates, _oom_boundaries(records))
    mv.device_name, mv.devices = device
    qualifying = [c for c in candidates if not c.excluded]
    if qualifying:
        mv.verdict, group = _verdict(qualifying, budget, device)
        mv.best, mv.tied = group[0], group[1:]
        mv.span = span = _span(group, budget, device)
        mv.unsettled_why = _unsettled_why(mv, budget) if mv.verdict == "UNSETTLED" else ""
        mv.cost = span.cost
        mv.over_cost = over_cost(span.cost_slow, mv.device_name, budget)
        mv.margin_days = budget.days - span.days_slow
        mv.images_in_budget = budget.images_in_budget(span.forecast_ips)
        if budget.dataset_size:
            mv.epochs_in_budget = mv.images_in_budget / budget.dataset_size
    return mv


def _verdict(qualifying: list[Candidate], budget: Budget, device: tuple[str, int]) -> tuple[Verdict, list[Candidate]]:
    """The model's verdict and the trials its plan rests on (the leader first, then those tied with it).

    GO where some trial holds the budget (and budget.max_cost) at its slowest window with enough windows to
    have one; the leader is the fastest of those by its forecast. NO-GO where every trial fails even at its
    fastest window. UNSETTLED otherwise, led by the fastest trial still open. `qualifying`: fastest first."""

    def holds(c: Candidate, days: float) -> bool:
        return days <= budget.days and not over_cost(budget.cost(days, *device), device[0], budget)

    settled_go = [c for c in qualifying if (c.windows or 0) >= SETTLED_WINDOWS and holds(c, c.days_slow)]
    open_ = [c for c in qualifying if holds(c, c.days_fast)]
    verdict: Verdict = "GO" if settled_go else "UNSETTLED" if open_ else "NO-GO"
    pool = settled_go or open_ or qualifying
    return verdict, [pool[0], *(c for c in pool[1:] if c.overlaps(pool[0]))]


def _span(group: list[Candidate], budget: Budget, device: tuple[str, int]) -> Span:
    """The plan of a leader and the trials tied with it: the slowest forecast of them, the slowest window of
    them and the leader's fastest."""
    planned = min(group, key=lambda c: c.measured_ips)
    slowest = min(group, key=lambda c: c.slow_ips)
    span = Span(
        planned.measured_ips, slowest.slow_ips, group[0].fast_ips, planned.days, slowest.days_slow, group[0].days_fast
    )
    days = (span.days, span.days_slow, span.days_fast)
    span.cost, span.cost_slow, span.cost_fast = (budget.cost(d, *device) for d in days)
    return span


def _unsettled_why(mv: ModelVerdict, budget: Budget) -> str:
    """Why the evidence cannot decide: too few windows behind the plan, or a range that straddles the budget."""
    span = mv.span
    assert span is not None and mv.best is not None
    few = [c for c in (mv.best, *mv.tied) if (c.windows or 0) < SETTLED_WINDOWS]
    if few:
        counts = ", ".join(f"{c.run_name or c.run_id}: {c.windows or 'no count of'}" for c in few[:3])
        return (
            f"too few timed windows to show how far the rate moves ({counts}; a GO needs {SETTLED_WINDOWS}), "
            "so no slow end was measured"
        )
    ends = f"{fmt_days(span.days_fast)} days at the fastest window, {fmt_days(span.days_slow)} at the slowest"
    return f"the budget lies inside the measured range ({ends})"


def decide(
    records: list[TrialRecord],
    budget: Budget,
    policy: Policy | None = None,
    verified: dict[str, TrialRecord] | None = None,
) -> Decision:
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
    models = _model_verdicts(records, budget, policy, verified or {})
    needed = budget.images_needed / (budget.days * SECONDS_PER_DAY * budget.utilization)
    go = [mv for mv in models if mv.go]
    # The largest GO model; measured GO on several devices, the cheapest of them (else the fastest).
    recommended = min(go, key=_preference) if go else None
    unsettled = sorted((mv for mv in models if mv.verdict == "UNSETTLED"), key=_preference)
    verdict: Verdict = "GO" if recommended is not None else "UNSETTLED" if unsettled else "NO-GO"
    # A GO stands on its own evidence; a larger model left unsettled could still change the recommendation.
    size = (recommended.params_m or 0.0) if recommended is not None else math.inf
    bigger = [mv for mv in unsettled if (mv.params_m or 0.0) > size]
    rows = scaling(records)
    return Decision(
        verdict=verdict,
        budget=budget,
        policy=policy,
        models=models,
        recommended=recommended,
        loader=loader_findings(records, policy.knee_tolerance),
        reason=_reason(records, models, recommended, unsettled, budget, needed),
        needed_ips=needed,
        memory=memory_checks(records),
        knobs=(effects := knob_effects(records)),
        combined=combinations(records, effects),
        scaling=rows,
        left_out=left_out,
        unstable=_unstable_warning(recommended),
        unsettled=unsettled,
        remeasure=_behind(records, unsettled if recommended is None else bigger, lambda r: r.unsettled),
        capped=_behind(records, unsettled if recommended is None else bigger, lambda r: r.few_windows and r.capped),
        notes=[_bigger_note(mv) for mv in bigger],
        cheapest=min((mv for mv in go if mv.cost is not None), key=_cost_or_inf, default=None),
        what_if=what_if(recommended, budget) if recommended is not None else [],
        needs=needs(models, budget),
        projections=projections(models, rows, budget),
    )


def _model_verdicts(
    records: list[TrialRecord], budget: Budget, policy: Policy, verified: dict[str, TrialRecord]
) -> list[ModelVerdict]:
    """One verdict per model and device that measured it: records from two machines are never mixed."""
    groups: dict[tuple[str, tuple[str, int]], list[TrialRecord]] = defaultdict(list)
    names: dict[str, tuple[str, dict[str, str]]] = {}
    default = only_device(records)
    for r in records:
        key, name, kwargs = model_key(r)
        groups[(key, device_of(r, default))].append(r)
        names[key] = (name, kwargs)
    models = [_model_verdict(k, *names[k], rs, budget, policy, device, verified) for (k, device), rs in groups.items()]
    models.sort(key=lambda mv: (-(mv.params_m or 0.0), mv.key, mv.device))
    return models


def _preference(mv: ModelVerdict) -> tuple[float, float, float]:
    return -(mv.params_m or 0.0), _cost_or_inf(mv), _days(mv)


def _behind(records: list[TrialRecord], models: list[ModelVerdict], which: Callable[[TrialRecord], bool]) -> list[str]:
    """The runs behind these models' plans that `which` picks, by run name: those `dinox run
    --remeasure-unsettled` measures again (r.unsettled), or those whose spec caps their windows below a GO's."""
    ids = {c.run_id for mv in models if mv.best is not None for c in (mv.best, *mv.tied)}
    return [r.run_name or r.run_id for r in records if r.run_id in ids and which(r)]


def _bigger_note(mv: ModelVerdict) -> str:
    return f"{mv.label} is larger and UNSETTLED ({mv.unsettled_why}): settled, it could be recommended instead"


def _cost_or_inf(mv: ModelVerdict) -> float:
    return mv.cost if mv.cost is not None else math.inf


def _days(mv: ModelVerdict) -> float:
    return mv.days


def status_summary(records: list[TrialRecord]) -> str:
    """`5 trials: error 4, crashed 1`."""
    counts = Counter(r.status or "unknown" for r in records)
    return f"{len(records)} trial{'s' if len(records) != 1 else ''}: " + ", ".join(
        f"{k} {v}" for k, v in counts.most_common()
    )


def _check_something_measured(records: list[TrialRecord]) -> None:
    if any(r.status == "ok" for r in records) or all(r.status in _NO_FIT for r in records):
        return
    errors = Counter(one_line(r.tags.get(rec.ERROR, ""), 200) for r in records if r.status not in _NO_FIT)
    error, n = errors.most_common(1)[0]
    commonest = f"; the commonest error ({n}x): {error}" if error else ""
    raise DecisionError(f"nothing was measured ({status_summary(records)}){commonest}")


def _reason(
    records: list[TrialRecord],
    models: list[ModelVerdict],
    recommended: ModelVerdict | None,
    unsettled: list[ModelVerdict],
    budget: Budget,
    needed: float,
) -> str:
    per_device = len({mv.device for mv in models}) > 1

    def where(mv: ModelVerdict) -> str:
        return f"{mv.label} on {mv.device}" if per_device else mv.label

    if recommended is not None:
        span = recommended.span
        assert span is not None
        cost = f", costing {fmt_cost(recommended.cost)}" if recommended.cost is not None else ""
        return (
            f"{recommended.label} is the largest model that finishes {budget.describe()}"
            f"{f', on {recommended.device}' if per_device else ''}: forecast {span.forecast_ips:.1f} "
            f"{IPS_WINDOWS} -> {fmt_days(span.days)} days{cost}; even at the slowest window measured "
            f"({span.slow_ips:.1f} img/s, {fmt_days(span.days_slow)} days) "
            f"{fmt_days(recommended.margin_days or 0.0)} days to spare"
        )
    if unsettled:
        mv = unsettled[0]
        span = mv.span
        assert span is not None
        return (
            f"not settled: {where(mv)} would finish {budget.describe()} at its forecast, {span.forecast_ips:.1f} "
            f"{IPS_WINDOWS} -> {fmt_days(span.days)} days, but {mv.unsettled_why}"
        )
    if not any(r.status == "ok" for r in records):
        tried = sorted({r.batch_size for r in records if r.batch_size is not None})
        smallest = f"; the smallest batch tried was {tried[0]}" if tried else ""
        return (
            f"nothing fits: every configuration ran out of memory ({status_summary(records)}){smallest}. "
            "Try a smaller batch.size (or auto), model.grad_checkpointing, bf16-mixed or a larger device"
        )
    measured = [mv for mv in models if mv.span is not None]
    if not measured:
        return "no trial qualifies: none is ok within the policy (see each model's statuses and exclusions)"
    fastest = max(measured, key=lambda mv: mv.span.fast_ips)  # type: ignore[union-attr]
    fs = fastest.span
    assert fs is not None
    epochs = f", {fastest.epochs_in_budget:.1f} epochs in the budget" if fastest.epochs_in_budget else ""
    in_time = [mv for mv in measured if mv.over_cost and _days(mv) <= budget.days]
    money = f"; {where(in_time[0])} meets the deadline but {in_time[0].over_cost}" if in_time else ""
    return (
        f"no model finishes {budget.describe()}, even at the fastest window measured; it needs {needed:.1f} "
        f"{IPS_WINDOWS}. The fastest, {where(fastest)}, reaches {fs.fast_ips:.1f} img/s at its fastest window "
        f"-> {fmt_days(fs.days_fast)} days (forecast {fs.forecast_ips:.1f} {IPS_WINDOWS}, "
        f"{fmt_days(fs.days)} days){epochs}{money}"
    )


def _unstable_warning(recommended: ModelVerdict | None) -> str:
    """An unstable best trial: the GO holds at its slowest window, but its forecast moved between windows."""
    best = recommended.best if recommended is not None else None
    if best is None or not best.unstable:
        return ""
    spread = f"differ by {best.spread:.0%}" if best.spread is not None else "disagree"
    return (
        f"the recommended trial's timed windows {spread}: the GO holds at the slowest of them, but its forecast "
        "is uncertain; `dinox run SPEC --remeasure-unsettled` on a quiet machine narrows it"
    )

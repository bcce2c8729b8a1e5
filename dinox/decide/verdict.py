"""From trial records and a budget to GO / NO-GO / UNSETTLED: pure functions, plus the report's text and JSON.

Never talks to MLflow: ``dinox.store`` reads the records and logs what this module produces.

The policy in one paragraph: only ``ok`` trials count. A trial whose peak reserved memory is above
``max_memory_share`` of its device is not recommended (a run that close to the edge dies on day three). With
``effective_batch`` set, only trials with that effective batch count. Each trial gives a forecast (images over
all its timed windows' wall time: the expected rate) and a measured range (its slowest and fastest window).
Per model, the fastest qualifying trial by its forecast leads; trials whose ranges overlap the leader's are
tied with it (the measurement cannot order them), as are those closer than the box moved between their
sweeps, or while their one sweep ran, where the store shows a move (``decide.occasions``), and the plan takes
the slowest of them, the configuration it recommends. Trials measured again head to head
(``decide.head_to_head``) are planned with their rounds' figures and ordered by the rounds: one settled slower
than another neither leads nor ties. A model is GO when the budget holds at the slow end of that range and at
least ``SETTLED_WINDOWS`` windows ran; NO-GO when it fails even at the fast end; UNSETTLED otherwise. The
recommendation is the largest model that is GO; with none, the decision is UNSETTLED when some model is, else
NO-GO.
"""

from __future__ import annotations

import math
import shlex
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from dinox import record as rec
from dinox.decide import reasons
from dinox.decide.budget import SECONDS_PER_DAY, Budget, DecisionError, fmt_days
from dinox.decide.candidates import bouts, candidate, contested, moved_apart, order, tied, varying
from dinox.decide.checks import MemoryCheck, ScalingRow, memory_checks, scaling
from dinox.decide.grouping import device_of, memory_groups, model_key, only_device, telling
from dinox.decide.head_to_head import HeadToHead
from dinox.decide.knobs import Combination, KnobEffect, combinations, knob_effects
from dinox.decide.loader_findings import LoaderFindings, loader_findings
from dinox.decide.money import Need, Projection, WhatIf, needs, over_cost, projections, what_if
from dinox.decide.occasions import Move, moves
from dinox.decide.types import Candidate, ModelVerdict, OomBoundary, Policy, Span, Verdict
from dinox.store.trial_record import SETTLED_WINDOWS, TrialRecord, record_problem, store_text


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
    contested: list[Candidate] = field(default_factory=list)  # tied leaders `dinox head-to-head` would order
    spec_file: str = ""  # the spec the trials came from, where the command line named it
    sets: tuple[str, ...] = ()  # the `--set`s the trials were measured with (one sweep's), for the commands
    capped: list[str] = field(default_factory=list)  # of `remeasure`, runs whose spec allows too few windows
    # The cheapest (model, device) that meets the deadline (and max_cost), where prices are known.
    cheapest: ModelVerdict | None = None
    what_if: list[WhatIf] = field(default_factory=list)  # the recommended at 0.5x / 1x / 2x the schedule
    needs: list[Need] = field(default_factory=list)  # what each NO-GO configuration would need
    projections: list[Projection] = field(default_factory=list)  # onto N devices, at a measured efficiency
    knobs: list[KnobEffect] = field(default_factory=list)  # what each varied param bought, measured
    combined: list[Combination] = field(default_factory=list)  # several at once, against the product
    shrunk: bool = False  # some trials were measured with `dinox run --shrink`: a small stand-in, never settled

    def spec_words(self, without: frozenset[str] = frozenset()) -> str:
        """The spec as shell words for the commands the report prints (SPEC where it is not known), with the
        `--set`s its trials were measured with (without them the same spec names other trials), less those of
        the fields in `without` (where the advice is to change them)."""
        spec = shlex.quote(store_text(self.spec_file)) if self.spec_file else "SPEC"
        kept = [s for s in self.sets if s.partition("=")[0].strip() not in without]
        return " ".join([spec, *(f"--set {shlex.quote(store_text(s))}" for s in kept)])

    spec_arg = property(spec_words)  # every --set kept

    @property
    def settled(self) -> bool:
        return self.verdict != "UNSETTLED" and not self.shrunk

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
    rematches: dict[str, HeadToHead],
    shifts: dict[frozenset[str], Move],
) -> ModelVerdict:
    statuses: dict[str, int] = defaultdict(int)
    for r in records:
        statuses[r.status or "unknown"] += 1
    params_m = next((r.metrics[rec.PARAMS_M] for r in records if rec.PARAMS_M in r.metrics), None)
    shown = varying(records)
    ok = [r for r in records if r.status == "ok"]
    built = (
        candidate(r, budget, policy, shown, verified.get(r.run_id), rematches.get(r.run_id), _moved(r, shifts))
        for r in ok
    )
    candidates = [c for c in built if c is not None]
    candidates.sort(key=lambda c: -c.measured_ips)
    mv = ModelVerdict(key, name, kwargs, params_m, len(records), dict(statuses), candidates, _oom_boundaries(records))
    mv.device_name, mv.devices = device
    qualifying = [c for c in candidates if not c.excluded]
    if qualifying:
        mv.verdict, group = _verdict(qualifying, budget, device, rematches, shifts)
        mv.span = span = _span(group, budget, device)
        # The plan takes the slowest forecast of a tie, so the tie's trial with that forecast is the one
        # recommended: the forecast is then its own (what `dinox verify` holds against its training), never a
        # faster-measured tied trial's planned at another's rate (pessimistic by the tie's width).
        mv.lead, planned = group[0], min(group, key=lambda c: c.measured_ips)
        mv.best, mv.tied = planned, [c for c in group if c is not planned]
        mv.moved = {c.run_id: m for c in group[1:] if (m := moved_apart(rematches, mv.lead, c, shifts))}
        mv.bouts = bouts(mv.lead, qualifying, rematches)
        mv.unsettled_why = _unsettled_why(mv, budget) if mv.verdict == "UNSETTLED" else ""
        mv.cost = span.cost
        mv.over_cost = over_cost(span.cost_slow, mv.device_name, budget)
        mv.margin_days = budget.days - span.days_slow
        mv.images_in_budget = budget.images_in_budget(span.forecast_ips)
        if budget.dataset_size:
            mv.epochs_in_budget = mv.images_in_budget / budget.dataset_size
    return mv


def _moved(r: TrialRecord, shifts: dict[frozenset[str], Move]) -> Move | None:
    """The move its sweep's drift check shows while the sweep ran, if it shows one."""
    sweep = r.tags.get(rec.PARENT_RUN, "")
    return shifts.get(frozenset((sweep,))) if sweep else None


def _verdict(
    qualifying: list[Candidate],
    budget: Budget,
    device: tuple[str, int],
    rematches: dict[str, HeadToHead],
    shifts: dict[frozenset[str], Move],
) -> tuple[Verdict, list[Candidate]]:
    """The model's verdict and the trials its plan rests on (the leader first, then those tied with it).

    GO where some trial holds the budget (and budget.max_cost) at its slowest window with enough windows to
    have one; the leader is the fastest of those by its forecast that no head-to-head found slower than
    another. NO-GO where every trial fails even at its fastest window. UNSETTLED otherwise, led by the
    fastest trial still open. Tied with the leader: the trials whose ranges overlap its own, unless a
    head-to-head settled their order, and those closer than a move the store shows (between their sweeps, or
    while their one sweep ran).
    `qualifying`: fastest first."""

    def holds(c: Candidate, days: float) -> bool:
        return days <= budget.days and not over_cost(budget.cost(days, *device), device[0], budget)

    settled_go = [c for c in qualifying if (c.windows or 0) >= SETTLED_WINDOWS and holds(c, c.days_slow)]
    open_ = [c for c in qualifying if holds(c, c.days_fast)]
    verdict: Verdict = "GO" if settled_go else "UNSETTLED" if open_ else "NO-GO"
    pool = settled_go or open_ or qualifying
    # A trial a head-to-head settled slower than another cannot be the fastest: it neither leads nor ties.
    unbeaten = [c for c in pool if not any(order(rematches, other, c) > 0 for other in pool)] or pool
    lead = unbeaten[0]
    return verdict, [lead, *(c for c in unbeaten if c is not lead and tied(rematches, lead, c, shifts))]


def _span(group: list[Candidate], budget: Budget, device: tuple[str, int]) -> Span:
    """The plan of a leader and the trials tied with it: the slowest forecast of them, the slowest window of
    them and the leader's fastest."""
    planned = min(group, key=lambda c: c.measured_ips)
    slowest = min(group, key=lambda c: c.slow_ips)
    span = Span(
        planned.measured_ips, slowest.slow_ips, group[0].fast_ips, planned.days, slowest.days_slow, group[0].days_fast
    )
    span.drift = max(c.drift for c in group)
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
    if span.drift:
        ends += f", each widened by the {span.drift:.1%} its sweep moved while it ran"
    return f"the budget lies inside the measured range ({ends})"


def decide(
    records: list[TrialRecord],
    budget: Budget,
    policy: Policy | None = None,
    verified: dict[str, TrialRecord] | None = None,
    rematches: dict[str, HeadToHead] | None = None,
    earlier: list[TrialRecord] | None = None,
) -> Decision:
    """`verified`: each trial run's latest verification; `rematches`: each trial run's latest head-to-head
    (dinox.decide.head_to_head.read); `earlier`: the runs the records superseded, oldest first (what shows
    the box moving between sweeps: dinox.decide.occasions). Raises DecisionError when nothing can be decided:
    no records, none usable, or none measured (every trial failed for a reason other than memory). Every
    configuration out of memory is a NO-GO."""
    policy = policy or Policy()
    if not records:
        raise DecisionError("no trial runs to decide on")
    left_out = [(r.run_name or r.run_id, why) for r in records if (why := record_problem(r))]
    records = [r for r in records if not record_problem(r)]
    if not records:
        raise DecisionError(
            f"none of the {len(left_out)} trial records can be used: {left_out[0][0]}: {left_out[0][1]}"
        )
    reasons.check_something_measured(records)
    shifts = moves([*(r for r in earlier or [] if not record_problem(r)), *records])
    models = _model_verdicts(records, budget, policy, verified or {}, rematches or {}, shifts)
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
        reason=reasons.reason(records, models, recommended, unsettled, budget, needed),
        needed_ips=needed,
        memory=memory_checks(records),
        knobs=(effects := knob_effects(records, shifts)),
        combined=combinations(records, effects, shifts),
        scaling=rows,
        left_out=left_out,
        unstable=reasons.unstable_warning(recommended),
        unsettled=unsettled,
        remeasure=_behind(records, unsettled if recommended is None else bigger, lambda r: r.unsettled),
        capped=_behind(records, unsettled if recommended is None else bigger, lambda r: r.few_windows and r.capped),
        contested=contested(recommended or (unsettled[0] if unsettled else None)),
        notes=_notes(bigger, recommended or (unsettled[0] if unsettled else None), records, shifts),
        cheapest=min((mv for mv in go if mv.cost is not None), key=_cost_or_inf, default=None),
        what_if=what_if(recommended, budget) if recommended is not None else [],
        needs=needs(models, budget),
        projections=projections(models, rows, budget),
    )


def _model_verdicts(
    records: list[TrialRecord],
    budget: Budget,
    policy: Policy,
    verified: dict[str, TrialRecord],
    rematches: dict[str, HeadToHead],
    shifts: dict[frozenset[str], Move],
) -> list[ModelVerdict]:
    """One verdict per model and device that measured it: records from two machines are never mixed."""
    groups: dict[tuple[str, tuple[str, int]], list[TrialRecord]] = defaultdict(list)
    names: dict[str, tuple[str, dict[str, str]]] = {}
    default = only_device(records)
    for r in records:
        key, name, kwargs = model_key(r)
        groups[(key, device_of(r, default))].append(r)
        names[key] = (name, kwargs)
    models = [
        _model_verdict(k, *names[k], rs, budget, policy, device, verified, rematches, shifts)
        for (k, device), rs in groups.items()
    ]
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


def _notes(
    bigger: list[ModelVerdict],
    planned: ModelVerdict | None,
    records: list[TrialRecord],
    shifts: dict[frozenset[str], Move],
) -> list[str]:
    """What the decision adds beside its verdict: larger models left unsettled, windows too short to forecast,
    a sweep behind the plan (`planned`: the recommended model, else the first unsettled) that moved."""
    short = reasons.short_windows_note(planned if planned is not None and planned.go else None, records)
    moved = _moved_note(planned, shifts)
    return [_bigger_note(mv) for mv in bigger] + [n for n in (short, moved) if n]


def _moved_note(planned: ModelVerdict | None, shifts: dict[frozenset[str], Move]) -> str:
    """The sweep that measured the plan's trials moved while it ran (its drift check shares no rate with the
    first trial's own windows): the forecast is the box's pace of the minutes each trial was measured in, and
    real training may meet the other. Issue 33, 2026-12-01: a JPEG sweep whose check moved 17.7 % planned at
    49.7 img/s, and real training ran 55.0. Not said where the plan's trial was verified on a box that held
    still: its verification speaks for real training."""
    if planned is None or planned.best is None or (planned.best.verified and not planned.best.verified.moved):
        return ""
    sweeps = dict.fromkeys(c.sweep for c in (planned.best, *planned.tied) if c.sweep)
    move = next((m for s in sweeps if (m := shifts.get(frozenset((s,)))) is not None), None)
    if move is None:
        return ""
    return (
        f"the sweep that measured {planned.label}'s plan moved while it ran: {move.describe(str)}; its forecast "
        "is the box's pace of the minutes each trial was measured in, and real training may run at another "
        "(`dinox verify` holds the forecast against real training)"
    )


def _cost_or_inf(mv: ModelVerdict) -> float:
    return mv.cost if mv.cost is not None else math.inf


def _days(mv: ModelVerdict) -> float:
    return mv.days

"""Each ok trial as the policy sees it (a Candidate): its configuration, its forecast and measured range, and
what replaces the sweep's figures where the trial was measured again (a head-to-head's rounds) or trained for
real (a verification); and which candidates the measurement can order: a head-to-head's settled order, else
their sweep ranges where the box held still between their sweeps (order, tied, moved_apart), what the rounds
said of each (bouts), the tie still open (contested)."""

from __future__ import annotations

import math
from collections import defaultdict

from dinox import record as rec
from dinox.decide.budget import Budget
from dinox.decide.head_to_head import Bout, HeadToHead
from dinox.decide.occasions import Move
from dinox.decide.routine import routine_cost
from dinox.decide.types import Candidate, ModelVerdict, Policy, Rematch, Verification
from dinox.isolate.contention import policy_of
from dinox.spec import params
from dinox.spec.sections import ROLES
from dinox.store.profile_table import ProfileSummary
from dinox.store.trial_record import TrialRecord


def _configuration(r: TrialRecord, varying: set[str]) -> dict[str, str]:
    # The batch leads (what a recipe is read by), then the other shown fields in the spec's order.
    keys = sorted((k for k in ROLES.shown_keys() if k in r.params), key=lambda k: not k.startswith("batch."))
    keys += sorted(k for k in varying if k not in keys and k in r.params)
    return {k: r.params[k] for k in keys}


def varying(records: list[TrialRecord]) -> set[str]:
    """The params that differ between a model's trials (shown beside each), the model's own kwargs aside."""
    values: dict[str, set[str]] = defaultdict(set)
    for r in records:
        for k, v in r.params.items():
            values[k].add(v)
    keys = {k for k, vs in values.items() if len(vs) > 1 or any(k not in r.params for r in records)}
    # The model's kwargs are part of the model's key, shown with its name.
    return {k for k in keys if ROLES.describes(k) and not k.startswith(params.MODEL_KWARGS)}


def candidate(
    r: TrialRecord,
    budget: Budget,
    policy: Policy,
    varying: set[str],
    verify: TrialRecord | None = None,
    rematch: HeadToHead | None = None,
    moved: Move | None = None,
) -> Candidate | None:
    """The trial as the policy sees it: its forecast and measured range (the head-to-head's rounds where it
    was measured again so, then real training's rate where a verification fell outside them, else widened by
    `moved`, the move its sweep's drift check shows), the days each gives, and why the policy leaves it out, if
    it does. None: nothing to plan with."""
    m = r.metrics
    effective = r.effective_batch
    measured = m.get(rec.IMAGES_PER_S)
    if effective is None or measured is None or measured <= 0:
        return None
    p90, p50 = m.get(rec.STEP_S_P90), m.get(rec.STEP_S_P50)
    total, reserved = m.get(rec.DEVICE_MEM_TOTAL_GB), m.get(rec.PEAK_MEM_RESERVED_GB)
    share = reserved / total if total and reserved is not None else None
    unstable = r.tags.get(rec.UNSTABLE) == "true"
    spread = m.get(rec.WINDOW_SPREAD)
    excluded = _excluded(policy, effective, share, unstable, spread)
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
        epoch_restart_step_s=m.get(rec.EPOCH_RESTART_STEP_S),
        epoch_boundary_s=r.epoch_boundary_s,
        sweep=r.tags.get(rec.PARENT_RUN, ""),
        omp_wait_policy=r.tags.get(rec.OMP_WAIT_POLICY, ""),
    )
    _apply_head_to_head(c, rematch)
    _apply_verification(c, verify)
    _apply_move(c, moved)
    c.routine = routine_cost(r.params, m, budget, effective)
    c.days, c.days_slow, c.days_fast = (budget.days_for(ips, c.epoch_boundary_s, c.routine.seconds) for ips in c.rates)
    return c


def _excluded(policy: Policy, effective: int, share: float | None, unstable: bool, spread: float | None) -> str:
    """Why the policy leaves the trial out ("" where it does not): its effective batch, its memory, its
    unsettled windows (--exclude-unstable)."""
    if policy.effective_batch is not None and effective != policy.effective_batch:
        return f"effective batch {effective} != {policy.effective_batch}"
    if share is not None and share > policy.max_memory_share:
        return f"peak reserved memory {share:.0%} of the device > {policy.max_memory_share:.0%}"
    if unstable and policy.exclude_unstable:
        return f"unstable: its timed windows differ by {spread:.0%}" if spread is not None else "unstable"
    return ""


def _apply_verification(c: Candidate, verify: TrialRecord | None) -> None:
    """Real training of the trial (dinox verify): shown beside it, and planned with where its rate falls
    outside the range the windows measured (the windows' spread cannot explain the difference). Where its check
    windows said the box had moved (verify's UNDECIDED), the slice ran on another box than the windows: its rate
    only widens the range the verdict is read over, and the forecast stays the windows'."""
    m = verify.metrics if verify is not None else {}
    ips, error = m.get(rec.VERIFY_IMAGES_PER_S), m.get(rec.FORECAST_ERROR)
    if verify is None or ips is None or error is None or not (math.isfinite(ips) and ips > 0):
        return
    c.verified = Verification(verify.run_id, ips, error, moved=verify.tags.get(rec.VERIFY_MOVED) == "true")
    slow, fast = c.window_range
    if not slow <= ips <= fast:
        if not c.verified.moved:
            c.windows_ips, c.measured_ips = c.measured_ips, ips
            c.omp_wait_policy = verify.tags.get(rec.OMP_WAIT_POLICY, "")  # real training's rate: the step it trained
        c.window_min_ips, c.window_max_ips = min(slow, ips), max(fast, ips)
        c.widened = True


def _apply_move(c: Candidate, moved: Move | None) -> None:
    """Its sweep moved while it ran: the box ran at another pace at one end than at the other, the trial's
    windows are the pace of their minutes, and real training may meet either (issue 33: two quickstart sweeps
    of 2026-12-01 moved 37.0 and 40.8 % while they ran, their trials' windows a few % wide). Not where a
    head-to-head's rounds or real training on a box that held still replaced the sweep's figures."""
    if moved is None or c.rematch is not None or (c.verified is not None and not c.verified.moved):
        return
    c.drift = moved.gap
    c.checked = moved.after if moved.trial == (c.run_name or c.run_id) else None


def _apply_head_to_head(c: Candidate, h: HeadToHead | None) -> None:
    """Measured again head to head: the plan takes the rounds' figures (measured after the trial was chosen
    as a leader, so not the highest of noisy figures), the sweep's own is kept to be shown."""
    if h is None or not h.of(c.run_id):
        return
    slow, fast, windows = h.span(c.run_id)
    pooled, policy = len(h.planning(c.run_id)), h.policy(c.run_id)
    c.rematch = Rematch(h.group, len(h.of(c.run_id)), c.measured_ips, c.window_range, pooled, policy_of(policy))
    c.measured_ips, c.window_min_ips, c.window_max_ips, c.windows = h.pooled(c.run_id), slow, fast, windows
    c.omp_wait_policy = policy  # the step the rounds measured: verify trains it


def _rate(value: float | None) -> float | None:
    return value if value is not None and value > 0 else None


# --- ties and head-to-heads: which candidates the measurement can order ---------------------------------


def order(rematches: dict[str, HeadToHead], a: Candidate, b: Candidate) -> int:
    """What the last head-to-head of both settled: 1 a is faster, -1 b is, 0 not settled or never measured so."""
    h = _last_met(rematches, a, b)
    return 0 if h is None else h.bout(a.run_id, b.run_id).order


def tied(rematches: dict[str, HeadToHead], lead: Candidate, c: Candidate, moves: dict[frozenset[str], Move]) -> bool:
    """Measured head to head together, their rounds decide; else their measured ranges (one measurement each),
    unless the two came from sweeps the box moved between (`moves`: dinox.decide.occasions)."""
    if _met(rematches, lead, c):
        return order(rematches, lead, c) == 0
    return c.overlaps(lead) or moved_apart(rematches, lead, c, moves) is not None


def moved_apart(
    rematches: dict[str, HeadToHead], lead: Candidate, c: Candidate, moves: dict[frozenset[str], Move]
) -> Move | None:
    """The move that alone ties the two: their ranges would have ordered them, and no head-to-head of the two
    has. The move the store shows between their two sweeps (or, within one sweep, the move its drift check
    shows), where the two ranges lie closer than that move: each fast end raised by its noise (Move.noise: its
    size between sweeps, its gap within one), they share a rate. Ranges further apart than the box moved still
    order the two, as a knob's change beyond that noise is one."""
    if c.overlaps(lead) or _met(rematches, lead, c) or not lead.sweep or not c.sweep:
        return None
    move = moves.get(frozenset((lead.sweep, c.sweep)))
    if move is None or not c.overlaps(lead, slack=move.noise):
        return None
    return move


def _met(rematches: dict[str, HeadToHead], a: Candidate, b: Candidate) -> bool:
    """Measured head to head together: their rounds order them."""
    return _last_met(rematches, a, b) is not None


def _last_met(rematches: dict[str, HeadToHead], a: Candidate, b: Candidate) -> HeadToHead | None:
    """The last head-to-head both took part in (a's latest, or one before it); None: they never met."""
    h = rematches.get(a.run_id)
    return None if a is b or h is None else h.last_met(a.run_id, b.run_id)


def bouts(best: Candidate, qualifying: list[Candidate], rematches: dict[str, HeadToHead]) -> list[Bout]:
    """The leader against each other trial it met head to head, from the last head-to-head of the two, named as
    decide shows them: its latest head-to-head's first, then those of earlier ones against the trials it has
    not met since."""
    h = rematches.get(best.run_id)
    if h is None:
        return []
    out: dict[str, Bout] = {}
    for met in (h, *reversed(h.earlier)):
        if best.run_id in met.runs:
            met.names.update({c.run_id: c.run_name or c.run_id for c in qualifying})
            out |= {b.other: b for b in met.outcome(best.run_id) if b.other not in out}
    return list(out.values())


def contested(mv: ModelVerdict | None) -> list[Candidate]:
    """The plan's leader and the trials tied with it, where no head-to-head of them all has run yet."""
    if mv is None or mv.best is None or not mv.tied:
        return []
    met = {b.other for b in mv.bouts}  # the leader's bouts
    others = [c for c in (mv.best, *mv.tied) if c is not mv.lead]
    return [] if all(c.run_id in met for c in others) else [mv.lead, *others]

"""What each knob bought, measured: for every param a sweep varies, the pairs of trials equal in everything
else, and what changing it did to the throughput (images over the timed windows, the figure decide plans
with), to the peak memory and to the status (a knob that makes a batch run out of memory).

The field reports dinox grew from multiplied assumed speedups ("compile 1.2x, channels_last 1.15x, ...");
this is the same table from the trials themselves, each ratio with its range, its pair count, and whether it
stands out of the trials' own noise (the larger window spread of the two trials of a pair).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from dinox import record as rec
from dinox.decide.occasions import Move, between
from dinox.spec import params
from dinox.spec.sections import ROLES
from dinox.store.trial_record import (
    TrialRecord,
    measured_range,
    measured_spread,
    no_effect,
    pair_noise,
    within_noise,
)

# What changes a trial's speed besides its params: two trials that differ in any of these never pair (a
# 2-thread trial against a 1-thread one once read as "runtime.gc enabled -> frozen: 10.61x").
SPEED_CONTEXT = (
    rec.DEVICE_NAME,
    rec.TORCH_THREADS,
    rec.OMP_WAIT_POLICY,
    rec.TORCH_VERSION,
    rec.CUDA_VERSION,
    rec.TIMM_VERSION,
    rec.DINOX_VERSION,
)
MAX_COMBINED = 500  # trials of one group compared pairwise for the combinations (a sweep has far fewer)
DERIVED = params.BATCH_EFFECTIVE  # follows batch.size x accumulation: never a knob of its own


@dataclass
class Pair:
    before: TrialRecord
    after: TrialRecord


@dataclass
class KnobEffect:
    """One change of one param (`field` from `before` to `after`) over the pairs that differ only in it."""

    field: str
    before: str
    after: str
    ratios: list[float] = field(default_factory=list)  # after / before, img/s over the windows, ok pairs only
    quiet: list[bool] = field(default_factory=list)  # each ok pair's change within its noise (within_noise)
    memory_gb: list[float] = field(default_factory=list)  # after - before, peak reserved memory, ok pairs
    statuses: Counter = field(default_factory=Counter)  # "ok -> oom" and the like, pairs whose status changed
    unapplied: str = ""  # "no effect on cpu": the changed trials measured something else instead (dinox.note)

    @property
    def pairs(self) -> int:
        return len(self.ratios) + sum(self.statuses.values())

    @property
    def ratio(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None

    @property
    def within_noise(self) -> bool:
        """Every pair's change inside that pair's own noise: the knob did nothing the trials can tell."""
        return bool(self.quiet) and all(self.quiet)

    @property
    def memory(self) -> float | None:
        return statistics.median(self.memory_gb) if self.memory_gb else None

    def describe(self) -> str:
        """One line: `model.compile False -> True: 1.18x (1.12-1.25x, 4 pairs), memory +0.40 GiB`."""
        parts = []
        if self.ratio is not None:
            n, low, high = len(self.ratios), f"{min(self.ratios):.2f}", f"{max(self.ratios):.2f}"
            pairs = f"{n} pair{'s' if n > 1 else ''}"
            # One pair, or pairs that agree to the digits shown, have no range: `1.11x (1.11-1.11x, 2 pairs)` was
            # the figure three times.
            span = f"{low}-{high}x, {pairs}" if low != high else f"{low}x, {pairs}"
            if self.unapplied:
                parts.append(f"{self.unapplied} ({span})")
            elif self.within_noise:
                parts.append(f"within noise ({span})")
            else:
                parts.append(f"{self.ratio:.2f}x ({span if low != high else pairs})")
        if self.memory is not None:
            parts.append(f"memory {self.memory:+.2f} GiB")
        parts += [f"{n} pair{'s' if n > 1 else ''} {change}" for change, n in sorted(self.statuses.items())]
        return f"{self.field} {self.before} -> {self.after}: " + ", ".join(parts)


def knob_effects(records: list[TrialRecord], shifts: dict[frozenset[str], Move] | None = None) -> list[KnobEffect]:
    """Every varied param's effect, biggest first: status changes (a batch that no longer fits), then the
    ratios out of noise by their distance from 1, then those within noise. Pairs never cross devices; a pair
    from two sweeps the box moved between (`shifts`: dinox.decide.occasions) has that move in its noise."""
    usable = [r for r in records if r.status in ("ok", "oom")]
    varied = _varied(usable)
    effects: dict[tuple[str, str, str], KnobEffect] = {}
    for name in varied:
        for group in _groups_without(usable, name):
            for pair in _pairs(group, name):
                b, a = pair.before.params[name], pair.after.params[name]
                effect = effects.setdefault((name, b, a), KnobEffect(name, b, a))
                _add(effect, pair, shifts or {})
    out = [e for e in effects.values() if e.pairs]
    return sorted(out, key=lambda e: (-sum(e.statuses.values()), e.within_noise, -abs((e.ratio or 1.0) - 1)))


@dataclass
class Combination:
    """Several knobs changed at once: the measured ratio against the product of their single effects (the
    field reports' "speedups multiply", checked), over every pair of trials that made that change."""

    changes: tuple[str, ...]  # "model.compile False -> True", ...
    product: float
    ratios: list[float] = field(default_factory=list)  # each pair's after / before, img/s over the windows
    # Each pair's own noise, as a single knob's: the larger spread of its two trials' timed windows, and for
    # trials from two sweeps the box moved between, that move.
    noise: list[float] = field(default_factory=list)

    @property
    def measured(self) -> float:
        return statistics.median(self.ratios)

    @property
    def multiplies(self) -> bool:
        """Every pair's ratio within that pair's noise of the product: as far as these trials can tell, the
        single effects multiply."""
        return all(within_noise(r / self.product, n) for r, n in zip(self.ratios, self.noise, strict=True))


def combinations(
    records: list[TrialRecord], effects: list[KnobEffect], shifts: dict[frozenset[str], Move] | None = None
) -> list[Combination]:
    """The pairs of ok trials that differ in two or more varied params, all in the direction the single
    effects were measured in (and in nothing else), by the changes they make: what each pair did together,
    against the product, and each pair's noise (a move between their sweeps, `shifts`, in it as in a single
    knob's)."""
    single = {(k.field, k.before, k.after): k.ratio for k in effects if k.ratio is not None}
    by_key = {(k.field, k.before, k.after): k for k in effects}
    fields = sorted({k.field for k in effects})
    found: dict[tuple[str, ...], Combination] = {}
    # Only trials equal in every param but the varied ones can pair: grouped first, so a store of thousands
    # of trials is never compared all against all.
    groups: dict[tuple, list[TrialRecord]] = defaultdict(list)
    for r in records:
        if r.status == "ok" and _ips(r):
            rest = sorted(
                (k, v) for k, v in r.params.items() if k not in fields and k != DERIVED and ROLES.describes(k)
            )
            groups[(tuple(rest), _context(r))].append(r)
    for ok in groups.values():
        for a in ok[:MAX_COMBINED]:
            for b in ok[:MAX_COMBINED]:
                diff = [f for f in fields if a.params.get(f) != b.params.get(f)]
                keys = [(f, a.params.get(f, ""), b.params.get(f, "")) for f in diff]
                if len(diff) < 2 or not all(k in single for k in keys) or not _same_else(a, b, diff):
                    continue
                changes = tuple(f"{f} {x} -> {y}" for f, x, y in keys)
                product = math.prod(single[k] for k in keys)  # type: ignore[misc]
                measured = _ips(b) / _ips(a)  # type: ignore[operator]
                # A ladder's rungs make each single effect from one pair, the very pairs a combination chains:
                # the product is the measurement by construction and says nothing.
                if not (all(len(by_key[k].ratios) == 1 for k in keys) and math.isclose(measured, product)):
                    c = found.setdefault(changes, Combination(changes, product))
                    c.ratios.append(measured)
                    c.noise.append(_noise(a, b, between(a, b, shifts or {})))
    return sorted(found.values(), key=lambda c: (-len(c.changes), c.changes))


def _same_else(a: TrialRecord, b: TrialRecord, diff: list[str]) -> bool:
    keys = {k for k in (*a.params, *b.params) if ROLES.describes(k)} - {*diff, DERIVED}
    return all(a.params.get(k) == b.params.get(k) for k in keys) and _context(a) == _context(b)


def _context(r: TrialRecord) -> tuple[str, ...]:
    return tuple(r.tags.get(t, "") for t in SPEED_CONTEXT)


def _varied(records: list[TrialRecord]) -> list[str]:
    """The params that describe the workload and take more than one value among the records."""
    values: dict[str, set[str]] = defaultdict(set)
    for r in records:
        for k, v in r.params.items():
            if ROLES.describes(k):
                values[k].add(v)
    return sorted(k for k, vs in values.items() if len(vs) > 1 and k != DERIVED)


def _groups_without(records: list[TrialRecord], name: str) -> list[list[TrialRecord]]:
    """Trials equal in every workload param but `name` (and the effective batch, which follows the batch size
    and the accumulation), in the same speed context (device, threads, versions: SPEED_CONTEXT)."""
    groups: dict[tuple, list[TrialRecord]] = defaultdict(list)
    for r in records:
        if name in r.params:
            key = tuple(sorted((k, v) for k, v in r.params.items() if k not in (name, DERIVED) and ROLES.describes(k)))
            groups[(key, _context(r))].append(r)
    return list(groups.values())


def _pairs(group: list[TrialRecord], name: str) -> list[Pair]:
    """Within trials equal but for `name`, each value and the next in order (False then True, 8 then 16 then
    32, other values in the order the sweep ran them: fp32 then bf16-mixed on a ladder): one trial per value,
    the latest where a value repeats. Neighbours only: a param swept over many values gives a row per step,
    not one per pair of values (5,000 hostile records would give millions)."""
    by_value: dict[str, TrialRecord] = {}
    first: dict[str, int] = {}
    for r in group:
        value = r.params[name]
        by_value[value] = r
        tag = r.tags.get(rec.TRIAL_INDEX, "")
        index = int(tag) if tag.isdigit() else 1 << 30
        first[value] = min(first.get(value, index), index)
    values = sorted(by_value, key=lambda v: _order(v, first[v]))
    return [Pair(by_value[b], by_value[a]) for b, a in zip(values, values[1:], strict=False)]


def _order(value: str, first_index: int) -> tuple[int, float, str]:
    low = value.strip().lower()
    if low in ("false", "true"):
        return (0, float(low == "true"), "")
    try:
        return (1, float(value), "")
    except ValueError:
        return (2, float(first_index), value)


def _add(effect: KnobEffect, pair: Pair, shifts: dict[frozenset[str], Move]) -> None:
    b, a = pair.before, pair.after
    if b.status != a.status:
        effect.statuses[f"{b.status} -> {a.status}"] += 1
        return
    if b.status != "ok":
        return  # both out of memory: the knob changed nothing that was measured
    rb, ra = _ips(b), _ips(a)
    if rb is None or ra is None:
        return
    effect.ratios.append(ra / rb)
    moved = between(a, b, shifts)
    ranges = (measured_range(b.metrics), measured_range(a.metrics))
    effect.quiet.append(within_noise(ra / rb, _spreads(a, b), ranges, slack=moved.noise if moved else 0.0))
    label = no_effect(a.tags)  # every pair's changed trial must say so, or the knob did apply somewhere
    effect.unapplied = label if len(effect.ratios) == 1 or effect.unapplied == label else ""
    mb, ma = b.metrics.get(rec.PEAK_MEM_RESERVED_GB), a.metrics.get(rec.PEAK_MEM_RESERVED_GB)
    if mb is not None and ma is not None:
        effect.memory_gb.append(ma - mb)


def _noise(a: TrialRecord, b: TrialRecord, moved: Move | None) -> float:
    """What a change between two trials must stand out of: the larger of their windows' spreads, or the move
    between their two sweeps (or while their one sweep ran) where the box moved (`moved`: occasions.between)."""
    return max(_spreads(a, b), moved.noise if moved else 0.0)


def _spreads(a: TrialRecord, b: TrialRecord) -> float:
    """The larger of the two trials' window spreads (the default where neither measured one)."""
    return pair_noise(*(measured_spread(r.metrics) for r in (a, b)))


def _ips(r: TrialRecord) -> float | None:
    """The figure decide plans with: images over the timed windows' wall time."""
    ips = r.metrics.get(rec.IMAGES_PER_S)
    return ips if ips and ips > 0 else None

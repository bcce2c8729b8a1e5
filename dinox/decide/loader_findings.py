"""What the input pipeline says across a sweep: the worker count past which more workers stop paying (the
knee), whether pinned memory helps, and which trials wait on the loader or on the host."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from dinox import record as rec
from dinox.decide.grouping import groups_without, telling
from dinox.spec import params
from dinox.store.trial_record import TrialRecord


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
class EncodingRow:
    """Trials equal but for their shards, whose shards hold the same slices encoded differently."""

    settings: dict[str, str]
    images_per_s: dict[str, float]  # layout (png16, raw16) -> the best measured images/s
    loader_images_per_s: dict[str, float]  # layout -> what the input pipeline alone delivered


@dataclass
class LoaderFindings:
    knees: list[KneeRow] = field(default_factory=list)
    pin: list[PinRow] = field(default_factory=list)
    # (run name, model, measured ips, the costs its bound was read from): trials whose input pipeline sets the pace
    io_bound: list[tuple[str, str, float, str]] = field(default_factory=list)
    # (run name, model, measured ips): trials whose device waits on the host (Python, kernel launches)
    host_bound: list[tuple[str, str, float]] = field(default_factory=list)
    encodings: list[EncodingRow] = field(default_factory=list)
    # io_bound trials measured while other trials ran (`dinox run --devices`): disk, page cache and memory
    # bandwidth were shared, whatever cores each had
    io_bound_beside: list[str] = field(default_factory=list)

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


def loader_findings(records: list[TrialRecord], tolerance: float) -> LoaderFindings:
    ok = [r for r in records if r.status == "ok" and rec.IMAGES_PER_S in r.metrics]
    findings = LoaderFindings(knees=_knees(ok, tolerance), pin=_pins(ok), encodings=_encodings(ok))
    findings.io_bound = [
        (
            r.run_name or r.run_id,
            r.params.get(params.MODEL_NAME, "?"),
            r.metrics[rec.IMAGES_PER_S],
            r.bound_evidence,
        )
        for r in ok
        if r.tags.get(rec.BOUND) == "io_bound"
    ]
    findings.io_bound_beside = [
        r.run_name or r.run_id
        for r in ok
        if r.tags.get(rec.BOUND) == "io_bound" and int(r.tags.get(rec.CONCURRENT_TRIALS, "1")) > 1
    ]
    findings.host_bound = [
        (r.run_name or r.run_id, r.params.get(params.MODEL_NAME, "?"), r.metrics[rec.IMAGES_PER_S])
        for r in ok
        if r.tags.get(rec.BOUND) == "host_bound"
    ]
    return findings


def _loader_alone(r: TrialRecord) -> float | None:
    """What the input pipeline delivered alone, where the trial's record takes it as evidence: a trial that ran
    faster than its loader alone says that window was slowed (rec.BOUND_NOTE), and a slowed window shown as the
    loader's ceiling would sit below the rate beside it (61 img/s against 173, beside two busy processes)."""
    if rec.LOADER_IMAGES_PER_S not in r.metrics or rec.BOUND_NOTE in r.tags:
        return None
    return r.metrics[rec.LOADER_IMAGES_PER_S]


def _knees(ok: list[TrialRecord], tolerance: float) -> list[KneeRow]:
    """The worker knee: among trials equal in everything but loader.num_workers."""
    knees: list[tuple[tuple, list[tuple[int, float]], list[tuple[int, float]]]] = []
    for key, rs in groups_without(ok, params.LOADER_NUM_WORKERS):
        by_workers: dict[int, float] = {}
        ceiling: dict[int, float] = {}
        for r in rs:
            w = r.param_int(params.LOADER_NUM_WORKERS)
            if w is not None:
                by_workers[w] = max(by_workers.get(w, 0.0), r.metrics[rec.IMAGES_PER_S])
                if (alone := _loader_alone(r)) is not None:
                    ceiling[w] = max(ceiling.get(w, 0.0), alone)
        if len(by_workers) >= 2:
            knees.append((key, sorted(by_workers.items()), sorted(ceiling.items())))
    rows = []
    for settings, (_key, points, loader_points) in zip(telling([k for k, _, _ in knees]), knees, strict=True):
        best_w, best = max(points, key=lambda p: p[1])
        knee = min(w for w, ips in points if ips >= (1 - tolerance) * best)
        rows.append(KneeRow(settings, points, knee, best_w, best, loader_points))
    return rows


def _pins(ok: list[TrialRecord]) -> list[PinRow]:
    """Pinned memory: pairs equal in everything but loader.pin_memory."""
    pairs: list[tuple[tuple, float, float]] = []
    for key, rs in groups_without(ok, params.LOADER_PIN_MEMORY):
        pinned = [r.metrics[rec.IMAGES_PER_S] for r in rs if r.param_bool(params.LOADER_PIN_MEMORY)]
        unpinned = [r.metrics[rec.IMAGES_PER_S] for r in rs if r.param_bool(params.LOADER_PIN_MEMORY) is False]
        if pinned and unpinned:
            pairs.append((key, max(pinned), max(unpinned)))
    labels = telling([k for k, _, _ in pairs])
    return [PinRow(settings, on, off) for settings, (_k, on, off) in zip(labels, pairs, strict=True)]


def _encodings(ok: list[TrialRecord]) -> list[EncodingRow]:
    """PNG against raw CT shards: trials equal but for data.shards, whose shards' layouts differ."""
    groups = []
    for key, rs in groups_without(ok, params.DATA_SHARDS):
        layouts = {r.tags.get(rec.SHARD_LAYOUT) for r in rs} & {"png16", "raw16"}
        if len(layouts) == 2:
            groups.append((key, rs))
    rows = []
    for settings, (_key, rs) in zip(telling([k for k, _ in groups]), groups, strict=True):
        row = EncodingRow(settings, {}, {})
        for r in rs:
            layout = r.tags.get(rec.SHARD_LAYOUT, "")
            if layout in ("png16", "raw16"):
                row.images_per_s[layout] = max(row.images_per_s.get(layout, 0.0), r.metrics[rec.IMAGES_PER_S])
                if (alone := _loader_alone(r)) is not None:
                    row.loader_images_per_s[layout] = max(row.loader_images_per_s.get(layout, 0.0), alone)
        rows.append(row)
    return rows

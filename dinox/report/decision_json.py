"""The decision as programs read it: decision.json, and the decision run's params and metrics.

decision.json's shape is a contract (users' scripts read it); pydantic serialises the decision's dataclasses
into it, non-finite numbers as null.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from pydantic import TypeAdapter

from dinox import record as rec
from dinox.decide.knobs import KnobEffect
from dinox.decide.loader_findings import LoaderFindings
from dinox.decide.types import ModelVerdict
from dinox.decide.verdict import Decision
from dinox.report.settling import head_to_head_command, remeasure_command

_JSON = TypeAdapter(dict[str, Any])
# 2: verdict may be UNSETTLED (with settled, exit_code, unsettled, remeasure); days and images/s are the
# forecast over the timed windows, each model's span holds the slow and fast ends the verdict reads; needs'
# images_per_s and a knob's ratio are the windows' figure (were *_p90 and ratio_p90).
# Within 2, added: recommended.routine (the checkpoints and evaluation passes in its days, routine:); shrunk
# (trials of `dinox run --shrink`: then settled is false and exit_code 3 whatever the verdict); ties, beside
# tied_with / tied, saying why each trial is tied (head_to_head, moved, overlap) and the evidence in words;
# combined[]: measured is the median over every pair that made the changes (was one pair's), with pairs,
# ratios, noise (each pair's) and multiplies (every pair's ratio within its noise of the product); lead
# (recommended and each model: the fastest-measured trial of a tie, which the recommendation is not: it is the
# tie's slowest, the trial the plan's figure comes from); recommended.omp_wait_policy and best.omp_wait_policy (what
# OpenMP's waiting threads did in the measurement the forecast comes from: `dinox verify` trains with it);
# recommended.head_to_head.pooled_rounds (the rounds its figure pools: those under its latest round's policy);
# span.drift and best.drift (the move of the sweep behind it, by which the slow and fast ends are widened).
SCHEMA_VERSION = 2
# `dinox decide`'s exit code for each verdict (2 is an error: no verdict at all).
EXIT_CODES = {"GO": 0, "NO-GO": 1, "UNSETTLED": 3}


def exit_code(d: Decision) -> int:
    """A verdict the evidence did not settle (or one on shrunk trials) exits 3, whatever it reads."""
    return EXIT_CODES[d.verdict] if d.settled else EXIT_CODES["UNSETTLED"]


def to_json(d: Decision) -> dict[str, Any]:
    return json.loads(_JSON.dump_json(_payload(d)))


def dumps(d: Decision) -> str:
    return _JSON.dump_json(_payload(d), indent=2).decode() + "\n"


def _payload(d: Decision) -> dict[str, Any]:
    """The file's shape, holding the decision's own dataclasses; pydantic turns them into JSON."""
    return {
        "schema_version": SCHEMA_VERSION,
        "verdict": d.verdict,
        "settled": d.settled,
        "shrunk": d.shrunk,
        "exit_code": exit_code(d),
        "unsettled": [
            {"model": mv.label, "device": mv.device, "why": mv.unsettled_why, "span": mv.span} for mv in d.unsettled
        ],
        "remeasure": {"runs": d.remeasure, "command": remeasure_command(d) if d.remeasure else None},
        "head_to_head": (
            {"runs": [c.run_id for c in d.contested], "command": head_to_head_command(d)} if d.contested else None
        ),
        "unstable": d.unstable or None,
        "reason": d.reason,
        "recommended": _recommended(d.recommended),
        "models": [_model(mv) for mv in d.models],
        "budget": {
            **d.budget.model_dump(),
            "images_needed": d.budget.images_needed,
            "needed_images_per_s": d.needed_ips,
        },
        "policy": d.policy,
        "loader": _loader(d.loader),
        "sources": d.sources,
        "notes": d.notes,
        "memory_predictions": [asdict(c) | {"ratio": c.ratio} for c in d.memory],
        "scaling": [asdict(row) | {"efficiency": row.efficiency} for row in d.scaling],
        "left_out": [{"run": run, "why": why} for run, why in d.left_out],
        "devices": [_device(d, name) for name in d.device_names],
        "cheapest": _recommended(d.cheapest),
        "what_if": [asdict(w) | {"images": d.budget.images_needed * w.factor} for w in d.what_if],
        "needs": [
            {
                "model": n.model,
                "device": n.device,
                "images_per_s": n.has_ips,
                "needs_images_per_s": n.needs_ips,
                "factor": n.factor,
            }
            for n in d.needs
        ],
        "projections": [asdict(p) | {"images_per_s": p.ips} for p in d.projections],
        "knobs": [_knob(k) for k in d.knobs],
        "combined": [
            asdict(c) | {"measured": c.measured, "pairs": len(c.ratios), "multiplies": c.multiplies} for c in d.combined
        ],
    }


def _knob(k: KnobEffect) -> dict[str, Any]:
    """What one change of one param did, over the pairs equal in everything else."""
    return {
        "field": k.field,
        "from": k.before,
        "to": k.after,
        "pairs": k.pairs,
        "ratio": k.ratio,
        "no_effect": k.unapplied or None,
        "ratio_min": min(k.ratios) if k.ratios else None,
        "ratio_max": max(k.ratios) if k.ratios else None,
        "within_noise": k.within_noise,
        "memory_gb": k.memory,
        "status_changes": dict(k.statuses),
    }


def _device(d: Decision, device: str) -> dict[str, Any]:
    """One device's verdict: its largest GO model, as `recommended` for the whole decision."""
    best = d.largest_go_on(device)
    verdict = "GO" if best else "UNSETTLED" if any(mv.device == device for mv in d.unsettled) else "NO-GO"
    return {"device": device, "verdict": verdict, "recommended": _recommended(best)}


def _recommended(rec: ModelVerdict | None) -> dict[str, Any] | None:
    if rec is None or rec.best is None:
        return None
    return {
        "run_id": rec.best.run_id,
        "model": rec.name,
        "model_kwargs": rec.kwargs,
        "params_m": rec.params_m,
        "configuration": rec.best.configuration,
        "tied_with": [c.run_id for c in rec.tied],
        "lead": _lead(rec),
        "ties": [asdict(t) for t in rec.ties()],
        "head_to_head": _bouts(rec),
        "forecast_images_per_s": rec.ips,
        "span": rec.span,
        "images_per_s_p90": rec.best.conservative_ips,
        "images_per_s_p50": rec.best.median_ips,
        "mfu": rec.best.mfu,
        "days": rec.days,
        "margin_days": rec.margin_days,
        "epoch_start_s": rec.best.epoch_start_s,
        "epoch_boundary_s": rec.best.epoch_boundary_s,
        "omp_wait_policy": rec.best.omp_wait_policy or None,
        "routine": asdict(rec.best.routine) | {"seconds": rec.best.routine.seconds},
        "profile": rec.best.profile,
        "device": rec.device,
        "cost": rec.cost,
    }


def _lead(mv: ModelVerdict) -> str | None:
    """The fastest-measured trial of a tie (one of tied / tied_with); the plan and the recommendation take the
    slowest. None where nothing is tied."""
    return mv.lead.run_id if mv.tied and mv.lead is not None else None


def _bouts(mv: ModelVerdict) -> dict[str, Any] | None:
    """What a head-to-head of the leaders settled: each bout, and the sweep's figure the rounds replaced."""
    best = mv.best
    if best is None or best.rematch is None:
        return None
    r = best.rematch
    return {"id": r.group, "rounds": r.rounds, "pooled_rounds": r.pooled_rounds, "sweep_images_per_s": r.sweep_ips,
            "bouts": mv.bouts}  # fmt: skip


def _model(mv: ModelVerdict) -> dict[str, Any]:
    return {
        "model": mv.name,
        "model_kwargs": mv.kwargs,
        "key": mv.key,
        "params_m": mv.params_m,
        "trials": mv.trials,
        "statuses": mv.statuses,
        "verdict": mv.verdict,
        "unsettled_why": mv.unsettled_why or None,
        "best": mv.best,
        "tied": [c.run_id for c in mv.tied],
        "lead": _lead(mv),
        "ties": [asdict(t) for t in mv.ties()],
        "span": mv.span,
        "days": mv.days if mv.span else None,
        "device": mv.device,
        "device_name": mv.device_name,
        "devices": mv.devices,
        "cost": mv.cost,
        "over_cost": mv.over_cost or None,
        "margin_days": mv.margin_days,
        "epochs_in_budget": mv.epochs_in_budget,
        "images_in_budget": mv.images_in_budget,
        "excluded": [
            {"run_id": c.run_id, "run_name": c.run_name, "why": c.excluded} for c in mv.candidates if c.excluded
        ],
        "oom_boundary": mv.oom,
    }


def _loader(f: LoaderFindings) -> dict[str, Any]:
    return {
        "knees": f.knees,
        "pin_memory": [asdict(p) | {"ratio": p.ratio} for p in f.pin],
        "pin_memory_summary": f.pin_summary,
        "encodings": f.encodings,
        "io_bound": [
            {"run": n, "model": m, "images_per_s": ips, "bound_evidence": why} for n, m, ips, why in f.io_bound
        ],
        "host_bound": [{"run": n, "model": m, "images_per_s": ips} for n, m, ips in f.host_bound],
        "io_bound_beside_others": f.io_bound_beside,
    }


def log_params(d: Decision) -> dict[str, str]:
    """The decision's inputs, as MLflow params of the decision run."""
    out = {f"{rec.BUDGET_PREFIX}{k}": str(v) for k, v in d.budget.model_dump().items()}
    out.update({f"{rec.POLICY_PREFIX}{k}": str(v) for k, v in asdict(d.policy).items()})
    out[rec.SOURCES] = "; ".join(d.sources)[:500]
    return out


def log_metrics(d: Decision) -> dict[str, float]:
    out = {rec.NEEDED_IMAGES_PER_S: d.needed_ips, rec.MODELS: float(len(d.models))}
    if d.recommended is not None and d.recommended.best is not None:
        out[rec.RECOMMENDED_DAYS] = d.recommended.days
        out[rec.RECOMMENDED_IMAGES_PER_S] = d.recommended.ips  # type: ignore[assignment]
    return out

"""What a sweep leaves behind locally and says as it goes: results.csv (one row per trial, the figures first,
then the params), the one-line account of each trial, and the SweepReport the command prints at the end."""

from __future__ import annotations

import csv
import io
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dinox import record as rec
from dinox.contract import TrialResult
from dinox.errors import WorkdirError, shell_word
from dinox.plan.grid import Trial
from dinox.store import descriptions
from dinox.store.trial_record import (
    IPS_WINDOWS,
    measured_range,
    measured_spread,
    no_effect,
    pair_noise,
    within_noise,
)
from dinox.writes import write_whole

CSV_LEAD = [
    "index",
    "trial_id",
    "run_id",
    "label",
    "status",
    "bound",
    "bound_evidence",
    "unstable",
    rec.IMAGES_PER_S,
    rec.STEP_S_P50,
    rec.STEP_S_P90,
    rec.DATA_S,
    rec.H2D_S,
    rec.COMPUTE_S,
    rec.LOADER_COST,
    rec.TRANSFER_COST,
    rec.LOADER_IMAGES_PER_S,
    rec.DEVICE_IDLE_SHARE,
    rec.PEAK_MEM_ALLOCATED_GB,
    rec.PEAK_MEM_RESERVED_GB,
    rec.DEVICE_MEM_TOTAL_GB,
    rec.HOST_PEAK_RSS_GB,
    rec.PARAMS_M,
    "error",
]


@dataclass
class SweepReport:
    parent_run_id: str
    experiment_id: str
    sweep_dir: Path
    rows: list[dict[str, object]] = field(default_factory=list)
    results: list[TrialResult] = field(default_factory=list)
    resumed: list[tuple[Trial, str]] = field(default_factory=list)  # (trial, its recorded status)
    resumed_unsettled: int = 0  # of those, ok ones whose timed windows disagreed
    store_failures: int = 0
    # Parent-side seconds per measured trial, from opening its run to closing it.
    trial_loop_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    drift: str = ""  # what the drift check said (dinox.sweep.drift), for the parent run's description
    drift_gap: float = 0.0  # how far it showed the box moved while the sweep ran (dinox.contract.range_gap)

    def timeline(self) -> dict[str, float]:
        """Mean seconds per trial by phase; `overhead_s` is what is neither data setup, model build nor steps."""
        measured = [r for r in self.results if rec.TRIAL_WALL_S in r.metrics]
        n = len(measured)
        if not n:
            return {}
        mean = {
            k: sum(r.metrics.get(k, 0.0) for r in measured) / n
            for k in (
                rec.STARTUP_S,
                rec.SETUP_S,
                rec.DATA_SETUP_S,
                rec.BUILD_S,
                rec.MEASURE_S,
                rec.WINDOW_S,
                rec.TEARDOWN_S,
                rec.TRIAL_WALL_S,
            )
        }
        loop = sum(self.trial_loop_s) / len(self.trial_loop_s) if self.trial_loop_s else mean[rec.TRIAL_WALL_S]
        mean["recording_s"] = loop - mean[rec.TRIAL_WALL_S]
        mean["per_trial_s"] = loop
        mean["overhead_s"] = loop - mean[rec.DATA_SETUP_S] - mean[rec.BUILD_S] - mean[rec.MEASURE_S]
        return mean

    def summary(self, uri: str) -> list[tuple[str, bool]]:
        """What `dinox run` says at the end, as (line, to stderr)."""
        counts = ", ".join(f"{n} {s}" for s, n in sorted(Counter(r.status for r in self.results).items()))
        shaky = sum(r.status == "ok" and r.tags.get(rec.UNSTABLE) == "true" for r in self.results)
        if shaky:
            counts += f" ({shaky} of them unsettled: their timed windows disagreed)"
        resumed = f"; {len(self.resumed)} already recorded" if self.resumed else ""
        if self.resumed_unsettled:
            resumed += f" ({self.resumed_unsettled} unsettled, kept: --remeasure-unsettled measures them again)"
        done = f"dinox: sweep done in {self.wall_s:.1f}s: {counts or 'nothing run'}{resumed}."
        lines = [(f"{done} Results: {self.sweep_dir / 'results.csv'}", False)]
        t = self.timeline()
        if t:
            per_trial = (
                f"       per trial (mean): start-up {t[rec.STARTUP_S]:.1f}s, setup {t[rec.SETUP_S]:.1f}s, "
                f"measurement {t[rec.MEASURE_S]:.1f}s (timed windows {t[rec.WINDOW_S]:.1f}s of it), "
                f"teardown {t[rec.TEARDOWN_S]:.1f}s, "
                f"recording {t['recording_s']:.1f}s"
            )
            lines.append((per_trial, False))
        if self.store_failures:
            failed = (
                f"warning: {self.store_failures} tracking store call(s) failed; "
                f"run `dinox sync {shell_word(self.sweep_dir)}`"
            )
            lines.append((f"{failed} once the store is back", True))
        if uri.startswith("sqlite:///"):
            browse = f"mlflow ui --backend-store-uri {shell_word(uri)}"
            lines.append((f"       browse: {browse}  (then open http://127.0.0.1:5000)", False))
        return lines


def row(trial: Trial, run_id: str, r: TrialResult) -> dict[str, object]:
    row: dict[str, object] = {
        "index": trial.index,
        "trial_id": trial.trial_id,
        "run_id": run_id,
        "label": trial.label,
        "status": r.status,
        "bound": r.bound,
        "bound_evidence": r.tags.get(rec.BOUND_EVIDENCE, ""),
        "unstable": r.tags.get(rec.UNSTABLE, ""),
        "error": r.error,
        "note": r.tags.get(rec.NOTE, ""),
        "math_class": r.tags.get(rec.MATH_CLASS, "").split(" ")[0],  # MFU's peak: the class the math ran in
    }
    row.update({k: round(v, 6) for k, v in r.metrics.items()})
    row.update(trial.spec.flat_params())
    return row


def _shown(ips: float) -> str:
    """Images/s to three significant figures at least (12.3, 1.23, 0.123; 123.4 keeps its tenth)."""
    return f"{ips:.{1 if ips >= 10 else 2 if ips >= 1 else 3}f}"


def _rung_step(
    r: dict[str, object], prior: dict[str, object] | None, ips: float, before: float | None, moved: float
) -> str:
    """The speedup over the rung before, or why there is none to read: decide's knob rule, the sweep's move
    (its drift check's gap) in the pair's noise as decide puts it there."""
    if before is None or prior is None:
        return "-"
    if label := no_effect({rec.NOTE: str(r.get("note") or "")}):
        return label
    ratio = ips / before
    noise = pair_noise(*(measured_spread(x) for x in (r, prior)))
    ranges = (measured_range(prior), measured_range(r))
    return "within noise" if within_noise(ratio, noise, ranges, slack=moved) else f"{ratio:.2f}x"


def write_csv(path: Path, rows: list[dict[str, object]]) -> None:
    extra = sorted({k for row in rows for k in row} - set(CSV_LEAD))
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=CSV_LEAD + extra)
    writer.writeheader()
    writer.writerows(rows)
    write_whole(path, text.getvalue())


def describe(trial: Trial, r: TrialResult) -> str:
    m = r.metrics
    head = f"[{trial.index + 1:>{len(str(trial.total))}}/{trial.total}] {r.status:<8} {trial.label}"
    if rec.BATCH_AUTO_FIT in m and not trial.spec.batch.auto:
        head += f" (batch.size auto -> {trial.spec.size}: {int(m[rec.BATCH_AUTO_FIT])} fit, less the margin)"
    return f"{head} | {descriptions.trial_body(r.status, r.bound, m, r.error, r.tags)}"


def write_sweep_files(sweep_dir: Path, spec_text: str, trials: list[Trial]) -> None:
    """The spec as written, and every trial as validated (what each child is given). Raises WorkdirError."""
    normalized = [
        {"index": t.index, "trial_id": t.trial_id, "sweep_values": t.overrides, "spec": t.spec.model_dump(mode="json")}
        for t in trials
    ]
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / "spec.yaml").write_text(spec_text)
        (sweep_dir / "spec.normalized.yaml").write_text(yaml.safe_dump(normalized, sort_keys=False))
    except OSError as e:
        raise WorkdirError(e.errno, f"cannot write {sweep_dir}: {e.strerror or e}") from e


def ladder_lines(ladder: list[dict[str, object]], rows: list[dict[str, object]], moved: float = 0.0) -> list[str]:
    """An ablation ladder as the field reports' tables should have been: each rung's change, its figure (images
    over the timed windows, as decide plans with), the speedup over the rung before and over the base, and its
    peak memory, all measured. A step inside the pair's own noise, or a change the device did not apply, says
    so as decide's knob table does, instead of a speedup no reader should multiply. `moved`: how far the box
    moved while the sweep ran (its drift check's gap), in every rung's noise."""
    by_index = {int(r["index"]): r for r in rows}  # type: ignore[call-overload]
    head = ["rung", "change", IPS_WINDOWS, "step speedup", "cumulative", "peak GiB"]
    table: list[list[str]] = []
    base = before = None
    for i in range(len(ladder) + 1):
        change = "base" if i == 0 else " ".join(f"{k}={v}" for k, v in ladder[i - 1].items())
        r = by_index.get(i)
        ok = r is not None and r["status"] == "ok" and rec.IMAGES_PER_S in r
        # The figure as printed, and every ratio from it: a reader dividing two printed figures gets the
        # table's speedup (from unrounded ones, 6.35 and 23.5 printed 6.4 and 23.5 beside a 3.68x).
        ips = float(_shown(float(r[rec.IMAGES_PER_S]))) if ok else None  # type: ignore[index, arg-type]
        if r is None:
            cells = ["(recorded earlier)", "", "", ""]
        elif ips is None:
            cells = [str(r["status"]), "-", "-", "-"]
        else:
            peak = r.get(rec.PEAK_MEM_RESERVED_GB)
            step = _rung_step(r, by_index.get(i - 1), ips, before, moved) if i else "-"
            total = f"{ips / base:.2f}x" if base else "-"
            cells = [_shown(ips), step, total, f"{float(peak):.2f}" if peak is not None else "-"]  # type: ignore[arg-type]
        base = base if base is not None or i else ips
        before = ips
        table.append([str(i), change, *cells])
    widths = [max(len(h), *(len(row[c]) for row in table)) for c, h in enumerate(head)]
    lines = ["ablation ladder (each rung adds its change to the ones above):"]
    lines += ["  " + "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
    return lines

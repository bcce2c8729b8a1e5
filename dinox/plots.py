"""The decision's PNG plots: throughput against physical batch (OOM marked), days against the budget, and
throughput against loader workers. Pure rendering of a Decision and its records; no MLflow."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only: no display on a GPU box or in CI

import matplotlib.pyplot as plt  # noqa: E402

from dinox.decide import Decision, model_key  # noqa: E402
from dinox.records import TrialRecord  # noqa: E402


def write_plots(d: Decision, records: list[TrialRecord], out: Path) -> list[Path]:
    paths = [_throughput_vs_batch(d, records, out / "throughput_vs_batch.png"), _days(d, out / "days_vs_budget.png")]
    if d.loader.knees:
        paths.append(_workers(d, out / "throughput_vs_workers.png"))
    return paths


def _throughput_vs_batch(d: Decision, records: list[TrialRecord], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(9, 5.5))
    ooms: dict[str, list[int]] = defaultdict(list)
    for r in records:
        if r.status == "oom" and r.batch_size is not None:
            ooms[model_key(r)[0]].append(r.batch_size)
    values: list[float] = []
    for mv in d.models:
        pts = sorted((int(c.configuration.get("batch.size", 0)), c.conservative_ips) for c in mv.candidates)
        (line,) = ax.plot([], [])
        color = line.get_color()
        if pts:
            best: dict[int, float] = {}
            for b, ips in pts:
                best[b] = max(best.get(b, 0.0), ips)
            values += [ips for _, ips in pts]
            ax.scatter([b for b, _ in pts], [ips for _, ips in pts], color=color, alpha=0.4, s=18)
            ax.plot(list(best), list(best.values()), marker="o", color=color, label=_short(mv.label))
        if ooms.get(mv.key):
            # At the foot of the axes whatever the scale: an OOM has no throughput.
            ax.scatter(ooms[mv.key], [0.03] * len(ooms[mv.key]), marker="x", s=90, color=color,
                       transform=ax.get_xaxis_transform(), clip_on=False)  # fmt: skip
            if not pts:
                ax.plot([], [], marker="o", color=color, label=_short(mv.label))
    ax.axhline(d.needed_ips, color="grey", linestyle="--", label=f"needed: {d.needed_ips:.1f} img/s")
    if any(ooms.values()):
        ax.scatter([], [], marker="x", color="black", label="OOM (at the foot)")
    values.append(d.needed_ips)
    if max(values) / max(min(values), 1e-9) > 20:
        ax.set_yscale("log")  # models decades apart: each stays readable
    ax.set_xscale("log", base=2)
    # Tick at the batch sizes measured, written as numbers (48, 64, 96), not powers of two.
    sizes = sorted({int(c.configuration.get("batch.size", 0)) for mv in d.models for c in mv.candidates}
                   | {b for bs in ooms.values() for b in bs} - {0})  # fmt: skip
    if sizes:
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("physical batch size")
    ax.set_ylabel("images/s (p90 step time)")
    ax.set_title("Throughput against physical batch")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def _short(label: str, limit: int = 60) -> str:
    return label if len(label) <= limit else label[: limit - 3] + "..."


def _days(d: Decision, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(10, max(2.8, 0.6 * len(d.models) + 1.6)))
    labels = [_short(mv.label, 45) for mv in d.models]
    days = [mv.best.days if mv.best else 0.0 for mv in d.models]
    colors = ["tab:green" if mv.go else "tab:red" for mv in d.models]
    ax.barh(labels, days, color=colors)
    for i, mv in enumerate(d.models):
        text = f" {days[i]:.1f} d ({'GO' if mv.go else 'NO-GO'})" if mv.best else " no qualifying trial"
        ax.text(days[i], i, text, va="center", fontsize=8)
    ax.axvline(d.budget.days, color="black", linestyle="--", label=f"budget: {d.budget.days:g} days")
    ax.set_xlim(0, max([*days, d.budget.days]) * 1.25)  # room for the annotations
    ax.set_xlabel("days for the schedule (best qualifying trial, p90 throughput)")
    ax.set_title(f"{d.verdict}: {d.budget.describe()}", fontsize=10)
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, path)


def _workers(d: Decision, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 5))
    for k in d.loader.knees[:12]:  # more lines than that is unreadable; the report's table has them all
        label = ", ".join(f"{key.rsplit('.', 1)[-1]}={v}" for key, v in k.settings.items()) or "all trials"
        (line,) = ax.plot([w for w, _ in k.points], [ips for _, ips in k.points], marker="o", label=_short(label))
        if k.loader_points:  # what the loader alone delivers: where the step's curve meets it, the loader paces
            ax.plot([w for w, _ in k.loader_points], [ips for _, ips in k.loader_points], linestyle="--",
                    marker=".", color=line.get_color(), alpha=0.7)  # fmt: skip
        knee_ips = dict(k.points)[k.knee_workers]
        ax.scatter([k.knee_workers], [knee_ips], s=160, facecolors="none", edgecolors=line.get_color())
    shown = d.loader.knees[:12]
    if any(k.loader_points for k in shown):
        ax.plot([], [], linestyle="--", marker=".", color="grey", label="the loader alone (loader_images_per_s)")
        values = [ips for k in shown for _, ips in (*k.points, *k.loader_points)]
        if max(values) / max(min(values), 1e-9) > 20:
            ax.set_yscale("log")  # a loader 100x faster than the step: both curves stay readable
    ax.set_xlabel("DataLoader workers")
    ax.set_ylabel("images/s (measured)")
    ax.set_title("Throughput against workers (circle: the knee; dashed: the loader alone)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

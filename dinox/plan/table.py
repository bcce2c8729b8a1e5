"""`dinox plan`'s table: the trials in the order `run` measures them, with what each will cost."""

from __future__ import annotations

from dinox.errors import escaped
from dinox.plan.footprint import Estimates
from dinox.plan.grid import Trial
from dinox.spec.sections import MeasureSpec


def render(trials: list[Trial], estimates: Estimates | None) -> list[str]:
    swept = list(dict.fromkeys(k for t in trials for k in t.overrides))
    header = ["#", "trial_id", *swept, "model", "img", "batch", "accum", "effective", "precision", "workers"]
    if estimates is not None:
        header += ["GFLOP/img", "device GiB", "loader GiB", "OOM?"]
    # A cell holds a spec's value (a model name, a swept value): a newline or carriage return in it would break
    # the row or overwrite it on the terminal, so each is shown escaped.
    rows = [[escaped(cell) for cell in _row(t, swept, estimates)] for t in trials]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    m = trials[0].spec.measure
    shrunk = "shrunk " if trials[0].spec.shrunk else ""
    counted = f"{len(trials)} {shrunk}trial{'s' if len(trials) != 1 else ''}"
    lines.append(
        f"{counted}; each: {m.warmup_steps} warm-up + {_windows(m)} x {m.bench_steps} timed optimizer steps, "
        f"timeout {m.timeout_s:g}s"
    )
    return lines + (_estimate_notes(trials, estimates) if estimates is not None else [])


def _row(t: Trial, swept: list[str], estimates: Estimates | None) -> list[str]:
    s = t.spec
    if s.batch.auto:  # what the batch search leaves open
        accum, effective = str(s.batch.accumulation or "auto"), str(s.batch.effective or "auto")
    else:
        accum, effective = str(s.accumulation), str(s.effective_batch)
    row = [str(t.index + 1), t.trial_id[:8], *(str(t.overrides.get(k, "")) for k in swept)]
    row += [s.model.name, str(s.model.img_size), str(s.batch.size), accum, effective, s.precision]
    row.append(str(s.loader.num_workers))
    if estimates is not None:
        cost = estimates.cost(s)
        mem = None if s.batch.auto else estimates.memory(s)
        row += [
            f"{cost.flops_per_image / 1e9:.1f}" if cost else "-",
            f"{mem.device_gb:.2f}" if mem else "-",
            f"{mem.loader_host_gb:.2f}" if mem else "-",
            "OOM" if mem and mem.over else "",
        ]
    return row


def _estimate_notes(trials: list[Trial], estimates: Estimates) -> list[str]:
    m = estimates.machine
    if m is None:
        lines = [f"no memory plan: {estimates.why_missing(trials[0].spec) or 'no estimate'}"]
    else:
        limit = f"{m.device_total_gb:.1f} GiB" if m.device_total_gb is not None else "unknown memory"
        lines = [f"estimated for {m.device} ({m.device_name}, {limit}; host {m.host_total_gb:.1f} GiB)"]
    for t in trials:
        mem = None if t.spec.batch.auto else estimates.memory(t.spec)
        if mem is not None and mem.over:
            lines.append(f"  #{t.index + 1} predicted OOM: {mem.over}")
        elif estimates.cost(t.spec) is None:
            lines.append(f"  #{t.index + 1} no estimate: {estimates.why_missing(t.spec) or 'unknown'}")
    return lines + estimates.slow_steps(trials)


def _windows(m: MeasureSpec) -> str:
    least, most = m.window_bounds
    return str(least) if least == most else f"{least}-{most}"

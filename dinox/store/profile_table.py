"""measure.profile's summary (the `dinox.profile` tag) read back and shown: the trial run's description and the
report's table for the winner. The tag comes from the store, so it is data: parsed defensively, every name made
inert before it reaches Markdown. No MLflow, no torch."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from dinox import record as rec
from dinox.store.trial_record import inert, store_text

TRACE_ARTIFACT = f"{rec.PROFILE_DIR}/trace.json.gz"
IDLE_KINDS = ("host_wait", "kernel_wait", "other")


@dataclass(frozen=True)
class OpRow:
    name: str
    calls: float  # per step
    ms: float  # self time per step
    share: float  # of the profiled steps' wall time


@dataclass(frozen=True)
class ProfileSummary:
    steps: int = 0
    span_s: float = 0.0
    images_per_s: float | None = None
    host: list[OpRow] = field(default_factory=list)
    device: list[OpRow] = field(default_factory=list)
    idle: dict[str, float] | None = None  # busy, host_wait, kernel_wait, other: shares of the device's stretch
    error: str = ""  # the profiler failed: why (the measured result stands)

    @classmethod
    def parse(cls, text: str | None) -> ProfileSummary | None:
        """None for no tag or one that is not a summary dinox wrote."""
        if not text:
            return None
        try:
            d = json.loads(text)
            if "error" in d:
                return cls(error=store_text(str(d["error"]))[:300])
            idle = d.get("idle")
            return cls(
                steps=int(d["steps"]),
                span_s=_finite(d["span_s"]),
                images_per_s=_finite(d["images_per_s"]) if d.get("images_per_s") is not None else None,
                host=[_row(r) for r in d.get("host", [])],
                device=[_row(r) for r in d.get("device", [])],
                idle={k: _finite(idle[k]) for k in ("busy", *IDLE_KINDS)} if idle else None,
            )
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return None


def _finite(value: Any) -> float:
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(value)
    return x


def _row(r: Any) -> OpRow:
    name, calls, ms, share = r
    return OpRow(store_text(str(name))[:100], _finite(calls), _finite(ms), _finite(share))


def markdown(p: ProfileSummary, trace_link: str = "") -> list[str]:
    """The summary as Markdown: a line on the profiled steps, the idle split (CUDA), the top ops tables."""
    if p.error:
        return [f"measure.profile: the profiler failed ({inert(p.error)}); the measured figures stand."]
    where = f"[{TRACE_ARTIFACT}]({trace_link})" if trace_link else f"`{TRACE_ARTIFACT}`"
    ips = f", {p.images_per_s:.1f} img/s under the profiler" if p.images_per_s is not None else ""
    out = [
        f"**Profile**: {p.steps} steps after the measured windows, {p.span_s / max(p.steps, 1) * 1e3:.1f} ms a step"
        f"{ips}. Trace: {where} (open in ui.perfetto.dev or chrome://tracing).",
        "",
    ]
    if p.idle is not None:
        i = p.idle
        out += [
            f"Device busy {i['busy']:.0%}; idle waiting on the host {i['host_wait']:.0%}, on the kernel before "
            f"{i['kernel_wait']:.0%}, other {i['other']:.0%} (HTA's split).",
            "",
        ]
    for title, rows in (("self device time", p.device), ("self host time", p.host)):
        if not rows:
            continue
        out += [f"| top ops by {title} | calls/step | ms/step | share of step |", "|---|---|---|---|"]
        out += [f"| {inert(r.name)} | {r.calls:g} | {r.ms:.2f} | {r.share:.0%} |" for r in rows]
        out.append("")
    return out

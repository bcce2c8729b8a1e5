"""Throughput against physical batch, drawn one way wherever a sweep's trials are drawn: the parent run's
plot as the sweep ends (descriptions.throughput_plot) and decide's report (dinox.report.plots). One series
per model: every trial a faint dot with its timed windows' slowest to fastest as a bar, the best per batch
joined, and where two or three trials share a batch each dot named with what else it varied
(`num_workers=2`): a grid over loader workers drew two unnamed dots per batch on the parent run's plot, which
a reader takes for repeats. Pure drawing on axes the caller made; matplotlib is imported only by
`import_plotting`, so importing this module costs nothing."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from dinox.spec import params

# (batch, images/s, text): a dot to name once the axes' limits are known (name_dots)
Name = tuple[int, float, str]


@dataclass(frozen=True)
class Dot:
    """One trial: its physical batch, its figure (images/s), its timed windows' slowest and fastest rate (None:
    one window, no spread) and its params (what else it varied is read from them)."""

    batch: int
    ips: float
    low: float | None
    high: float | None
    configuration: Mapping[str, Any]


def import_plotting() -> ModuleType:
    """matplotlib's pyplot on the file-only backend. A sweep calls this early (0.3-0.4 s here), while its fork
    server still imports torch and timm and the parent would only wait, rather than after its last trial."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a GPU box or in CI
    # Names come from specs and the store as plain text: a "$" in a model name or a path would start mathtext
    # (and "m$^{$" crashed the decision's plot).
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt

    return plt


def draw_series(ax: Any, dots: list[Dot], color: str, label: str, names: list[Name]) -> list[float]:
    """One model's trials (see the module docstring); the values drawn (dots and bars), for the axes' scale.
    The names of dots that share a batch are added to `names`, for name_dots."""
    pts = sorted((d for d in dots if d.ips > 0), key=lambda d: (d.batch, d.ips))
    if not pts:
        return []
    best: dict[int, float] = {}
    for d in pts:
        best[d.batch] = max(best.get(d.batch, 0.0), d.ips)
        if d.low is not None and d.high is not None:
            ax.vlines(d.batch, d.low, d.high, color=color, alpha=0.5, linewidth=2)
    ax.scatter([d.batch for d in pts], [d.ips for d in pts], color=color, alpha=0.4, s=18)
    # Two or three trials at a batch get a name each; more would print over each other (the report lists them).
    per_batch = Counter(d.batch for d in pts)
    keys = varied(pts)
    for d in pts:
        if keys and 1 < per_batch[d.batch] <= 3:
            text = " ".join(f"{k.rsplit('.', 1)[-1]}={d.configuration.get(k, '')}" for k in keys)
            names.append((d.batch, d.ips, text))
    ax.plot(list(best), list(best.values()), marker="o", color=color, label=label)
    return [d.ips for d in pts] + [v for d in pts for v in (d.low, d.high) if v]


def varied(dots: list[Dot]) -> list[str]:
    """The params other than the batch size whose values differ among the dots (two at most: a name to read)."""
    keys = sorted({k for d in dots for k in d.configuration} - {params.BATCH_SIZE, params.BATCH_EFFECTIVE})
    return [k for k in keys if len({str(d.configuration.get(k)) for d in dots}) > 1][:2]


def name_dots(fig: Any, ax: Any, names: list[Name]) -> None:
    """Each named dot's text beside it, and at one batch size a line above the one below at least: two trials
    at 107.2 and 107.1 img/s printed one name over the other. Placed in display space, after the layout."""
    fig.tight_layout()  # the axes' final size (a later tight_layout then changes nothing)
    ax.get_ylim()  # the view's limits settled: display positions are final
    line = 9 * fig.dpi / 72  # pixels
    by_batch: dict[int, list[tuple[float, str]]] = defaultdict(list)
    for b, ips, text in names:
        by_batch[b].append((ips, text))
    renderer, frame = fig.canvas.get_renderer(), ax.get_window_extent()
    for b, dots in by_batch.items():
        below = -math.inf
        for ips, text in sorted(dots):
            at = ax.transData.transform((b, ips))[1]
            y = max(at, below + line)
            below = y
            up = -3 + (y - at) * 72 / fig.dpi
            name = ax.annotate(text, (b, ips), xytext=(5, up), textcoords="offset points", fontsize=7)
            if name.get_window_extent(renderer).x1 > frame.x1:  # past the frame (the largest batch): to its left
                name.xyann = (-7, up)
                name.set_horizontalalignment("right")


def batch_axis(ax: Any, sizes: list[int]) -> None:
    """The x axis: physical batch on a log2 scale, a tick at each size measured, written as a number (48, 64,
    96: not a power of two), a margin either side."""
    import matplotlib.ticker

    ax.set_xscale("log", base=2)
    ax.set_xlim(sizes[0] / 1.3, sizes[-1] * 1.3)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("physical batch size")

"""The live view of a sweep on a terminal: a tqdm bar over the trials (elapsed, ETA) whose description is
each trial in flight and its phase (start-up, setup, warm-up, window k of n, ablation windows, loader alone).
The result lines print above the bar. Not on a terminal (CI, a log file, `| tee`), plain lines only."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tqdm import tqdm

TICK_S = 1.0  # how often the bar redraws on its own: a warm-up step of minutes must not look frozen


class Progress:
    def __init__(self, total: int, echo: Callable[[str], None], live: bool):
        self.echo = echo
        fmt = "{l_bar}{bar:20}| {n_fmt}/{total_fmt} trials [{elapsed}<{remaining}]"
        self.bar = tqdm(total=total, unit="trial", dynamic_ncols=True, leave=False, bar_format=fmt) if live else None
        self.phases: dict[str, tuple[str, float]] = {}  # trial label -> its phase and when it began, in flight
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if self.bar is not None:  # tqdm redraws only when told: elapsed and each phase's clock tick here
            self._ticker = threading.Thread(target=self._tick, name="dinox-progress", daemon=True)
            self._ticker.start()

    def line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)  # above the bar, which redraws below it
        else:
            self.echo(text)

    def phase(self, label: str, text: str) -> None:
        self.phases[label] = (text, time.monotonic())
        self._describe()

    def advance(self, label: str = "") -> None:
        self.phases.pop(label, None)
        if self.bar is not None:
            self._describe()
            self.bar.update(1)
            self.bar.refresh()  # once per trial: show it now, not after tqdm's minimum interval

    def describe(self, now: float | None = None) -> str:
        """Every trial in flight with its phase and how long the phase has run (several side by side under
        --devices), the longest cut: `size=64: warm-up 2:15`."""
        now = time.monotonic() if now is None else now
        width = 40 if len(self.phases) == 1 else 24
        return " | ".join(
            f"{label[:width]}: {text} {_clock(now - since)}" for label, (text, since) in list(self.phases.items())
        )

    def _describe(self) -> None:
        bar = self.bar
        if bar is not None:
            bar.set_description_str(self.describe(), refresh=True)

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            self._describe()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _clock(seconds: float) -> str:
    s = int(max(0.0, seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"

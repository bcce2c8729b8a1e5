"""The live view of a sweep on a terminal: a tqdm bar over the trials (elapsed, ETA) whose description is
each trial in flight and its phase (start-up, setup, warm-up, window k of n, ablation windows, loader alone).
The result lines print above the bar. Not on a terminal (CI, a log file, `| tee`), plain lines only."""

from __future__ import annotations

from collections.abc import Callable

from tqdm import tqdm


class Progress:
    def __init__(self, total: int, echo: Callable[[str], None], live: bool):
        self.echo = echo
        fmt = "{l_bar}{bar:20}| {n_fmt}/{total_fmt} trials [{elapsed}<{remaining}]"
        self.bar = tqdm(total=total, unit="trial", dynamic_ncols=True, leave=False, bar_format=fmt) if live else None
        self.phases: dict[str, str] = {}  # trial label -> its phase, while it is in flight

    def line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)  # above the bar, which redraws below it
        else:
            self.echo(text)

    def phase(self, label: str, text: str) -> None:
        self.phases[label] = text
        self._describe()

    def advance(self, label: str = "") -> None:
        self.phases.pop(label, None)
        if self.bar is not None:
            self._describe()
            self.bar.update(1)
            self.bar.refresh()  # once per trial: show it now, not after tqdm's minimum interval

    def _describe(self) -> None:
        """Every trial in flight with its phase (several side by side under --devices), the longest cut."""
        if self.bar is not None:
            width = 40 if len(self.phases) == 1 else 24
            self.bar.set_description_str(
                " | ".join(f"{label[:width]}: {text}" for label, text in self.phases.items()), refresh=True
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

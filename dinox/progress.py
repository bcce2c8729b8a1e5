"""The live view of a sweep on a terminal: a tqdm bar over the trials (elapsed, ETA) whose description is
the trial in flight and its phase (start-up, setup, warm-up, window k of n, ablation windows, loader alone).
The result lines print above the bar. Not on a terminal (CI, a log file, `| tee`), plain lines only."""

from __future__ import annotations

from collections.abc import Callable

from tqdm import tqdm


class Progress:
    def __init__(self, total: int, echo: Callable[[str], None], live: bool):
        self.echo = echo
        fmt = "{l_bar}{bar:20}| {n_fmt}/{total_fmt} trials [{elapsed}<{remaining}]"
        self.bar = tqdm(total=total, unit="trial", dynamic_ncols=True, leave=False, bar_format=fmt) if live else None

    def line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)  # above the bar, which redraws below it
        else:
            self.echo(text)

    def phase(self, label: str, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(f"{label[:40]}: {text}", refresh=True)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.refresh()  # once per trial: show it now, not after tqdm's minimum interval

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

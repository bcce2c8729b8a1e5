"""The live view: plain lines off a terminal, a bar with the trial's phase on one; the phase file read."""

import io

from dinox.isolate.runner import _PhaseReader
from dinox.sweep.progress import Progress


def test_off_a_terminal_only_the_lines_print():
    lines: list[str] = []
    p = Progress(3, lines.append, live=False)
    p.phase("size=8", "window 1/3")
    p.line("[1/3] ok")
    p.advance()
    p.close()
    assert lines == ["[1/3] ok"]


def test_on_a_terminal_the_bar_carries_the_trial_and_its_phase(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    p = Progress(3, print, live=True)
    p.phase("size=8", "window 2/3")
    p.advance()
    assert "size=8: window 2/3 0:00" in out.getvalue() and "1/3 trials" in out.getvalue()
    p.phase("size=16", "warm-up")  # two trials side by side (--devices): both on the bar
    p.phase("size=32", "window 1 (of 2-5)")
    assert "size=16: warm-up 0:00 | size=32: window 1 (of 2-5) 0:00" in out.getvalue()
    p.close()


def test_the_bar_keeps_ticking_through_a_long_phase(monkeypatch):
    """A warm-up step of minutes on a CPU (the headline spec's ViT-g) froze the bar at `[00:14<?]`: it redraws
    every second on its own, with how long the phase in flight has run."""
    from dinox.sweep import progress

    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    monkeypatch.setattr(progress, "TICK_S", 0.05)
    p = Progress(2, print, live=True)
    p.phase("size=64", "warm-up")
    start = p.phases["size=64"][1]
    # Mid-second: `start + 10861 - start` can come out a hair under 10861 in floating point.
    assert p.describe(now=start + 135.5) == "size=64: warm-up 2:15"
    assert p.describe(now=start + 3 * 3600 + 61.5) == "size=64: warm-up 3:01:01"
    before = out.getvalue().count("\r")
    import time

    time.sleep(0.5)
    p.close()
    assert out.getvalue().count("\r") >= before + 3, "no redraw while nothing happened"


def test_the_phase_file_is_passed_on_when_it_changes(tmp_path):
    seen: list[str] = []
    reader = _PhaseReader(tmp_path / "phase", seen.append)
    reader.poll(0.0)  # no file yet: nothing
    (tmp_path / "phase").write_text("warm-up")
    reader.poll(1.0)
    reader.poll(2.0)  # unchanged: not again
    (tmp_path / "phase").write_text("window 1/2")
    reader.poll(2.1)  # within 0.2 s of the last look: not yet
    reader.poll(2.3)
    assert seen == ["warm-up", "window 1/2"]

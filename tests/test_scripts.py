"""dinox's own benchmarks run and print figures of the right form (their values are for the README and
the notes: this shared 2-core machine is too noisy for timed assertions)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT


def run_script(name: str, *args: str, cwd) -> str:
    proc = subprocess.run([sys.executable, "-W", "ignore", str(ROOT / "scripts" / name), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_bench_overhead_prints_its_figures(tmp_path):
    # One isolation: the script's other path differs only in the argument it passes to run_sweep.
    out = run_script("bench_overhead.py", "--trials", "1", "--isolation", "fork", cwd=tmp_path)
    assert re.search(r"^per_trial_s\s+\d+\.\d{3}$", out, re.M), out
    assert re.search(r"^overhead_per_trial_s\[fork\] \d+\.\d{3} ", out, re.M), out


def test_bench_fidelity_prints_its_figures(tmp_path):
    out = run_script("bench_fidelity.py", "--steps", "2", "--warmup", "1", "--rounds", "1", "--img", "32",
                     "--batch", "4", cwd=tmp_path)  # fmt: skip
    assert re.search(r"^dinox images/s\s+\d+\.\d  median \d+\.\d$", out, re.M), out
    assert re.search(r"^hand loop images/s\s+\d+\.\d  median \d+\.\d$", out, re.M), out
    assert re.search(r"^fidelity_ratio \d+\.\d{3} ", out, re.M), out

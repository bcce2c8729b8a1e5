#!/usr/bin/env python3
"""Per-trial cost of dinox itself: everything a trial pays for that is not data setup, model build or steps.

Runs a sweep of N tiny trials (a 2-layer ViT at 32 px, one timed step each) into a throw-away SQLite store
and prints the mean time per trial by phase:

    python scripts/bench_overhead.py            # 8 trials
    python scripts/bench_overhead.py --trials 16
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from dinox import grid, spec
from dinox.sweep import run_sweep
from dinox.tracking import SweepRecorder

SPEC = """\
name: bench_overhead
model: {{name: vit_tiny_patch16_224, img_size: 32, kwargs: {{patch_size: 8, depth: 2}}}}
objective: {{num_classes: 10}}
batch: {{size: 2}}
measure: {{warmup_steps: 1, bench_steps: 1, timeout_s: 120}}
sweep:
  grid:
    data.seed: {seeds}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(SPEC.format(seeds=list(range(args.trials))))
        doc = spec.load(path)
        trials = grid.expand(doc)
        recorder = SweepRecorder(f"sqlite:///{tmp}/mlflow.db")
        report = run_sweep(doc, trials, recorder=recorder, workdir=Path(tmp) / "work", echo=lambda _line: None)
    bad = [r.status for r in report.results if r.status != "ok"]
    if bad:
        print(f"trials failed: {bad}", file=sys.stderr)
        return 1
    t = report.timeline()
    print(f"trials: {len(report.results)}  sweep wall: {report.wall_s:.2f} s")
    for key in ("per_trial_s", "startup_s", "setup_s", "data_setup_s", "build_s", "measure_s", "teardown_s",
                "recording_s"):  # fmt: skip
        print(f"{key:<14} {t[key]:7.3f} s")
    print(f"overhead_per_trial_s {t['overhead_s']:.3f}  (per trial, not data setup, model build or measured steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

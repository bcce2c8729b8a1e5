#!/usr/bin/env python3
"""Per-trial cost of dinox itself: everything a trial pays for that is not data setup, model build or steps.

Runs a sweep of N tiny trials (a 2-layer ViT at 32 px, one timed step each) into a throw-away SQLite store,
once with each isolation (spawn: a fresh interpreter per trial; fork: forked from a process with torch and
timm imported), and prints the mean time per trial by phase:

    python scripts/bench_overhead.py            # 8 trials, both isolations
    python scripts/bench_overhead.py --trials 16 --isolation fork
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from dinox.plan import grid
from dinox.spec import file as spec_file
from dinox.store.recorder import SweepRecorder
from dinox.sweep.run import SweepOptions, run_sweep

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


def sweep(isolation: str, trials: int) -> tuple[dict[str, float], float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(SPEC.format(seeds=list(range(trials))))
        doc = spec_file.load(path)
        recorder = SweepRecorder(f"sqlite:///{tmp}/mlflow.db")
        options = SweepOptions(isolation=isolation)
        report = run_sweep(doc, grid.expand(doc), recorder, Path(tmp) / "work", options, echo=lambda _line: None)
    bad = [r.status for r in report.results if r.status != "ok"]
    if bad:
        raise SystemExit(f"{isolation}: trials failed: {bad}")
    return report.timeline(), report.wall_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--isolation", choices=["spawn", "fork", "both"], default="both")
    args = parser.parse_args()
    modes = ["spawn", "fork"] if args.isolation == "both" else [args.isolation]
    results = {mode: sweep(mode, args.trials) for mode in modes}
    keys = ("per_trial_s", "startup_s", "setup_s", "data_setup_s", "build_s", "measure_s", "teardown_s", "recording_s")
    print(f"{args.trials} tiny trials per sweep; mean seconds per trial")
    print(f"{'':<14}" + "".join(f"{m:>10}" for m in modes))
    for key in keys:
        print(f"{key:<14}" + "".join(f"{results[m][0][key]:>10.3f}" for m in modes))
    print(f"{'sweep wall':<14}" + "".join(f"{results[m][1]:>10.2f}" for m in modes))
    for m in modes:
        print(
            f"overhead_per_trial_s[{m}] {results[m][0]['overhead_s']:.3f}  "
            f"(per trial: not data setup, model build or measured steps)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

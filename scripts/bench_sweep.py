#!/usr/bin/env python3
"""What a sweep costs, whole commands against each other, alternating, a fresh store and workdir each run.

Each side is a set of extra `dinox run` arguments; every round runs every side once, in turn, so a noisy
machine hurts both alike. Prints each run's wall time and windows per trial, then each side's median:

    # adaptive windows (the spec's) against a fixed 3
    python scripts/bench_sweep.py specs/quickstart.yaml --side "--set measure.repeats=3" --side ""
    # trials side by side
    python scripts/bench_sweep.py specs/quickstart.yaml --side "--devices cpu:1" --side "--devices cpu:2"
    # the fixed cost: a one-trial sweep (and `dinox validate`) against the bare imports
    python scripts/bench_sweep.py --fixed-cost
"""

from __future__ import annotations

import argparse
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ONE_TRIAL = """\
name: bench_fixed_cost
model: {name: vit_tiny_patch16_224, img_size: 32, kwargs: {patch_size: 8}}
objective: {num_classes: 10}
batch: {size: 4}
measure: {warmup_steps: 1, bench_steps: 3, repeats: 1, timeout_s: 120, ablation: false}
"""
DINOX = [sys.executable, "-m", "dinox"]


def timed(command: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{shlex.join(command)} failed ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return wall


def windows(db: Path) -> list[int]:
    """Windows measured by each trial of the store, in trial order (read with sqlite: no MLflow import)."""
    with sqlite3.connect(db) as c:
        rows = c.execute(
            "select r.name, m.value from runs r join latest_metrics m on m.run_uuid = r.run_uuid "
            "where m.key = 'windows' order by r.name"
        ).fetchall()
    return [int(v) for _name, v in rows]


def sides(spec: Path, sides: list[str], rounds: int) -> None:
    walls: dict[str, list[float]] = {s: [] for s in sides}
    for r in range(1, rounds + 1):
        for side in sides:
            with tempfile.TemporaryDirectory() as tmp:
                wall = timed([*DINOX, "run", str(spec.resolve()), *shlex.split(side)], Path(tmp))
                walls[side].append(wall)
                per_trial = " ".join(map(str, windows(Path(tmp) / "mlflow.db")))
                print(f"round {r} [{side or 'as written'}] wall {wall:.1f} s, windows per trial: {per_trial}")
    for side, w in walls.items():
        print(f"median [{side or 'as written'}] {statistics.median(w):.1f} s over {len(w)} runs")


def fixed_cost(rounds: int) -> None:
    bare = [sys.executable, "-c", "import torch, timm, mlflow"]
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        (cwd / "one.yaml").write_text(ONE_TRIAL)
        timed([*DINOX, "run", "one.yaml"], cwd)  # the store created and migrated once, as for any later run
        ratios = []
        for r in range(1, rounds + 1):
            imports = timed(bare, cwd)
            run = timed([*DINOX, "run", "one.yaml", "--force"], cwd)
            validate = timed([*DINOX, "validate", "one.yaml"], cwd)
            ratios.append(run / imports)
            print(
                f"round {r}: bare imports {imports:.2f} s, one-trial dinox run {run:.2f} s "
                f"({run / imports:.2f}x), dinox validate {validate:.2f} s"
            )
    print(f"median run / imports {statistics.median(ratios):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec", nargs="?", type=Path)
    ap.add_argument("--side", action="append", default=[], help="extra `dinox run` arguments for one side")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--fixed-cost", action="store_true", help="a one-trial sweep against the bare imports")
    args = ap.parse_args()
    if args.fixed_cost:
        fixed_cost(args.rounds)
    elif args.spec is None or not args.side:
        ap.error("give a SPEC and at least one --side, or --fixed-cost")
    else:
        sides(args.spec, args.side, args.rounds)


if __name__ == "__main__":
    main()

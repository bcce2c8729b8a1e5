#!/usr/bin/env python3
"""measure.profile costs the measured figures nothing: the same trial measured with and without `--profile`,
alternating over several rounds in one run of this script (each a real `dinox run --force` into one store),
prints the windows' images/s of each, their medians' ratio (target: within the trials' own window spread of
1.0) and what the profiled steps themselves ran at (the profiler's own cost, outside the windows).

    python scripts/bench_profile.py                  # ResNet-18 at 64 px, batch 16, CPU, 3 rounds
    python scripts/bench_profile.py --model vit_small_patch16_224 --img 224 --batch 64 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SPEC = """\
name: bench_profile
model: {{name: {model}, img_size: {img}}}
objective: {{num_classes: 100}}
batch: {{size: {batch}}}
loader: {{num_workers: 0}}
measure: {{warmup_steps: 3, bench_steps: 8, repeats: 3, ablation: false}}
"""


def one(root: Path, profiled: bool) -> tuple[float, float, float | None]:
    """(images/s over the windows, their spread, images/s of the profiled steps) of one measurement."""
    args = [sys.executable, "-m", "dinox", "run", "spec.yaml", "--force", "--no-system-metrics"]
    subprocess.run(args + (["--profile", "1"] if profiled else []), cwd=root, check=True, capture_output=True)
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    run = client.search_runs(["1"], "tags.`dinox.role` = 'trial'", order_by=["attributes.start_time DESC"])[0]
    m, tags = run.data.metrics, run.data.tags
    under = json.loads(tags["dinox.profile"])["images_per_s"] if "dinox.profile" in tags else None
    return m["images_per_s"], m["window_spread"], under


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--img", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        root = Path(tmp)
        (root / "spec.yaml").write_text(SPEC.format(model=a.model, img=a.img, batch=a.batch))
        plain, traced, spreads, under = [], [], [], []
        for i in range(a.rounds):
            for profiled in (i % 2 == 1, i % 2 == 0):  # alternate which side goes first
                ips, spread, u = one(root, profiled)
                (traced if profiled else plain).append(ips)
                spreads.append(spread)
                if u is not None:
                    under.append(u)
                print(f"round {i + 1} {'profiled  ' if profiled else 'unprofiled'} {ips:8.1f} img/s (windows)")
    ratio = statistics.median(traced) / statistics.median(plain)
    spread, below = statistics.median(spreads), statistics.median(under)
    print(f"median img/s: unprofiled {statistics.median(plain):.1f}, profiled {statistics.median(traced):.1f}")
    print(f"ratio profiled / unprofiled: {ratio:.3f} (the trials' own window spread: median {spread:.1%})")
    print(f"the profiled steps: {below:.1f} img/s (under torch.profiler, outside the windows)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What a DINO step costs against a classification step of the same backbone, measured by dinox itself.

Runs two trials in child processes on synthetic data (so the loader is out of the picture): the same
timm backbone, batch and precision, once with a classification head and once with DINO (student + EMA
teacher, DINO head, multi-crop, centering, EMA update). Prints step times and the ratio.

    python scripts/bench_dino_cost.py                                   # ViT-Tiny/16, 224 px, CPU-sized
    python scripts/bench_dino_cost.py --model vit_large_patch14_dinov2 --local 98 --batch 64 --precision bf16-mixed
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from dinox.isolate import runner
from dinox.plan import grid
from dinox.spec import file as spec_file

SPEC = """\
name: dino_cost
model: {{name: {model}, img_size: {img}}}
precision: {precision}
batch: {{size: {batch}, accumulation: 1}}
measure: {{warmup_steps: 2, bench_steps: {steps}, timeout_s: 1800}}
data: {{source: synthetic}}
sweep:
  cases:
    - {{objective: {{kind: classification, num_classes: 1000}}}}
    - {{objective: {{kind: dino, out_dim: {out_dim}, local_crops: {locals}, local_crop_size: {local}}}}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_tiny_patch16_224")
    parser.add_argument("--img", type=int, default=224)
    parser.add_argument("--local", type=int, default=96)
    parser.add_argument("--locals", type=int, default=8)
    parser.add_argument("--out-dim", type=int, default=65536)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--precision", default="fp32")
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(
            SPEC.format(
                model=a.model,
                img=a.img,
                precision=a.precision,
                batch=a.batch,
                steps=a.steps,
                out_dim=a.out_dim,
                locals=a.locals,
                local=a.local,
            )
        )
        results = {}
        for trial in grid.expand(spec_file.load(path)):
            r = runner.run_trial(trial, Path(tmp) / str(trial.index)).result
            if r.status != "ok":
                raise SystemExit(f"{trial.spec.objective.kind}: {r.status}: {r.error}")
            results[trial.spec.objective.kind] = r.metrics
    c, d = results["classification"], results["dino"]
    print(
        f"{a.model} at {a.img} px, batch {a.batch}, {a.precision}; DINO: 2 x {a.img} + {a.locals} x {a.local} "
        f"crops, out_dim {a.out_dim}"
    )
    print(f"  {'objective':<15} {'step p50 s':>10} {'img/s':>8} {'trainable M':>12}")
    for kind, m in (("classification", c), ("dino", d)):
        print(f"  {kind:<15} {m['step_s_p50']:>10.3f} {m['images_per_s']:>8.2f} {m['trainable_params_m']:>12.1f}")
    print(f"dino_step_cost_ratio {d['step_s_p50'] / c['step_s_p50']:.2f}  (DINO step p50 / classification step p50)")


if __name__ == "__main__":
    main()

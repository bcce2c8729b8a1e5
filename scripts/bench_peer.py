#!/usr/bin/env python3
"""dinox against the tuner it grew from, on that tuner's own 4-point CT grid: the DINO-X project's
`scripts/tune_throughput.py` (a 2-block ViT at 64 px, batch 32/64 x 0/2 workers, 10 timed steps a point, 60
slices inflated x100) and `dinox run` of the same grid, one after the other, `--rounds` times, alternating which
goes first. A benchmark, not a test: it prints each side's whole-command wall time, the per-point images/s and,
for dinox, a trial's measurement over its timed windows (with its warm-up, and after it) and how long its drift
check (the first trial measured again at the sweep's end) ran; it asserts nothing.

    git clone https://github.com/timlawrenz/DINO-X /tmp/DINO-X       # the peer: its scripts/ folder is enough
    python scripts/bench_peer.py --peer /tmp/DINO-X/scripts
    python scripts/bench_peer.py --peer /tmp/DINO-X/scripts --rounds 3 --evidence one-window
    python scripts/bench_peer.py --peer /tmp/DINO-X/scripts --evidence one-window --step both

Every setting is the peer's: its worker loaders' prefetch_factor=1 too, which dinox's spec sets with the worker
count (`sweep.cases`: torch refuses a prefetch factor without workers).

dinox runs at its own evidence (`--evidence default`: timed windows until three agree, each followed by its
ablation round until the label is decided), at the peer's (`one-window`: one timed window of the same 10 steps,
ablation kept), or both; with timm's ViT of the peer's shapes (`--step timm`), with the peer's own PatchViT,
head and loss as a team's module imported from the peer's files (`--step peer`: a gap there is the
measurement's alone), or both. The demo CT data (60 slices of 2 synthetic series, 16-bit PNG) is written once, by
scripts/make_demo_ct.py and `dinox preprocess`, into a temporary folder; nothing is written outside it.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRID = {"batch_sizes": (32, 64), "num_workers": (0, 2)}
POINTS = [(b, w) for b in GRID["batch_sizes"] for w in GRID["num_workers"]]

SPEC = """\
name: peer_grid
model:
  name: vit_tiny_patch16_224      # the peer's PatchViT: dim 256, 2 blocks, 4 heads, MLP x2, patch 16
  img_size: 64
  kwargs: {embed_dim: 256, depth: 2, num_heads: 4, mlp_ratio: 2.0}
objective: {kind: classification, num_classes: 2}
precision: fp32
batch: {size: 32}
optimizer: {name: adamw, lr: 1.0e-3, weight_decay: 0.0}
loader: {num_workers: 0, pin_memory: false}
data: {source: ct_png, index_csv: processed/_index/index.csv, subset_size: 60, inflation: 100}
measure: {warmup_steps: 5, bench_steps: 10}
sweep:
  grid:
    batch.size: [32, 64]
  cases:                          # the peer's loaders: prefetch_factor 1 where there are workers
    - {loader.num_workers: 0}
    - {loader.num_workers: 2, loader.prefetch_factor: 1}
"""
EVIDENCE = {"default": [], "one-window": ["--set", "measure.repeats=1"]}

# --step peer: the peer's own step as a team's module (objective kind python), so that a per-point gap is
# the measurement's and not two models': timm's ViT (F.scaled_dot_product_attention, a 2-class head under
# cross-entropy) is not the peer's PatchViT (torch's TransformerEncoder under its _TinyHead, a mean-square
# loss), however alike their shapes. Imported from the peer's own files, never copied.
PEER_STEP = """\
import sys

import torch.nn as nn


class _VitCLS(nn.Module):  # the peer's own wrapper (defined inside its main()): the class token
    def __init__(self, vit):
        super().__init__()
        self.vit = vit

    def forward(self, x):
        return self.vit.forward_features(x)[0]


class Step:
    def __init__(self, ctx):
        sys.path.insert(0, ctx.options["peer"])
        import phase3_micro_run as m
        from tune_throughput import _TinyHead

        vit = m.PatchViT(img_size=64, patch=16, dim=256, depth=2, heads=4, mlp_ratio=2.0)
        self.model = nn.Sequential(_VitCLS(vit), _TinyHead(256)).to(ctx.device)

    def parameters(self):
        return self.model.parameters()

    def loss(self, batch):
        images, _labels = batch  # the peer's data has no labels; its loss reads none
        return (self.model(images).float() ** 2).mean()

    def after_optimizer_step(self):
        pass

    def compile(self, compile_fn):
        self.model = compile_fn(self.model)

    def distribute(self, wrap):
        self.model = wrap(self.model)
        return self.model


def build(ctx):
    return Step(ctx)
"""
STEPS = ("timm", "peer")


def step_spec(peer: Path) -> str:
    """The grid with the peer's step in place of timm's (the model section stays: the team's module reads none
    of it)."""
    options = json.dumps({"peer": str(peer.resolve())})
    objective = f'objective: {{kind: python, entry: "peerstep:build", num_classes: 2, options: {options}}}'
    return SPEC.replace("objective: {kind: classification, num_classes: 2}", objective)


def make_data(work: Path, peer: Path) -> None:
    py = sys.executable
    subprocess.run(
        [py, str(ROOT / "scripts/make_demo_ct.py"), "--patients", "2", "--slices", "30", "dicom"],
        cwd=work,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [py, "-m", "dinox", "preprocess", "--dicom-root", "dicom", "--out-root", "processed"],
        cwd=work,
        check=True,
        capture_output=True,
    )
    (work / "peer_grid.yaml").write_text(SPEC)
    (work / "peer_grid_peer_step.yaml").write_text(step_spec(peer))
    (work / "peerstep.py").write_text(PEER_STEP)


def run_peer(peer: Path, work: Path, n: int) -> tuple[float, dict[tuple[int, int], float]]:
    out = work / f"peer-{n}"
    args = [
        sys.executable, str(peer / "tune_throughput.py"), "--index-csv", "_index/index.csv",
        "--subset-size", "60", "--img-size", "64", "--inflation-factor", "100", "--model", "tiny",
        "--vit-depth", "2", "--bench-steps", "10", "--warmup-steps", "5", "--pin-memory", "false",
        "--batch-sizes", ",".join(map(str, GRID["batch_sizes"])),
        "--num-workers", ",".join(map(str, GRID["num_workers"])), "--out-dir", str(out),
    ]  # fmt: skip
    t = time.perf_counter()
    done = subprocess.run(args, cwd=work / "processed", capture_output=True, text=True)  # its paths: relative
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"the peer exited {done.returncode}: {done.stderr[-1500:]}")
    with (out / "results.csv").open() as f:
        rates = {(int(r["batch_size"]), int(r["num_workers"])): float(r["images_per_s"]) for r in csv.DictReader(f)}
    return wall, rates


def run_dinox(
    work: Path, tag: str, evidence: str, step: str = "timm"
) -> tuple[float, dict[tuple[int, int], float], dict[tuple[int, int], tuple[float, float]], float | None]:
    """(wall, images/s per point, per point the trial's measurement over its timed windows with its warm-up and
    without it (the spec's 5 steps, which the peer runs too); the drift check child's seconds, from its first
    mark to its last, None where none ran)."""
    store = work / f"dinox-{tag}.db"
    spec = "peer_grid.yaml" if step == "timm" else "peer_grid_peer_step.yaml"
    args = [sys.executable, "-m", "dinox", "run", spec, "--tracking-uri", f"sqlite:///{store}",
            "--workdir", f".dinox-{tag}", "--no-system-metrics", *EVIDENCE[evidence]]  # fmt: skip
    t = time.perf_counter()
    done = subprocess.run(args, cwd=work, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"dinox run exited {done.returncode}: {done.stderr[-1500:]}")
    results = next((work / f".dinox-{tag}").glob("sweeps/*/*/results.jsonl"))
    rates, ratios = {}, {}
    for line in results.read_text().splitlines():
        event = json.loads(line)
        if event.get("event") != "result":
            continue
        m, o = event["result"]["metrics"], event["trial"]["overrides"]
        point = (int(o["batch.size"]), int(o["loader.num_workers"]))
        rates[point] = m["images_per_s"]
        if m.get("measure_s") and m.get("window_s"):
            ratios[point] = (m["measure_s"] / m["window_s"], (m["measure_s"] - m.get("warmup_s", 0.0)) / m["window_s"])
    drift = next((work / f".dinox-{tag}").glob("sweeps/*/*/trials/*-drift/result.json"), None)
    marks = json.loads(drift.read_text()).get("marks", {}) if drift else {}
    drift_s = max(marks.values()) - min(marks.values()) if marks else None
    return wall, rates, ratios, drift_s


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer", type=Path, required=True, help="the peer's scripts/ folder (tune_throughput.py)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--evidence", choices=[*EVIDENCE, "both"], default="both")
    p.add_argument(
        "--step", choices=[*STEPS, "both"], default="timm", help="dinox's step: timm's ViT, the peer's own, or both"
    )
    a = p.parse_args()
    if not (a.peer / "tune_throughput.py").is_file() or not (a.peer / "phase3_micro_run.py").is_file():
        raise SystemExit(f"{a.peer}: no tune_throughput.py and phase3_micro_run.py there")
    levels = list(EVIDENCE) if a.evidence == "both" else [a.evidence]
    steps = list(STEPS) if a.step == "both" else [a.step]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_peer-") as tmp:
        work = Path(tmp)
        make_data(work, a.peer)
        for n in range(a.rounds):
            sides = [("peer", None, None), *[("dinox", level, step) for level in levels for step in steps]]
            for side, level, step in sides if n % 2 == 0 else sides[::-1]:  # alternate which goes first
                if side == "peer":
                    wall, rates = run_peer(a.peer, work, n)
                    rows.append((n + 1, "peer", wall, rates, None, None))
                else:
                    wall, rates, ratio, drift_s = run_dinox(work, f"{n}-{level}-{step}", level, step)
                    name = f"dinox ({level})" if step == "timm" else f"dinox ({level}, the peer's step)"
                    rows.append((n + 1, name, wall, rates, ratio, drift_s))
                print(f"round {n + 1}: {rows[-1][1]}: {wall:.1f} s", file=sys.stderr, flush=True)
    heads = " | ".join(f"bs={b} w={w}" for b, w in POINTS)
    what = "a trial's measurement / its timed windows: mean, largest (after warm-up)"
    print(f"| round | side | wall s | x peer | {heads} | {what} | drift check s |")
    print("|---" * (6 + len(POINTS)) + "|")
    for n, side, wall, rates, ratio, drift_s in rows:
        peer_wall = next(r[2] for r in rows if r[0] == n and r[1] == "peer")
        cells = " | ".join(f"{rates.get(pt, float('nan')):.1f}" for pt in POINTS)
        share = "-" if not ratio else shares(ratio)
        drift = "-" if drift_s is None else f"{drift_s:.1f}"
        print(f"| {n} | {side} | {wall:.1f} | {wall / peer_wall:.2f} | {cells} | {share} | {drift} |")
    print(summary(rows))
    return 0


def shares(ratios: dict[tuple[int, int], tuple[float, float]]) -> str:
    """The trials' measurement over their timed windows: the mean, and the largest with its point (the criterion
    is a trial's: a mean hides the worker trials, which measure their loader too)."""
    (b, w), most = max(ratios.items(), key=lambda kv: kv[1][0])
    mean = [statistics.mean(r[i] for r in ratios.values()) for i in (0, 1)]
    return f"{mean[0]:.2f}x, {most[0]:.2f}x at bs={b} w={w} ({mean[1]:.2f}x, {most[1]:.2f}x)"


def summary(rows: list[tuple]) -> str:
    """Over the rounds, per dinox side: the median of its wall over the same round's peer wall, and per point
    its median images/s against the peer's median, in %. One 10-step window moves 15-20 % run to run on a
    shared box, on both sides alike; the medians are what the rounds can compare."""
    walls = {r[0]: r[2] for r in rows if r[1] == "peer"}
    med = lambda side, pt: statistics.median(r[3].get(pt, math.nan) for r in rows if r[1] == side)  # noqa: E731
    lines = []
    for side in dict.fromkeys(r[1] for r in rows if r[1] != "peer"):
        ratio = statistics.median(r[2] / walls[r[0]] for r in rows if r[1] == side)
        points = ", ".join(f"{(med(side, pt) / med('peer', pt) - 1) * 100:+.1f} %" for pt in POINTS)
        lines.append(f"{side}, median of {len(walls)} rounds: {ratio:.2f}x the peer's wall; per point {points}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

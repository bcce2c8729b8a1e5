#!/usr/bin/env python3
"""Fidelity: dinox's measured throughput against a minimal hand-written PyTorch loop doing the same steps.

Both run the same timm model, batch, accumulation, precision and DataLoader over the same synthetic data,
each in a fresh process, alternating over several rounds in one run of this script; it prints the
images/s of each and the ratio of their medians (target: at or above 0.98).

    python scripts/bench_fidelity.py                        # ResNet-18 at 64 px, batch 32, CPU
    python scripts/bench_fidelity.py --model vit_small_patch16_224 --img 224 --batch 64 --precision bf16-mixed
    python scripts/bench_fidelity.py --system-metrics       # also dinox with its system metrics sampled, as in
                                                            # a sweep: their cost (target: under 1 %)
    python scripts/bench_fidelity.py --user-entry           # a team's own step (objective kind python): the same
                                                            # module, measured by dinox and driven by a plain
                                                            # loop (target: between 0.98 and 1.02)
    python scripts/bench_fidelity.py --user-entry --in-process   # both steps in one process, window for window:
                                                            # the steps' own difference, without two processes'
    python scripts/bench_fidelity.py --loader-bound         # a loader-bound trial: 2 workers x prefetch 4 of
                                                            # samples that take 10 ms, a compiled 2-layer ViT
                                                            # whose first step (compilation) is long
                                                            # (target: between 0.98 and 1.02)

Loader-bound, the workers fill their queues during the long first step; a loop that times its first steps
from that backlog reports more than the loader can feed. The hand loop stands for the run being planned: it
times a long window (--hand-steps) after --hand-settle steps, so the backlog is a vanishing part of it; dinox
times its usual windows. Above the hand loop is as wrong as below it.
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = """\
name: fidelity
model: {{name: {model}, img_size: {img}, kwargs: {kwargs}, compile: {compile}}}
objective: {{num_classes: 100}}
precision: {precision}
batch: {{size: {batch}, accumulation: {accum}}}
loader: {{num_workers: {workers}, prefetch_factor: {prefetch}, persistent_workers: {persistent}}}
data: {{source: synthetic, sample_delay_ms: {delay_ms}}}
measure: {{warmup_steps: {warmup}, bench_steps: {steps}, {repeats}timeout_s: 1800}}
"""


# --user-entry: the team's module, as a team writes it (its own timm model and loss), outside dinox.
USER_MODULE = """\
import timm
import torch.nn.functional as F


class Step:
    def __init__(self, ctx):
        self.model = timm.create_model(
            ctx.options["model"], pretrained=False, num_classes=ctx.num_classes, **ctx.options["kwargs"]
        ).to(ctx.device)

    def parameters(self):
        return self.model.parameters()

    def loss(self, batch):
        images, labels = batch
        return F.cross_entropy(self.model(images), labels)

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


def user_kwargs(a: argparse.Namespace) -> dict:
    """The timm model's arguments as the team's module passes them (img_size where the model takes one)."""
    import timm

    kwargs = dict(a.kwargs)
    if "img_size" in timm.create_model(a.model, pretrained=False).default_cfg.get(
        "input_size", ()
    ) or a.model.startswith(("vit", "deit")):
        kwargs["img_size"] = a.img
    return kwargs


def spec_text(a: argparse.Namespace) -> str:
    """The trial: one window, or (loader-bound) dinox's default windows, 2 to 5 until they agree."""
    values = {
        **vars(a),
        "kwargs": json.dumps(a.kwargs),
        "prefetch": a.prefetch if a.workers else "null",
        "persistent": str(a.workers > 0).lower(),
        "repeats": "" if a.loader_bound else "repeats: 1, ",
    }
    text = SPEC.format(**values)
    if a.user_entry:  # the same model, built by the team's module instead of by dinox
        options = json.dumps({"model": a.model, "kwargs": user_kwargs(a)})
        where = f'path: "{a.module_dir}", num_classes: 100, options: {options}'
        entry = f'{{kind: python, entry: "benchstep:build", {where}}}'
        text = text.replace("objective: {num_classes: 100}", f"objective: {entry}")
    return text


def hand_step(a: argparse.Namespace, samples: int):
    """The step a careful user writes by hand, built over a loader of `samples` images: (step, synchronise)."""
    import timm
    import torch
    from torch.utils.data import DataLoader

    from dinox.data.synthetic import SyntheticImages
    from dinox.data.views import ViewPlan

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    if a.user_entry:  # the team's module, driven by the plain loop: its loss is the step
        sys.path.insert(0, a.module_dir)
        import types

        import benchstep  # type: ignore[import-not-found]

        ctx = types.SimpleNamespace(
            device=device, num_classes=100, options={"model": a.model, "kwargs": user_kwargs(a)}
        )
        team = benchstep.build(ctx)
        if a.compile:
            team.compile(torch.compile)
        model = team.model.train()
    else:
        try:
            model = timm.create_model(a.model, pretrained=False, num_classes=100, img_size=a.img, **a.kwargs)
        except TypeError:
            model = timm.create_model(a.model, pretrained=False, num_classes=100, **a.kwargs)
        model = model.to(device).train()
        if a.compile:
            model = torch.compile(model)
    opt = torch.optim.AdamW(
        model.parameters(), lr=1e-3, weight_decay=0.05, **({"fused": True} if device.type == "cuda" else {})
    )
    dtype = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(a.precision)
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    data = SyntheticImages(samples, 3, ViewPlan(full_size=a.img), 100, 0, a.delay_ms / 1000.0)
    loader = DataLoader(
        data,
        batch_size=a.batch,
        shuffle=True,
        num_workers=a.workers,
        prefetch_factor=a.prefetch if a.workers else None,
        persistent_workers=a.workers > 0,
        drop_last=True,
        generator=torch.Generator().manual_seed(0),
    )
    it = iter(loader)
    loss_fn = torch.nn.CrossEntropyLoss()
    # uint8 images made float and normalised on the device, as timm's PrefetchLoader does.
    mean = torch.tensor(timm.data.IMAGENET_DEFAULT_MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(timm.data.IMAGENET_DEFAULT_STD, device=device).view(1, 3, 1, 1) * 255

    def step() -> None:
        for _ in range(a.accum):
            x, y = next(it)
            x, y = x.to(device).float().sub_(mean).div_(std), y.to(device)
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = (team.loss((x, y)) if a.user_entry else loss_fn(model(x), y)) / a.accum
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)

    return step, (torch.cuda.synchronize if device.type == "cuda" else (lambda: None))


def hand_loop(a: argparse.Namespace) -> float:
    """The hand-written step in a process of its own: warmed up, then timed at the edges."""
    step, sync = hand_step(a, (a.warmup + a.hand_settle + a.hand_steps) * a.accum * a.batch)
    for _ in range(a.warmup + a.hand_settle):
        step()
    sync()
    t = time.perf_counter()
    for _ in range(a.hand_steps):
        step()
    sync()
    return a.hand_steps * a.accum * a.batch / (time.perf_counter() - t)


def paired_windows(spec_text: str, step, sync, a: argparse.Namespace, images: int, header: str) -> None:
    """dinox's trial (its own objects, timed by its loop, from `spec_text`) and the hand `step` in this one
    process, window for window, alternating which goes first: what differs between two processes (their
    placement on the cores, a neighbour's burst) is gone, and what is left is the steps' own difference.
    `images`: per hand step. Prints each side's windows and the paired ratios; bench_dinov2 uses it too."""
    import tempfile

    from dinox.measure.trial import TrialRun
    from dinox.plan import grid
    from dinox.spec import file as spec_file

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(spec_text)
        (trial,) = grid.expand(spec_file.load(path))
    run = TrialRun(trial.spec, {}, {}, {})
    run.setup()
    loop = run.make_loop()
    windows = 4 * a.rounds
    for _ in range(a.warmup):
        step()
    dinox, hand = [], []
    for i in range(windows):
        for side in ("dinox", "hand") if i % 2 == 0 else ("hand", "dinox"):
            if side == "dinox":  # a trial's warm-up and one timed window, as `measure.repeats: 1` runs them
                dinox.append(loop.run(1 if i else a.warmup, a.steps).windows[0].images_per_s)
                continue
            step()  # one untimed step, as dinox's window starts at a step's end
            sync()
            t = time.perf_counter()
            for _ in range(a.steps):
                step()
            sync()
            hand.append(a.steps * images / (time.perf_counter() - t))
    ratios = [d / h for d, h in zip(dinox, hand, strict=True)]
    print(f"{header}, in one process: {windows} windows of {a.steps} steps a side")
    print(f"dinox images/s      {' '.join(f'{v:.1f}' for v in dinox)}  median {statistics.median(dinox):.1f}")
    print(f"hand loop images/s  {' '.join(f'{v:.1f}' for v in hand)}  median {statistics.median(hand):.1f}")
    print(f"window ratios       {' '.join(f'{r:.3f}' for r in ratios)}")
    print(
        f"fidelity_ratio {statistics.median(ratios):.3f}  (median of the paired windows' dinox / hand loop; dinox "
        f"ahead in {sum(r > 1 for r in ratios)} of {windows}; target between 0.98 and 1.02)"
    )
    print(within_target(ratios))


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval for the median of `values` (the sign test's order statistics): the k-th
    smallest and k-th largest, k the largest count with P(Binomial(n, 1/2) < k) <= (1 - level) / 2. None where
    there are too few values for one (under 6 at 95 %). The pairs' spread on a shared box is no normal curve,
    so no mean and standard error."""
    n, tail, k = len(values), 0.0, 0
    while (step := math.comb(n, k) / 2**n) + tail <= (1 - level) / 2:
        tail, k = tail + step, k + 1
    ordered = sorted(values)
    return (ordered[k - 1], ordered[n - k]) if k else None


def within_target(ratios: list[float], low: float = 0.98, high: float = 1.02) -> str:
    """Whether the paired ratios show the median inside the target, outside it, or cannot say: its 95 % interval
    inside [low, high], wholly outside, or across an edge (more pairs narrow it)."""
    interval = median_interval(ratios)
    if interval is None:
        return f"median's 95 % interval: too few pairs ({len(ratios)}) for one; within the target: not shown"
    lo, hi = interval
    said = (
        "yes"
        if low <= lo and hi <= high
        else "no"
        if hi < low or lo > high
        else "not shown (the interval reaches past an edge: more pairs narrow it)"
    )
    return f"median's 95 % interval {lo:.3f}-{hi:.3f} over {len(ratios)} pairs; within {low:.2f}-{high:.2f}: {said}"


SERVER = None  # dinox's fork server, as `dinox run` uses it: each trial a fresh process, without the imports


def dinox_trial(a: argparse.Namespace, tmp: Path, i: int, sampled: bool = False) -> tuple[float, float]:
    """One trial as a sweep measures it; `sampled`: with its system metrics sampled into a run meanwhile.
    Its images/s, and the CPU seconds per second this (parent) process spent meanwhile."""
    from dinox.isolate import runner
    from dinox.plan import grid
    from dinox.spec import file as spec_file

    path = tmp / f"spec{i}.yaml"
    path.write_text(spec_text(a))
    (trial,) = grid.expand(spec_file.load(path))
    monitor = None
    if sampled:
        from mlflow import MlflowClient

        from dinox.store.system_metrics import TrialMonitor

        uri = f"sqlite:///{tmp / 'mlflow.db'}"
        client = MlflowClient(uri)
        run_id = client.create_run("0").info.run_id
    cpu, wall = time.process_time(), time.time()
    if sampled:
        monitor = TrialMonitor(run_id, uri)
    r = runner.run_trial(trial, tmp / f"t{i}{'s' if sampled else ''}", server=SERVER).result
    if monitor is not None:
        monitor.finish()
    parent_cpu = (time.process_time() - cpu) / (time.time() - wall)
    if r.status != "ok":
        raise SystemExit(f"dinox trial {r.status}: {r.error}")
    return r.metrics["images_per_s"], parent_cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--img", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--system-metrics", action="store_true", help="also measure dinox with system metrics sampled")
    p.add_argument("--loader-bound", action="store_true", help="the loader-bound case (see above)")
    p.add_argument("--delay-ms", type=float, default=0.0, help="each sample's wait (synthetic sample_delay_ms)")
    p.add_argument("--prefetch", type=int, default=2, help="loader.prefetch_factor")
    p.add_argument("--compile", action="store_true", help="model.compile: true on both sides")
    p.add_argument("--hand-steps", type=int, default=None, help="the hand loop's timed steps (default: --steps)")
    p.add_argument("--hand-settle", type=int, default=0, help="untimed hand-loop steps after its warm-up")
    p.add_argument("--kwargs", type=json.loads, default={}, help="timm.create_model keyword arguments, as JSON")
    p.add_argument("--user-entry", action="store_true", help="a team's own step module on both sides")
    p.add_argument("--in-process", action="store_true", help="both steps in this one process, window for window")
    p.add_argument("--module-dir", default="", help=argparse.SUPPRESS)  # where --user-entry's module is
    p.add_argument("--hand-loop", action="store_true", help=argparse.SUPPRESS)  # the child's side
    a = p.parse_args()
    if a.loader_bound:
        a.model, a.img, a.batch, a.workers, a.prefetch, a.delay_ms, a.compile = (
            "vit_tiny_patch16_224",
            32,
            8,
            2,
            4,
            10.0,
            True,
        )
        a.kwargs = {"patch_size": 8, "depth": 2}
        a.hand_steps = a.hand_steps or 200
        a.hand_settle = a.hand_settle or 50
    a.hand_steps = a.hand_steps or a.steps
    if a.hand_loop:
        print(json.dumps({"images_per_s": hand_loop(a)}))
        return
    module_dir = tempfile.mkdtemp(prefix="dinox-team-")
    atexit.register(shutil.rmtree, module_dir, ignore_errors=True)  # the hand-loop child is done by then
    if a.user_entry:
        a.module_dir = module_dir
        Path(module_dir, "benchstep.py").write_text(USER_MODULE)
    if a.in_process:
        step, sync = hand_step(a, (a.warmup + 4 * a.rounds * (a.steps + 1)) * a.accum * a.batch)
        header = (
            f"{'a team module building ' if a.user_entry else ''}{a.model} at {a.img} px, batch {a.batch} x "
            f"{a.accum}, {a.precision}, {a.workers} workers"
        )
        paired_windows(spec_text(a), step, sync, a, a.accum * a.batch, header)
        return
    skip = ("rounds", "hand_loop", "system_metrics", "loader_bound", "compile", "kwargs", "user_entry", "in_process")
    args = [f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items() if k not in skip]
    args += ["--kwargs", json.dumps(a.kwargs)] + (["--compile"] if a.compile else [])
    args += ["--user-entry"] if a.user_entry else []
    dinox, hand, sampled, cpu = [], [], [], {False: [], True: []}
    global SERVER
    from dinox.isolate.forkserver import ForkServer

    SERVER = ForkServer()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):
            # Rounds alternate, and so does which side goes first in a round: a side always run second would
            # meet whatever the first leaves behind (a warm page cache, a busier box) every time.
            sides = [*(["dinox", "sampled"] if a.system_metrics else ["dinox"]), "hand"]
            for side in sides if i % 2 == 0 else sides[::-1]:
                if side == "hand":
                    out = subprocess.run(
                        [sys.executable, __file__, "--hand-loop", *args], capture_output=True, text=True, check=True
                    )
                    hand.append(json.loads(out.stdout.strip().splitlines()[-1])["images_per_s"])
                    continue
                on = side == "sampled"
                ips, parent_cpu = dinox_trial(a, Path(tmp), i, sampled=on)
                (sampled if on else dinox).append(ips)
                cpu[on].append(parent_cpu)
    SERVER.close()
    loading = f", samples {a.delay_ms:g} ms, prefetch {a.prefetch}" if a.delay_ms else ""
    print(
        f"{'a team module building ' if a.user_entry else ''}{a.model} at {a.img} px, batch {a.batch} x {a.accum}, "
        f"{a.precision}, {a.workers} workers{loading}"
        f"{', compiled' if a.compile else ''}, {a.steps} steps a dinox window, {a.hand_steps} timed hand-loop steps "
        f"after {a.warmup + a.hand_settle}, {a.rounds} rounds"
    )
    print(f"dinox images/s      {' '.join(f'{v:.1f}' for v in dinox)}  median {statistics.median(dinox):.1f}")
    print(f"hand loop images/s  {' '.join(f'{v:.1f}' for v in hand)}  median {statistics.median(hand):.1f}")
    print(f"round ratios        {' '.join(f'{d / h:.3f}' for d, h in zip(dinox, hand, strict=True))}")
    target = "between 0.98 and 1.02" if a.loader_bound or a.user_entry else ">= 0.98"
    print(
        f"fidelity_ratio {statistics.median(dinox) / statistics.median(hand):.3f}  (dinox / hand loop; target {target})"
    )
    if sampled:
        print(
            f"dinox + system metrics images/s  {' '.join(f'{v:.1f}' for v in sampled)}  "
            f"median {statistics.median(sampled):.1f}"
        )
        cost = 1 - statistics.median(sampled) / statistics.median(dinox)
        print(f"system_metrics_cost {cost:+.3f}  (1 - sampled / unsampled median; within this box's noise)")
        # The sampler's own CPU, measured in this process: what it can take from a trial that saturates the
        # machine's cores, a figure far steadier than the throughput difference.
        extra = statistics.median(cpu[True]) - statistics.median(cpu[False])
        cores = os.cpu_count() or 1
        print(
            f"sampler_cpu {extra * 1000:.1f} ms/s in the parent = {extra:.2%} of one core, "
            f"{extra / cores:.2%} of this {cores}-core machine (target < 1%)"
        )


if __name__ == "__main__":
    main()

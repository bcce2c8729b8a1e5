#!/usr/bin/env python3
"""GPU acceptance: every GPU path of dinox through `dinox run`, five of them against a hand-written loop.

    python scripts/gpu_check.py                 # on a CUDA machine: --quick, then --rest
    python scripts/gpu_check.py --print-spec    # the spec it runs, without running it (any machine)
    python scripts/gpu_check.py --quick         # seven cases: the first minutes on a new GPU node
    python scripts/gpu_check.py --rest          # the nine cases --quick leaves out
    python scripts/gpu_check.py --small         # three of the cases at CPU sizes, on any machine: the script's
                                                # own plumbing (statuses and labels; no fidelity floor there)
    python scripts/gpu_check.py --keep DIR      # any of the above, keeping the store (DIR/mlflow.db) and the
                                                # sweep's results.csv in DIR, for `dinox decide` later

It writes demo CT data, a spec and an MLflow store into a temporary folder (nothing outside it), runs the spec
with `dinox run` (one trial per GPU path), then times five of the same configurations in a loop written by
hand that synchronises only at the edges of its window, as a user's own training loop would (timm's
PrefetchLoader where the trial copies on a side stream). It prints one table (trial, status, images/s,
dinox / hand loop, bound with its evidence, device idle share, peak memory, MFU against dinox.plan.peaks,
the profiled device's busy and host-wait shares, each case's own seconds) and exits 1 when a fidelity ratio is
outside 0.98-1.02 (on a GPU), a constructed case gets the wrong label, a trial ends other than expected, a graph
compiles inside the timed windows, MFU is above 1, a profiled trial has no idle split or a hand loop fails.
Stopped (Ctrl-C, `timeout`), it stops `dinox run` and the hand loops with it.

The cases, and the seconds each took on the first H100 (80 GB HBM3, torch 2.11, timm 1.0.29; 2026-11-26,
`dinox run` trial / hand loop; "-": not yet timed there, changed since or cut off by that run's time limit):

    --quick  bf16 channels_last fused (ResNet-50, 128)     30 / 26   hand loop 0.994, 0.967 (two runs)
             pinned copies (ResNet-18, 256, 8 workers)     15 / 15   hand loop ate its loader's queue (fixed)
             DINO ViT-S/14 multi-crop (8 x 98 px, 64)      24
             side-stream prefetch (ResNet-50, 128)         17 / 16   timm's PrefetchLoader: 0.955, 0.953
             small steps, profiled (built host_bound)      17
             CT PNG, 0 workers (built io_bound)            101 at batch 128 (1 s a step); now batch 32: -
             large synthetic (built compute_bound, ViT-B)  15
    --rest   fp16 GradScaler 31, tf32 41, compile, profiled 126, unpinned copies 12 (these four beside a
             hand loop that an earlier `timeout` had left running); OOM under a memory cap, batch.size auto,
             fp32 with runtime knobs, DINO + compile, CT PNG with 2 workers: -

The whole check took more than the 8 minutes it is meant to fit: --quick's `dinox run` 231 s, the four --rest
trials above 209 s. The CT PNG, 0 workers case was the largest part of --quick and is now a quarter of it; the
rest's time is not yet measured. The CT set holds more slices than the largest batch; the batch search's
probes run without ablation windows; only the compile cases compile (and the compile case's hand loop).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIDELITY_MIN = 0.98
FIDELITY_MAX = 1.02  # above the user's own loop is as wrong as below it

BASE = """\
# Written by scripts/gpu_check.py: one trial per GPU path.
name: gpu_check
model: {{name: resnet50, img_size: 224, channels_last: true}}
objective: {{kind: classification, num_classes: 1000}}
precision: bf16-mixed
batch: {{size: 128, accumulation: 1}}
optimizer: {{name: adamw, lr: 1.0e-3}}
loader: {{num_workers: {workers}, pin_memory: true, prefetch_factor: 4, persistent_workers: true}}
data: {{source: synthetic}}
hardware: {{device: {device}}}
measure: {{warmup_steps: 10, bench_steps: {steps}, repeats: 3, ablation_steps: {steps}, timeout_s: 600}}
sweep:
  cases:
"""


@dataclass(frozen=True)
class Case:
    label: str
    overrides: dict
    expect_status: str = "ok"
    expect_bound: str | None = None  # a constructed case: the label it must get
    hand_loop: bool = False  # also timed in the hand-written loop
    profiled: bool = False  # measure.profile on: its summary (dinox.profile) must hold the device's idle split

    def yaml(self) -> str:
        return f"    - {json.dumps(self.overrides)}   # {self.label}\n"


QUICK = (
    "bf16 channels_last fused",
    "side-stream prefetch",
    "pinned copies",
    "DINO ViT-S/14 multi-crop",
    "CT PNG, 0 workers (built io_bound)",
    "large synthetic (built compute_bound)",
    "small steps, profiled (built host_bound)",
)


def cases(index_csv: str, small: bool, part: str = "all") -> list[Case]:
    """The GPU paths. `small`: tiny models and sizes (the CPU smoke test of this script's own plumbing)."""
    big = "resnet18" if small else "vit_base_patch16_224"
    img, batch = (32, 8) if small else (224, 128)
    out = [
        Case("bf16 channels_last fused", {"batch.size": batch, "model.img_size": img}, hand_loop=True),
        Case("fp16 GradScaler", {"precision": "fp16-mixed", "batch.size": batch, "model.img_size": img}),
        Case("tf32", {"precision": "tf32", "model.channels_last": False, "batch.size": batch, "model.img_size": img}),
        Case(
            "compile, profiled",
            {"model.compile": True, "batch.size": batch, "model.img_size": img, "measure.profile": True},
            hand_loop=True,
            profiled=True,
        ),
        Case(
            "pinned copies", {"model.name": "resnet18", "batch.size": 2 * batch, "model.img_size": img}, hand_loop=True
        ),
        Case(
            "unpinned copies",
            {"model.name": "resnet18", "batch.size": 2 * batch, "model.img_size": img, "loader.pin_memory": False},
        ),
        Case(
            "OOM under a memory cap",
            {
                "model.name": "vit_large_patch16_224",
                "batch.size": 512,
                "hardware.memory_limit_gb": 6,
                "model.channels_last": False,
            },
            expect_status="oom",
        ),
        Case(
            "batch.size auto",
            {
                "batch.size": "auto",
                "batch.auto_min": 16,
                "batch.auto_max": 1024,
                "hardware.memory_limit_gb": 12,
                "model.img_size": img,
            },
        ),
        Case(
            "DINO ViT-S/14 multi-crop",
            {
                "model.name": "vit_small_patch14_dinov2",
                "model.channels_last": False,
                "objective": {"kind": "dino", "out_dim": 65536, "local_crops": 8, "local_crop_size": 98},
                "batch.size": 64,
            },
        ),
        Case(
            "side-stream prefetch",
            {"batch.size": batch, "model.img_size": img, "loader.device_prefetch": True},
            hand_loop=True,
        ),
        Case(
            "fp32, runtime knobs",
            {
                "precision": "fp32",
                "model.channels_last": False,
                "batch.size": batch,
                "model.img_size": img,
                "runtime": {
                    "matmul_precision": "high",
                    "cudnn_benchmark": True,
                    "expandable_segments": True,
                    "gc": "frozen",
                },
            },
            hand_loop=True,
        ),
        Case(
            "DINO + compile",
            {
                "model.name": "vit_small_patch14_dinov2",
                "model.channels_last": False,
                "model.compile": True,
                "objective": {"kind": "dino", "out_dim": 65536, "local_crops": 8, "local_crop_size": 98},
                "batch.size": 64,
            },
        ),
        Case(
            "small steps, profiled (built host_bound)",
            {"batch.size": 8, "model.img_size": 64, "measure.profile": True},
            expect_bound="host_bound",
            profiled=True,
        ),
        Case(
            "CT PNG, 2 workers (built io_bound)",
            {
                "data": {"source": "ct_png", "index_csv": index_csv},
                "model.name": "resnet18",
                "loader.num_workers": 2,
                "loader.prefetch_factor": 2,
                "batch.size": batch // 2,
                "model.img_size": img,
            },
            expect_bound="io_bound",
        ),
        Case(
            "CT PNG, 0 workers (built io_bound)",
            {
                "data": {"source": "ct_png", "index_csv": index_csv},
                "loader.num_workers": 0,
                "loader.prefetch_factor": None,
                "loader.persistent_workers": False,
                "batch.size": batch // 4 if not small else batch,  # 128 took 101 s: 1 s a step
                "model.img_size": img,
            },
            expect_bound="io_bound",
        ),
        Case(
            "large synthetic (built compute_bound)",
            {"model.name": big, "model.channels_last": False, "batch.size": batch, "model.img_size": img},
            expect_bound="compute_bound",
        ),
    ]
    if part != "all":
        out = [c for c in out if (c.label in QUICK) == (part == "quick")]
    if small:  # the CPU smoke test: what a CPU can run, at CPU sizes
        out = [
            c
            for c in out
            if c.label in ("tf32", "large synthetic (built compute_bound)", "CT PNG, 0 workers (built io_bound)")
        ]
        out = [
            Case(
                c.label,
                {**c.overrides, "precision": "fp32", "model.name": "resnet18"},
                c.expect_status,
                c.expect_bound,
                c.label == "tf32",
            )
            for c in out
        ]
    return out


def spec_text(index_csv: str, small: bool, device: str, part: str = "all") -> str:
    text = BASE.format(workers=0 if small else 8, steps=4 if small else 20, device=device)
    if small:
        text = text.replace("pin_memory: true, prefetch_factor: 4, persistent_workers: true", "pin_memory: false")
        text = text.replace("warmup_steps: 10", "warmup_steps: 2")
    return text + "".join(c.yaml() for c in cases(index_csv, small, part))


def make_ct(tmp: Path, small: bool) -> str:
    """A small CT study as DICOM, then PNGs and an index, through dinox's own preprocessing: more slices than
    the CT case's batch (a set smaller than one batch yields none; dinox refuses it)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import make_demo_ct

    from dinox.data.dicom_preprocess import preprocess

    # 16 > batch 8; 144 > batch 128. At CPU sizes a 512 px slice's decoding outweighs a 32 px step clearly.
    patients, slices, size = (2, 8, 512) if small else (3, 48, 256)
    make_demo_ct.make_demo(tmp / "dicom", patients=patients, slices=slices, size=size)
    return preprocess(tmp / "dicom", tmp / "png", progress=False).index_path


def _child(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """A child that ends with this script: stopped (`timeout`, Ctrl-C), it is stopped too, and its own
    children with it. On the first H100 a hand loop left behind by a `timeout` ran on beside the next
    `dinox run`, and two of that run's trials read it as their loader's cost."""
    with subprocess.Popen(cmd, start_new_session=True, **kw) as proc:
        try:
            out, err = proc.communicate()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)  # dinox run ends its trial and records what it has
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_dinox(tmp: Path, spec: Path) -> list[dict[str, str]]:
    """`dinox run` in the temporary folder (store, workdir and all); the sweep's results.csv rows."""
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    sys.stdout.flush()  # its lines as they come, after ours: a check cut short still shows how far it got
    proc = _child(
        [sys.executable, "-m", "dinox", "run", str(spec), "--tracking-uri", uri, "--workdir", str(tmp / ".dinox")],
        cwd=tmp,
    )
    if proc.returncode != 0:
        raise SystemExit(f"dinox run exited {proc.returncode}")
    (results,) = (tmp / ".dinox" / "sweeps" / "gpu_check").glob("*/results.csv")
    shutil.copyfile(results, tmp / "results.csv")
    return sorted(csv.DictReader(results.open()), key=lambda r: int(r["index"]))


def run_tags(tmp: Path, rows: list[dict[str, str]]) -> list[tuple[dict | None, dict | None]]:
    """Each trial's measure.profile summary (the dinox.profile tag) and its windows' SM clocks (the
    dinox.window_clocks tag: a GPU ramping up or throttling across the windows), None where it has none."""
    from mlflow.tracking import MlflowClient

    from dinox import record as rec

    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    tags = [client.get_run(r["run_id"]).data.tags if r.get("run_id") else {} for r in rows]
    return [tuple(json.loads(t[k]) if k in t else None for k in (rec.PROFILE, rec.WINDOW_CLOCKS)) for t in tags]


def hand_loop(row: dict[str, str], steps: int, warmup: int) -> float:
    """The same configuration in the loop a careful user writes: no host sync inside the timed window, the
    runtime knobs the trial set, timm's PrefetchLoader where the trial copies on a side stream."""
    import timm
    import torch
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
    from torch.utils.data import DataLoader

    from dinox.data.synthetic import SyntheticImages
    from dinox.data.views import ViewPlan

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    size, img = int(row["batch.size"]), int(row["model.img_size"])
    precision, cl = row["precision"], row["model.channels_last"] == "True"
    torch.backends.cudnn.benchmark = row.get("runtime.cudnn_benchmark", "True") != "False" and dev.type == "cuda"
    # torch's defaults, as a user's loop has them: cuDNN's TF32 on, the matmuls' only for tf32 or where set.
    torch.set_float32_matmul_precision(
        row.get("runtime.matmul_precision") or ("high" if precision == "tf32" else "highest")
    )
    torch.backends.cudnn.allow_tf32 = precision != "fp32-strict"
    model = timm.create_model(row["model.name"], pretrained=False, num_classes=1000).to(dev)
    model = model.to(memory_format=torch.channels_last) if cl else model
    if row["model.compile"] != "False":
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05, fused=dev.type == "cuda")
    dtype = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(dev.type) if dtype == torch.float16 else None
    workers, pin = int(row["loader.num_workers"]), row["loader.pin_memory"] == "True" and dev.type == "cuda"
    prefetch = int(row.get("loader.prefetch_factor") or 2) if workers else 0
    # The workers fill their queue (workers x prefetch batches) while the model is built and cuDNN tunes, and
    # the queue drains only by the gap between the step's pace and the loader's: a window that starts on it
    # times batches made before it. On the first H100, warm-up past the queue once (34 steps) left half of it:
    # ResNet-18 with 8 workers ran 9996 img/s in this loop, 6723 in dinox, 6544 from the loader alone. Four
    # times the queue drains it where the loader runs at 3/4 of the step's pace or slower; nearer than that,
    # what is left of it moves the figure by less than the step outruns the loader.
    backlog = workers * prefetch
    warmup += 4 * backlog
    data = SyntheticImages((warmup + steps) * size, 3, ViewPlan(full_size=img), 1000, 0)
    loader = DataLoader(
        data,
        batch_size=size,
        shuffle=True,
        num_workers=workers,
        pin_memory=pin,
        drop_last=True,
        persistent_workers=workers > 0,
        prefetch_factor=prefetch or None,
    )
    side = row.get("loader.device_prefetch") == "True" and dev.type == "cuda"
    if side:  # timm's own side-stream loader: copies, makes float and normalises the next batch ahead
        loader = timm.data.loader.PrefetchLoader(loader, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, device=dev)
    it, loss_fn = iter(loader), torch.nn.CrossEntropyLoss()
    # uint8 images made float and normalised on the device, as timm's PrefetchLoader does.
    mean = torch.tensor(IMAGENET_DEFAULT_MEAN, device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor(IMAGENET_DEFAULT_STD, device=dev).view(1, 3, 1, 1) * 255

    def step() -> None:
        x, y = next(it)
        if not side:
            x, y = x.to(dev, non_blocking=pin), y.to(dev, non_blocking=pin)
            x = x.float().sub_(mean).div_(std)
        x = x.contiguous(memory_format=torch.channels_last) if cl else x
        with torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(model(x), y)
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return steps * size / (time.perf_counter() - t)


def _hand_in_child(row: dict[str, str], steps: int, warmup: int) -> tuple[float | None, float, str]:
    """The hand loop in a fresh process of its own, as dinox's trials are: (images/s, its seconds, its error)."""
    t = time.time()
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import gpu_check; "
        "print(json.dumps(gpu_check.hand_loop(json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))"
    )
    from dinox.isolate import contention

    env = dict(os.environ)
    # OpenMP's waiting threads as dinox sets them for its trials on this box: spinning beside a neighbour's
    # work, a hand loop measures the neighbour (a --small run beside a parallel suite: dinox/hand 21.3).
    env.update({k: v for k, v in contention.omp_env(os.environ).items() if k == "OMP_WAIT_POLICY"})
    if row.get("runtime.expandable_segments") == "True":  # as the trial's child sets it, before CUDA starts
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    out = _child(
        [sys.executable, "-c", code, str(ROOT / "scripts"), json.dumps(row), str(steps), str(warmup)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    if out.returncode != 0:  # the table still comes, with this case failed and why
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return None, time.time() - t, f"hand loop exited {out.returncode}: {last}"
    return float(out.stdout.strip().splitlines()[-1]), time.time() - t, ""


@dataclass
class Line:
    case: Case
    row: dict[str, str]
    hand: float | None = None
    hand_s: float = 0.0  # the hand loop's own seconds
    hand_error: str = ""
    profile: dict | None = None  # the trial's dinox.profile summary
    clocks: dict | None = None  # the trial's dinox.window_clocks: each timed window's rate and SM clock

    def problems(self, fidelity: bool = True) -> list[str]:
        """What is wrong with this case; `fidelity`: hold the ratio to FIDELITY_MIN-MAX (a GPU's windows; a CPU's
        few-millisecond steps at --small sizes move by more than 2 % from run to run)."""
        out, r = [], self.row
        if r["status"] != self.case.expect_status:
            out.append(f"{self.case.label}: {r['status']} where {self.case.expect_status} was expected ({r['error']})")
        # The promise is the right label or an honest "inconclusive" (a loaded box cannot always tell), never a
        # wrong one.
        if (
            self.case.expect_bound
            and r["status"] == "ok"
            and r["bound"] not in (self.case.expect_bound, "inconclusive")
        ):
            out.append(f"{self.case.label}: labelled {r['bound']}, built to be {self.case.expect_bound}")
        if fidelity and self.ratio is not None and not FIDELITY_MIN <= self.ratio <= FIDELITY_MAX:
            bounds = f"{FIDELITY_MIN}-{FIDELITY_MAX}"
            out.append(f"{self.case.label}: dinox / hand loop = {self.ratio:.3f}, outside {bounds}")
        # Static shapes compile every graph in warm-up: one inside the windows is in their time.
        if (recompiled := _num(r.get("recompiles_in_windows"))) and recompiled > 0:
            out.append(f"{self.case.label}: {recompiled:g} graph(s) compiled inside the timed windows")
        if self.hand_error:
            out.append(f"{self.case.label}: {self.hand_error}")
        if self.case.profiled and r["status"] == "ok":
            idle = (self.profile or {}).get("idle")
            if self.profile is None:
                out.append(f"{self.case.label}: measure.profile left no summary (dinox.profile)")
            elif fidelity and not idle:  # on a GPU the trace has device activity: the split must be there
                out.append(f"{self.case.label}: the profile has no idle split of the device's time")
            elif idle and r["bound"] == "host_bound" and idle.get("busy", 0) > 0.9:
                out.append(
                    f"{self.case.label}: labelled host_bound, yet the profiled device was busy {idle['busy']:.0%}"
                )
        # MFU above 1 is a peak of the wrong precision class (dinox.math_class), never a fast trial.
        if (mfu := _num(r.get("mfu"))) and mfu > 1.0:
            out.append(f"{self.case.label}: MFU {mfu:.0%} is above the peak (math class {r.get('math_class', '?')})")
        return out

    @property
    def ratio(self) -> float | None:
        ips = _num(self.row.get("images_per_s"))
        return ips / self.hand if ips and self.hand else None


def _num(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def _idle(profile: dict | None) -> str:
    idle = (profile or {}).get("idle")
    return f"{idle['busy']:.0%} / {idle['host_wait']:.0%}" if idle else "-"


def _clocks(clocks: dict | None) -> str:
    """The SM clock after the first and the last timed window, in MHz ("-" off a GPU)."""
    from dinox.contract import SM_CLOCK_KEY

    mhz = (clocks or {}).get(SM_CLOCK_KEY) or []
    return f"{mhz[0]:.0f} -> {mhz[-1]:.0f}" if mhz else "-"


def table(lines: list[Line]) -> str:
    head = ["trial", "status", "img/s", "windows apart", "dinox/hand", "bound", "idle share", "peak GiB", "MFU"]
    head += ["profiled busy / host wait", "SM MHz, first -> last window", "seconds"]
    rows = []
    for ln in lines:
        r = ln.row
        ips, spread, idle, peak, mfu, wall = (
            _num(r.get(k))
            for k in (
                "images_per_s",
                "window_spread",
                "device_idle_share",
                "peak_mem_reserved_gb",
                "mfu",
                "trial_wall_s",
            )
        )
        why = r.get("bound_evidence") or ""
        rows.append(
            [
                ln.case.label,
                r["status"],
                f"{ips:.1f}" if ips else "-",
                f"{spread:.1%}" if spread is not None else "-",
                f"{ln.ratio:.3f}" if ln.ratio else "-",
                (r["bound"] or "-") + (f" ({why})" if why else ""),
                f"{idle:.1%}" if idle is not None else "-",
                f"{peak:.2f}" if peak else "-",
                f"{mfu:.1%}" if mfu else "-",
                _idle(ln.profile),
                _clocks(ln.clocks),
                (f"{wall:.0f}" if wall else "-") + (f" + hand {ln.hand_s:.0f}" if ln.hand else ""),
            ]
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    fmt = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([fmt(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(fmt, rows)])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--print-spec", action="store_true", help="print the spec and exit")
    p.add_argument("--small", action="store_true", help="three cases at CPU sizes, on any machine")
    one = p.add_mutually_exclusive_group()
    one.add_argument("--quick", action="store_true", help="six cases: the first minutes on a new GPU node")
    one.add_argument("--rest", action="store_true", help="the cases --quick leaves out")
    p.add_argument("--keep", type=Path, help="an empty or new folder to keep the store and results.csv in")
    a = p.parse_args()
    signal.signal(signal.SIGTERM, _stop)  # `timeout` stops the children too, as Ctrl-C does
    part = "quick" if a.quick else "rest" if a.rest else "all"
    with tempfile.TemporaryDirectory(prefix="dinox-gpu-check-") as name:
        tmp = Path(name)
        if a.keep:
            a.keep.mkdir(parents=True, exist_ok=True)
            if any(a.keep.iterdir()):
                print(f"gpu_check: --keep {a.keep} is not empty", file=sys.stderr)
                return 2
            tmp = a.keep.resolve()
        device = "cpu" if a.small else "cuda"
        if a.print_spec:
            print(spec_text("data/processed/_index/index.csv", a.small, device, part), end="")
            return 0
        import torch

        if not a.small and not torch.cuda.is_available():
            print("gpu_check: no CUDA device here (torch.cuda.is_available() is False)", file=sys.stderr)
            return 2
        t0 = time.time()
        index = make_ct(tmp, a.small)
        spec = tmp / "gpu_check.yaml"
        spec.write_text(spec_text(index, a.small, device, part))
        rows = run_dinox(tmp, spec)
        swept = time.time() - t0
        steps, warmup = (4, 2) if a.small else (40, 10)
        lines = []
        for c, r, (prof, clocks) in zip(cases(index, a.small, part), rows, run_tags(tmp, rows), strict=True):
            hand = _hand_in_child(r, steps, warmup) if c.hand_loop and r["status"] == "ok" else (None, 0.0, "")
            lines.append(Line(c, r, *hand, profile=prof, clocks=clocks))
        name_ = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
        print(f"\n{name_}, torch {torch.__version__}: {time.time() - t0:.0f} s (data and dinox run {swept:.0f} s)\n")
        print(table(lines))
        problems = [msg for ln in lines for msg in ln.problems(fidelity=not a.small)]
        for msg in problems:
            print(f"FAIL {msg}")
        print("gpu_check: OK" if not problems else f"gpu_check: {len(problems)} problem(s)")
        return 1 if problems else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("gpu_check: stopped; its children with it", file=sys.stderr)
        sys.exit(130)

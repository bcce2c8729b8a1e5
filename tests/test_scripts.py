"""dinox's own benchmarks run and print figures of the right form (their values are for the README and
the notes: this shared 2-core machine is too noisy for timed assertions)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, TINY


def run_script(name: str, *args: str, cwd) -> str:
    """The script's output, once it exits 0 having left nothing in its temporary directory (a folder of its own
    here): each says it writes only to temporary folders, and a shared box's /tmp keeps whatever is left."""
    # A short path, as /tmp's: multiprocessing puts the Unix sockets through which a loader worker hands over
    # tensors there, and a path over 107 bytes (a folder inside pytest's) left bench_settle's worker waiting.
    temp = Path(tempfile.mkdtemp(prefix="script-tmp-", dir="/tmp"))
    try:
        proc = subprocess.run(
            [sys.executable, "-W", "ignore", str(ROOT / "scripts" / name), *args],
            cwd=cwd,
            env=dict(os.environ, TMPDIR=str(temp)),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        # Not the script's: torch's compile cache and pytest's last base folders, each kept on purpose.
        theirs = ("torchinductor_", "pytest-of-")
        assert [p.name for p in temp.iterdir() if not p.name.startswith(theirs)] == [], f"{name} left these behind"
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return proc.stdout


def test_bench_overhead_prints_its_figures(tmp_path):
    # One isolation: the script's other path differs only in the argument it passes to run_sweep.
    out = run_script("bench_overhead.py", "--trials", "1", "--isolation", "fork", cwd=tmp_path)
    assert re.search(r"^per_trial_s\s+\d+\.\d{3}$", out, re.M), out
    assert re.search(r"^overhead_per_trial_s\[fork\] \d+\.\d{3} ", out, re.M), out


def test_bench_box_prints_each_thread_count_s_paces_and_what_else_the_box_did(tmp_path):
    args = ("--threads", "1", "--seconds", "1.5", "--every", "0.5", "--img", "32")
    out = run_script("bench_box.py", *args, cwd=tmp_path)
    (line,) = out.splitlines()
    m = re.fullmatch(
        r"1 thread: ((?:\d+ )+)img/s \(min (\d+), max (\d+)\); steal [\d.]+ s, other processes \d+% of the cores, "
        r"idle \d+%",
        line,
    )
    assert m, line
    paces = [int(v) for v in m.group(1).split()]
    assert len(paces) >= 2 and (min(paces), max(paces)) == (int(m.group(2)), int(m.group(3))), line
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_box.py"), "--img", "30"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "--img a multiple of 16" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_boundary_prints_each_boundary_both_ways_and_refuses_a_bad_option_in_one_line(tmp_path):
    out = run_script(
        "bench_boundary.py",
        "--workers",
        "1",
        "--epochs",
        "1",
        "--steps",
        "2",
        "--img",
        "32",
        "--batch",
        "4",
        cwd=tmp_path,
    )
    lines = out.splitlines()
    assert lines[0] == "1 worker, forked again each epoch:" and lines[2] == "1 worker, persistent:", out
    epoch = (
        r"  epoch 1: first batch \d+\.\d{3} s, its step (\d+\.\d{3}) s \(([+-]\d+\.\d{3}) over the median "
        r"(\d+\.\d{3})\), page faults \d+ against a median \d+"
    )
    for line in (lines[1], lines[3]):
        m = re.fullmatch(epoch, line)
        assert m, line
        step, excess, median = map(float, m.groups())
        assert excess == pytest.approx(step - median, abs=0.0015), line  # the excess is the two figures' difference
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_boundary.py"), "--steps", "1"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "--steps at least 2" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_settle_prints_each_way_of_starting_a_window_and_refuses_a_bad_set_in_one_line(tmp_path):
    """The trial's windows timed three ways in one process (continuous, drained as the trial drains, from a
    full queue), on a loader with a worker so the steadying has something to drain."""
    spec = tmp_path / "s.yaml"
    spec.write_text(TINY.format(name="bench_settle") + "loader: {num_workers: 1}\n")
    out = run_script("bench_settle.py", str(spec), "--rounds", "1", cwd=tmp_path)
    assert "1 workers (2 batches ready at most), windows of 3 steps, an ablation round between" in out, out
    assert re.search(r"^round\s+continuous\s+drained\s+full$", out, re.M), out
    assert re.search(r"^\s+1(\s+\d+\.\d){3}$", out, re.M), out
    assert re.search(r"^vs continuous drained [+-]\d+\.\d% {2}full [+-]\d+\.\d%$", out, re.M), out
    steadying = float(re.search(r"^steadying: (\d+\.\d{3}) s in all$", out, re.M).group(1))
    assert steadying > 0, out  # the drained windows steadied the pipeline; the others never do
    ends = r"^ready as a window ended \(median\) continuous \d+(\.5)?  drained \d+(\.5)?  full \d+(\.5)?$"
    assert re.search(ends, out, re.M), out  # the queue each kind of window left: the refill a drained one paid for
    bad = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_settle.py"), str(spec), "--set", "batch.nope=1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stdout == "", bad.stdout
    assert bad.stderr.startswith("error: ") and "batch.nope" in bad.stderr and "Traceback" not in bad.stderr
    escape = tmp_path / "s\x1b]0;x\x07.yaml"
    escape.write_text(spec.read_text())
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_settle.py"), str(escape)], capture_output=True)
    assert bad.returncode == 2 and b"\x1b" not in bad.stdout + bad.stderr and b"printable" in bad.stderr, bad.stderr


def test_bench_sweep_prints_each_sides_wall_and_windows(tmp_path):
    spec = tmp_path / "two.yaml"
    spec.write_text(TINY.format(name="bench_sweep") + "sweep:\n  grid:\n    batch.size: [2, 4]\n")
    # One side is enough here: each side is the same command with other arguments.
    out = run_script("bench_sweep.py", str(spec), "--side", "--devices cpu:2", "--rounds", "1", cwd=tmp_path)
    assert re.search(r"^round 1 \[--devices cpu:2\] wall \d+\.\d s, windows per trial: 1 1$", out, re.M), out
    assert re.search(r"^median \[--devices cpu:2\] \d+\.\d s over 1 runs$", out, re.M), out
    # (--fixed-cost, the same script's bare-imports round, is left to its users: 8 s of the suite for a print.)


def test_bench_loader_writes_the_demo_tree_and_prints_a_row_per_decoder_and_augment(tmp_path):
    """docs/data.md's loader benchmark, small: the demo JPEGs it writes where none are, each configuration a row."""
    args = ["--root", str(tmp_path / "demo"), "--size", "32", "--workers", "0", "1", "--batch", "4"]
    out = run_script("bench_loader.py", *args, "--batches", "2", "--rounds", "1", cwd=tmp_path)
    assert out.startswith("400 demo images, 32 px, batch 4; images/s (median of 1 rounds)"), out
    rows = re.findall(r"^(pil|torchvision) +(yes|no) +(\d+\.\d) +(\d+\.\d)$", out, re.M)
    assert sorted((d, a) for d, a, *_ in rows) == [
        ("pil", "no"),
        ("pil", "yes"),
        ("torchvision", "no"),
        ("torchvision", "yes"),
    ]
    assert all(float(r) > 0 for *_, r0, r1 in rows for r in (r0, r1)), out


def test_bench_fidelity_prints_its_figures(tmp_path):
    out = run_script(
        "bench_fidelity.py",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--rounds",
        "1",
        "--img",
        "32",
        "--batch",
        "4",
        cwd=tmp_path,
    )
    assert re.search(r"^dinox images/s\s+\d+\.\d  median \d+\.\d$", out, re.M), out
    assert re.search(r"^hand loop images/s\s+\d+\.\d  median \d+\.\d$", out, re.M), out
    assert re.search(r"^fidelity_ratio \d+\.\d{3} ", out, re.M), out


def test_bench_fidelity_user_entry_and_bench_dinov2_print_their_ratios(tmp_path):
    """Issue 38's two fidelity figures: a team module measured by dinox against the same module in a plain
    loop, and dinox's DINOv2 step against a loop written from DINOv2's own code (one tiny round each)."""
    small = ("--steps", "2", "--warmup", "1", "--rounds", "1", "--batch", "4")
    out = run_script("bench_fidelity.py", "--user-entry", "--img", "32", *small, cwd=tmp_path)
    assert out.startswith("a team module building resnet18 at 32 px"), out
    assert re.search(r"^fidelity_ratio \d+\.\d{3}  \(dinox / hand loop; target between 0.98 and 1.02\)$", out, re.M)
    assert re.search(r"^round ratios +\d+\.\d{3}$", out, re.M), out
    # The same two steps in one process, window for window (4 windows a side for a round).
    out = run_script("bench_fidelity.py", "--user-entry", "--in-process", "--img", "32", *small, cwd=tmp_path)
    assert re.search(r"^window ratios +(\d+\.\d{3} ){3}\d+\.\d{3}$", out, re.M), out
    assert re.search(r"^fidelity_ratio \d+\.\d{3}  \(median of the paired windows' .* in \d of 4;", out, re.M), out
    assert "median's 95 % interval: too few pairs (4) for one; within the target: not shown" in out, out
    tiny = ("--img", "32", "--depth", "1", "--locals", "2", "--local-px", "16", *small)
    out = run_script("bench_dinov2.py", *tiny, cwd=tmp_path)
    assert re.search(r"^hand loop images/s\s+\d+\.\d  median \d+\.\d$", out, re.M), out
    assert re.search(r"^fidelity_ratio \d+\.\d{3}  \(dinox / hand loop; target between 0.98 and 1.02\)$", out, re.M)
    out = run_script("bench_dinov2.py", "--in-process", *tiny, cwd=tmp_path)
    assert re.search(r"^window ratios +(\d+\.\d{3} ){3}\d+\.\d{3}$", out, re.M), out
    assert re.search(r"^fidelity_ratio \d+\.\d{3}  \(median of the paired windows' .* in \d of 4;", out, re.M), out


def test_the_fidelity_verdict_reads_the_median_s_interval_not_the_median_alone():
    """A median of 0.992 over 24 pairs spread 0.78-1.21 was reported against the ±2 % target as if it met it;
    the interval the pairs give the median says whether they show it, refute it or cannot tell."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from bench_fidelity import median_interval, within_target
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert median_interval([float(v) for v in range(1, 25)]) == (7.0, 18.0)  # the sign test's order statistics
    assert median_interval([1.0] * 5) is None and median_interval([float(v) for v in range(6)]) == (0.0, 5.0)
    assert within_target([0.99, 1.01] * 10).endswith("within 0.98-1.02: yes")
    assert within_target([0.95, 0.97] * 10).endswith("within 0.98-1.02: no")
    assert "not shown" in within_target([0.78, 0.95, 0.99, 1.0, 1.05, 1.21] * 4)


def _gpu_check():
    import importlib.util

    if "gpu_check" not in sys.modules:  # dataclasses look their module up there
        spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
        sys.modules["gpu_check"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["gpu_check"])
    return sys.modules["gpu_check"]


def test_gpu_check_spec_covers_every_gpu_path_and_validates(tmp_path):
    from dinox.plan import grid
    from dinox.spec import file as spec_file

    gc = _gpu_check()
    (tmp_path / "index.csv").write_text("png_path,series_dir,slice_index\n")
    path = tmp_path / "gpu_check.yaml"
    path.write_text(gc.spec_text(str(tmp_path / "index.csv"), small=False, device="cuda"))
    trials = grid.expand(spec_file.load(path))
    cases = gc.cases(str(tmp_path / "index.csv"), small=False)
    assert len(trials) == len(cases) == 16
    by_label = {c.label: t.spec for c, t in zip(cases, trials, strict=True)}
    assert by_label["fp16 GradScaler"].precision == "fp16-mixed"
    assert by_label["compile, profiled"].model.compile is True and by_label["compile, profiled"].measure.profile
    assert by_label["DINO + compile"].model.compile and by_label["DINO + compile"].objective.kind == "dino"
    assert by_label["side-stream prefetch"].loader.device_prefetch
    assert by_label["fp32, runtime knobs"].runtime.matmul_precision == "high"
    assert by_label["CT PNG, 2 workers (built io_bound)"].loader.num_workers == 2
    assert by_label["unpinned copies"].loader.pin_memory is False and by_label["pinned copies"].loader.pin_memory
    assert by_label["OOM under a memory cap"].hardware.memory_limit_gb == 6
    assert by_label["batch.size auto"].batch.auto
    assert by_label["DINO ViT-S/14 multi-crop"].objective.kind == "dino"
    assert by_label["CT PNG, 0 workers (built io_bound)"].loader.num_workers == 0
    assert sum(c.hand_loop for c in cases) == 5 and {c.expect_bound for c in cases} == {
        None,
        "io_bound",
        "compute_bound",
        "host_bound",
    }
    quick, rest = (
        gc.cases(str(tmp_path / "index.csv"), False, "quick"),
        gc.cases(str(tmp_path / "index.csv"), False, "rest"),
    )
    assert len(quick) == len(gc.QUICK) and sorted(c.label for c in quick + rest) == sorted(by_label)


def test_gpu_check_fails_on_a_wrong_label_a_low_fidelity_or_an_unexpected_status():
    gc = _gpu_check()
    row = {
        "status": "ok",
        "bound": "io_bound",
        "images_per_s": "96.0",
        "error": "",
        "device_idle_share": "0.02",
        "peak_mem_reserved_gb": "10.5",
        "mfu": "0.41",
    }
    built = gc.Case("built compute_bound", {}, expect_bound="compute_bound", hand_loop=True)
    line = gc.Line(built, row, hand=100.0)
    assert line.ratio == pytest.approx(0.96)
    assert line.problems() == [
        "built compute_bound: labelled io_bound, built to be compute_bound",
        "built compute_bound: dinox / hand loop = 0.960, outside 0.98-1.02",
    ]
    above = gc.Line(built, {**row, "bound": "compute_bound"}, hand=90.0)  # dinox 7 % above the user's own loop
    assert above.problems() == ["built compute_bound: dinox / hand loop = 1.067, outside 0.98-1.02"]
    assert above.problems(fidelity=False) == []  # --small on a CPU: the ratio is shown, not held
    oom = gc.Line(gc.Case("OOM", {}, expect_status="oom"), {**row, "status": "ok", "bound": "compute_bound"})
    assert oom.problems() == ["OOM: ok where oom was expected ()"]
    fine = gc.Line(gc.Case("fine", {}), {**row, "bound": "compute_bound"}, hand=96.0)
    assert fine.problems() == []
    recompiled = gc.Line(gc.Case("compile", {}), {**row, "bound": "compute_bound", "recompiles_in_windows": "2.0"})
    assert recompiled.problems() == ["compile: 2 graph(s) compiled inside the timed windows"]
    too_fast = gc.Line(gc.Case("fp32", {}), {**row, "mfu": "1.7", "math_class": "fp32"})
    assert too_fast.problems() == ["fp32: MFU 170% is above the peak (math class fp32)"]
    profiled = gc.Case("small steps", {}, expect_bound="host_bound", profiled=True)
    host = {**row, "bound": "host_bound"}
    assert gc.Line(profiled, host).problems() == ["small steps: measure.profile left no summary (dinox.profile)"]
    assert gc.Line(profiled, host, profile={"steps": 3}).problems() == [
        "small steps: the profile has no idle split of the device's time"
    ]
    busy = {"busy": 0.97, "host_wait": 0.01, "kernel_wait": 0.02, "other": 0.0}
    assert gc.Line(profiled, host, profile={"idle": busy}).problems() == [
        "small steps: labelled host_bound, yet the profiled device was busy 97%"
    ]
    waiting = {"busy": 0.35, "host_wait": 0.6, "kernel_wait": 0.05, "other": 0.0}
    assert gc.Line(profiled, host, profile={"idle": waiting}).problems() == []
    assert "| 35% / 60% " in gc.table([gc.Line(profiled, host, profile={"idle": waiting})])
    # The SM clock after the first and the last timed window: a GPU that throttled across them shows it.
    clocks = {"images_per_s": [7269.0, 6122.0], "sm_clock_mhz": [1980.0, 1410.0]}
    assert "| 1980 -> 1410 " in gc.table([gc.Line(fine.case, fine.row, clocks=clocks)])
    assert "| SM MHz, first -> last window |" in gc.table([fine])  # off a GPU: the column, with "-" in it
    broken = gc.Line(built, {**row, "bound": "compute_bound"}, hand_error="hand loop exited 1: TypeError: x")
    assert broken.problems() == ["built compute_bound: hand loop exited 1: TypeError: x"]
    text = gc.table([line, fine])
    assert "| built compute_bound | ok     | 96.0  | -             | 0.960" in text and "41.0%" in text
    assert "2.0%" in text and gc.table([gc.Line(built, {**row, "window_spread": "0.031"})]).count("| 3.1% ") == 1


def test_gpu_check_small_passes_on_this_cpu(tmp_path):
    """What the first session on a GPU runs first, at CPU sizes: CT data made and preprocessed, `dinox run` of
    three cases (built io_bound, built compute_bound, one beside a hand loop in a child of its own), the
    table with each case's seconds, exit 0 on a healthy box."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--small"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = [ln for ln in proc.stdout.splitlines() if ln.startswith("| ")]
    assert len(table) == 1 + 3 and "gpu_check: OK" in proc.stdout  # the header, then one row per case
    # The promise, not a timing: each built case gets its label or says it cannot tell (a loaded box).
    assert re.search(
        r"\| CT PNG, 0 workers \(built io_bound\) +\| ok +\| [\d.]+ +\| [\d.]+% +\| - +\| (io_bound|inconclusive) ",
        proc.stdout,
    ), proc.stdout
    assert re.search(
        r"\| tf32 +\| ok +\| [\d.]+ +\| [\d.]+% +\| \d+\.\d{3} +\| (compute_bound|inconclusive) "
        r".*\| \d+ \+ hand \d+ +\|",
        proc.stdout,
    ), proc.stdout
    assert re.search(r"^CPU, torch .*: \d+ s \(data and dinox run \d+ s\)$", proc.stdout, re.M)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_check_passes_on_this_gpu():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py")], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_the_gpu_verify_spec_is_valid_and_named_in_its_docs():
    """scripts/gpu_verify.yaml (the third GPU's forecast check) validates here, where it cannot run: a spec for
    a CUDA device is told so, exit 0; and the command its header gives is the one docs/measuring.md gives."""
    spec = ROOT / "scripts" / "gpu_verify.yaml"
    proc = subprocess.run([sys.executable, "-m", "dinox", "validate", str(spec)], capture_output=True, text=True)
    assert proc.returncode == 0 and "2 trials" in proc.stdout, proc.stdout + proc.stderr
    command = next(ln.strip("# ") for ln in spec.read_text().splitlines() if "bench_verify.py" in ln)
    assert command in (ROOT / "docs" / "measuring.md").read_text()


def test_bench_verify_prints_a_row_per_round(tmp_path):
    """A sweep from scratch, its decision and a verify of the recommendation: one table row, the forecast
    and the real rate side by side with the error (their values are the note's, not this test's)."""
    spec = tmp_path / "bench_verify.yaml"
    text = TINY.format(name="bench_verify").replace("repeats: 1", "repeats: 3")
    spec.write_text(text + "budget: {days: 1, target_images: 100}\n")
    out = run_script("bench_verify.py", "--spec", str(spec), "--rounds", "1", "--minutes", "0.05", cwd=tmp_path)
    row = next(ln for ln in out.splitlines() if ln.startswith("| 1 |"))
    # The head-to-head column: "-" without --head-to-head (and without a tie).
    rates = r"\| [\d.]+ \| [\d.]+ \| [+-]\d+\.\d% \| \d+ \| [\d.]+ \| [\d.]+ "  # forecast, real, error, edges, checks
    rates += r"\| [\d.]+-[\d.]+ "  # the slice's slowest and fastest quarter, at its steps' own pace
    # The error at the check windows (pooled, then those after the slice: what the box-move rule reads), then
    # OpenMP's waiting threads in the trial and in the slice, verify holding the trial's.
    cells = rates + r"\| [+-]\d+\.\d% \| [+-]\d+\.\d% \| (held|off|undecided) \| (PASSIVE / PASSIVE|unset / unset) \|$"
    # The drift column: "-", as a sweep of one trial has no drift check.
    assert re.match(r"\| 1 \| - \| GO \| batch 4 x 1, 0 workers, 32 px \| \d+ \| - " + cells, row), out


@pytest.mark.parametrize(
    ("case", "model", "images"), [("ct-dino", "vit_tiny_patch16_224", 96), ("jpeg-mixup", "resnet18", 2000)]
)
def test_bench_verify_s_cases_are_specs_dinox_plans_on_the_data_they_write(tmp_path, case, model, images):
    """--case: the data written (and preprocessed) in a folder whose name a shell or YAML would misread, and the
    case's spec beside it naming that data, which `dinox plan` takes as the spec says."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from bench_verify import CASES
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    folder = tmp_path / "it's #1: {a}"
    folder.mkdir()
    spec = CASES[case](folder)
    if case == "ct-dino":
        assert len((folder / "processed" / "_index" / "index.csv").read_text().splitlines()) == 1 + images
    else:
        assert len(list((folder / "jpegs").glob("*/*.JPEG"))) == images
    proc = subprocess.run(
        [sys.executable, "-m", "dinox", "plan", str(spec)], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows, trials = proc.stdout.splitlines(), 1 if case == "ct-dino" else 2  # jpeg-mixup: batch 16 and 32
    assert all(model in row.split() for row in rows[1 : trials + 1]), proc.stdout
    assert rows[trials + 1].startswith(f"{trials} trial{'s' if trials > 1 else ''}; each: "), proc.stdout


def test_gpu_check_stopped_by_timeout_stops_its_children(tmp_path):
    """`timeout` (SIGTERM) on the check stops the `dinox run` under it, whose trial records what it has, and
    leaves no process behind to weigh on the next run (a hand loop left so once read as a loader's cost)."""
    import psutil

    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--small", "--keep", str(tmp_path / "kept")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    first = proc.stdout.readline()
    while first and not first.startswith("[1/3]"):
        first = proc.stdout.readline()
    assert first.startswith("[1/3]"), proc.stderr.read()
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children  # dinox run and its trial
    proc.terminate()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "gpu_check: stopped; its children with it" in err, err[-2000:]
    assert "dinox: interrupted" in out + err
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, alive


# Stand-ins for the two names bench_peer's --step peer imports from the peer's files, with their signatures.
PEER_VIT = """\
import torch.nn as nn


class PatchViT(nn.Module):
    def __init__(self, img_size, patch, dim, depth, heads, mlp_ratio):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)

    def forward_features(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        return x[:, 0], x[:, 1:]
"""
PEER_HEAD = """\
import torch.nn as nn


class _TinyHead(nn.Linear):
    def __init__(self, dim):
        super().__init__(dim, 1)
"""


def test_bench_peer_grid_is_a_valid_dinox_spec_and_a_missing_peer_is_named(tmp_path):
    # The peer (the DINO-X tuner) is not on this box: the dinox side's grid must still validate, as the spec
    # the script hands to `dinox run`, and a --peer without the tuner is one line, not a traceback.
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_peer
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    (tmp_path / "peer_grid.yaml").write_text(bench_peer.SPEC.replace("processed/_index/index.csv", "idx.csv"))
    import numpy as np
    from PIL import Image

    rows = ["png_path,series_dir,slice_index,encoding"]
    for k in range(60):  # the grid's subset: 60 slices of one series, 16-bit as `dinox preprocess` writes them
        Image.fromarray(np.full((64, 64), 32768 - 500, np.uint16)).save(tmp_path / f"{k:05d}.png")
        rows.append(f"{k:05d}.png,s,{k},hu+32768_uint16")
    (tmp_path / "idx.csv").write_text("\n".join(rows) + "\n")
    valid = subprocess.run(
        [sys.executable, "-m", "dinox", "validate", "peer_grid.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert valid.returncode == 0, valid.stdout + valid.stderr
    # --step peer: the same grid with the peer's own step as a team's module, built from the peer's files (here
    # stand-ins of the two names it imports, of the peer's signatures): dinox validates it, building the step
    # in its entry check (tests/measure/test_user_step.py tests its refusals).
    peer = tmp_path / "peer"
    peer.mkdir()
    (peer / "phase3_micro_run.py").write_text(PEER_VIT)
    (peer / "tune_throughput.py").write_text(PEER_HEAD)
    (tmp_path / "step.yaml").write_text(bench_peer.step_spec(peer).replace("processed/_index/index.csv", "idx.csv"))
    (tmp_path / "peerstep.py").write_text(bench_peer.PEER_STEP)
    step = subprocess.run(
        [sys.executable, "-m", "dinox", "validate", "step.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert step.returncode == 0, step.stdout + step.stderr
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_peer.py"), "--peer", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and proc.stderr.strip().endswith("no tune_throughput.py and phase3_micro_run.py there")
    assert "Traceback" not in proc.stderr


def test_suite_cpu_sums_each_process_the_suite_starts_by_kind(tmp_path):
    """Issue 36's measuring stick: a pytest run whose one test starts `dinox verify` (forked by the suite's
    prewarmed interpreter); that process is logged as its kind and under its test, beside the whole."""
    test = "tests/verify/test_verify.py::test_a_decision_json_s_verdict_reaches_the_terminal_on_one_line"
    out = run_script("suite_cpu.py", "--top", "5", "--", test, cwd=tmp_path)
    assert re.search(
        r"^suite: pytest exit 0, \d+ s wall, \d+ CPU-s in all .*; \d+ processes logged \d+ CPU-s", out, re.M
    )
    assert re.search(r"^ +\d+\.\d +1 +M?  dinox verify, forked \(tests/prewarmed.py\)$", out, re.M), out
    assert re.search(rf"^ +\d+\.\d +1  {re.escape(test)}$", out, re.M), out

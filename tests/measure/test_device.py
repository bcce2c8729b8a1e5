"""The device's own rules, on the CPU: what counts as running out of memory, a memory cap that leaves room for
what a process holds outside torch's allocator, and the precisions' switches and the math class they give."""

from __future__ import annotations

import pytest
import timm
import torch

from dinox.contract import GIB
from dinox.measure import runtime
from dinox.measure.device import (
    allocator_cap,
    apply_precision,
    conv_share,
    math_class_tag,
    outside_from,
    over_limit,
)
from dinox.measure.result import is_oom
from dinox.plan import peaks


def test_out_of_memory_through_cudnn_or_cublas_is_an_oom():
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"))
    assert is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    # pytorch#108645: no engine fits its workspace near the cap; elsewhere a configuration no engine supports.
    no_engine = RuntimeError("GET was unable to find an engine to execute this computation")
    assert is_oom(no_engine, memory_share=0.97) and not is_oom(no_engine, memory_share=0.4)
    assert not is_oom(no_engine)  # memory unknown: an error, with its message


def test_an_emulated_card_leaves_room_for_what_lives_outside_the_allocator():
    total, limit, outside = 80 * GIB, 24 * GIB, int(0.6 * GIB)  # an H100 emulating a 24 GiB card
    assert allocator_cap(limit, outside, total) == pytest.approx(23.4 / 80)
    assert allocator_cap(limit, 0, total) == pytest.approx(24 / 80)
    assert allocator_cap(100 * GIB, 0, total) == 1.0 and allocator_cap(limit, 30 * GIB, total) == 0.0
    assert over_limit(int(23.3 * GIB), outside, limit) == ""
    why = over_limit(int(23.3 * GIB), int(0.9 * GIB), limit)  # cuDNN and NCCL grew it after the start
    assert why.startswith("out of memory on a 24.0 GiB card") and "24.20 GiB" in why


@pytest.fixture
def tf32_switches():
    """torch's process-wide switches, put back after the test."""
    saved = (torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark)
    yield
    torch.backends.cudnn.allow_tf32, _, torch.backends.cudnn.benchmark = saved
    torch.set_float32_matmul_precision(saved[1])


@pytest.mark.parametrize(
    "precision,matmul,cudnn",
    [("fp32", False, True), ("fp32-strict", False, False), ("tf32", True, True), ("fp16-mixed", False, True)],
)
def test_each_precision_sets_torch_s_switches_as_a_user_s_loop_has_them(tf32_switches, precision, matmul, cudnn):
    """fp32 is torch's default (cuDNN's TF32 on, the matmuls' off); fp32-strict IEEE everywhere. Read back from
    torch itself (a CUDA device object needs no GPU to set them)."""
    assert apply_precision(torch.device("cuda"), precision).tags == {}
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (matmul, cudnn)
    assert "matmul_tf32=" + str(matmul) in runtime.applied(torch.device("cuda"), True, True, {})


def test_the_math_class_is_read_from_what_ran_and_sets_mfu_s_peak(tf32_switches):
    resnet = timm.create_model("resnet18", pretrained=False, num_classes=10)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10)
    assert conv_share([resnet]) > 0.9 and conv_share([vit]) < 0.05
    cuda = torch.device("cuda")
    apply_precision(cuda, "fp32")  # torch's defaults: a ResNet's convolutions in TF32, a ViT's matmuls not
    assert math_class_tag(cuda, "fp32", conv_share([resnet])).startswith("tf32 (matmul_tf32=False cudnn_tf32=True;")
    assert math_class_tag(cuda, "fp32", conv_share([vit])).startswith("fp32 ")
    torch.set_float32_matmul_precision("high")  # runtime.matmul_precision: high on an fp32 trial
    assert math_class_tag(cuda, "fp32", conv_share([vit])).startswith("tf32 ")
    apply_precision(cuda, "tf32")
    torch.set_float32_matmul_precision("highest")  # ... and highest on a tf32 one
    assert math_class_tag(cuda, "tf32", conv_share([vit])).startswith("fp32 ")
    assert math_class_tag(torch.device("cpu"), "tf32", 0.0).startswith("fp32 (matmul_tf32=False cudnn_tf32=False, none")
    assert math_class_tag(cuda, "fp16-mixed", 0.0).startswith("fp16 ")
    # MFU against the peak of that class: the ViT-L ladder's fp32 + matmul high rung on an H100.
    assert peaks.lookup("NVIDIA H100 80GB HBM3", "tf32")[0] == 494.7
    assert peaks.lookup("NVIDIA H100 80GB HBM3", "fp16")[0] == 989.4
    assert peaks.lookup("NVIDIA H100 80GB HBM3", "fp32-strict")[0] == 66.9


def test_fp32_strict_on_a_cpu_says_it_changed_nothing():
    tags = apply_precision(torch.device("cpu"), "fp32-strict").tags
    assert tags["dinox.note"] == "fp32-strict has no effect on cpu; measured as fp32"


def test_what_lies_outside_the_allocator_is_read_where_it_can_be_and_said_where_not():
    """NVML's account of this pid; in a container (host pids) its one process; without NVML the device's
    used memory less the allocator's; several processes, none this one: unknown, and the cap says so."""
    mib = 2**20
    assert outside_from(42, [(7, 900 * mib), (42, 1500 * mib)], 0, 0, 1000 * mib) == (500 * mib, "nvml")
    assert outside_from(42, [(31337, 1500 * mib)], 0, 0, 1000 * mib)[0] == 500 * mib  # a PID namespace
    assert outside_from(42, [(7, 9 * mib), (8, 9 * mib)], 0, 0, 0) == (
        None,
        "outside unknown: NVML lists several processes, none with this pid",
    )
    got, source = outside_from(42, None, free=70_000 * mib, total=80_000 * mib, reserved=9_400 * mib)
    assert got == 600 * mib and source.startswith("mem_get_info")
    assert outside_from(42, [(42, 100 * mib)], 0, 0, 400 * mib)[0] == 0  # NVML lags the allocator: never negative


def test_the_allocator_settings_are_read_back_from_torch():
    """What torch's allocator parsed from PYTORCH_CUDA_ALLOC_CONF, in a fresh process (it reads it once)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    code = "from dinox.measure.runtime import allocator_settings; print(allocator_settings())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "expandable_segments:True", out.stderr[-500:]


def test_the_sm_clock_is_read_through_torch_on_cuda_and_is_none_elsewhere(monkeypatch):
    """torch.cuda.clock_rate (NVML, mapped through CUDA_VISIBLE_DEVICES by torch) on a CUDA device; None on a
    CPU, and None where NVML is missing or refuses (a MIG slice), never an error that ends the run."""
    from dinox.measure.device import clock_reader, sm_clock_mhz

    asked = []
    monkeypatch.setattr(torch.cuda, "clock_rate", lambda device=None: asked.append(device) or 1755)
    assert sm_clock_mhz(torch.device("cpu")) is None and asked == []  # a CPU has no SM clock to ask for
    assert sm_clock_mhz(torch.device("cuda", 1)) == 1755.0 and asked == [torch.device("cuda", 1)]
    # The loop's reader: made at setup, where NVML's first (slow) call initialises it, never between windows.
    assert clock_reader(torch.device("cpu")) is None
    read = clock_reader(torch.device("cuda", 0))
    assert asked[-1] == torch.device("cuda", 0) and len(asked) == 2 and read() == 1755.0 and len(asked) == 3

    def refuses(device=None):
        raise ModuleNotFoundError("pynvml does not seem to be installed or it can't be imported.")

    monkeypatch.setattr(torch.cuda, "clock_rate", refuses)
    assert sm_clock_mhz(torch.device("cuda", 0)) is None


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_real_gpu_s_sm_clock_is_read():
    """What `dinox verify` keeps at each check window on a GPU: NVML's SM clock of the trial's own device."""
    from dinox.measure.device import sm_clock_mhz

    mhz = sm_clock_mhz(torch.device("cuda", 0))
    assert mhz is not None and 100 <= mhz <= 5000, mhz


def test_a_forked_trial_s_peak_memory_reads_as_a_fresh_process_s(tmp_path):
    """`dinox run`'s default isolation forks each trial from a fork server that imported torch; a user's training
    script is a fresh process. Forked, the trial's peak once missed the libraries' pages the fork server had
    touched (0.54 against 0.82 GiB for this trial): on the CPU that peak is the device memory decide plans with,
    and the plan's own runtime figure, read in the forked estimate child, missed them too."""
    import json

    from mlflow import MlflowClient

    from dinox import record as rec
    from tests.conftest import TINY, run_dinox

    (tmp_path / "s.yaml").write_text(TINY.format(name="rss"))
    peaks, runtimes = {}, {}
    for isolation in ("spawn", "fork"):
        args = ["run", "s.yaml", "--no-system-metrics", "--force", "--isolation", isolation]
        proc = run_dinox([*args, "--workdir", isolation], cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (estimate,) = (tmp_path / isolation).glob("sweeps/*/*/estimate/estimate.json")
        runtimes[isolation] = json.loads(estimate.read_text())["machine"]["runtime_gb"]
        client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
        (run,) = client.search_runs(["1"], "tags.`dinox.role` = 'trial'", order_by=["start_time DESC"], max_results=1)
        assert run.data.tags[rec.MEM_SOURCE] == "process_peak_rss"
        peaks[isolation] = run.data.metrics[rec.PEAK_MEM_ALLOCATED_GB]
    # Never above the fresh process's (what is added back is what the fork server held and the child did not),
    # and short of it only by pages the child touched that the fork server never had: a few percent here.
    assert 0.9 * peaks["spawn"] <= peaks["fork"] <= peaks["spawn"] * 1.01, peaks
    assert runtimes["fork"] == pytest.approx(runtimes["spawn"], rel=0.05), runtimes

"""Memory plans, TFLOPs and MFU from a model's cost (pure arithmetic), and the peak table."""

from __future__ import annotations

import pytest

from dinox.contract import GIB
from dinox.plan import footprint, peaks
from dinox.plan.footprint import Estimates, Machine, ModelCost
from dinox.spec.sections import TrialSpec

COST = ModelCost(
    params=100_000_000,
    trainable_params=100_000_000,
    frozen_params=0,
    flops_per_image=3e10,
    saved_bytes_per_image=50 * 2**20,
    sample_bytes=3 * 224 * 224 * 4 + 8,
)
H100 = Machine("cuda", "NVIDIA H100 80GB HBM3", 79.1, 251.0, 0.6)
CPU = Machine("cpu", "AMD EPYC (2 cpus)", 23.5, 23.5, 0.7)


def spec(**over) -> TrialSpec:
    raw = {"name": "x", "model": {"name": "vit_base_patch16_224"}, "batch": {"size": 64}}
    raw.update(over)
    return TrialSpec.model_validate(raw)


def test_device_memory_adds_up_the_training_state_and_activations():
    plan = footprint.plan_memory(spec(), COST, H100)
    assert plan.weights_gb == pytest.approx(4e8 / GIB)
    assert plan.grads_gb == pytest.approx(4e8 / GIB)
    assert plan.optimizer_gb == pytest.approx(8e8 / GIB)  # AdamW: two fp32 moments
    assert plan.activations_gb == pytest.approx(64 * 50 / 1024)
    assert plan.runtime_gb == 0.0  # a GPU's memory does not hold the Python process
    assert plan.device_gb == pytest.approx(1.6e9 / GIB + 3.125 + 64 * COST.sample_bytes / GIB)
    assert plan.over == ""
    sgd = footprint.plan_memory(spec(optimizer={"name": "sgd"}), COST, H100)
    assert sgd.optimizer_gb == pytest.approx(4e8 / GIB)


def test_mixed_precision_keeps_16_bit_weight_copies_and_smaller_activations():
    fp32 = footprint.plan_memory(spec(), COST, H100)
    bf16 = footprint.plan_memory(spec(precision="bf16-mixed"), COST, H100)
    assert bf16.weights_gb == pytest.approx(fp32.weights_gb * 1.5)
    assert bf16.activations_gb == pytest.approx(fp32.activations_gb * footprint.MIXED_ACTIVATION_SHARE)


def test_loader_host_memory_is_workers_times_prefetch_times_batch_bytes():
    batch_bytes = 64 * COST.sample_bytes
    plan = footprint.plan_memory(spec(loader={"num_workers": 8, "prefetch_factor": 4}), COST, H100)
    assert plan.loader_host_gb == pytest.approx(8 * 4 * batch_bytes / GIB)
    pinned = footprint.plan_memory(spec(loader={"num_workers": 8, "pin_memory": True}), COST, H100)
    assert pinned.loader_host_gb == pytest.approx((8 * 2 + 1) * batch_bytes / GIB)  # torch's prefetch 2, + pinned
    assert footprint.plan_memory(spec(), COST, H100).loader_host_gb == pytest.approx(batch_bytes / GIB)


def test_a_trial_over_the_device_or_the_cap_is_flagged():
    big = footprint.plan_memory(spec(batch={"size": 2048}), COST, H100)
    assert big.device_gb > 79.1 and big.over.startswith("device ") and "device memory (79.1 GiB)" in big.over
    capped = footprint.plan_memory(spec(hardware={"memory_limit_gb": 4}), COST, H100)
    assert "the memory limit (4.0 GiB)" in capped.over
    # On the CPU the device is host memory, and the process itself counts.
    on_cpu = footprint.plan_memory(spec(batch={"size": 512}, hardware={"device": "cpu"}), COST, CPU)
    assert on_cpu.runtime_gb == 0.7 and "host memory (23.5 GiB)" in on_cpu.over and "host " in on_cpu.over
    loader = footprint.plan_memory(
        spec(batch={"size": 128}, loader={"num_workers": 64, "prefetch_factor": 64}), COST, H100
    )
    assert loader.device_gb < 79 and "loader" in loader.over  # 4096 batches of 128 in flight: host RAM, not the GPU


def test_tflops_and_mfu_against_the_table_or_the_override():
    metrics, tags = footprint.compute_metrics(COST.flops_per_image, 1000.0, "NVIDIA H100 80GB HBM3", "bf16-mixed", None)
    assert metrics["tflops"] == pytest.approx(30.0)
    assert metrics["peak_tflops"] == 989.4 and metrics["mfu"] == pytest.approx(30.0 / 989.4)
    assert tags["dinox.peak_source"] == "NVIDIA H100 SXM bf16 dense peak"
    metrics, tags = footprint.compute_metrics(COST.flops_per_image, 10.0, "AMD EPYC (2 cpus)", "fp32", None)
    assert "mfu" not in metrics and metrics["tflops"] == pytest.approx(0.3) and not tags
    metrics, tags = footprint.compute_metrics(COST.flops_per_image, 10.0, "AMD EPYC (2 cpus)", "fp32", 1.5)
    assert metrics["mfu"] == pytest.approx(0.2) and tags["dinox.peak_source"] == "hardware.peak_tflops"


@pytest.mark.parametrize(
    "name,precision,peak",
    [
        ("NVIDIA H100 PCIe", "bf16-mixed", 756.0),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.7),
        ("NVIDIA H200", "fp16-mixed", 989.4),
        ("NVIDIA H200 NVL", "bf16-mixed", 835.0),
        ("NVIDIA GH200 480GB", "tf32", 494.7),
        ("NVIDIA A100-SXM4-80GB", "fp32", 19.5),
        ("NVIDIA GeForce RTX 4090", "bf16-mixed", 165.2),
        ("NVIDIA GeForce RTX 5090", "bf16-mixed", 209.5),
        ("AMD Instinct MI300X", "bf16-mixed", 1307.4),
        ("AMD Radeon Graphics (gfx1151)", "bf16-mixed", 59.4),
    ],
)
def test_peak_table(name, precision, peak):
    found = peaks.lookup(name, precision)
    assert found is not None and found[0] == peak


def test_a_peak_is_matched_by_whole_words_and_a_mig_slice_gets_its_share():
    assert peaks.lookup("NVIDIA RTX A1000 6GB Laptop GPU", "bf16-mixed") is None  # not an A100
    sliced = peaks.lookup("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "bf16-mixed")
    assert sliced is not None and sliced[0] == pytest.approx(312.0 * 3 / 7) and "MIG 3g slice" in sliced[1]
    assert peaks.lookup("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "tf32")[0] == pytest.approx(494.7 / 7)  # type: ignore[index]


def test_estimates_key_trials_by_what_changes_the_model():
    a, b = spec(), spec(batch={"size": 8}, model={"name": "vit_base_patch16_224", "compile": True})
    c = spec(model={"name": "vit_base_patch16_224", "grad_checkpointing": True})
    assert footprint.estimate_key(a) == footprint.estimate_key(b) != footprint.estimate_key(c)
    assert len(Estimates.request([a, b, c])["specs"]) == 2
    est = Estimates.parse(
        {
            "machine": vars(H100),
            "costs": {footprint.estimate_key(a): vars(COST)},
            "errors": {footprint.estimate_key(c): "ValueError: x"},
        }
    )
    assert est.cost(b) == COST and est.memory(b) is not None and est.cost(c) is None
    assert est.why_missing(c) == "ValueError: x"
    down = Estimates.parse(None, "child killed by SIGKILL")
    assert down.memory(a) is None and down.why_missing(a) == "child killed by SIGKILL"


def test_the_largest_batch_the_plan_puts_in_a_memory_size():
    est = Estimates(CPU, {footprint.estimate_key(spec()): COST}, {})
    fit = est.largest_fit(spec(), 10.0)
    assert fit is not None
    plan = lambda b: footprint.plan_memory(spec(batch={"size": b}), COST, CPU).device_gb  # noqa: E731
    assert plan(fit) <= footprint.HEADROOM * 10.0 < plan(fit + 1)


def test_an_auto_batch_on_a_cpu_without_a_cap_stays_within_the_host_s_available_memory():
    """The search doubled until the kernel's OOM killer SIGKILLed a probe (on a real host, after driving it out
    of memory); the trial then ended crashed although 2048 fit. Now the memory plan bounds it by what is
    available, and a probe the OOM killer ends counts as a batch that did not fit."""
    import psutil

    from dinox.contract import TrialResult
    from dinox.sweep.batch_search import BatchSearch, killed_for_memory

    auto = spec(batch={"size": "auto", "auto_min": 8, "auto_max": 1_000_000})
    est = Estimates(CPU, {footprint.estimate_key(auto): COST}, {})
    search = BatchSearch.for_spec(auto)
    note = search.bound_by_host(auto, est)
    available = psutil.virtual_memory().available / GIB
    assert search.high == est.largest_fit(auto, available) < 1_000_000 and "GiB" in note
    capped = spec(batch={"size": "auto", "auto_max": 1_000_000}, hardware={"memory_limit_gb": 4})
    assert BatchSearch.for_spec(capped).bound_by_host(capped, est) == ""  # the cap bounds it already
    assert killed_for_memory(TrialResult("crashed", error="child killed by SIGKILL (the kernel OOM killer sends this)"))
    assert not killed_for_memory(TrialResult("crashed", error="child killed by SIGSEGV"))
    # cuDNN finding no engine at the cap's edge: the boundary once a smaller batch fitted, an error before.
    no_engine = TrialResult("error", error="RuntimeError: GET was unable to find an engine to execute this computation")
    search = BatchSearch(16, 1024, 0.1)
    assert not killed_for_memory(no_engine, search)
    search.record(16, True)
    assert killed_for_memory(no_engine, search) and not killed_for_memory(TrialResult("error", error="x"), search)


def test_a_step_of_hours_is_said_before_it_starts():
    """The step's floor: its training FLOPs at the device's measured matmul rate. 3e10 FLOP/image x 64 images
    at 0.02 TFLOP/s is 96 s a step: said, with the trial and its steps; at 20 TFLOP/s nothing is said."""
    import dataclasses

    from dinox.plan.grid import Trial

    s = spec()
    trial = Trial(0, 1, {"batch.size": 64}, s, "t")
    slow = Estimates(dataclasses.replace(CPU, matmul_tflops=0.02), {footprint.estimate_key(s): COST}, {})
    assert slow.step_floor_s(s) == pytest.approx(3e10 * 64 / 0.02e12)
    assert s.measure.warmup_steps + s.measure.window_bounds[0] * s.measure.bench_steps == 65  # 96 s each: 1.7 h
    assert slow.slow_steps([trial]) == [
        "note: 1 trial(s) take at least 1.0 min a step on AMD EPYC (2 cpus): #1 (size=64) at least 1.6 min a step "
        "and 1.7 h for its 65 steps, at this device's measured fp32 matmul rate "
        "(0.02 TFLOP/s); a spec for another machine: `dinox plan` there, or hardware.device on this one"
    ]
    fast = Estimates(dataclasses.replace(CPU, matmul_tflops=20.0), {footprint.estimate_key(s): COST}, {})
    assert fast.slow_steps([trial]) == [] and Estimates(CPU, {}, {}).step_floor_s(s) is None


def test_the_estimate_child_measures_the_matmul_rate():
    import torch

    from dinox.measure.estimate import matmul_tflops

    rate = matmul_tflops(torch.device("cpu"), seconds=0.05)
    assert rate is not None and 1e-4 < rate < 50  # a CPU: between a tenth of a GFLOP/s and 50 TFLOP/s


def test_the_estimate_keeps_what_fused_attention_saves_not_the_n_squared_probabilities():
    """On the meta device SDPA runs its math path, which saves the attention probabilities; a fused kernel
    (timm's default) keeps q, k, v, the output and a log-sum-exp instead. ViT-S/16 at 224 px: 12 blocks of 6
    heads over 197 tokens, 197 x 197 float32 probabilities each."""
    import timm

    from dinox.measure.estimate import cost_of

    before = timm.layers.use_fused_attn()
    fused = spec(model={"name": "vit_small_patch16_224", "fused_attention": True})
    plain = spec(model={"name": "vit_small_patch16_224", "fused_attention": False})
    on, off = cost_of(fused), cost_of(plain)
    probabilities = 12 * 6 * 197 * 197 * 4
    saved = off.saved_bytes_per_image - on.saved_bytes_per_image
    # The probabilities go; the output each block now keeps (197 x 384 floats) and the log-sum-exp come.
    assert saved == pytest.approx(probabilities - 12 * (197 * 384 * 4 + 6 * 197 * 4), rel=0.02), saved
    assert on.flops_per_image == off.flops_per_image  # the same work, counted on the plain step
    assert timm.layers.use_fused_attn() == before  # the estimate child's global switch put back
    unset = spec(model={"name": "vit_small_patch16_224"})  # timm's default: fused where torch has it
    assert footprint.estimate_key(fused) != footprint.estimate_key(plain) != footprint.estimate_key(unset)
    assert cost_of(unset).saved_bytes_per_image == on.saved_bytes_per_image

"""The bound label: its rules on known evidence, and on two trials built to be loader-bound and compute-bound,
measured for real on the CPU with their ablation windows."""

from __future__ import annotations

import pytest

from dinox import grid, runner, spec_file
from dinox.bound import Evidence, classify, costs, fixed_share


def test_the_ablation_rule_comes_first_and_respects_the_noise():
    e = Evidence(period=1.0, data=0.9, copy=0.0, loader_cost=0.05, transfer_cost=0.02)
    assert classify(e, 0.1) == ("compute_bound", "ablation")  # the host's 90 % data wait is not the cost
    assert classify(Evidence(1.0, 0.0, 0.0, loader_cost=0.3, transfer_cost=0.0), 0.1) == ("io_bound", "ablation")
    assert classify(Evidence(1.0, 0.0, 0.0, loader_cost=0.0, transfer_cost=0.2), 0.1)[0] == "transfer_bound"
    # A 15 % difference between windows that themselves differ by 20 % is noise.
    assert classify(Evidence(1.0, 0.0, 0.0, loader_cost=0.15, transfer_cost=0.0, noise=0.2), 0.1)[0] == "compute_bound"
    idle = Evidence(1.0, 0.0, 0.0, loader_cost=0.0, transfer_cost=0.0, compute_only_idle_share=0.3)
    assert classify(idle, 0.1) == ("host_bound", "ablation")
    launch = Evidence(1.0, 0.0, 0.0, loader_cost=0.0, transfer_cost=0.0, fixed_share=0.7)
    assert classify(launch, 0.1) == ("host_bound", "ablation")


def test_the_device_and_host_rules():
    assert classify(Evidence(1.0, 0.5, 0.0, idle=0.4, idle_loading=0.35), 0.1) == ("io_bound", "device_events")
    assert classify(Evidence(1.0, 0.0, 0.0, idle=0.4, idle_loading=0.0), 0.1) == ("host_bound", "device_events")
    assert classify(Evidence(1.0, 0.0, 0.3, idle=0.0, idle_loading=0.0), 0.1) == ("transfer_bound", "device_events")
    assert classify(Evidence(1.0, 0.3, 0.2), 0.1) == ("io_bound", "host_timers")
    assert classify(Evidence(1.0, 0.05, 0.3), 0.1) == ("transfer_bound", "host_timers")
    assert classify(Evidence(1.0, 0.05, 0.05), 0.1) == ("compute_bound", "host_timers")


def test_costs_and_fixed_share():
    assert costs(50.0, 100.0, 125.0) == pytest.approx((0.5, 0.2))
    assert costs(50.0, None, 125.0) == (None, None)
    assert fixed_share(0.040, 0.020) == pytest.approx(0.0)  # time halves with the batch: all per-image work
    assert fixed_share(0.040, 0.040) == pytest.approx(1.0)  # time independent of the batch
    assert fixed_share(0.040, 0.030) == pytest.approx(0.5)


CONSTRUCTED = """\
name: constructed
model: {{name: {model}, img_size: {img}{kwargs}}}
objective: {{num_classes: 10}}
batch: {{size: {batch}}}
data: {{source: synthetic, sample_delay_ms: {delay}}}
measure: {{warmup_steps: 3, bench_steps: 10, repeats: 2, ablation_steps: 10, timeout_s: 300}}
"""


@pytest.fixture(scope="module")
def measured(tmp_path_factory, fork_server):
    """Two real trials in forked children: a loader whose samples cost 20 ms each in the main process (0
    workers) against a 2-layer ViT at 32 px, and ResNet-18 at 64 px on noise that costs nothing to make."""
    tmp = tmp_path_factory.mktemp("bound")
    cases = {
        "io": dict(
            model="vit_tiny_patch16_224", img=32, kwargs=", kwargs: {patch_size: 8, depth: 2}", batch=4, delay=20
        ),
        "compute": dict(model="resnet18", img=64, kwargs="", batch=8, delay=0),
    }
    out = {}
    for name, case in cases.items():
        path = tmp / f"{name}.yaml"
        path.write_text(CONSTRUCTED.format(**case))
        (trial,) = grid.expand(spec_file.load(path))
        out[name] = (runner.run_trial(trial, tmp / name, server=fork_server).result, case["batch"])
    return out


def test_a_constructed_loader_bound_trial_is_io_bound_by_its_ablation_windows(measured):
    r, _batch = measured["io"]
    assert r.status == "ok", r.error
    m = r.metrics
    assert (r.bound, r.tags["dinox.bound_rule"], r.tags["dinox.step_clock"]) == ("io_bound", "ablation", "host")
    assert m["loader_cost"] > 0.5
    # The loader alone: 4 samples x 20 ms a batch, about 50 images/s; the step consumes fewer.
    assert m["loader_images_per_s"] == pytest.approx(50, rel=0.2) and m["images_per_s"] < m["loader_images_per_s"]


def test_a_constructed_compute_bound_trial_is_compute_bound(measured):
    r, _batch = measured["compute"]
    assert r.status == "ok", r.error
    m = r.metrics
    assert (r.bound, r.tags["dinox.bound_rule"]) == ("compute_bound", "ablation")
    # The io case costs > 0.5; here a few percent, read once at 0.11 by a full suite on this 2-core box.
    assert m["loader_cost"] < 0.2 and m["loader_images_per_s"] > 10 * m["images_per_s"]


def test_the_ablation_and_loader_windows_stay_outside_images_per_s(measured):
    for r, batch in measured.values():
        m = r.metrics
        images = 2 * 10 * batch  # 2 timed windows of 10 steps
        assert m["images_per_s"] == pytest.approx(images / m["window_s"], rel=1e-6)  # the timed windows only
        assert m["ablation_s"] > 0 and "images_per_s_compute_only" in m and "images_per_s_no_loader" in m
        assert "fixed_share" not in m  # the half-batch window: a device with a timeline of its own only

"""The study's shipped specs, shrunk to CPU size, run end to end on demo CT data: DICOM -> preprocess ->
(shards) -> run -> MLflow, for every source and objective."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from tests.cli.test_cli import RECORD_METRICS, RECORD_PARAMS, RECORD_TAGS
from tests.conftest import ROOT, run_dinox
from tests.data.test_dicom_preprocess import demo
from tests.data.test_images import demo as images

TINY_VIT = {"embed_dim": 48, "depth": 2, "num_heads": 2}
SMALL_STEPS = {"warmup_steps": 1, "bench_steps": 2, "repeats": 1, "timeout_s": 300, "ablation": False}


@pytest.fixture(scope="module")
def ct_data(tmp_path_factory):
    work = tmp_path_factory.mktemp("workloads")
    demo.make_demo(work / "dicom", patients=2, slices=10, size=64)
    proc = run_dinox(["preprocess", "--dicom-root", "dicom", "--out-root", "png"], cwd=work)
    assert proc.returncode == 0, proc.stderr
    proc = run_dinox(
        ["shards", "--index-csv", "png/_index/index.csv", "--out", "shards", "--shard-size", "6"], cwd=work
    )
    assert proc.returncode == 0, proc.stderr
    return work


def shrink(name: str, **changes) -> dict:
    """A shipped spec with CPU-sized values: same structure, sections and knobs, tiny numbers."""
    spec = yaml.safe_load((ROOT / "specs" / name).read_text())
    spec["hardware"]["device"] = "auto"
    spec["measure"] = dict(SMALL_STEPS)
    for dotted, value in changes.items():
        node = spec
        *parents, last = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return spec


def run_spec(work: Path, spec: dict) -> list:
    path = work / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = run_dinox(["run", path.name], cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    exp = client.get_experiment_by_name(spec["name"])
    runs = client.search_runs([exp.experiment_id], "tags.`dinox.role` = 'trial'")
    for r in runs:
        assert r.data.tags["dinox.status"] == "ok", (r.data.tags.get("dinox.error"), proc.stdout)
        assert RECORD_PARAMS <= set(r.data.params) and RECORD_TAGS <= set(r.data.tags)
        assert RECORD_METRICS <= set(r.data.metrics)
    return runs


def test_vit_large_dinov2_on_ct_png_and_on_webdataset(ct_data):
    crops = {
        "objective__out_dim": 512,
        "objective__head_hidden_dim": 64,
        "objective__head_bottleneck_dim": 32,
        "objective__local_crops": 2,
        "objective__local_crop_size": 28,
    }
    # The ablation windows on, here only: DINO's multi-crop views reused on the device and copied again.
    spec = shrink(
        "vit_large_sweep.yaml",
        model__kwargs=TINY_VIT,
        model__img_size=56,
        loader__num_workers=1,
        data__index_csv="png/_index/index.csv",
        measure__ablation=True,
        **crops,
    )
    shards = {"source": "webdataset", "shards": "shards", "shuffle_buffer": 8}
    base = {"batch.size": 4, "batch.accumulation": 2}
    spec["sweep"] = {"cases": [base, {**base, "data": shards}]}
    runs = run_spec(ct_data, spec)
    assert sorted(r.data.params["data.source"] for r in runs) == ["ct_png", "webdataset"]
    for r in runs:
        assert r.data.params["objective.kind"] == "dinov2" and r.data.params["objective.out_dim"] == "512"
        assert (r.data.params["objective.ibot"], r.data.params["objective.clip_grad"]) == ("True", "3.0")
        assert r.data.params["model.grad_checkpointing"] == "True" and r.data.params["precision"] == "bf16-mixed"
        # The backbone is what decide compares; the DINO head (and the mask token) is extra trainable weight.
        assert r.data.metrics["trainable_params_m"] > r.data.metrics["params_m"] > 0
        assert r.data.metrics["copy_images_per_s"] > 0 and r.data.tags["dinox.bound_rule"] == "ablation"


def test_vit_giant_cases_with_and_without_checkpointing(ct_data):
    spec = shrink(
        "vit_giant_sweep.yaml",
        model__kwargs=TINY_VIT,
        model__img_size=28,
        loader__num_workers=0,
        loader__persistent_workers=False,
        data__index_csv="png/_index/index.csv",
        objective__out_dim=256,
        objective__local_crops=1,
        objective__local_crop_size=14,
    )
    spec["sweep"]["cases"] = [spec["sweep"]["cases"][0], {**spec["sweep"]["cases"][2], "batch.size": 2}]
    runs = run_spec(ct_data, spec)
    assert sorted(r.data.params["model.grad_checkpointing"] for r in runs) == ["False", "True"]


def test_loader_knee_grid_classification_on_ct_png(ct_data):
    spec = shrink(
        "loader_knee.yaml",
        model__img_size=32,
        data__index_csv="png/_index/index.csv",
        data__subset_size=8,
        data__inflation=10,
        loader__pin_memory=False,
    )
    spec["sweep"]["grid"] = {"batch.size": [4], "loader.num_workers": [0, 1]}
    runs = run_spec(ct_data, spec)
    assert sorted(r.data.params["loader.num_workers"] for r in runs) == ["0", "1"]
    assert all(r.data.params["data.inflation"] == "10" for r in runs)


def test_resnet50_case_runs(ct_data):
    """The ImageNet spec on real JPEGs: RandAugment and random erasing (its base), Mixup/CutMix (one grid value)."""
    images.write_tree(ct_data / "data" / "demo_images", classes=2, per_class=4, size=(64, 48))
    spec = shrink("resnet50_imagenet.yaml", model__img_size=32, model__compile=False, loader__pin_memory=False)
    spec["sweep"]["cases"] = [{"batch.size": 4, "loader.num_workers": 1, "loader.prefetch_factor": 2}]
    spec["sweep"]["grid"]["data.mixup"] = spec["sweep"]["grid"]["data.mixup"][1:]
    (run,) = run_spec(ct_data, spec)
    assert run.data.params["precision"] == "fp16-mixed" and run.data.params["model.channels_last"] == "True"
    assert run.data.params["data.augment.auto_augment"] == "rand-m9-mstd0.5"
    assert run.data.params["data.mixup.cutmix_alpha"] == "1.0" and run.data.params["data.source"] == "image_folder"
    assert run.data.metrics["device_mem_total_gb"] == pytest.approx(23.0)

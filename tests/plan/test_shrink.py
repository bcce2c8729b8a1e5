"""`--shrink`: every shipped spec's grid kept, point for point, on a small stand-in that says what it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from dinox.plan import grid, shrink
from dinox.plan.machine import without_torch
from dinox.spec import file as spec_file
from tests.conftest import ROOT

SHIPPED = sorted((ROOT / "specs").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_a_shipped_spec_keeps_its_grid_small_and_says_so(path: Path):
    doc = spec_file.load(str(path))
    full, small = grid.expand(doc), grid.expand(doc, shrink=True)
    assert len(small) == len(full) and len({t.trial_id for t in small}) == len(small)
    assert not {t.trial_id for t in small} & {t.trial_id for t in full}
    for before, after in zip(full, small, strict=True):
        s = after.spec
        assert s.shrunk is True and before.spec.shrunk is None
        assert s.name == f"{before.spec.name}_shrunk" and after.run_name.endswith(" shrunk")
        assert s.flat_params()["shrunk"] == "True" and "shrunk" not in before.spec.flat_params()
        assert set(after.overrides) <= set(before.overrides)  # the same sweep keys, the values it runs with
        assert s.model.img_size <= 64 and s.model.img_size <= before.spec.model.img_size
        assert not shrink.family_kept(s.model.name), "every shipped model has a family --shrink knows"
        assert s.measure.bench_steps <= 5 and s.measure.warmup_steps <= 2 and s.measure.timeout_s <= 600
        low, high = s.measure.window_bounds
        assert high == min(2, before.spec.measure.window_bounds[1]) and 1 <= low <= high  # two: a spread
        if isinstance(before.spec.batch.size, int):
            assert s.batch.size <= max(12, before.spec.batch.size // 8)
            assert s.batch.size % 2 == 0 or before.spec.batch.size % 2  # an even batch stays even (Mixup)
            assert s.effective_batch % s.batch.size == 0
        if before.spec.hardware.device in ("cuda", "mps") and without_torch(before.spec.hardware.device):
            assert s.hardware.device == "auto" and s.hardware.memory_limit_gb is None
        else:
            assert s.hardware.device == before.spec.hardware.device
    sizes = [(a.spec.batch.size, b.spec.batch.size) for a, b in zip(full, small, strict=True)]
    numeric = sorted({p for p in sizes if isinstance(p[0], int)})
    assert [b for _, b in numeric] == sorted(b for _, b in numeric), "the grid's batches keep their order"


def test_a_vit_keeps_whole_patches_and_dino_its_crop_counts():
    doc = spec_file.load(str(ROOT / "specs" / "vit_large_sweep.yaml"))
    trial = grid.expand(doc, shrink=True)[0]
    s = trial.spec
    assert s.model.kwargs == {"embed_dim": 96, "depth": 2, "num_heads": 2}
    assert (s.model.img_size, s.objective.local_crop_size) == (56, 28)  # /14: whole patches
    assert (s.objective.global_crops, s.objective.local_crops) == (2, 8)  # the pipeline, as written
    assert (s.objective.out_dim, s.objective.head_hidden_dim, s.objective.head_bottleneck_dim) == (1024, 256, 64)
    assert [t.spec.batch.size for t in grid.expand(doc, shrink=True)] == [2, 4, 6, 8, 10]
    assert trial.run_name == "1 bs=2 acc=4 shrunk"
    line = shrink.summary(doc.base, [o for o, _ in grid.points(doc)], s)
    assert "embed_dim 96, depth 2, num_heads 2" in line and "48->2, 64->4, 96->6, 128->8, 160->10" in line
    assert "; 2 warm-up + 5 timed steps a window, 2 windows;" in line
    loose = s.model_copy(update={"measure": s.measure.model_copy(update={"min_repeats": 1})})
    assert "; 2 warm-up + 5 timed steps a window, 1-2 windows;" in shrink.summary(doc.base, [], loose)


def test_a_model_it_cannot_shrink_is_kept_and_the_line_says_so(write_spec):
    path = write_spec(
        """\
        name: other
        model: {name: efficientnet_b0, img_size: 224}
        batch: {size: 64, effective: 256}
        sweep: {grid: {batch.size: [32, 64]}}
        """
    )
    doc = spec_file.load(str(path))
    trials = grid.expand(doc, shrink=True)
    assert [t.spec.model.kwargs for t in trials] == [{}, {}]
    assert [t.spec.batch.size for t in trials] == [4, 8] and trials[0].spec.model.img_size == 64
    assert [t.spec.effective_batch for t in trials] == [32, 32]  # 256 / 8, whole batches of each size
    line = shrink.summary(doc.base, [o for o, _ in grid.points(doc)], trials[0].spec)
    assert "efficientnet_b0 kept at its size" in line


def test_the_name_stays_a_name_at_its_longest():
    assert len(shrink.shrunk_name("n" * 100)) == 100 and shrink.shrunk_name("n" * 100).endswith("_shrunk")


def test_images_stay_a_whole_number_of_the_patches_the_kwargs_set():
    raw = {"name": "x", "model": {"name": "vit_base_patch16_224", "kwargs": {"patch_size": 14}}}
    shrink.apply(raw, shrink.of({}, []))
    assert raw["model"]["img_size"] == 56 and raw["model"]["kwargs"]["patch_size"] == 14

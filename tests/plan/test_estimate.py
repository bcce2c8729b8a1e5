"""The estimate child, for real: one process, timm models on the meta device."""

from __future__ import annotations

import pytest

from dinox.isolate import runner
from dinox.plan.footprint import Estimates
from dinox.spec.sections import TrialSpec


def spec(model: dict, **over) -> TrialSpec:
    return TrialSpec.model_validate({"name": "x", "model": model, "hardware": {"device": "cpu"}, **over})


RESNET = spec({"name": "resnet18", "img_size": 224})
VIT = spec({"name": "vit_tiny_patch16_224", "img_size": 64})
VIT_CKPT = spec({"name": "vit_tiny_patch16_224", "img_size": 64, "grad_checkpointing": True})
DINO = spec(
    {"name": "vit_tiny_patch16_224", "img_size": 64},
    objective={"kind": "dino", "out_dim": 1024, "local_crops": 2, "local_crop_size": 32},
)
BAD = spec(
    {"name": "vit_tiny_patch16_224", "img_size": 64}, objective={"kind": "dino", "local_crop_size": 40}
)  # not a multiple of the patch size


@pytest.fixture(scope="module")
def estimates(tmp_path_factory) -> Estimates:
    with pytest.MonkeyPatch.context() as mp:  # a cache of its own: every cost computed here, none read back
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        data, failure = runner.run_estimate(
            Estimates.request([RESNET, VIT, VIT_CKPT, DINO, BAD]), tmp_path_factory.mktemp("estimate")
        )
    assert data is not None, failure
    return Estimates.parse(data, failure)


def test_training_flops_are_three_forwards(estimates):
    # ResNet-18 at 224: 1.82 GMACs forward (timm's figure) = 3.64 GFLOPs; training = forward + 2x backward.
    cost = estimates.cost(RESNET)
    assert cost is not None and cost.flops_per_image == pytest.approx(3 * 3.64e9, rel=0.03)
    assert cost.params == cost.trainable_params == pytest.approx(11.69e6, rel=0.01) and cost.frozen_params == 0
    assert cost.sample_bytes == 3 * 224 * 224 * 4 + 8


def test_checkpointing_keeps_less_and_recomputation_is_not_counted(estimates):
    plain, ckpt = estimates.cost(VIT), estimates.cost(VIT_CKPT)
    assert plain is not None and ckpt is not None
    assert ckpt.flops_per_image == plain.flops_per_image
    assert 0 < ckpt.saved_bytes_per_image < 0.5 * plain.saved_bytes_per_image


def test_dino_counts_the_teacher_as_frozen_weights_and_all_views(estimates):
    dino, plain = estimates.cost(DINO), estimates.cost(VIT)
    assert dino is not None and plain is not None
    assert dino.params == plain.params - 192 * 1000 - 1000  # the backbone without the classifier
    assert dino.trainable_params > dino.params  # the head trains with the backbone
    # Frozen: the teacher (a copy of student and head) and both heads' weight-norm gains (fixed, as in DINO).
    assert dino.frozen_params == dino.trainable_params + 2 * 1024
    assert dino.sample_bytes == 2 * 3 * 64 * 64 * 4 + 2 * 3 * 32 * 32 * 4 + 8
    assert dino.flops_per_image > 2 * plain.flops_per_image  # two global views and the teacher's forward


def test_a_model_that_cannot_be_built_has_its_reason_and_the_rest_still_come(estimates):
    assert estimates.cost(BAD) is None
    assert "not a multiple of vit_tiny_patch16_224's patch size 16" in estimates.why_missing(BAD)
    m = estimates.machine
    assert m is not None and m.device == "cpu" and m.host_total_gb > 1 and 0.1 < m.runtime_gb < m.host_total_gb
    plan = estimates.memory(VIT)
    assert plan is not None and plan.runtime_gb == m.runtime_gb and plan.over == ""

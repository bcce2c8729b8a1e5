"""DINOv2's step (dinox.measure.dinov2): trains on the CPU with each component on and off, and `dinox plan`'s
FLOPs count the iBOT head's work on the masked patches on top of the DINO step's."""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils.data import default_collate

from dinox.measure import dinov2_masks, estimate, models, objectives
from dinox.spec.sections import TrialSpec

HEAD = {"out_dim": 512, "head_hidden_dim": 128, "head_bottleneck_dim": 32, "head_layers": 3}
CROPS = {"global_crops": 2, "local_crops": 2, "local_crop_size": 32}


def _spec(kind: str = "dinov2", **over) -> TrialSpec:
    model = {"name": "vit_tiny_patch16_224", "img_size": 64, "kwargs": {"depth": 2}}
    return TrialSpec.model_validate({"name": "d", "model": model, "objective": {"kind": kind, **HEAD, **CROPS, **over}})


def _views(b: int = 4) -> list[torch.Tensor]:
    return [torch.randn(b, 3, 64, 64), torch.randn(b, 3, 64, 64), torch.randn(b, 3, 32, 32), torch.randn(b, 3, 32, 32)]


COMPONENTS = {
    "defaults": {},
    "no_ibot": {"ibot": False},
    "separate_ibot_head": {"ibot_separate_head": True},
    "no_koleo": {"koleo_weight": 0},
    "sinkhorn_knopp": {"centering": "sinkhorn_knopp"},
    "no_clip": {"clip_grad": None},
    "one_lr": {"layerwise_decay": 1.0},
    "no_drop_path": {"drop_path": 0},
    "zeroing_drop_path": {"drop_path_skip": False},
}


@pytest.mark.parametrize("case", list(COMPONENTS))
def test_the_step_trains_with_each_component_on_and_off(case):
    torch.manual_seed(0)
    spec = _spec(**COMPONENTS[case])
    o = spec.objective
    step = objectives.build(models.build(spec.model, 0, [64, 32]), o)
    groups = step.param_groups()
    opt = torch.optim.AdamW([{"params": g["params"], "lr": 1e-3 * g["lr_scale"]} for g in groups])
    teacher_before = [p.clone() for p in step.teacher.parameters()]
    losses, mask_trained = [], []
    collate = step.collate(None) or default_collate  # what the loader's workers run: DINOv2's masks drawn there
    samples = [([v[0] for v in _views(1)], 0) for _ in range(4)]
    for i in range(3):
        loss = step.loss(collate(samples) if i else (_views(), None))  # no collate: the step draws its own
        loss.backward()
        token = step.student.tokens.mask_token  # only where iBOT masks (DDP refuses unused parameters)
        mask_trained.append(token is not None and token.grad is not None and bool(token.grad.abs().sum() > 0))
        if step.grad_clip:
            norm = torch.nn.utils.clip_grad_norm_(step.parameters(), step.grad_clip)
            assert torch.isfinite(norm)
        opt.step()
        opt.zero_grad()
        step.after_optimizer_step()
        losses.append(float(loss.detach()))
    assert all(torch.isfinite(torch.tensor(losses)))
    assert any(not torch.equal(a, b) for a, b in zip(teacher_before, step.teacher.parameters(), strict=True))  # EMA
    assert step.grad_clip == o.clip_grad
    scales = sorted({round(g["lr_scale"], 6) for g in groups})
    r = o.layerwise_decay  # the embeddings and tokens r^3 (patch_embed x 0.2), block i r^(2-i), the rest 1
    assert scales == sorted({round(x, 6) for x in (r**3 * 0.2, r**3, r**2, r, 1.0)})
    assert (step.student.ibot_head is not None) == (o.ibot and o.ibot_separate_head)
    skipping = [b for b in step.student.tokens.vit.blocks if "forward" in vars(b)]
    assert len(skipping) == (2 if o.drop_path > 0.1 and o.drop_path_skip else 0)
    assert not any("forward" in vars(b) for b in step.teacher.tokens.vit.blocks)  # the teacher drops nothing
    assert mask_trained == [o.ibot] * 3  # the mask token trains exactly when iBOT is on


def test_the_compute_skipping_drop_path_runs_each_branch_on_the_samples_kept():
    spec = _spec(drop_path=0.5)
    step = objectives.build(models.build(spec.model, 0, [64, 32]), spec.objective)
    block = step.student.tokens.vit.blocks[0]
    seen: list[int] = []
    block.mlp.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[0]))
    block(torch.randn(8, 17, 192))
    assert seen == [4]  # 8 samples at 0.5: the MLP ran on 4 of them
    block.eval()
    block(torch.randn(8, 17, 192))
    assert seen == [4, 8]  # evaluation: every sample


def test_block_masks_cover_the_asked_share_of_the_global_crops_and_halve_with_the_batch():
    """DINOv2's collate: of 16 global crops (8 samples x 2) half masked, each within its ratio bucket's top,
    the rest not; the half batch's draw is the first half of each crop's samples, within its own upperbound."""
    spec = _spec(mask_sample_probability=0.5, mask_ratio_min=0.1, mask_ratio_max=0.5)
    masking = objectives.build(models.build(spec.model, 0, [64, 32]), spec.objective).masking
    assert masking == dinov2_masks.Masking(4, 2, 0.5, (0.1, 0.5))  # 4x4 patches at 64 px
    random.seed(0)
    draw = masking.draw(8)
    per_image = draw.masks.sum(dim=1)
    # Eight crops asked for masks; DINOv2's generator can place no rectangle of 4 patches or more where a crop's
    # ratio asks for 1 or 2 of its 16 (ten tries, then it stops): such a crop stays unmasked, as in DINOv2.
    masked = int((per_image > 0).sum())
    assert 6 <= masked <= 8 and int(per_image.max()) <= 16 * 0.5
    assert draw.rows == masking.upperbound(16) == sum(int(16 * r) for r in torch.linspace(0.1, 0.5, 9).tolist()[1:])
    assert draw.picked.numel() == int(draw.masks.sum()) <= draw.rows
    assert torch.allclose(draw.weights.sum(), torch.tensor(float(masked)))  # one over each masked crop's count
    half = draw[:4]
    assert draw.shape[0] == 8 and half.shape[0] == 4 and half.rows == masking.upperbound(8)
    assert torch.equal(half.masks, draw.masks.view(2, 8, 16)[:, :4].flatten(0, 1))
    assert half.picked.numel() == min(int(half.masks.sum()), half.rows)
    with pytest.raises(IndexError):
        draw[:3]


def test_the_mask_generator_is_dinov2_s():
    """dinov2/data/masking.py's contract: exactly the count where it fits, rectangles of at least 4 patches, each
    adding at most max_num_patches; none asked, none drawn."""
    generator = dinov2_masks.MaskingGenerator(16, 0.5 * 256)
    assert not generator(0).any()
    asked = [n for n in (26, 64, 128) for _ in range(20)]
    counts = [int(generator(n).sum()) for n in asked]
    assert all(c <= n for c, n in zip(counts, asked, strict=True))
    assert sum(c == n for c, n in zip(counts, asked, strict=True)) >= 50  # ten tries in a row rarely add nothing


def test_plan_counts_the_ibot_head_on_the_masked_patches():
    """With drop path and KoLeo off, DINOv2's FLOPs are DINO's plus the head on the masked patch tokens, padded to
    DINOv2's upperbound: a forward through the teacher's, a forward and a backward (2x) through the student's."""
    common = {"drop_path": 0, "koleo_weight": 0}
    dino = estimate.cost_of(_spec("dino"))
    with_ibot = estimate.cost_of(_spec(**common))
    without = estimate.cost_of(_spec(ibot=False, **common))
    assert without.flops_per_image == pytest.approx(dino.flops_per_image, rel=1e-6)
    spec = _spec(**common)
    masking = objectives.build(models.build(spec.model, 0, [64, 32]), spec.objective).masking
    masked = masking.upperbound(2 * estimate.SAMPLES)  # the rows the heads run on, whatever the draw
    d, h, b, k = 192, HEAD["head_hidden_dim"], HEAD["head_bottleneck_dim"], HEAD["out_dim"]
    head_forward = 2 * (d * h + h * h + h * b + b * k)
    expected = 4 * head_forward * masked / estimate.SAMPLES
    assert with_ibot.flops_per_image - dino.flops_per_image == pytest.approx(expected, rel=0.02)
    assert with_ibot.saved_bytes_per_image > dino.saved_bytes_per_image  # the memory plan holds the iBOT head too


@pytest.mark.slow
def test_two_ranks_train_it_with_ibot_on_and_off(tmp_path):
    """Under DistributedDataParallel (two CPU ranks, gloo) through `dinox run`: with iBOT off the mask token
    would be a parameter no step uses, and DDP's reduction stops on the second step (it once did)."""
    from mlflow import MlflowClient

    from tests.conftest import run_dinox

    (tmp_path / "s.yaml").write_text(
        "name: ddp\n"
        "model: {name: vit_tiny_patch16_224, img_size: 32, kwargs: {patch_size: 8, depth: 2}}\n"
        "objective: {kind: dinov2, out_dim: 256, head_hidden_dim: 64, head_bottleneck_dim: 32, local_crops: 2,"
        " local_crop_size: 16}\n"
        "batch: {size: 4, accumulation: 2}\n"
        "hardware: {device: cpu, gpus: 2}\n"
        "measure: {warmup_steps: 1, bench_steps: 3, repeats: 1, timeout_s: 300, ablation: false}\n"
        "sweep: {grid: {objective.ibot: [true, false]}}\n"
    )
    proc = run_dinox(["run", "s.yaml", "--no-system-metrics"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_runs(["1"], "tags.`dinox.role` = 'trial'")
    assert sorted((r.data.params["objective.ibot"], r.data.tags["dinox.status"]) for r in runs) == [
        ("False", "ok"),
        ("True", "ok"),
    ], proc.stdout


def test_a_dinov2_trial_s_loader_draws_the_masks_in_its_workers(tmp_path):
    """The trial wraps its loader's collate with the objective's (DINOv2's mask draw, as DINOv2's collate does):
    a batch from a worker already carries the masks, the patch indices and the half batch's draw."""
    from dinox.measure.trial import TrialRun

    raw = _spec().model_dump()
    raw.update(batch={"size": 4}, loader={"num_workers": 1}, measure={"warmup_steps": 1, "bench_steps": 1})
    run = TrialRun(TrialSpec.model_validate(raw), {}, {}, {}, out_dir=tmp_path)
    run.setup()
    assert isinstance(run.loader.collate_fn, dinov2_masks.MaskCollate)
    views, draw = next(iter(run.loader))
    assert len(views) == 4 and isinstance(draw, dinov2_masks.MaskDraw) and draw.shape[0] == 4
    assert draw.masks.shape == (2 * 4, 16) and draw.half is not None and draw[:2].masks.shape == (2 * 2, 16)
    assert run.make_loop().run(1, 1).windows[0].images_per_s > 0  # the step takes them as they come

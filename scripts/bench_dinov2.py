#!/usr/bin/env python3
"""Fidelity of dinox's DINOv2 step: a dinox trial (`objective.kind: dinov2`) against a hand-written loop of the
same recipe, at a small scale on the CPU, alternating over rounds in one run; prints the images/s of each and the
ratio of their medians (target: between 0.98 and 1.02).

    python scripts/bench_dinov2.py                 # ViT-Tiny depth 4 at 64 px, 2 global + 4 local crops of 32 px
    python scripts/bench_dinov2.py --rounds 5 --steps 30 --batch 32
    python scripts/bench_dinov2.py --in-process    # both steps in one process, window for window (4 a round)

The hand loop is written from DINOv2's own code (facebookresearch/dinov2: ``data/masking.py``'s MaskingGenerator,
``data/collate.py``'s mask draw, ``train/ssl_meta_arch.py``'s forward_backward with its shared-head buffer,
``loss/``'s DINOLoss, iBOTPatchLoss.forward_masked and KoLeoLoss, ``layers/block.py``'s
drop_add_residual_stochastic_depth, ``utils/param_groups.py``'s layer-wise decay), not from dinox's: the same
timm ViT stands in for DINOv2's, and the same synthetic views feed both sides.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPEC = """\
name: dinov2_fidelity
model: {{name: vit_tiny_patch16_224, img_size: {img}, kwargs: {{depth: {depth}}}}}
objective: {{kind: dinov2, out_dim: {out_dim}, head_hidden_dim: {hidden}, head_bottleneck_dim: {bottleneck},
  global_crops: 2, local_crops: {locals_}, local_crop_size: {local_px}}}
batch: {{size: {batch}}}
optimizer: {{name: adamw, lr: 1.0e-3, weight_decay: 0.04}}
loader: {{num_workers: 0}}
measure: {{warmup_steps: {warmup}, bench_steps: {steps}, repeats: 1, ablation: false, timeout_s: 1800}}
"""

# DINOv2's defaults (ssl_default_config.yaml), as the dinox spec above takes them by default too.
MASK_PROBABILITY, MASK_RATIO = 0.5, (0.1, 0.5)
STUDENT_TEMP, TEACHER_TEMP, CENTER_MOMENTUM, TEACHER_MOMENTUM = 0.1, 0.07, 0.9, 0.992
KOLEO, CLIP, LAYER_DECAY, PATCH_EMBED_LR, DROP_PATH = 0.1, 3.0, 0.9, 0.2, 0.3


class MaskingGenerator:
    """dinov2/data/masking.py: rectangles of 4 patches or more, aspect 0.3-3.3, until the count is reached."""

    def __init__(self, side: int, min_patches: int = 4, min_aspect: float = 0.3):
        self.h = self.w = side
        self.min_patches = min_patches
        self.log_aspect = (math.log(min_aspect), math.log(1 / min_aspect))

    def _mask(self, mask, max_patches: int) -> int:
        delta = 0
        for _ in range(10):
            area = random.uniform(self.min_patches, max_patches)
            aspect = math.exp(random.uniform(*self.log_aspect))
            h, w = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if w < self.w and h < self.h:
                top, left = random.randint(0, self.h - h), random.randint(0, self.w - w)
                covered = int(mask[top : top + h, left : left + w].sum())
                if 0 < h * w - covered <= max_patches:
                    delta += h * w - covered
                    mask[top : top + h, left : left + w] = True
            if delta > 0:
                break
        return delta

    def __call__(self, count: int):
        import torch

        mask = torch.zeros(self.h, self.w, dtype=torch.bool)
        done = 0
        while done < count:
            delta = self._mask(mask, count - done)
            if delta == 0:
                break
            done += delta
        return mask


def collate_masks(n: int, side: int, generator: MaskingGenerator) -> dict:
    """dinov2/data/collate.py's masks for `n` global crops."""
    import torch

    tokens = side * side
    masked = int(n * MASK_PROBABILITY)
    probs = torch.linspace(*MASK_RATIO, masked + 1)
    upperbound, masks = 0, []
    for i in range(masked):
        masks.append(generator(int(tokens * random.uniform(float(probs[i]), float(probs[i + 1])))))
        upperbound += int(tokens * float(probs[i + 1]))
    masks += [generator(0) for _ in range(masked, n)]
    random.shuffle(masks)
    collated = torch.stack(masks).flatten(1)
    indices = collated.flatten().nonzero().flatten()
    weight = (1 / collated.sum(-1).clamp(min=1.0)).unsqueeze(-1).expand_as(collated)[collated]
    return {"masks": collated, "indices": indices, "weight": weight, "upperbound": upperbound}


def hand_step(a: argparse.Namespace, samples: int):
    """DINOv2's step, written from its code, over a loader of `samples` synthetic multi-crop samples."""
    import timm
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader

    from dinox.data.synthetic import SyntheticImages  # the same views as the trial's, nothing of its step
    from dinox.data.views import ViewPlan

    torch.manual_seed(0)
    random.seed(0)

    class DINOHead(nn.Module):  # dinov2/layers/dino_head.py (no batch norm, GELU)
        def __init__(self, dim: int):
            super().__init__()
            self.mlp = nn.Sequential(
                nn.Linear(dim, a.hidden), nn.GELU(), nn.Linear(a.hidden, a.hidden), nn.GELU(),
                nn.Linear(a.hidden, a.bottleneck),
            )  # fmt: skip
            self.last_layer = nn.utils.parametrizations.weight_norm(nn.Linear(a.bottleneck, a.out_dim, bias=False))
            self.last_layer.parametrizations.weight.original0.data.fill_(1)

        def forward(self, x):
            return self.last_layer(F.normalize(self.mlp(x), dim=-1, p=2, eps=1e-6))

    def backbone():
        vit = timm.create_model(
            "vit_tiny_patch16_224",
            pretrained=False,
            num_classes=0,
            img_size=a.img,
            depth=a.depth,
            dynamic_img_size=True,
        )
        vit.mask_token = nn.Parameter(torch.zeros(1, vit.embed_dim))
        return vit

    def tokens(vit, x, masks=None):  # DinoVisionTransformer.prepare_tokens_with_masks, then blocks and norm
        x = vit.patch_embed(x)
        if masks is not None:
            x = torch.where(masks.view(*x.shape[:-1], 1), vit.mask_token.to(x.dtype), x)
        x = vit.norm(vit.blocks(vit.norm_pre(vit._pos_embed(x))))
        return x[:, 0], x[:, 1:]

    def stochastic_depth(block):  # layers/block.py: drop_add_residual_stochastic_depth above 0.1
        def branch(x, f):
            b = x.shape[0]
            keep = max(int(b * (1 - DROP_PATH)), 1)
            brange = torch.randperm(b, device=x.device)[:keep]
            residual = f(x[brange])
            flat = torch.index_add(x.flatten(1), 0, brange, residual.flatten(1).to(x.dtype), alpha=b / keep)
            return flat.view_as(x)

        def forward(x, *args, **kwargs):
            x = branch(x, lambda t: block.ls1(block.attn(block.norm1(t))))
            return branch(x, lambda t: block.ls2(block.mlp(block.norm2(t))))

        block.forward = forward

    student = nn.ModuleDict({"backbone": backbone(), "dino_head": None})
    student["dino_head"] = DINOHead(student["backbone"].embed_dim)
    teacher = nn.ModuleDict({"backbone": backbone(), "dino_head": DINOHead(student["backbone"].embed_dim)})
    teacher.load_state_dict(student.state_dict())
    for p in teacher.parameters():
        p.requires_grad = False
    for block in student["backbone"].blocks:
        stochastic_depth(block)

    # utils/param_groups.py: lr multiplier decay^(layers + 1 - layer id), patch_embed x 0.2, no decay on 1-d.
    layers = a.depth
    groups: dict = {}
    for name, p in student.named_parameters():
        if "pos_embed" in name or "patch_embed" in name or "mask_token" in name or "cls_token" in name:
            layer_id = 0
        elif "blocks." in name:
            layer_id = int(name.split("blocks.")[1].split(".")[0]) + 1
        else:
            layer_id = layers + 1
        lr = LAYER_DECAY ** (layers + 1 - layer_id) * (PATCH_EMBED_LR if "patch_embed" in name else 1.0)
        wd = 0.0 if name.endswith(".bias") or "norm" in name or "gamma" in name or p.ndim == 1 else 1.0
        groups.setdefault((lr, wd), []).append(p)
    optimizer = torch.optim.AdamW(
        [{"params": ps, "lr": 1e-3 * lr, "weight_decay": 0.04 * wd} for (lr, wd), ps in groups.items()],
        betas=(0.9, 0.999),
    )
    dino_center = torch.zeros(1, a.out_dim)
    ibot_center = torch.zeros(1, 1, a.out_dim)

    def dino_loss(students, teachers):  # loss/dino_clstoken_loss.py's forward
        total = 0
        for s in students:
            lsm = F.log_softmax(s / STUDENT_TEMP, dim=-1)
            for t in teachers:
                total -= torch.sum(t * lsm, dim=-1).mean()
        return total

    def koleo(x, eps=1e-8):  # loss/koleo_loss.py
        x = F.normalize(x, eps=eps, p=2, dim=-1)
        dots = torch.mm(x, x.t())
        n = x.shape[0]
        dots.view(-1)[:: (n + 1)].fill_(-1)
        _, nearest = torch.max(dots, dim=1)
        return -torch.log(F.pairwise_distance(x, x[nearest], 2, eps=eps) + eps).mean()

    side = a.img // 16
    generator = MaskingGenerator(side)
    plan = ViewPlan(
        full_size=None, global_count=2, global_size=a.img, local_count=a.locals_, local_size=a.local_px
    )  # fmt: skip
    loader = DataLoader(
        SyntheticImages(samples, 3, plan, 1, 0), batch_size=a.batch, shuffle=True, drop_last=True,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    it = iter(loader)
    mean = torch.tensor(timm.data.IMAGENET_DEFAULT_MEAN).view(1, 3, 1, 1) * 255
    std = torch.tensor(timm.data.IMAGENET_DEFAULT_STD).view(1, 3, 1, 1) * 255

    def step() -> None:
        nonlocal dino_center, ibot_center
        views, _ = next(it)
        views = [v.float().sub_(mean).div_(std) for v in views]
        global_crops, local_crops = torch.cat(views[:2]), torch.cat(views[2:])
        c = collate_masks(global_crops.shape[0], side, generator)
        masks, indices, weight, upperbound = c["masks"], c["indices"], c["weight"], c["upperbound"]
        n_masked = indices.shape[0]
        with torch.no_grad():  # get_teacher_output, shared head, "centering"
            t_cls, t_patch = tokens(teacher["backbone"], global_crops)
            t_cls = torch.cat(t_cls.chunk(2)[::-1])
            dim = t_patch.shape[-1]
            buffer = t_patch.new_zeros(upperbound + t_cls.shape[0], dim)
            buffer[: t_cls.shape[0]].copy_(t_cls)
            torch.index_select(
                t_patch.flatten(0, 1), 0, indices, out=buffer[t_cls.shape[0] : t_cls.shape[0] + n_masked]
            )
            out = teacher["dino_head"](buffer)
            t_cls_out, t_patch_out = out[: t_cls.shape[0]], out[t_cls.shape[0] : t_cls.shape[0] + n_masked]
            t_dino = F.softmax((t_cls_out - dino_center) / TEACHER_TEMP, dim=-1).view(2, -1, a.out_dim)
            t_ibot = F.softmax((t_patch_out.unsqueeze(0) - ibot_center) / TEACHER_TEMP, dim=-1).squeeze(0)
            dino_center = dino_center * CENTER_MOMENTUM + t_cls_out.mean(0, keepdim=True) * (1 - CENTER_MOMENTUM)
            ibot_center = ibot_center * CENTER_MOMENTUM + t_patch_out.mean(0).view(1, 1, -1) * (1 - CENTER_MOMENTUM)
        s_cls_g, s_patch = tokens(student["backbone"], global_crops, masks)
        s_cls_l, _ = tokens(student["backbone"], local_crops)
        buffer = s_patch.new_zeros(upperbound, dim)
        buffer[:n_masked].copy_(torch.index_select(s_patch.flatten(0, 1), 0, indices))
        out = student["dino_head"](torch.cat([s_cls_l, s_cls_g, buffer]))
        n_l, n_g = s_cls_l.shape[0], s_cls_g.shape[0]
        s_local, s_global, s_masked = out[:n_l], out[n_l : n_l + n_g], out[n_l + n_g :][:n_masked]
        terms = a.locals_ * 2 + 2
        loss = dino_loss(s_local.chunk(a.locals_), t_dino) / terms
        loss = loss + dino_loss([s_global], [t_dino.flatten(0, 1)]) * 2 / terms
        loss = loss + KOLEO * sum(koleo(p) for p in s_cls_g.chunk(2))
        ibot = torch.sum(t_ibot * F.log_softmax(s_masked / STUDENT_TEMP, dim=-1), dim=-1)
        loss = loss + (-(ibot * weight).sum() / masks.shape[0]) * 2 * 0.5
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in student.parameters() if p.requires_grad], CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            sp, tp = list(student.parameters()), list(teacher.parameters())
            torch._foreach_mul_(tp, TEACHER_MOMENTUM)
            torch._foreach_add_(tp, sp, alpha=1 - TEACHER_MOMENTUM)

    return step


def hand_loop(a: argparse.Namespace) -> float:
    step = hand_step(a, (a.warmup + a.steps) * a.batch)
    for _ in range(a.warmup):
        step()
    t = time.perf_counter()
    for _ in range(a.steps):
        step()
    return a.steps * a.batch / (time.perf_counter() - t)


def dinox_trial(a: argparse.Namespace, tmp: Path, i: int, server) -> float:
    from dinox.isolate import runner
    from dinox.plan import grid
    from dinox.spec import file as spec_file

    path = tmp / f"spec{i}.yaml"
    path.write_text(SPEC.format(**vars(a)))
    (trial,) = grid.expand(spec_file.load(path))
    r = runner.run_trial(trial, tmp / f"t{i}", server=server).result
    if r.status != "ok":
        raise SystemExit(f"dinox trial {r.status}: {r.error}")
    return r.metrics["images_per_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--img", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--local-px", dest="local_px", type=int, default=32)
    p.add_argument("--locals", dest="locals_", type=int, default=4)
    p.add_argument("--out-dim", dest="out_dim", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--bottleneck", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--in-process", action="store_true", help="both steps in this one process, window for window")
    p.add_argument("--hand-loop", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.hand_loop:
        print(json.dumps({"images_per_s": hand_loop(a)}))
        return
    if a.in_process:  # both steps in this process, window for window (bench_fidelity's pairing)
        from bench_fidelity import paired_windows

        step = hand_step(a, (a.warmup + 4 * a.rounds * (a.steps + 1)) * a.batch)
        header = (
            f"DINOv2 step: ViT-Tiny/16 depth {a.depth} at {a.img} px, 2 global + {a.locals_} local crops of "
            f"{a.local_px} px, {a.out_dim} prototypes, batch {a.batch}, fp32"
        )
        paired_windows(SPEC.format(**vars(a)), step, lambda: None, a, a.batch, header)
        return
    args = [
        f"--{k.replace('_', '-').rstrip('-')}={v}"
        for k, v in vars(a).items()
        if k not in ("rounds", "hand_loop", "in_process")
    ]
    from dinox.isolate.forkserver import ForkServer

    server = ForkServer()
    dinox, hand = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):  # alternating, so both sides see the same drift of a shared machine
            first, second = ("dinox", "hand") if i % 2 == 0 else ("hand", "dinox")
            for side in (first, second):
                if side == "dinox":
                    dinox.append(dinox_trial(a, Path(tmp), i, server))
                else:
                    out = subprocess.run(
                        [sys.executable, __file__, "--hand-loop", *args], capture_output=True, text=True, check=True
                    )
                    hand.append(json.loads(out.stdout.strip().splitlines()[-1])["images_per_s"])
    server.close()
    print(
        f"DINOv2 step: ViT-Tiny/16 depth {a.depth} at {a.img} px, 2 global + {a.locals_} local crops of "
        f"{a.local_px} px, "
        f"{a.out_dim} prototypes, batch {a.batch}, fp32, {a.steps} timed steps after {a.warmup}, {a.rounds} rounds"
    )
    print(f"dinox images/s      {' '.join(f'{v:.1f}' for v in dinox)}  median {statistics.median(dinox):.1f}")
    print(f"hand loop images/s  {' '.join(f'{v:.1f}' for v in hand)}  median {statistics.median(hand):.1f}")
    ratio = statistics.median(dinox) / statistics.median(hand)
    paired = [d / h for d, h in zip(dinox, hand, strict=True)]  # each round's two sides ran back to back
    print(f"round ratios        {' '.join(f'{r:.3f}' for r in paired)}  median {statistics.median(paired):.3f}")
    print(f"fidelity_ratio {ratio:.3f}  (dinox / hand loop; target between 0.98 and 1.02)")


if __name__ == "__main__":
    main()

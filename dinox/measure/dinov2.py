"""DINOv2's training step (facebookresearch/dinov2: ``train/ssl_meta_arch.py``, ``loss/``, ``layers/block.py``),
on a timm ViT, each component switchable (dinox.spec.sections.Dinov2Objective):

- DINO on class tokens: the local crops against both teacher views, each global crop against the other one;
- iBOT on masked patch tokens: block masks on ``mask_sample_probability`` of the global crops (a ratio in
  [mask_ratio_min, mask_ratio_max] each), a learned mask token in their place in the student, the teacher's
  tokens at those places as targets; the DINO head shared unless ``ibot_separate_head``;
- KoLeo on the student's global class tokens, per crop; centering (an EMA) or Sinkhorn-Knopp for the teacher;
- gradient clipping (``grad_clip``, applied by the loop after unscaling), layer-wise learning-rate decay
  (``param_groups``), and a stochastic depth that computes each residual branch only for the samples it keeps
  (DINOv2's ``drop_add_residual_stochastic_depth``), on the student only.

Masks are drawn in the loader's collate, as DINOv2 draws them (dinox.measure.dinov2_masks: ``collate`` wraps
the loader's), and reach the step with the indices of their patches, so no boolean indexing runs on the device;
the heads run on DINOv2's padded `upperbound` rows, a figure of the batch alone (so the meta-device estimate,
which draws its own, counts the same work).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from timm.layers import DropPath
from timm.models._manipulate import checkpoint_seq
from torch import nn

from dinox.measure.dinov2_masks import MaskCollate, MaskDraw, Masking
from dinox.measure.heads import DINOHead, attribute_modules
from dinox.spec.objectives import Dinov2Objective


class _Tokens(nn.Module):
    """A timm ViT's forward_features with a mask token put in place of the masked patches (the student's)."""

    def __init__(self, vit: nn.Module, masked: bool):
        super().__init__()
        if not all(hasattr(vit, a) for a in ("patch_embed", "_pos_embed", "blocks", "norm", "num_prefix_tokens")):
            raise ValueError(f"objective.kind dinov2 needs a timm VisionTransformer, not {type(vit).__name__}")
        self.vit = vit
        # Only where iBOT masks: a parameter no step uses would stop DistributedDataParallel's reduction.
        self.mask_token = nn.Parameter(torch.zeros(vit.embed_dim)) if masked else None

    def forward(self, x: torch.Tensor, masks: torch.Tensor | None = None) -> torch.Tensor:
        vit = self.vit
        x = vit.patch_embed(x)  # (B, N, D), or (B, H, W, D) where the ViT takes several sizes
        if masks is not None and self.mask_token is not None:
            x = torch.where(masks.view(*x.shape[:-1], 1), self.mask_token.to(x.dtype), x)
        x = vit.norm_pre(vit.patch_drop(vit._pos_embed(x)))
        x = checkpoint_seq(vit.blocks, x) if vit.grad_checkpointing and self.training else vit.blocks(x)
        return vit.norm(x)


class _Branch(nn.Module):
    """Backbone tokens and heads in one forward, so DistributedDataParallel sees every parameter used."""

    def __init__(self, vit: nn.Module, spec: Dinov2Objective):
        super().__init__()
        self.tokens = _Tokens(vit, masked=spec.ibot)
        dim, prefix = vit.embed_dim, vit.num_prefix_tokens
        self.prefix = prefix
        shape = (spec.out_dim, spec.head_hidden_dim, spec.head_bottleneck_dim, spec.head_layers)
        self.head = DINOHead(dim, *shape)
        self.ibot_head = DINOHead(dim, *shape) if spec.ibot and spec.ibot_separate_head else None

    def forward(
        self,
        globals_: torch.Tensor,
        locals_: list[torch.Tensor],
        masks: torch.Tensor | None,
        picked: torch.Tensor | None,
        rows: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """(global class tokens after the head, local ones, masked patch tokens after their head, the global
        class tokens before it). `masks` replaces patches by the mask token; `picked` indexes the patches
        (flattened over the batch) whose tokens iBOT reads, padded with zeros to `rows` for the head (DINOv2's
        upperbound buffer: the same shapes every step), cut back after it."""
        g = self.tokens(globals_, masks)
        cls_g = g[:, 0]
        cls_l = [self.tokens(v)[:, 0] for v in _by_size(locals_)]
        patches = None
        if picked is not None:
            chosen = g[:, self.prefix :].flatten(0, -2).index_select(0, picked)
            patches = F.pad(chosen, (0, 0, 0, max(rows - chosen.shape[0], 0)))
        heads_in = [cls_g, *cls_l] + ([patches] if patches is not None and self.ibot_head is None else [])
        out = self.head(torch.cat(heads_in))
        n_g, n_l = cls_g.shape[0], sum(c.shape[0] for c in cls_l)
        out_g, out_l = out[:n_g], out[n_g : n_g + n_l] if n_l else None
        if patches is not None:
            patches = out[n_g + n_l :] if self.ibot_head is None else self.ibot_head(patches)
            patches = patches[: picked.shape[0]]  # type: ignore[union-attr]
        return out_g, out_l, patches, cls_g


def _by_size(views: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views of one resolution concatenated (DINO's MultiCropWrapper): one backbone call per size."""
    out, start = [], 0
    while start < len(views):
        end = start
        while end < len(views) and views[end].shape[-1] == views[start].shape[-1]:
            end += 1
        out.append(torch.cat(views[start:end]))
        start = end
    return out


class Dinov2:
    """Student and EMA teacher on one timm ViT, DINOv2's losses over them (see the module's docstring)."""

    def __init__(self, vit: nn.Module, spec: Dinov2Objective):
        self.spec = spec
        device = next(vit.parameters()).device
        self.student = _Branch(vit, spec).to(device)
        self.teacher = copy.deepcopy(self.student)
        for p in self.teacher.parameters():
            p.requires_grad = False
        if hasattr(self.teacher.tokens.vit, "set_grad_checkpointing"):
            self.teacher.tokens.vit.set_grad_checkpointing(False)  # no backward through the teacher
        _stochastic_depth(self.student.tokens.vit, spec.drop_path, spec.drop_path_skip)
        self._pairs = (list(self.student.parameters()), list(self.teacher.parameters()))
        self.center = torch.zeros(1, spec.out_dim, device=device)
        self.patch_center = torch.zeros(1, spec.out_dim, device=device)
        self.reduce = True  # off inside `local`
        self.grad_clip = spec.clip_grad
        vit = self.student.tokens.vit
        side = (spec.global_crop_size or vit.patch_embed.img_size[0]) // vit.patch_embed.patch_size[0]
        ratio = (spec.mask_ratio_min, spec.mask_ratio_max)
        self.masking = Masking(side, spec.global_crops, spec.mask_sample_probability, ratio)

    def collate(self, base: Callable[[list], Any] | None) -> Callable[[list], Any] | None:
        """The loader's collate with DINOv2's mask draw after it, where iBOT masks (the loader's workers pay
        for the draw, as DINOv2's do)."""
        return MaskCollate(self.masking, base) if self.spec.ibot else base

    # --- the protocol (dinox.measure.objectives.Objective) -------------------------------------------------

    def parameters(self) -> list[nn.Parameter]:
        return [p for p in self.student.parameters() if p.requires_grad]

    def param_groups(self) -> list[dict[str, Any]]:
        """DINOv2's groups: layer-wise lr decay over the blocks, patch_embed_lr_mult, no weight decay on biases,
        norms and the tokens (dinov2/utils/param_groups.py's rules)."""
        s, vit = self.spec, self.student.tokens.vit
        depth = len(vit.blocks)
        groups: dict[tuple[float, float], list[nn.Parameter]] = {}
        for name, p in self.student.named_parameters():
            if not p.requires_grad:
                continue
            layer = _layer_of(name, depth)
            lr = s.layerwise_decay ** (depth + 1 - layer) * (s.patch_embed_lr_mult if "patch_embed" in name else 1.0)
            wd = 0.0 if name.endswith(".bias") or "norm" in name or p.ndim == 1 or "token" in name else 1.0
            groups.setdefault((lr, wd), []).append(p)
        return [{"params": ps, "lr_scale": lr, "wd_scale": wd} for (lr, wd), ps in groups.items()]

    def compile(self, compile_fn: Callable[[nn.Module], nn.Module]) -> None:
        """The backbones' token paths (the heads and the indexing stay eager); under DDP the whole student."""
        if isinstance(self.student, _Branch):
            self.student.tokens = compile_fn(self.student.tokens)  # type: ignore[assignment]
        else:
            self.student = compile_fn(self.student)
        self.teacher.tokens = compile_fn(self.teacher.tokens)  # type: ignore[assignment]

    def distribute(self, wrap: Callable[[nn.Module], nn.Module]) -> nn.Module:
        self.student = wrap(self.student)
        return self.student

    def modules(self) -> list[nn.Module]:
        return attribute_modules(self)

    @contextlib.contextmanager
    def local(self) -> Iterator[None]:
        was, self.reduce = self.reduce, False
        try:
            yield
        finally:
            self.reduce = was

    def evaluate(self, batch: Any) -> torch.Tensor:
        return self.teacher.tokens(batch[0][0])[:, 0]

    def state(self) -> dict[str, Any]:
        return {"student": self.student.state_dict(), "teacher": self.teacher.state_dict(), "center": self.center}

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        m = self.spec.teacher_momentum
        torch._foreach_mul_(self._pairs[1], m)
        torch._foreach_add_(self._pairs[1], self._pairs[0], alpha=1 - m)

    # --- the loss ---------------------------------------------------------------------------------------------

    def loss(self, batch: Any) -> torch.Tensor:
        views, draw = batch
        s, g = self.spec, self.spec.global_crops
        globals_ = torch.cat(views[:g])
        masks = picked = weights = None
        rows = 0
        if s.ibot:
            if not isinstance(draw, MaskDraw):  # no collate drew them (the meta-device estimate): drawn here
                draw = self.masking.draw(globals_.shape[0] // g).to(globals_.device)
            masks, picked, weights, rows = draw.masks, draw.picked, draw.weights, draw.rows
        with torch.no_grad():
            t_g, _t_l, t_patch, _ = self.teacher(globals_, [], None, picked, rows)
            t_cls = self._teacher_probs(t_g.float(), self.center)
            t_patch = self._teacher_probs(t_patch.float(), self.patch_center) if t_patch is not None else None
        s_g, s_l, s_patch, cls_g = self.student(globals_, list(views[g:]), masks, picked, rows)
        t_chunks = t_cls.chunk(g)
        s_g_chunks, s_l_chunks = s_g.float().chunk(g), s_l.float().chunk(len(views) - g) if s_l is not None else ()
        terms = [_ce(t, x, s.student_temp) for t in t_chunks for x in s_l_chunks]
        terms += [_ce(t, s_g_chunks[j], s.student_temp) for i, t in enumerate(t_chunks) for j in range(g) if j != i]
        total = torch.stack(terms).sum() / max(len(terms), 1)
        if s.koleo_weight > 0:
            total = total + s.koleo_weight * sum(_koleo(c) for c in cls_g.float().chunk(g))
        if t_patch is not None and s_patch is not None:
            per_patch = torch.sum(-t_patch * F.log_softmax(s_patch.float() / s.student_temp, dim=-1), dim=-1)
            total = total + (per_patch * weights).sum() / globals_.shape[0]
        return total

    @torch.no_grad()
    def _teacher_probs(self, out: torch.Tensor, center: torch.Tensor) -> torch.Tensor:
        temp = self.spec.teacher_temp
        if self.spec.centering == "sinkhorn_knopp":
            return _sinkhorn_knopp(out, temp, self.reduce)
        probs = F.softmax((out - center) / temp, dim=-1)
        batch_center = out.mean(dim=0, keepdim=True)
        if self.reduce and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(batch_center)
            batch_center /= dist.get_world_size()
        center.mul_(self.spec.center_momentum).add_(batch_center, alpha=1 - self.spec.center_momentum)
        return probs


def _ce(t: torch.Tensor, s: torch.Tensor, temp: float) -> torch.Tensor:
    return torch.sum(-t * F.log_softmax(s / temp, dim=-1), dim=-1).mean()


def _koleo(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Kozachenko-Leonenko: minus the mean log distance of each L2-normalised vector to its nearest neighbour."""
    x = F.normalize(x, eps=eps, p=2, dim=-1)
    with torch.no_grad():  # which neighbour is nearest: no gradient flows through the choice
        dots = x @ x.t()
        dots.fill_diagonal_(-1)
        nearest = dots.argmax(dim=1)
    return -torch.log(F.pairwise_distance(x, x[nearest], eps=eps) + eps).mean()


@torch.no_grad()
def _sinkhorn_knopp(out: torch.Tensor, temp: float, reduce: bool, iterations: int = 3) -> torch.Tensor:
    """DINOv2's Sinkhorn-Knopp: rows (prototypes) and columns (samples) normalised in turn, over every rank."""
    world = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 and reduce
    q = torch.exp(out / temp).t()
    n = torch.tensor(float(q.shape[1]), device=q.device)
    total = q.sum()
    if world:
        dist.all_reduce(n)
        dist.all_reduce(total)
    q /= total
    k = q.shape[0]
    for _ in range(iterations):
        rows = q.sum(dim=1, keepdim=True)
        if world:
            dist.all_reduce(rows)
        q /= rows * k
        q /= q.sum(dim=0, keepdim=True) * n
    return (q * n).t()


def _layer_of(name: str, depth: int) -> int:
    """DINOv2's layer ids: the embeddings and tokens 0, block i i + 1, the rest (norm, heads) depth + 1."""
    if any(k in name for k in ("patch_embed", "pos_embed", "cls_token", "reg_token", "mask_token")):
        return 0
    if ".blocks." in name:
        return int(name.split(".blocks.", 1)[1].split(".", 1)[0]) + 1
    return depth + 1


def _stochastic_depth(vit: nn.Module, rate: float, skip: bool) -> None:
    """Every block at `rate` (DINOv2's drop_path_uniform). Above 0.1 with `skip`, each residual branch runs on the
    samples kept only, scaled up (its compute falls with the rate); otherwise timm's DropPath (zeroes, still
    computes every sample), as DINOv2's own block does below 0.1."""
    if rate <= 0:
        return
    for block in vit.blocks:
        if skip and rate > 0.1:
            block.forward = _skipping_forward(block, rate)
        else:
            block.drop_path1, block.drop_path2 = DropPath(rate), DropPath(rate)


def _skipping_forward(block: nn.Module, rate: float) -> Callable[..., torch.Tensor]:
    original = block.forward

    def branch(x: torch.Tensor, f: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        b = x.shape[0]
        keep = max(int(b * (1 - rate)), 1)
        idx = torch.randperm(b, device=x.device)[:keep]
        out = f(x[idx])
        return torch.index_add(x.flatten(1), 0, idx, out.flatten(1).to(x.dtype), alpha=b / keep).view_as(x)

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not block.training or args or kwargs.get("attn_mask") is not None:
            return original(x, *args, **kwargs)
        x = branch(x, lambda t: block.ls1(block.attn(block.norm1(t))))
        return branch(x, lambda t: block.ls2(block.mlp(block.norm2(t))))

    return forward

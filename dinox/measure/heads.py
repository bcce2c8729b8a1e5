"""What dinox's objectives share: DINO's projection head (DINO's and DINOv2's), and how an objective's modules
are found (its nn.Module attributes)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def attribute_modules(obj: Any) -> list[nn.Module]:
    """An object's nn.Module attributes: the model; DINO's student and teacher."""
    return [v for v in vars(obj).values() if isinstance(v, nn.Module)]


class DINOHead(nn.Module):
    """DINO's projection head: MLP -> bottleneck -> L2 normalisation -> weight-normalised prototypes."""

    def __init__(self, in_dim: int, out_dim: int, hidden_dim: int, bottleneck_dim: int, layers: int):
        super().__init__()
        dims = [in_dim] + [hidden_dim] * (layers - 1)
        blocks: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:], strict=True):
            blocks += [nn.Linear(a, b), nn.GELU()]
        blocks.append(nn.Linear(dims[-1], bottleneck_dim))
        self.mlp = nn.Sequential(*blocks)
        self.last_layer = nn.utils.parametrizations.weight_norm(nn.Linear(bottleneck_dim, out_dim, bias=False))
        # DINO's norm_last_layer: the norm is fixed at 1, only the direction trains.
        g = self.last_layer.parametrizations.weight.original0
        g.data.fill_(1.0)
        g.requires_grad = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last_layer(F.normalize(self.mlp(x), dim=-1, p=2))

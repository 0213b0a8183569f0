"""MixUp (Zhang et al. 2018) as a privacy defense: the client trains on convex
combinations of k of its own examples, with the labels mixed the same way.

Coefficients ~ Dirichlet(alpha·1_k); example i is mixed with k-1 others drawn
from the same client batch (with batch size 1 it can only mix with itself).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..options import check
from .base import Defense, DefenseContext


@dataclass
class MixupOptions:
    k: int = field(default=2, metadata={"range": (1, 1024)})  # examples per mixture (each a copy of the batch)
    alpha: float = 1.0  # Dirichlet concentration of the mixing coefficients

    def __post_init__(self):
        check(self.k >= 1, f"defense mixing: k must be >= 1, got {self.k}")
        check(self.alpha > 0, f"defense mixing: alpha must be > 0, got {self.alpha}")


def mix_batch(x: torch.Tensor, y: torch.Tensor, k: int, alpha: float, num_classes: int,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mixed inputs, soft labels, coefficients (B, k)); partner 0 is the example itself."""
    batch = x.shape[0]
    gammas = torch._standard_gamma(torch.full((batch, k), float(alpha)), generator=generator)
    coeffs = gammas / gammas.sum(1, keepdim=True)
    partners = [torch.arange(batch)] + [torch.randint(0, batch, (batch,), generator=generator) for _ in range(k - 1)]
    index = torch.stack(partners, 1)  # (B, k)
    targets = y if y.dtype.is_floating_point else F.one_hot(y, num_classes).float()
    shape = (batch, k) + (1,) * (x.dim() - 1)
    mixed_x = (coeffs.view(shape).to(x) * x[index]).sum(1)
    mixed_y = (coeffs.view(batch, k, 1) * targets[index]).sum(1)
    return mixed_x, mixed_y, coeffs


def class_count(y: torch.Tensor, ctx: DefenseContext) -> int:
    """Number of classes: the model's output width when known, else from the labels."""
    from ..models import last_linear

    if ctx.model is not None:
        return last_linear(ctx.model)[1].out_features
    return int(y.max()) + 1


class Mixup(Defense):
    """Trains on Dirichlet-weighted mixtures of k examples of the batch, labels mixed alike."""

    name = "mixup"
    Options = MixupOptions
    places = ("data",)

    def transform_batch(self, x, y, ctx: DefenseContext):
        mixed_x, mixed_y, _ = mix_batch(x, y, self.options.k, self.options.alpha, class_count(y, ctx),
                                        ctx.generator)
        return mixed_x, mixed_y

"""InstaHide (Huang et al., ICML 2020): k-image MixUp followed by a random
pixel-wise sign flip of the mixed image (a one-time mask σ ∈ {±1}^d per example).

Images are mapped from [0, 1] to [-1, 1] before the flip, as InstaHide works on
zero-centred inputs; the model then trains on the encrypted images.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..options import check
from .base import Defense, DefenseContext
from .mixup import class_count, mix_batch


@dataclass
class InstaHideOptions:
    k: int = field(default=4, metadata={"range": (1, 1024)})  # images per mixture (paper: 4)
    alpha: float = 1.0  # Dirichlet concentration of the mixing coefficients
    centre: bool = True  # map [0,1] inputs to [-1,1] before the sign flip

    def __post_init__(self):
        check(self.k >= 1, f"defense 'instahide': k must be >= 1, got {self.k}")
        check(self.alpha > 0, f"defense 'instahide': alpha must be > 0, got {self.alpha}")


class InstaHide(Defense):
    """k-image mixing followed by random pixel-wise sign flips."""

    name = "instahide"
    Options = InstaHideOptions
    places = ("data",)

    def transform_batch(self, x, y, ctx: DefenseContext):
        mixed_x, mixed_y, _ = mix_batch(x, y, self.options.k, self.options.alpha, class_count(y, ctx),
                                        ctx.generator)
        if self.options.centre:
            mixed_x = mixed_x * 2 - 1
        signs = torch.randint(0, 2, mixed_x.shape, generator=ctx.generator).to(mixed_x) * 2 - 1
        return mixed_x * signs, mixed_y

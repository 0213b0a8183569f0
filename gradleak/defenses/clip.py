"""Clipping of the whole update to an L2 norm bound (Liu et al. "gradient clipping")."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..options import check
from .base import Defense, DefenseContext


@dataclass
class ClipOptions:
    bound: float = 1.0  # maximal L2 norm of the update

    def __post_init__(self):
        check(self.bound > 0, f"defense 'clip': bound must be > 0, got {self.bound}")


class UpdateClipping(Defense):
    """Scales the update down to L2 norm `bound` when it is larger."""

    name = "clip"
    strength = ("bound", -1)
    Options = ClipOptions

    def two_layer(self, view):
        bound = self.options.bound
        norm = float(view.plain(view.x).norm())

        def clipped(x_: torch.Tensor) -> torch.Tensor:
            g = view.plain(x_)
            return g * torch.clamp(bound / g.norm(), max=1.0)
        return view.result(clipped, grad_norm=norm, clip_factor=max(1.0, norm / bound))

    def transform_update(self, update, ctx: DefenseContext):
        scale = min(1.0, self.options.bound / max(update.norm(), 1e-12))
        return update.map(lambda _, t: t * scale)

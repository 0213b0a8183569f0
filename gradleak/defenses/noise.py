"""Additive Gaussian noise on the update (paper 01 "gradient noise", paper 03 Tab. 8)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..options import check
from .base import Defense, DefenseContext


@dataclass
class NoiseOptions:
    sigma: float = 1e-2  # absolute std of the noise on every coordinate

    def __post_init__(self):
        check(self.sigma >= 0, f"defense 'noise': sigma must be >= 0, got {self.sigma}")


class GaussianNoise(Defense):
    """Gaussian noise N(0, sigma²) added to every update coordinate."""

    name = "noise"
    Options = NoiseOptions

    def transform_update(self, update, ctx: DefenseContext):
        sigma = self.options.sigma
        return update.map(lambda _, t: t + sigma * torch.randn(t.shape, generator=ctx.generator).to(t))

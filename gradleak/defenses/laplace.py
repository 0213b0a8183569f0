"""Additive Laplace noise on the update (the Laplace mechanism; Liu et al. "gradient noise")."""
from __future__ import annotations

import math

import torch

from .base import Defense
from .noise import GaussianNoise, NoiseOptions


class LaplaceNoise(GaussianNoise):
    """Laplace noise with per-coordinate std `sigma` (scale b = sigma/√2), or an SNR in dB."""

    name = "laplace"
    Options = NoiseOptions
    two_layer = Defense.two_layer  # the two-layer analysis's noise is Gaussian

    def sample(self, shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
        # Inverse CDF from seeded uniforms; unit variance (b = 1/√2).
        u = torch.rand(shape, generator=generator).clamp(1e-7, 1 - 1e-7) - 0.5
        return -torch.sign(u) * torch.log1p(-2 * u.abs()) / math.sqrt(2)

"""FedCDP (Wei et al. 2021; Yue et al. eqs. 17–18): per-example, per-layer clipping
to C and Gaussian noise N(0, σ²C²) on every local step.

With L clipped tensors one example moves the sum by at most C·√L, so the
accountant sees the noise multiplier σ/√L.
"""
from __future__ import annotations

import math

from ..fl.local import Tensors
from .base import Defense
from .dpsgd import DPSGD, DPSGDOptions, clip_factors


class FedCDP(DPSGD):
    """DP-SGD with each parameter tensor of each example clipped separately."""

    name = "fedcdp"
    strength = ("sigma", 1)
    Options = DPSGDOptions
    two_layer = Defense.two_layer  # the two-layer analysis clips the whole gradient (dpsgd)

    tensors_clipped: int = 0

    def noise_multiplier(self) -> float:
        return self.options.sigma / math.sqrt(max(self.tensors_clipped, 1))

    def clip_per_example(self, per_example: Tensors) -> Tensors:
        self.tensors_clipped = len(per_example)
        out = {}
        for n, g in per_example.items():
            factors = clip_factors(g.flatten(1).norm(dim=1), self.options.clip)
            out[n] = g * factors.view(-1, *[1] * (g.dim() - 1))
        return out

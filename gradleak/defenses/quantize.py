"""Deterministic b-bit uniform quantizer (Yue et al. eq. 6, φ_q).

Q(g_i) = (κ/s)·||g||_p·sign(g_i)·ξ_i with ξ_i = round(s|g_i| / (κ||g||_p)),
applied to every tensor of the update; s = 2^(b-1) - 1 gives 2s+1 ≤ 2^b levels
(b = 1 is treated as ternary, s = 1). QSGD (eq. 7) replaces the rounding by
unbiased stochastic rounding.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..options import check
from .base import Defense, DefenseContext


@dataclass
class QuantizeOptions:
    bits: int = 3
    norm: str = "inf"  # p of ||g||_p: inf (levels span the largest entry) or 2 (QSGD's choice)
    kappa: float = 1.0  # scaling factor κ

    def __post_init__(self):
        check(self.bits >= 1, f"defense quantizer: bits must be >= 1, got {self.bits}")
        check(self.bits <= 31, f"defense quantizer: bits must be <= 31, got {self.bits}")
        check(self.norm in ("inf", "2"), f"defense quantizer: norm must be inf or 2, got '{self.norm}'")
        check(self.kappa > 0, f"defense quantizer: kappa must be > 0, got {self.kappa}")

    @property
    def levels_per_sign(self) -> int:
        return max(1, 2 ** (self.bits - 1) - 1)


def quantize_tensor(t: torch.Tensor, opt: QuantizeOptions, generator: torch.Generator | None) -> torch.Tensor:
    """Eq. 6 with deterministic rounding (generator None) or eq. 7's stochastic rounding."""
    s = opt.levels_per_sign
    scale = opt.kappa * (t.abs().max() if opt.norm == "inf" else t.norm())
    if scale == 0:
        return torch.zeros_like(t)
    level = (s * t.abs() / scale).clamp(max=s)
    if generator is None:
        xi = level.round()
    else:
        lower = level.floor()
        xi = lower + (torch.rand(t.shape, generator=generator).to(t) < (level - lower)).to(t)
    return scale / s * torch.sign(t) * xi


class Quantize(Defense):
    """Deterministic b-bit uniform quantizer of every update tensor (Yue et al. eq. 6)."""

    name = "quantize"
    strength = ("bits", -1)
    Options = QuantizeOptions

    def transform_update(self, update, ctx: DefenseContext):
        return update.map(lambda _, t: quantize_tensor(t, self.options, None))

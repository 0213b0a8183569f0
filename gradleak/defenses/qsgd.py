"""QSGD (Alistarh et al. 2017; Yue et al. eq. 7, φ_qsgd): unbiased stochastic
b-bit quantization of every tensor, levels relative to its L2 norm by default."""
from __future__ import annotations

from dataclasses import dataclass

from .base import Defense, DefenseContext
from .quantize import QuantizeOptions, quantize_tensor


@dataclass
class QSGDOptions(QuantizeOptions):
    norm: str = "2"


class QSGD(Defense):
    """Stochastic unbiased b-bit quantizer of every update tensor (Yue et al. eq. 7)."""

    name = "qsgd"
    strength = ("bits", -1)
    Options = QSGDOptions

    def transform_update(self, update, ctx: DefenseContext):
        return update.map(lambda _, t: quantize_tensor(t, self.options, ctx.generator))

"""signSGD (Bernstein et al. 2018; Yue et al. eq. 5): one bit per coordinate."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..options import check
from .base import Defense, DefenseContext


@dataclass
class SignOptions:
    # mean: sign times the tensor's mean |entry| (scaled sign, keeps FedAvg's step size);
    # none: the bare ±1/0 signs
    scale: str = "mean"

    def __post_init__(self):
        check(self.scale in ("mean", "none"), f"defense 'sign': scale must be mean or none, got '{self.scale}'")


class SignSGD(Defense):
    """Sends the sign of every update entry (optionally times the tensor's mean |entry|)."""

    name = "sign"
    Options = SignOptions

    def transform_update(self, update, ctx: DefenseContext):
        if self.options.scale == "none":
            return update.map(lambda _, t: torch.sign(t))
        return update.map(lambda _, t: torch.sign(t) * t.abs().mean())

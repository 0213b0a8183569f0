"""The two-layer network f(x) = aᵀσ(Wx) of the Wang–Lee–Lei analysis (Liu et al. §3, App. B and D).

Both layers are bias-free so the gradient formulas of the paper hold exactly.
`init=gaussian` is the mean-field scaling of the upper bound (Assumption B.2):
W entries ~ N(0, 1) and every a_j = 1/m.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ..options import build_options, check
from .base import ModelSpec, make_activation, size_checked
from .building import act_name, flat_dim


@dataclass(frozen=True)
class TwoLayerOptions:
    width: int = 1000  # m, the number of hidden units
    init: Literal["default", "gaussian"] = "default"

    def __post_init__(self) -> None:
        check(self.width >= 1, "model 'twolayer' option 'width' must be at least 1")


@size_checked
def build_twolayer(spec: ModelSpec) -> nn.Module:
    """Flatten → Linear(d, m, no bias) → σ → Linear(m, classes, no bias)."""
    opts: TwoLayerOptions = build_options(TwoLayerOptions, spec.options, "model 'twolayer'")
    act = act_name(spec, "relu")
    hidden = nn.Linear(flat_dim(spec), opts.width, bias=False)
    head = nn.Linear(opts.width, spec.num_classes, bias=False)
    if opts.init == "gaussian":
        with torch.no_grad():
            hidden.weight.normal_(0.0, 1.0)
            head.weight.fill_(1.0 / opts.width)
    return nn.Sequential(nn.Flatten(), hidden, make_activation(act), head)

"""The LeNet of DLG (Zhu et al. 2019) and CPL (Wei et al. 2020).

Three 5×5 sigmoid convolutions (two with stride 2) and one linear layer; the
reference code is mit-han-lab/dlg `models/vision.py`. Its sigmoid activations
and uniform(-0.5, 0.5) initialisation are what makes DLG converge, so both are
the defaults here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ..options import build_options, check
from .base import ModelSpec, make_activation, size_checked
from .building import act_name, conv_out, image_shape


@dataclass(frozen=True)
class LeNetOptions:
    width: int = 12  # channels of every conv layer (12 in DLG)
    init: Literal["dlg", "default"] = "dlg"  # dlg: every weight and bias ~ U(-0.5, 0.5)

    def __post_init__(self) -> None:
        check(self.width >= 1, "model 'lenet' option 'width' must be at least 1")


def dlg_init_(model: nn.Module) -> None:
    """DLG's `weights_init`: weights and biases ~ U(-0.5, 0.5)."""
    with torch.no_grad():
        for module in model.modules():
            for name in ("weight", "bias"):
                param = getattr(module, name, None)
                if isinstance(param, nn.Parameter):
                    param.uniform_(-0.5, 0.5)


@size_checked
def build_lenet(spec: ModelSpec) -> nn.Module:
    """DLG/CPL LeNet: conv(s2)-act-conv(s2)-act-conv(s1)-act-flatten-linear."""
    opts: LeNetOptions = build_options(LeNetOptions, spec.options, "model 'lenet'")
    channels, height, width = image_shape(spec, min_size=1)
    act = act_name(spec, "sigmoid")
    w = opts.width
    out_h = conv_out(conv_out(height, 5, 2, 2), 5, 2, 2)
    out_w = conv_out(conv_out(width, 5, 2, 2), 5, 2, 2)
    model = nn.Sequential(
        nn.Conv2d(channels, w, kernel_size=5, stride=2, padding=2),
        make_activation(act),
        nn.Conv2d(w, w, kernel_size=5, stride=2, padding=2),
        make_activation(act),
        nn.Conv2d(w, w, kernel_size=5, stride=1, padding=2),
        make_activation(act),
        nn.Flatten(),
        nn.Linear(w * out_h * out_w, spec.num_classes),
    )
    if opts.init == "dlg":
        dlg_init_(model)
    return model

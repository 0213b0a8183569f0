"""LeNet-5 (LeCun et al. 1998) as used by MKOR (Wang, Velipasalar, Gursoy, WACV 2024).

conv5(6)-act-avgpool2-conv5(16)-act-avgpool2-fc120-act-fc84-act-fc, sigmoid by
default. The first conv pads by 2 below 32 px so 28×28 MNIST sees the 32×32
geometry of the original (16·5·5 = 400 features). `modified=True` is MKOR's
"modified LeNet": each average pool is dropped and the conv before it gets
stride 2, keeping the parameter count and the 400 features at 28/32 px.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..options import build_options
from .base import ModelSpec, make_activation, size_checked
from .building import act_name, conv_out, image_shape

MIN_SIZE = 16


@dataclass(frozen=True)
class LeNet5Options:
    modified: bool = False  # stride-2 convolutions instead of average pooling (MKOR)


@size_checked
def build_lenet5(spec: ModelSpec) -> nn.Module:
    """Classic LeNet-5 (or MKOR's pooling-free variant) sized to the input."""
    opts: LeNet5Options = build_options(LeNet5Options, spec.options, "model 'lenet5'")
    channels, height, width = image_shape(spec, min_size=MIN_SIZE)
    act = act_name(spec, "sigmoid")
    pad = 2 if min(height, width) < 32 else 0
    if opts.modified:
        features = [
            nn.Conv2d(channels, 6, kernel_size=5, stride=2, padding=pad), make_activation(act),
            nn.Conv2d(6, 16, kernel_size=5, stride=2), make_activation(act),
        ]
        sizes = [conv_out(conv_out(s, 5, 2, pad), 5, 2) for s in (height, width)]
    else:
        features = [
            nn.Conv2d(channels, 6, kernel_size=5, padding=pad), make_activation(act),
            nn.AvgPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5), make_activation(act),
            nn.AvgPool2d(2),
        ]
        sizes = [conv_out(conv_out(conv_out(s, 5, 1, pad), 2, 2) - 4, 2, 2) for s in (height, width)]
    return nn.Sequential(
        *features,
        nn.Flatten(),
        nn.Linear(16 * sizes[0] * sizes[1], 120), make_activation(act),
        nn.Linear(120, 84), make_activation(act),
        nn.Linear(84, spec.num_classes),
    )

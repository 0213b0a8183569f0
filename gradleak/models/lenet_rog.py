"""The LeNet of Yue et al.'s released code (Yue et al., ROG; github KAI-YUE/rog,
`networks/vgg.py`, class `LeNet_5`).

conv5(32, pad 2)-ReLU-maxpool2-conv5(64, pad 2)-ReLU-maxpool2-flatten-
fc(hidden, no bias)-ReLU-fc(classes, no bias), PyTorch's default
initialisation. At 128 px the first linear layer sees 64·32·32 = 65536
features (33.5 M weights): its gradient is an outer product of the error with
each image's pooled feature maps, which is what lets ROG see the images
through a per-tensor quantizer (docs/rog.md). Unlike the DLG `lenet`, which
has 12 channels and a single linear head, this is the model Yue et al.'s
numbers were measured on. `width` is conv1's channel count (conv2 has twice
as many) and `hidden` the first linear layer's width, for cheaper variants.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..options import build_options, check
from .base import ModelSpec, make_activation, size_checked
from .building import act_name, conv_out, image_shape

MIN_SIZE = 4  # two 2×2 max-pools


@dataclass(frozen=True)
class LeNetROGOptions:
    width: int = 32  # conv1 channels; conv2 has 2·width (32 / 64 in Yue et al.'s code)
    hidden: int = 512  # width of the first linear layer

    def __post_init__(self) -> None:
        check(self.width >= 1, "model 'lenet-rog' option 'width' must be at least 1")
        check(self.hidden >= 1, "model 'lenet-rog' option 'hidden' must be at least 1")


@size_checked
def build_lenet_rog(spec: ModelSpec) -> nn.Module:
    """Yue et al.'s LeNet_5 sized to the input (bias-free linear layers)."""
    opts: LeNetROGOptions = build_options(LeNetROGOptions, spec.options, "model 'lenet-rog'")
    channels, height, width = image_shape(spec, min_size=MIN_SIZE)
    act = act_name(spec, "relu")
    w = opts.width
    sizes = [conv_out(conv_out(s, 2, 2), 2, 2) for s in (height, width)]  # 5×5 convs keep the size
    return nn.Sequential(
        nn.Conv2d(channels, w, kernel_size=5, padding=2), make_activation(act),
        nn.MaxPool2d(2, 2),
        nn.Conv2d(w, 2 * w, kernel_size=5, padding=2), make_activation(act),
        nn.MaxPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(2 * w * sizes[0] * sizes[1], opts.hidden, bias=False), make_activation(act),
        nn.Linear(opts.hidden, spec.num_classes, bias=False),
    )
